"""JSON responses rendered by orjson (numpy arrays serialized natively, without Python floats)."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi.responses import JSONResponse


class OrjsonResponse(JSONResponse):
    """JSONResponse rendered with orjson, numpy arrays included."""

    def render(self, content: Any) -> bytes:
        """Serialize ``content``."""
        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)
