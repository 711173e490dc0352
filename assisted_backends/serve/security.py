"""Who may call the server: API keys, browsers' origins, and bodies declared as JSON.

Keys (`--api-key`, repeatable; `--api-key-file`, one key per line, `#` comments): every `/v1` route and
`/metrics` answer 401 in OpenAI's error shape unless the request carries `Authorization: Bearer KEY` with one
of them (compared in constant time); `/health` stays open. Each key is a *tenant*: suffix decoding's index of
earlier requests is kept per tenant (`engine.SuffixIndexes`), so one client's acceptance rate cannot reveal
another's text. No key given: the server is open, as it was (it listens on 127.0.0.1 by default).

Browsers: a web page may send a "simple" cross-site POST (`text/plain`, no preflight) to a loopback port; a body
not declared `application/json` is refused with 415 (`require_json`), so every real request needs a CORS
preflight, which fails unless `--cors-origins` names the page's origin (no CORS headers at all by default).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from assisted_backends.serve.errors import APIError, unauthorized, unsupported_media

OPEN_PATHS = ("/health",)


@dataclass(frozen=True)
class Keys:
    """The accepted keys, as SHA-256 digests with their tenant names ("key 1", "key 2", ...)."""

    digests: tuple[tuple[bytes, str], ...]

    @classmethod
    def of(cls, keys: Iterable[str]) -> Keys:
        unique = list(dict.fromkeys(keys))
        return cls(tuple((_digest(key), f"key {number}") for number, key in enumerate(unique, 1)))

    def tenant(self, authorization: str | None) -> str:
        """The tenant whose key `authorization` (the header's value) carries, or a 401."""
        if not authorization:
            raise unauthorized("no API key")
        scheme, _, key = authorization.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise unauthorized("the Authorization header is not 'Bearer KEY'")
        digest = _digest(key.strip())
        found = None
        for known, name in self.digests:  # every digest compared: the time does not say which matched
            if hmac.compare_digest(known, digest):
                found = name
        if found is None:
            raise unauthorized("the API key is not one of this server's")
        return found


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


def read_keys(keys: list[str] | None, files: list[str] | None) -> list[str]:
    """The keys of `--api-key` and of each `--api-key-file` (one a line; blank lines and `#` comments skipped);
    a ValueError naming the flag for an unreadable file, an empty one, or a key with spaces."""
    found = [("--api-key", key) for key in keys or []]
    for name in files or []:
        try:
            lines = Path(name).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as error:
            message = f"--api-key-file {name}: cannot read it ({error}); give a text file, one key a line"
            raise ValueError(message) from None
        read = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
        if not read:
            raise ValueError(f"--api-key-file {name}: holds no key; write one key a line")
        found += [(f"--api-key-file {name}", key) for key in read]
    for flag, key in found:
        if not key or any(character.isspace() for character in key):
            raise ValueError(f"{flag}: a key must be one word without spaces; give another")
    return [key for _, key in found]


def protected(path: str) -> bool:
    """Whether `path` needs a key when the server has keys."""
    return path not in OPEN_PATHS


def require_json(content_type: str | None) -> None:
    """415 unless the body is declared `application/json` (parameters such as `charset` allowed)."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        raise unsupported_media(content_type or "")


class RequireKey:
    """ASGI middleware: requests to protected paths without a valid key get the 401; the tenant of the others is
    set as `request.state.tenant`. `refused(error, path)` makes the response (the app's error response)."""

    def __init__(self, app, keys: Keys, refused) -> None:
        self.app, self.keys, self.refused = app, keys, refused

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and protected(scope["path"]):
            headers = dict(scope.get("headers") or ())
            authorization = headers.get(b"authorization", b"").decode("latin-1")
            try:
                tenant = self.keys.tenant(authorization)
            except APIError as error:
                error.headers["WWW-Authenticate"] = "Bearer"
                await self.refused(error, scope["path"])(scope, receive, send)
                return
            scope.setdefault("state", {})["tenant"] = tenant
        await self.app(scope, receive, send)


def secure(app, keys: Keys | None, origins: list[str], refused) -> None:
    """Put the key check (when `keys`) and CORS for `origins` (when any; outermost, so that preflights are
    answered without a key) in front of the FastAPI `app`."""
    if keys is not None:
        app.add_middleware(RequireKey, keys=keys, refused=refused)
    if origins:
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=origins, allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"], max_age=600)  # fmt: skip
