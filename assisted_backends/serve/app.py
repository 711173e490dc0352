"""The HTTP side (FastAPI on uvicorn): routes, request bodies to engine jobs, jobs back to responses.

The handlers run on the event loop and never touch a model: they check the key (`security`), the content type and
the body (`schemas`), hold a place in the waiting queue (429 when full, before any tokenization), make the prompt
(`prompts`, on the tokenizing thread), submit a `Job` to the engine and wait on its state (`events`).
`POST /v1/completions` and `/v1/chat/completions` answer with one JSON body or, with `stream`, server-sent
events ending in `data: [DONE]` (usage in a last chunk with `stream_options.include_usage`); a request of `n`
choices is n jobs (`choices`), its chunks carrying each choice's `index`. `POST /tokenize` and `/detokenize`
(`tokenize`) use the tokenizing thread and the event loop's tokenizer copy. A client that
disconnects cancels its job: a stream when its writer is cancelled or a send misses its deadline (`limits`), a
plain request when the handler sees the disconnect (polled every `POLL_S`). `GET /v1/models`, `/health` (503
while draining or once the engine failed), `/metrics`. Every error is in the OpenAI shape.
"""

import asyncio
import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from assisted_backends.serve.choices import Choice, Choices, choice_seed
from assisted_backends.serve.engine import Engine, Job
from assisted_backends.serve.errors import APIError, engine_error, invalid
from assisted_backends.serve.events import JobEvents
from assisted_backends.serve.limits import Limits, deadline_stream, read_body
from assisted_backends.serve.metrics import Metrics
from assisted_backends.serve.prompts import PromptMaker
from assisted_backends.serve.schemas import GenerationRequest, chat_request, completion_request, parse_body, shown
from assisted_backends.serve.security import Keys, require_json, secure
from assisted_backends.serve.text import TextTracker
from assisted_backends.serve.tokenize import detokenize_request, tokenize_request
from assisted_backends.serve.tool_calls import CallStream, assistant_message
from assisted_backends.structured.response_format import ResponseFormatError, SchemaProcessors

POLL_S = 0.25
ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics", "/tokenize", "/detokenize")


@dataclass
class ServerState:
    """What the routes share: the engine, the prompt maker, the model's id, EOS ids, metrics, the limits on
    clients, the API keys (None: open) and the origins browsers may call from."""

    engine: Engine
    prompts: PromptMaker
    model_name: str
    eos_ids: frozenset[int]
    metrics: Metrics
    limits: Limits = field(default_factory=Limits)
    created: int = 0
    keys: Keys | None = None
    cors_origins: tuple[str, ...] = ()
    server: Any = None  # the uvicorn server, once it runs (its should_exit: draining)
    tokenizing: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="assisted-tokenize")
    )  # one thread makes every prompt: its tokenizer copy is its own (`prompts.PerThread`)

    @property
    def draining(self) -> bool:
        return bool(self.server is not None and self.server.should_exit)


