"""The OpenAI request bodies, checked field by field: `/v1/completions` and `/v1/chat/completions`.

A body is a JSON object; each field has its type and range, and a refusal names the field (`errors.invalid`).
Fields that would change the text in a way this server does not honour exactly are refused by name
(`errors.unsupported`): `n` > 1, non-zero `frequency_penalty` / `presence_penalty` (OpenAI's additive penalties
have no exact counterpart among transformers' processors), `logprobs`, `logit_bias`, `tools`, `response_format`
other than text, `echo`, `best_of` > 1, `suffix`. Fields without effect on the tokens (`user`, `metadata`,
`store`, `service_tier`) are accepted and ignored; any other field is refused as unknown.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from assisted_backends.serve.errors import APIError, invalid, unsupported

IGNORED = frozenset({"user", "metadata", "store", "service_tier", "parallel_tool_calls"})
COMMON = frozenset({
    "model", "max_tokens", "temperature", "top_p", "seed", "stop", "stream", "stream_options", "n",
    "frequency_penalty", "presence_penalty", "logprobs", "logit_bias",
})  # fmt: skip
TEXT_FIELDS = COMMON | {"prompt", "echo", "best_of", "suffix"}
CHAT_FIELDS = COMMON | {"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice", "response_format"}
ROLES = ("system", "developer", "user", "assistant")
MAX_STOPS = 16
MAX_TEMPERATURE = 2.0


@dataclass(frozen=True)
class GenerationRequest:
    """What a body asks for, checked: the prompt (`text`, or `token_ids`, or chat `messages`), the limit (None: up
    to the context), sampling (temperature 0: greedy), `seed`, `stop` strings, streaming and usage in the stream."""

    chat: bool
    model: str
    text: str | None = None
    token_ids: tuple[int, ...] | None = None
    messages: tuple[dict, ...] | None = None
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def parse_body(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, or a 400 saying why not."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise APIError(400, f"the request body is not valid JSON ({error}); send a JSON object", None,
                       "invalid_json") from None  # fmt: skip
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, got {_kind(body)}", None, "invalid_json")
    return body


def _kind(value: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
             dict: "an object", type(None): "null"}  # fmt: skip
    return names.get(type(value), type(value).__name__)


def _integer(body: dict, name: str, minimum: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(name, f"expected an integer, got {_kind(value)}", "invalid_type")
    if minimum is not None and value < minimum:
        raise invalid(name, f"must be >= {minimum}, got {value}")
    return value


def _number(body: dict, name: str, low: float, high: float, default: float, open_low: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise invalid(name, f"expected a number, got {_kind(value)}", "invalid_type")
    if value > high or value < low or (open_low and value == low):
        interval = f"({low}, {high}]" if open_low else f"[{low}, {high}]"
        raise invalid(name, f"must be in {interval}, got {value}")
    return float(value)


def _boolean(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise invalid(name, f"expected a boolean, got {_kind(value)}", "invalid_type")
    return value


def _stops(body: dict) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise invalid("stop", f"expected a string or an array of strings, got {_kind(value)}", "invalid_type")
    if len(stops) > MAX_STOPS:
        raise invalid("stop", f"at most {MAX_STOPS} stop strings, got {len(stops)}")
    if any(not s for s in stops):
        raise invalid("stop", "stop strings must not be empty")
    return tuple(stops)


def _refuse_unsupported(body: dict, known: frozenset[str]) -> None:
    for name in body:
        if name not in known and name not in IGNORED:
            raise APIError(400, f"unrecognized request argument supplied: {name}; remove it", name, "unknown_parameter")
    n = _integer(body, "n", minimum=1)
    if n not in (None, 1):
        raise unsupported("n", f"one choice per request (n = 1), got {n}; send {n} requests instead")
    for name in ("frequency_penalty", "presence_penalty"):
        value = _number(body, name, -2.0, 2.0, 0.0)
        if value != 0.0:
            raise unsupported(name, "OpenAI's additive penalty has no exact counterpart here; send 0 or omit it")
    if body.get("logprobs") not in (None, False, 0):
        raise unsupported("logprobs", "log probabilities are not returned; omit it")
    if body.get("top_logprobs") not in (None, 0):
        raise unsupported("top_logprobs", "log probabilities are not returned; omit it")
    if body.get("logit_bias") not in (None, {}):
        raise unsupported("logit_bias", "biased logits are not served; omit it")
    if body.get("tools") not in (None, []) or body.get("tool_choice") not in (None, "none", "auto"):
        raise unsupported("tools", "tool calls are not parsed by this server; describe the tools in the messages")
    response_format = body.get("response_format")
    if response_format not in (None, {"type": "text"}):
        raise unsupported("response_format", "only plain text ({'type': 'text'}) is served")
    if body.get("echo") not in (None, False):
        raise unsupported("echo", "the prompt is not echoed back; omit it")
    if body.get("best_of") not in (None, 1):
        raise unsupported("best_of", "one candidate per request (best_of = 1)")
    if body.get("suffix") not in (None, ""):
        raise unsupported("suffix", "insertion (fill-in-the-middle) is not served")


def _model(body: dict) -> str:
    model = body.get("model")
    if model is None:
        raise invalid(
            "model", "required: the served model's id (GET /v1/models lists it)", "missing_required_parameter"
        )
    if not isinstance(model, str):
        raise invalid("model", f"expected a string, got {_kind(model)}", "invalid_type")
    return model


def _stream_options(body: dict, stream: bool) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise invalid("stream_options", "only allowed when stream is true")
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise invalid("stream_options", "expected an object with include_usage (a boolean)", "invalid_type")
    return _boolean(options, "include_usage")


def _shared(body: dict, chat: bool) -> dict[str, Any]:
    stream = _boolean(body, "stream")
    limit = _integer(body, "max_tokens", minimum=1)
    if chat:
        completion = _integer(body, "max_completion_tokens", minimum=1)
        if limit is not None and completion is not None and limit != completion:
            raise invalid("max_completion_tokens", f"differs from max_tokens ({completion} != {limit}); send one")
        limit = completion if completion is not None else limit
    return dict(
        model=_model(body),
        max_tokens=limit,
        temperature=_number(body, "temperature", 0.0, MAX_TEMPERATURE, 1.0),
        top_p=_number(body, "top_p", 0.0, 1.0, 1.0, open_low=True),
        seed=_integer(body, "seed"),
        stop=_stops(body),
        stream=stream,
        include_usage=_stream_options(body, stream),
    )


def _prompt(value: Any) -> tuple[str | None, tuple[int, ...] | None]:
    """(text, token ids): a string, an array of token ids, or a one-element array of either."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]
    if isinstance(value, str):
        if not value:
            raise invalid("prompt", "is empty: send some text")
        return value, None
    if isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        if any(t < 0 for t in value):
            raise invalid("prompt", "token ids must be >= 0")
        return None, tuple(value)
    if isinstance(value, list) and len(value) > 1 and all(isinstance(v, (str, list)) for v in value):
        raise unsupported("prompt", f"one prompt per request, got {len(value)}; send one request per prompt")
    raise invalid("prompt", f"expected a string or an array of token ids, got {_kind(value)}", "invalid_type")


