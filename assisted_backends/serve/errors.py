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
