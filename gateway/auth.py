"""API-key authentication with scopes.

Keys are configured only as SHA-256 digests (``digest:scope+scope[:rate[/burst]]``); a presented
key is hashed and compared with every configured digest in constant time. Keys are never logged.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from gateway import errors
from gateway.rate_limit import RateLimit

# "infer" runs the /v1 inference and model-listing routes; "admin" the model-lifecycle API
# (/v1/admin/...). A key holds either or both ("infer+admin").
SCOPES = ("infer", "admin")
DEFAULT_SCOPES = ("infer",)


@dataclass(frozen=True)
class Principal:
    """The caller a valid key identifies: its digest, scopes and rate limit (None: the default)."""

    digest: str
    scopes: frozenset[str]
    rate_limit: RateLimit | None = None


def hash_key(key: str) -> str:
    """Hex SHA-256 of an API key: the form keys are configured in."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def new_key(scopes: tuple[str, ...] = DEFAULT_SCOPES) -> tuple[str, str]:
    """A fresh random key and its configuration entry ``digest:scopes``. The key never starts
    with "-": on a command line (``--key KEY``) it would read as an option."""
    key = secrets.token_urlsafe(32)
    while key.startswith("-"):
        key = secrets.token_urlsafe(32)
    return key, f"{hash_key(key)}:{'+'.join(scopes)}"


class KeyRing:
    """The configured keys."""

    def __init__(self, entries: list[str]) -> None:
        self._keys: list[tuple[bytes, frozenset[str], RateLimit | None]] = []
        for entry in entries:
            digest, _, rest = entry.partition(":")
            scope_text, _, limit_text = rest.partition(":")
            scopes = frozenset(s for s in scope_text.split("+") if s) or frozenset(DEFAULT_SCOPES)
            unknown = scopes - set(SCOPES)
            if unknown:
                raise ValueError(f"unknown API key scope(s): {', '.join(sorted(unknown))}")
            limit = RateLimit.parse(limit_text) if limit_text else None
            self._keys.append((bytes.fromhex(digest), scopes, limit))

    def __len__(self) -> int:
        return len(self._keys)

    def digests(self, scope: str) -> list[str]:
        """The hex digests of the keys that hold ``scope``."""
        return [digest.hex() for digest, scopes, _ in self._keys if scope in scopes]

    def authenticate(self, presented: str | None) -> Principal:
        """The principal of ``presented``; Unauthorized when missing or unknown."""
        if not presented:
            raise errors.Unauthorized(
                "an API key is required: 'Authorization: Bearer <key>' or 'X-API-Key: <key>'"
            )
        digest = hashlib.sha256(presented.encode("utf-8")).digest()
        match: tuple[frozenset[str], RateLimit | None] | None = None
        # Compare against every key, so timing does not tell how many keys exist or which matched.
        for known, scopes, limit in self._keys:
            if hmac.compare_digest(known, digest):
                match = (scopes, limit)
        if match is None:
            raise errors.Unauthorized("the API key is not valid")
        return Principal(digest=digest.hex(), scopes=match[0], rate_limit=match[1])


def presented_key(authorization: str | None, x_api_key: str | None) -> str | None:
    """The key from ``Authorization: Bearer`` or ``X-API-Key`` (Bearer wins when both are sent)."""
    if authorization:
        scheme, _, credentials = authorization.partition(" ")
        if scheme.lower() == "bearer" and credentials.strip():
            return credentials.strip()
        raise errors.Unauthorized("the Authorization header must be 'Bearer <key>'")
    return x_api_key or None


def require_scope(principal: Principal, scope: str) -> Principal:
    """``principal`` if it holds ``scope``, else Forbidden."""
    if scope not in principal.scopes:
        raise errors.Forbidden(f"this API key lacks the '{scope}' scope")
    return principal