def _content(message: dict, index: int) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise unsupported(f"messages[{index}].content", "only text parts ({'type': 'text', 'text': ...})")
            parts.append(part["text"])
        return "".join(parts)
    raise invalid(f"messages[{index}].content", f"expected a string or an array of text parts, got {_kind(content)}",
                  "invalid_type")  # fmt: skip


def _messages(value: Any) -> tuple[dict, ...]:
    if value is None:
        raise invalid("messages", "required: an array of {role, content} objects", "missing_required_parameter")
    if not isinstance(value, list) or not value:
        raise invalid("messages", f"expected a non-empty array of messages, got {_kind(value)}", "invalid_type")
    messages = []
    for index, message in enumerate(value):
        if not isinstance(message, dict):
            raise invalid(f"messages[{index}]", f"expected an object, got {_kind(message)}", "invalid_type")
        role = message.get("role")
        if role not in ROLES:
            raise invalid(f"messages[{index}].role", f"must be one of {', '.join(ROLES)}, got {role!r}")
        if set(message) - {"role", "content", "name"}:
            extra = sorted(set(message) - {"role", "content", "name"})[0]
            raise unsupported(f"messages[{index}].{extra}", "only role, content and name are served")
        messages.append({"role": "system" if role == "developer" else role, "content": _content(message, index)})
    return tuple(messages)


def completion_request(body: dict[str, Any]) -> GenerationRequest:
    """A `/v1/completions` body, checked."""
    _refuse_unsupported(body, TEXT_FIELDS)
    if "prompt" not in body:
        raise invalid("prompt", "required: the text to continue", "missing_required_parameter")
    text, ids = _prompt(body["prompt"])
    return GenerationRequest(chat=False, text=text, token_ids=ids, **_shared(body, chat=False))


def chat_request(body: dict[str, Any]) -> GenerationRequest:
    """A `/v1/chat/completions` body, checked."""
    _refuse_unsupported(body, CHAT_FIELDS)
    return GenerationRequest(chat=True, messages=_messages(body.get("messages")), **_shared(body, chat=True))
