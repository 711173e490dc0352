"""The HTTP side (FastAPI on uvicorn): routes, request bodies to engine jobs, jobs back to responses.

The handlers run on the event loop and never touch a model: they check the body (`schemas`), make the prompt
(`prompts`, in a worker thread), submit a `Job` to the engine and wait on its events. `POST /v1/completions`
and `/v1/chat/completions` answer with one JSON body or, with `stream`, server-sent events ending in
`data: [DONE]` (usage in a last chunk with `stream_options.include_usage`). A client that disconnects cancels
its job: a stream when its writer is cancelled, a plain request when the handler sees the disconnect
(polled every `POLL_S`). `GET /v1/models`, `/health`, `/metrics`. Every error is in the OpenAI shape.
"""

import asyncio
import contextlib
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from assisted_backends.serve.engine import Engine, Job
from assisted_backends.serve.errors import APIError
from assisted_backends.serve.metrics import Metrics
from assisted_backends.serve.prompts import PromptMaker
from assisted_backends.serve.schemas import GenerationRequest, chat_request, completion_request, parse_body
from assisted_backends.serve.text import TextTracker

POLL_S = 0.25


@dataclass
class ServerState:
    """What the routes share: the engine, the prompt maker, the model's id, EOS ids, metrics, the body limit."""

    engine: Engine
    prompts: PromptMaker
    model_name: str
    eos_ids: frozenset[int]
    metrics: Metrics
    max_body_bytes: int
    created: int = 0
    server: Any = None  # the uvicorn server, once it runs (its should_exit: draining)

    @property
    def draining(self) -> bool:
        return bool(self.server is not None and self.server.should_exit)


class JobEvents:
    """A job's events, from the engine thread into this event loop; `next()` gives the newest state."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop, self.queue = loop, asyncio.Queue()

    def deliver(self, kind: str, payload: Any) -> None:  # the engine thread
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (kind, payload))

    async def next(self) -> tuple[str, Any]:
        """The next event, skipping progress events that a later one replaces."""
        kind, payload = await self.queue.get()
        while kind == "progress" and not self.queue.empty():
            kind, payload = self.queue.get_nowait()
        return kind, payload


def build_app(state: ServerState):
    """The FastAPI application for `state`."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from starlette.exceptions import HTTPException

    app = FastAPI(title="assisted-serve", docs_url=None, redoc_url=None, openapi_url=None)
    # (no `from __future__ import annotations` in this module: FastAPI reads the `Request` annotations below as
    # objects, and names imported inside this function would not resolve from strings)

    def error_response(error: APIError, endpoint: str) -> JSONResponse:
        state.metrics.requests.labels(endpoint, str(error.status)).inc()
        return JSONResponse(error.body(), status_code=error.status, headers=error.headers)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, error: APIError):
        return error_response(error, request.url.path)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, error: HTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code)
        message = f"{request.method} {request.url.path}: {error.detail}"
        return error_response(APIError(error.status_code, message, None, code), "other")

    @app.get("/health")
    async def health():
        body = {"status": "draining" if state.draining else "ok", "slots": state.engine.slots,
                "busy": state.engine.busy(), "waiting": state.engine.depth()}  # fmt: skip
        return JSONResponse(body, status_code=503 if state.draining else 200)

    @app.get("/metrics")
    async def metrics():
        content, media_type = state.metrics.render()
        return Response(content, media_type=media_type)

    @app.get("/v1/models")
    async def models():
        card = {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "assisted_backends",
                "max_model_len": state.prompts.context}  # fmt: skip
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await serve(request, completion_request, "/v1/completions")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await serve(request, chat_request, "/v1/chat/completions")

    async def serve(request: Request, parse, endpoint: str):
        body = parse_body(await read_body(request, state.max_body_bytes))
        generation: GenerationRequest = parse(body)
        if generation.model != state.model_name:
            raise APIError(404, f"model: {generation.model!r} is not served here; this server serves "
                           f"{state.model_name!r} (GET /v1/models)", "model", "model_not_found")  # fmt: skip
        if state.draining:
            raise APIError(503, "the server is shutting down and takes no new requests", None, "shutting_down",
                           "server_error")  # fmt: skip
        prompt = await asyncio.to_thread(state.prompts.token_ids, generation)
        limit = state.prompts.limit(generation, len(prompt))
        events = JobEvents(asyncio.get_running_loop())
        job = Job(prompt, limit, generation.temperature, generation.top_p, generation.seed, events.deliver)
        state.engine.submit(job)
        tracker = TextTracker(state.prompts.tokenizer, generation.stop, state.eos_ids, limit)
        reply = Reply(generation, state.model_name, len(prompt))
        if generation.stream:
            state.metrics.requests.labels(endpoint, "200").inc()
            return StreamingResponse(stream(job, events, tracker, reply), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})  # fmt: skip
        try:
            checked = time.monotonic()
            while not tracker.finished:
                try:
                    kind, payload = await asyncio.wait_for(events.next(), POLL_S)
                except asyncio.TimeoutError:
                    kind = None
                if time.monotonic() - checked >= POLL_S:  # events may never pause: look at the clock
                    checked = time.monotonic()
                    if await request.is_disconnected():
                        state.engine.cancel(job)
                        return Response(status_code=499)
                if kind is None:
                    continue
                if kind == "error":
                    raise APIError(500, payload, None, "engine_error", "server_error")
                tracker.update(payload, final=kind == "finish")
        finally:
            if not job.done:
                state.engine.cancel(job)
        state.metrics.requests.labels(endpoint, "200").inc()
        return reply.whole(tracker)

    async def stream(job: Job, events: JobEvents, tracker: TextTracker, reply: Reply):
        try:
            if reply.request.chat:
                yield reply.sse(reply.chunk({"role": "assistant", "content": ""}, None))
            while not tracker.finished:
                kind, payload = await events.next()
                if kind == "error":
                    yield reply.sse(APIError(500, payload, None, "engine_error", "server_error").body())
                    break
                delta = tracker.update(payload, final=kind == "finish")
                if delta:
                    yield reply.sse(reply.chunk(reply.content(delta), None))
            if tracker.finished:
                yield reply.sse(reply.chunk({} if reply.request.chat else "", tracker.finish_reason))
                if reply.request.include_usage:
                    yield reply.sse({**reply.head("chunk"), "choices": [], "usage": reply.usage(tracker)})
            yield "data: [DONE]\n\n"
        finally:
            if not job.done:
                state.engine.cancel(job)

    return app


