"""The things the load tool can send traffic to, behind one interface.

Each target scores one request of texts and raises :class:`RequestFailed` with a short error kind
(``http_503``, ``grpc_UNAVAILABLE``, ``timeout``, ``wrong_count`` ...) so errors can be counted
by kind. Only 127.0.0.1 is ever contacted.
"""

from __future__ import annotations

import abc
import asyncio
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import numpy as np
import orjson

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
# Triton serves each pipeline version under its own names; straight to Triton means version 1.
REGRESSION_MODEL = "text_regression_v1"


class RequestFailed(Exception):
    """One request failed; ``kind`` names how, for the error counts."""

    def __init__(self, kind: str, detail: str = "", retry_after: str | None = None) -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind
        # The server's Retry-After header, when it refused the request with one.
        self.retry_after = retry_after


def require_local(host: str) -> None:
    """Refuse any host but the loopback one: the tool never sends traffic elsewhere."""
    if host not in LOCAL_HOSTS:
        raise ValueError(f"the load tool only sends traffic to 127.0.0.1, not to {host!r}")


class Target(abc.ABC):
    """Something that scores a list of texts."""

    name: str

    async def open(self) -> None:  # noqa: B027 - optional hook
        """Create connections (before any timing starts)."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""

    @abc.abstractmethod
    async def score(self, texts: list[str]) -> None:
        """Score ``texts``; raise :class:`RequestFailed` on any failure."""


class HttpTarget(Target):
    """The gateway's REST contract: ``POST {base}/v1/predict``, ``{"texts": [...]}`` in,
    ``{"scores": [...]}`` out.

    The naive baseline speaks the same contract, so this target drives both.
    """

    def __init__(
        self,
        name: str,
        base_url: str,
        api_key: str,
        timeout_s: float = 10.0,
        max_connections: int = 64,
    ) -> None:
        parts = urlsplit(base_url)
        require_local(parts.hostname or "")
        self.name = name
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        """Open a pooled session (keep-alive connections, as a real app would hold).

        aiohttp rather than httpx: measured at concurrency 1 against the gateway, httpx's own
        overhead was about 2.3 ms per request more, which the tool would charge to the server.
        """
        self._session = aiohttp.ClientSession(
            base_url=self.base_url,
            headers={"X-API-Key": self.api_key, "Content-Type": "application/json"},
            timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            connector=aiohttp.TCPConnector(limit=self.max_connections),
        )

    async def close(self) -> None:
        """Close the session."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def score(self, texts: list[str]) -> None:
        """POST one request and check that one score came back per text."""
        assert self._session is not None, "open() the target first"
        try:
            async with self._session.post(
                "/v1/predict", data=orjson.dumps({"texts": texts})
            ) as answer:
                body = await answer.read()
                status = answer.status
                retry_after = answer.headers.get("Retry-After")
        except TimeoutError as error:
            raise RequestFailed("timeout", str(error)) from error
        except aiohttp.ClientError as error:
            raise RequestFailed("connection", type(error).__name__) from error
        if status != 200:
            raise RequestFailed(f"http_{status}", body[:200].decode(errors="replace"), retry_after)
        try:
            scores = orjson.loads(body)["scores"]
        except (ValueError, KeyError, TypeError) as error:
            raise RequestFailed("bad_body", str(error)) from error
        if len(scores) != len(texts):
            raise RequestFailed("wrong_count", f"{len(scores)} scores for {len(texts)} texts")


class TritonGrpcTarget(Target):
    """Triton over gRPC: ``text_regression_v1``, ``text`` BYTES [n,1] -> ``score`` FP32 [n,1]."""

    def __init__(
        self,
        grpc_url: str,
        name: str = "triton",
        model: str = REGRESSION_MODEL,
        timeout_s: float = 10.0,
    ) -> None:
        require_local(grpc_url.rsplit(":", 1)[0].strip("[]"))
        self.name = name
        self.grpc_url = grpc_url
        self.model = model
        self.timeout_s = timeout_s
        self._client: Any = None

    async def open(self) -> None:
        """Open one gRPC channel (HTTP/2 multiplexes every concurrent request over it)."""
        import tritonclient.grpc.aio as grpcclient

        self._client = grpcclient.InferenceServerClient(self.grpc_url)

    async def close(self) -> None:
        """Close the channel."""
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def score(self, texts: list[str]) -> None:
        """Infer one request and check the shape of the scores."""
        import tritonclient.grpc.aio as grpcclient
        from tritonclient.utils import InferenceServerException

        assert self._client is not None, "open() the target first"
        batch = np.array([text.encode("utf-8") for text in texts], dtype=np.object_).reshape(-1, 1)
        text_input = grpcclient.InferInput("text", list(batch.shape), "BYTES")
        text_input.set_data_from_numpy(batch)
        try:
            result = await self._client.infer(
                self.model,
                inputs=[text_input],
                outputs=[grpcclient.InferRequestedOutput("score")],
                client_timeout=self.timeout_s,
            )
        except InferenceServerException as error:
            raise RequestFailed(_grpc_kind(error), str(error.message())[:200]) from error
        except asyncio.TimeoutError as error:
            raise RequestFailed("timeout") from error
        scores = result.as_numpy("score")
        if scores is None or scores.shape != (len(texts), 1):
            shape = None if scores is None else scores.shape
            raise RequestFailed("wrong_count", f"score shape {shape} for {len(texts)} texts")


def _grpc_kind(error: Any) -> str:
    status = str(error.status() or "unknown")
    code = status.removeprefix("StatusCode.")
    if code == "DEADLINE_EXCEEDED":
        return "timeout"
    return f"grpc_{code}"