def build_app(state: ServerState):
    """The FastAPI application for `state`."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response
    from starlette.exceptions import HTTPException

    app = FastAPI(title="assisted-serve", docs_url=None, redoc_url=None, openapi_url=None)
    # (no `from __future__ import annotations` in this module: FastAPI reads the `Request` annotations below as
    # objects, and names imported inside this function would not resolve from strings)

    def error_response(error: APIError, endpoint: str) -> JSONResponse:
        state.metrics.requests.labels(endpoint if endpoint in ROUTES else "other", str(error.status)).inc()
        return JSONResponse(error.body(), status_code=error.status, headers=error.headers)

    secure(app, state.keys, list(state.cors_origins), error_response)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, error: APIError):
        return error_response(error, request.url.path)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, error: HTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code)
        message = f"{request.method} {shown(request.url.path)}: {error.detail}"
        return error_response(APIError(error.status_code, message, None, code), "other")

    @app.get("/health")
    async def health():
        engine = state.engine
        status = "failed" if engine.failure is not None else "draining" if state.draining else "ok"
        body = {"status": status, "slots": engine.slots, "busy": engine.busy(), "waiting": engine.depth()}
        if engine.failure is not None:
            body["error"] = engine.failure
        return JSONResponse(body, status_code=200 if status == "ok" else 503)

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

    @app.post("/tokenize")
    async def tokenize(request: Request):
        require_json(request.headers.get("content-type"))
        asked = tokenize_request(parse_body(await read_body(request, state.limits)), state.model_name)
        loop = asyncio.get_running_loop()
        tokens = await loop.run_in_executor(state.tokenizing, state.prompts.tokenize, asked.text, asked.add_special)
        state.metrics.requests.labels("/tokenize", "200").inc()
        return {"tokens": tokens, "count": len(tokens), "max_model_len": state.prompts.context}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        require_json(request.headers.get("content-type"))
        body = parse_body(await read_body(request, state.limits))
        tokens = detokenize_request(body, state.model_name, state.prompts.vocab_size)
        text = state.prompts.tokenizers.get().decode(tokens)
        state.metrics.requests.labels("/detokenize", "200").inc()
        return {"content": text, "prompt": text}

    async def serve(request: Request, parse, endpoint: str):
        require_json(request.headers.get("content-type"))
        body = parse_body(await read_body(request, state.limits))
        generation: GenerationRequest = parse(body)
        if generation.model != state.model_name:
            raise APIError(404, f"model: {shown(generation.model)!r} is not served here; this server serves "
                           f"{state.model_name!r} (GET /v1/models)", "model", "model_not_found")  # fmt: skip
        if state.draining:
            raise APIError(503, "the server is shutting down and takes no new requests", None, "shutting_down",
                           "server_error")  # fmt: skip
        if generation.n > state.engine.max_waiting:
            raise invalid("n", f"at most {state.engine.max_waiting} choices (this server's --max-waiting), got "
                          f"{generation.n}")  # fmt: skip
        choices, reply = await admit(request, generation)
        if generation.stream:
            state.metrics.requests.labels(endpoint, "200").inc()
            return deadline_stream(stream(choices, reply), state.limits.send_timeout_s,
                                   media_type="text/event-stream",
                                   headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})  # fmt: skip
        try:
            checked = time.monotonic()
            while not choices.finished:
                try:
                    news = await asyncio.wait_for(choices.wait(), POLL_S)
                except asyncio.TimeoutError:
                    news = []
                if time.monotonic() - checked >= POLL_S:  # events may never pause: look at the clock
                    checked = time.monotonic()
                    if await request.is_disconnected():
                        return Response(status_code=499)
                for choice, update in news:
                    if update.error is not None:
                        raise engine_error(update.error)
                    advance(choice, update)
        finally:
            cancel_unfinished(choices)
        state.metrics.requests.labels(endpoint, "200").inc()
        return reply.whole(choices)

    def advance(choice: Choice, update) -> str:
        """The text `update` adds to `choice`; a choice that ended by a stop string has its row ended."""
        delta = choice.tracker.update(update.new, update.count, update.final)
        if choice.tracker.finished and not choice.job.done:
            state.engine.cancel(choice.job)
        return delta

    schemas = SchemaProcessors(state.prompts.tokenizers.get, state.eos_ids, state.prompts.vocab_size)

    def response_format(schema: str, param: str | None = None):
        """The processor of a request's response_format schema, or of a forced tool call's (`param`: "tools"); a
        400 naming the part that cannot be served."""
        try:
            return schemas.get(schema)
        except ResponseFormatError as error:
            raise invalid(param or error.field, str(error)) from None

    def cancel_unfinished(choices: Choices) -> None:
        for job in choices.jobs:
            if not job.done:
                state.engine.cancel(job)

    async def admit(request: Request, generation: GenerationRequest) -> tuple[Choices, Reply]:
        """Places in the waiting queue (429 when full, before any tokenization), the prompt, one job per choice
        submitted."""
        engine, count = state.engine, generation.n
        engine.reserve(count)
        choices = Choices(asyncio.Event())
        try:
            loop = asyncio.get_running_loop()
            prompt = await loop.run_in_executor(state.tokenizing, state.prompts.token_ids, generation)
            limit = state.prompts.limit(generation, len(prompt))
            tenant = getattr(request.state, "tenant", None) if engine.isolated else None
            penalties = (generation.presence_penalty, generation.frequency_penalty, generation.repetition_penalty)
            grammar = None
            if generation.json_schema is not None:  # compiled where prompts are made: its tokenizer copy
                grammar = await loop.run_in_executor(state.tokenizing, response_format, generation.json_schema)
            elif generation.tools is not None and generation.tools.constrained:  # tool_choice required or named
                schema = generation.tools.call_schema()
                grammar = await loop.run_in_executor(state.tokenizing, response_format, schema, "tools")
            while len(choices.items) < count:
                index = len(choices.items)
                events = JobEvents(loop, choices.changed)
                job = Job(prompt, limit, generation.temperature, generation.top_p,
                          choice_seed(generation.seed, index), events.deliver, tenant, generation.top_k,
                          generation.min_p, penalties, grammar, logprobs=generation.logprobs)  # fmt: skip
                tracker = TextTracker(state.prompts.tokenizers.get(), generation.stop, state.eos_ids, limit)
                choices.items.append(Choice(index, job, events, tracker))
                engine.submit(job)
        except BaseException:
            engine.release(count - len(choices.items))
            cancel_unfinished(choices)
            raise
        return choices, Reply(generation, state.model_name, len(prompt), choices)

    async def stream(choices: Choices, reply: Reply):
        try:
            if reply.request.chat:
                for choice in choices.items:
                    yield reply.sse(reply.chunk(choice.index, {"role": "assistant", "content": ""}, None))
            failed = False
            while not choices.finished and not failed:
                for choice, update in await choices.wait():
                    if update.error is not None:
                        yield reply.sse(engine_error(update.error).body())
                        failed = True
                        break
                    for delta in reply.deltas(choice, advance(choice, update)):
                        yield reply.sse(reply.chunk(choice.index, delta, None))
                    if choice.tracker.finished:
                        end = {} if reply.request.chat else ""
                        yield reply.sse(reply.chunk(choice.index, end, reply.finish_reason(choice)))
            if not failed and reply.request.include_usage:
                yield reply.sse({**reply.head("chunk"), "choices": [], "usage": reply.usage(choices)})
            yield "data: [DONE]\n\n"
        finally:
            cancel_unfinished(choices)

    return app


class Reply:
    """The response bodies of one request, chat or text completion, whole or in chunks, of its choices."""

    def __init__(self, request: GenerationRequest, model: str, prompt_tokens: int, choices: Choices) -> None:
        self.request, self.model, self.prompt_tokens = request, model, prompt_tokens
        self.choices = choices  # each chunk carries its choice's new log-probabilities (`Choice.logprobs`)
        self.id = f"{'chatcmpl' if request.chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.calls: dict[int, CallStream] = {}  # per streamed choice, with tools: content split from calls

    def head(self, kind: str) -> dict:
        chat = self.request.chat
        name = {"whole": "chat.completion" if chat else "text_completion",
                "chunk": "chat.completion.chunk" if chat else "text_completion"}[kind]  # fmt: skip
        return {"id": self.id, "object": name, "created": self.created, "model": self.model,
                "system_fingerprint": None}  # fmt: skip

    def usage(self, choices: Choices) -> dict:
        """The prompt counted once, the completion tokens of every choice."""
        completion = choices.completion_tokens
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion,
                "total_tokens": self.prompt_tokens + completion}  # fmt: skip

    def content(self, text: str):
        return {"content": text} if self.request.chat else text

    def deltas(self, choice: Choice, text: str) -> list:
        """The stream's deltas for `text`, new in `choice` (with tools: content, then the calls once finished)."""
        if self.request.tools is None:
            return [self.content(text)] if text else []
        calls = self.calls.setdefault(choice.index, CallStream())
        return calls.deltas(text, choice.tracker.finished)

    def finish_reason(self, choice: Choice) -> str | None:
        called = choice.index in self.calls and self.calls[choice.index].called
        return "tool_calls" if called else choice.tracker.finish_reason

    def chunk(self, index: int, delta, finish_reason: str | None) -> dict:
        if self.request.chat:
            choice = {"index": index, "delta": delta, "logprobs": self._logprobs(index), "finish_reason": finish_reason}
        else:
            choice = {"index": index, "text": delta, "logprobs": self._logprobs(index), "finish_reason": finish_reason}
        return {**self.head("chunk"), "choices": [choice]}

    def whole(self, choices: Choices) -> dict:
        return {**self.head("whole"), "choices": [self._choice(choice) for choice in choices.items],
                "usage": self.usage(choices)}  # fmt: skip

    def _choice(self, choice: Choice) -> dict:
        tracker = choice.tracker
        if self.request.chat:
            plain = {"role": "assistant", "content": tracker.sent}
            message = assistant_message(tracker.sent) if self.request.tools is not None else plain
            return {"index": choice.index, "message": message, "logprobs": choice.logprobs(True),
                    "finish_reason": "tool_calls" if "tool_calls" in message else tracker.finish_reason}  # fmt: skip
        return {"index": choice.index, "text": tracker.sent, "logprobs": choice.logprobs(False),
                "finish_reason": tracker.finish_reason}  # fmt: skip

    def _logprobs(self, index: int) -> dict | None:
        """Choice `index`'s log-probabilities of the tokens shown since its last chunk (None: not asked)."""
        return self.choices.items[index].logprobs(self.request.chat)

    @staticmethod
    def sse(payload: dict) -> str:
        return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"