async def read_body(request, limit: int) -> bytes:
    """The request body, refused with 413 past `limit` bytes (read no further)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(int(declared), limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(size, limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(size: int, limit: int) -> APIError:
    return APIError(413, f"the request body is {size} bytes or more, over this server's limit of {limit} bytes "
                    "(--max-body-mb); send a shorter prompt", None, "request_too_large")  # fmt: skip


class Reply:
    """The response bodies of one request, chat or text completion, whole or in chunks."""

    def __init__(self, request: GenerationRequest, model: str, prompt_tokens: int) -> None:
        self.request, self.model, self.prompt_tokens = request, model, prompt_tokens
        self.id = f"{'chatcmpl' if request.chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def head(self, kind: str) -> dict:
        chat = self.request.chat
        name = {"whole": "chat.completion" if chat else "text_completion",
                "chunk": "chat.completion.chunk" if chat else "text_completion"}[kind]  # fmt: skip
        return {"id": self.id, "object": name, "created": self.created, "model": self.model,
                "system_fingerprint": None}  # fmt: skip

    def usage(self, tracker: TextTracker) -> dict:
        completion = tracker.completion_tokens
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion,
                "total_tokens": self.prompt_tokens + completion}  # fmt: skip

    def content(self, text: str):
        return {"content": text} if self.request.chat else text

    def chunk(self, delta, finish_reason: str | None) -> dict:
        if self.request.chat:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": finish_reason}
        return {**self.head("chunk"), "choices": [choice]}

    def whole(self, tracker: TextTracker) -> dict:
        if self.request.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": tracker.sent}, "logprobs": None,
                      "finish_reason": tracker.finish_reason}  # fmt: skip
        else:
            choice = {"index": 0, "text": tracker.sent, "logprobs": None, "finish_reason": tracker.finish_reason}
        return {**self.head("whole"), "choices": [choice], "usage": self.usage(tracker)}

    @staticmethod
    def sse(payload: dict) -> str:
        return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"
