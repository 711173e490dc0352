"""Serving the app on a bound socket until SIGTERM / SIGINT or an engine fault, and the exit status.

uvicorn owns SIGTERM and SIGINT: it stops accepting connections, lets requests in flight finish (for at most
`--shutdown-timeout`, then cancels them), then the app's lifespan stops the engine. An engine fault
(`engine.Engine.on_fault`) starts the same shutdown and the process exits with `ENGINE_FAILED`, for a supervisor
(systemd, Docker's restart policy, Kubernetes) to start it again.
"""

from __future__ import annotations

import signal
import socket
import sys
from contextlib import asynccontextmanager

ENGINE_FAILED = 3  # the exit status after an engine fault


def build_server(state, log_level: str):
    """The uvicorn server of `state`'s app: its lifespan starts and stops the engine, an engine fault shuts it
    down, `state.server` is set (its `should_exit`: draining)."""
    import uvicorn

    from assisted_backends.serve.app import build_app
    from assisted_backends.serve.limits import uvicorn_config

    @asynccontextmanager
    async def lifespan(app):
        state.engine.start()
        try:
            yield
        finally:
            state.engine.stop(state.limits.shutdown_timeout_s)

    app = build_app(state)
    app.router.lifespan_context = lifespan
    server = uvicorn.Server(uvicorn_config(app, state.limits, log_level))
    state.server = server
    state.engine.on_fault = lambda message: setattr(server, "should_exit", True)  # uvicorn polls it
    return server


def serve(state, sock: socket.socket, log_level: str, banner: list[str]) -> int:
    """Serve `state`'s app on `sock` (printing `banner` once it is built); 0 after a clean shutdown,
    `ENGINE_FAILED` after an engine fault."""
    server = build_server(state, log_level)
    for line in banner:
        print(line, file=sys.stderr, flush=True)
    # uvicorn raises the signal it caught again once it has drained, to the handler found when it started: this
    # one, so that a SIGTERM that drained cleanly ends the process with status 0
    signal.signal(signal.SIGTERM, lambda number, frame: None)
    server.run(sockets=[sock])
    if state.engine.failure is not None:
        print(f"stopped: {state.engine.failure}", file=sys.stderr, flush=True)
        return ENGINE_FAILED
    print("stopped: every request in flight finished", file=sys.stderr, flush=True)
    return 0
