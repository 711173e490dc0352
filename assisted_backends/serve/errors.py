"""Errors in the OpenAI API's shape: `{"error": {"message", "type", "param", "code"}}` with an HTTP status.

Every refusal the server makes (a malformed body, a field of the wrong type or range, a prompt longer than the
context, a full queue) is an `APIError`: one line naming the field and the fix, the status a client expects.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class APIError(Exception):
    """A refusal: HTTP `status`, one-line `message`, the OpenAI `type`, the field it names (`param`), a `code`."""

    status: int
    message: str
    param: str | None = None
    code: str | None = None
    type: str = "invalid_request_error"
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def invalid(param: str, message: str, code: str = "invalid_value") -> APIError:
    """400: field `param` is wrong; `message` says how and what to send instead."""
    return APIError(400, f"{param}: {message}", param, code)


def unsupported(param: str, why: str) -> APIError:
    """400: field `param` changes the output in a way this server cannot honour exactly."""
    return APIError(400, f"{param} is not supported by this server: {why}", param, "unsupported_parameter")


def unsupported_fields(refused: list[tuple[str, str]]) -> APIError:
    """400 naming every field of a body that this server cannot honour exactly (`refused`: (field, why) pairs)."""
    if len(refused) == 1:
        return unsupported(*refused[0])
    names = ", ".join(name for name, _ in refused)
    reasons = "; ".join(f"{name}: {why}" for name, why in refused)
    return APIError(
        400, f"{names} are not supported by this server ({reasons})", refused[0][0], "unsupported_parameter"
    )


def queue_full(waiting: int, retry_after: int) -> APIError:
    """429 with Retry-After: the waiting queue is at its bound."""
    return APIError(
        429,
        f"the server's waiting queue is full ({waiting} requests wait for a slot); retry after {retry_after} s",
        None,
        "queue_full",
        "rate_limit_error",
        {"Retry-After": str(retry_after)},
    )


def shutting_down() -> APIError:
    return APIError(503, "the server is shutting down and takes no new requests", None, "shutting_down", "server_error")


def engine_failed(why: str) -> APIError:
    """503: the engine thread ended on a fault; the server is exiting (its supervisor restarts it)."""
    return APIError(503, f"{why}; the server is exiting", None, "engine_failed", "server_error")


def engine_error(why: str) -> APIError:
    """500: the engine failed on this request's batch or its thread ended."""
    return APIError(500, why, None, "engine_error", "server_error")


def unauthorized(why: str) -> APIError:
    """401: no key, or not one of the server's (--api-key / --api-key-file)."""
    return APIError(401, f"{why}; send the header 'Authorization: Bearer KEY' with a key this server was started "
                    "with (--api-key, --api-key-file)", None, "invalid_api_key")  # fmt: skip


def unsupported_media(content_type: str) -> APIError:
    """415: a body that is not declared JSON (a browser's cross-site `text/plain` form, for one)."""
    return APIError(415, f"Content-Type: {content_type[:60] or 'none'}: send the body as application/json", None,
                    "unsupported_media_type")  # fmt: skip


def timed_out(what: str, seconds: float, flag: str) -> APIError:
    """408: the client took longer than `seconds` to send `what`."""
    return APIError(408, f"{what} took longer than {seconds:g} s ({flag}); send it at once", None, "request_timeout")
