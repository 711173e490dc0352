"""What a client may hold of the server, and for how long: connections, body reads, stream sends, shutdown.

- connections: at most `max_connections` open at once (uvicorn's `limit_concurrency`: past it a request is
  answered 503), so the bodies being read hold at most `max_connections` x `--max-body-mb`;
- a body must arrive within `body_timeout_s` (408 after), so a stalled upload frees its connection;
- each write of a stream must be taken by the client within `send_timeout_s`: a client that stops reading has its
  stream ended and its row cancelled (its events never pile up: `events.JobEvents` keeps the latest state);
- SIGTERM lets requests in flight finish for at most `shutdown_timeout_s`, then cancels them and exits.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from assisted_backends.serve.errors import APIError, timed_out


@dataclass(frozen=True)
class Limits:
    """The server's bounds on its clients (see the module docstring)."""

    max_body_bytes: int = 32 * 1024 * 1024
    max_connections: int = 64
    body_timeout_s: float = 30.0
    send_timeout_s: float = 30.0
    shutdown_timeout_s: float = 60.0


async def read_body(request, limits: Limits) -> bytes:
    """The request body: 413 past `max_body_bytes` (read no further), 408 when it takes past `body_timeout_s`."""
    limit = limits.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(int(declared), limit)
    chunks, size = [], 0
    try:
        async with asyncio.timeout(limits.body_timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise _too_large(size, limit)
                chunks.append(chunk)
    except TimeoutError:
        raise timed_out("sending the request body", limits.body_timeout_s, "--body-timeout") from None
    return b"".join(chunks)


def _too_large(size: int, limit: int) -> APIError:
    return APIError(413, f"the request body is {size} bytes or more, over this server's limit of {limit} bytes "
                    "(--max-body-mb); send a shorter prompt", None, "request_too_large")  # fmt: skip


class SendTimeout(Exception):
    """The client took no data for `send_timeout_s`."""


def deadline_stream(content, send_timeout_s: float, **options):
    """A `StreamingResponse` of `content` (an async generator) whose every send must complete within
    `send_timeout_s`; past it the stream ends (the connection is closed unfinished). `content` is closed however
    the stream ends, which cancels its job."""
    from starlette.responses import StreamingResponse

    class DeadlineStream(StreamingResponse):
        async def stream_response(self, send) -> None:
            async def send_in_time(message) -> None:
                try:
                    await asyncio.wait_for(send(message), send_timeout_s)
                except TimeoutError:
                    raise SendTimeout from None

            try:
                await super().stream_response(send_in_time)
            except SendTimeout:
                return  # past the send deadline the stream ends unfinished; `finally` cancels its job
            finally:  # also when the task is cancelled (shutdown's deadline): the content's cleanup cancels its job
                await self.body_iterator.aclose()

    return DeadlineStream(content, **options)


def uvicorn_config(app, limits: Limits, log_level: str):
    """uvicorn's configuration with these limits."""
    import uvicorn

    return uvicorn.Config(
        app,
        log_level=log_level,
        lifespan="on",
        access_log=log_level in ("info", "debug"),
        limit_concurrency=limits.max_connections,
        timeout_graceful_shutdown=limits.shutdown_timeout_s,
    )
