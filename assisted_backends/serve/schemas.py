"""The OpenAI request bodies, checked field by field: `/v1/completions` and `/v1/chat/completions`.

A body is a JSON object; each field has its type and range, and a refusal names the field (`errors.invalid`).
Served besides OpenAI's sampling fields: `n` choices, `presence_penalty` / `frequency_penalty` (OpenAI's, exact:
`options.penalties`), and the vendor extras llama-server and vLLM take, `top_k`, `min_p`, `repetition_penalty`.
Fields that would change the text in a way this server does not honour exactly are refused by name, all of them
in one 400 (`errors.unsupported_fields`): `logit_bias`, `echo`, `best_of` > 1, `suffix`. `logprobs` (chat's with
`top_logprobs`) is served from the scores each token was chosen from (`serve.choices`). Chat's `response_format`
(text, json_object, json_schema) is served through `structured` (exact with
speculation); chat's `tools`, `tool_choice`, `parallel_tool_calls` and tool turns through `tools`. Fields without
effect on the tokens (`user`, `metadata`, `store`, `service_tier`) are accepted and ignored (`parallel_tool_calls`
too, by completions); any other field is refused as unknown.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from json.decoder import WHITESPACE, scanstring
from typing import Any

from assisted_backends.options.fields import MAX_TOP_LOGPROBS
from assisted_backends.serve.errors import APIError, invalid, unsupported, unsupported_fields
from assisted_backends.serve.tools import ToolRequest, tool_request, tool_turn

IGNORED = frozenset({"user", "metadata", "store", "service_tier", "parallel_tool_calls"})
COMMON = frozenset({
    "model", "max_tokens", "temperature", "top_p", "seed", "stop", "stream", "stream_options", "n",
    "frequency_penalty", "presence_penalty", "logprobs", "logit_bias", "top_k", "min_p", "repetition_penalty",
})  # fmt: skip
TEXT_FIELDS = COMMON | {"prompt", "echo", "best_of", "suffix"}
CHAT_FIELDS = COMMON | {"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice", "response_format"}
ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_STOPS = 16
MAX_STOP_CHARS = 1024
MAX_TEMPERATURE = 2.0
MAX_DIGITS = 20  # an integer of more digits is no count, token id or seed
SEED_RANGE = (-(1 << 63), (1 << 64) - 1)  # the seeds torch takes
SHOWN_CHARS = 60  # of a client's value quoted in a message
MAX_CHOICES = 16  # n
MAX_REPETITION_PENALTY = 10.0
MAX_COMPLETION_LOGPROBS = 5  # completions' `logprobs` (chat's `top_logprobs`: `MAX_TOP_LOGPROBS`)


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
    n: int = 1
    top_k: int = 0  # 0: every token (vLLM's -1 too)
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    json_schema: str | None = None  # response_format's JSON Schema text (`structured.response_format`); None: text
    logprobs: int | None = None  # top tokens sent with each token's log-probability (`_logprobs`); None: none
    tools: ToolRequest | None = None  # the functions the answer may call (`tools`); None: no call parsed

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def parse_body(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, or a 400 saying why not (naming the top-level field that cannot be read)."""
    try:
        text = raw.decode(json.detect_encoding(raw))
        body = _DECODER.decode(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise APIError(400, f"the request body is not valid JSON ({error}); send a JSON object", None,
                       "invalid_json") from None  # fmt: skip
    except RecursionError:
        field = _unreadable_field(text)
        if field is None:
            raise APIError(400, f"the request body nests arrays or objects deeper than {sys.getrecursionlimit()} "
                           "levels; send a JSON object of flat fields", None, "invalid_json") from None  # fmt: skip
        raise invalid(shown(field), "nests arrays or objects too deeply; send a flat value") from None
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, got {kind_of(body)}", None, "invalid_json")
    return body


class LongInteger:
    """A JSON integer of more than `MAX_DIGITS` digits, kept as its length: no field takes one, and converting it
    would cost time quadratic in its digits (Python refuses past 4,300 of them)."""

    def __init__(self, digits: int) -> None:
        self.digits = digits


def _integer_literal(text: str) -> int | LongInteger:
    return int(text) if len(text.lstrip("-")) <= MAX_DIGITS else LongInteger(len(text.lstrip("-")))


_DECODER = json.JSONDecoder(parse_int=_integer_literal)


def _unreadable_field(text: str) -> str | None:
    """The top-level key whose value the decoder cannot read (nested too deeply), or None."""
    index = _space(text, 0)
    if text[index : index + 1] != "{":
        return None
    index += 1
    while True:
        index = _space(text, index)
        if text[index : index + 1] != '"':
            return None
        key, index = scanstring(text, index + 1)
        index = _space(text, index)
        if text[index : index + 1] != ":":
            return None
        try:
            _, index = _DECODER.raw_decode(text, _space(text, index + 1))
        except (RecursionError, ValueError):
            return key
        index = _space(text, index)
        if text[index : index + 1] != ",":
            return None
        index += 1


def _space(text: str, index: int) -> int:
    return WHITESPACE.match(text, index).end()


def shown(value: Any) -> str:
    """`value` for a message: its repr, cut to `SHOWN_CHARS` characters."""
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}... ({len(text)} characters)"


def kind_of(value: Any) -> str:
    if isinstance(value, LongInteger):
        return f"an integer of {value.digits} digits (at most {MAX_DIGITS} are read)"
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
             dict: "an object", type(None): "null"}  # fmt: skip
    return names.get(type(value), type(value).__name__)


def _integer(body: dict, name: str, minimum: int | None = None, maximum: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(name, f"expected an integer, got {kind_of(value)}", "invalid_type")
    if minimum is not None and value < minimum:
        raise invalid(name, f"must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise invalid(name, f"must be <= {maximum}, got {value}")
    return value


def _number(body: dict, name: str, low: float, high: float, default: float, open_low: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise invalid(name, f"expected a number, got {kind_of(value)}", "invalid_type")
    if value > high or value < low or (open_low and value == low):
        interval = f"({low}, {high}]" if open_low else f"[{low}, {high}]"
        raise invalid(name, f"must be in {interval}, got {value}")
    return float(value)


def boolean_field(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise invalid(name, f"expected a boolean, got {kind_of(value)}", "invalid_type")
    return value


def _stops(body: dict) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise invalid("stop", f"expected a string or an array of strings, got {kind_of(value)}", "invalid_type")
    if len(stops) > MAX_STOPS:
        raise invalid("stop", f"at most {MAX_STOPS} stop strings, got {len(stops)}")
    if any(not s for s in stops):
        raise invalid("stop", "stop strings must not be empty")
    if max(len(s) for s in stops) > MAX_STOP_CHARS:
        raise invalid("stop", f"stop strings of at most {MAX_STOP_CHARS} characters, got one of "
                      f"{max(len(s) for s in stops)}")  # fmt: skip
    return tuple(stops)


def _refuse_unsupported(body: dict, known: frozenset[str]) -> None:
    for name in body:
        if name not in known and name not in IGNORED:
            field = shown(name)
            raise APIError(400, f"unrecognized request argument supplied: {field}; remove it", field,
                           "unknown_parameter")  # fmt: skip
    refused = [(name, why) for name, why in _unsupported(body) if why]
    if refused:
        raise unsupported_fields(refused)


def _unsupported(body: dict) -> list[tuple[str, str | bool]]:
    """(field, why it is refused, or False when its value is served) for each field served only in part."""
    return [
        ("logit_bias", body.get("logit_bias") not in (None, {}) and "biased logits are not served; omit it"),
        ("echo", body.get("echo") not in (None, False) and "the prompt is not echoed back; omit it"),
        ("best_of", body.get("best_of") not in (None, 1) and "one candidate per request (best_of = 1); use n"),
        ("suffix", body.get("suffix") not in (None, "") and "insertion (fill-in-the-middle) is not served"),
    ]  # fmt: skip


def _logprobs(body: dict, chat: bool) -> int | None:
    """The top tokens wanted with each token's log-probability, None for none: chat's `logprobs` (a boolean) with
    `top_logprobs` (0 to 20), completions' `logprobs` (0 to 5, OpenAI's bounds)."""
    if not chat:
        return _integer(body, "logprobs", 0, MAX_COMPLETION_LOGPROBS)
    top = _integer(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if not boolean_field(body, "logprobs"):
        if top is not None:
            raise invalid("top_logprobs", "needs logprobs: true")
        return None
    return top or 0


def _model(body: dict) -> str:
    model = body.get("model")
    if model is None:
        raise invalid(
            "model", "required: the served model's id (GET /v1/models lists it)", "missing_required_parameter"
        )
    if not isinstance(model, str):
        raise invalid("model", f"expected a string, got {kind_of(model)}", "invalid_type")
    return model


def _stream_options(body: dict, stream: bool) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise invalid("stream_options", "only allowed when stream is true")
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise invalid("stream_options", "expected an object with include_usage (a boolean)", "invalid_type")
    return boolean_field(options, "include_usage")


def _shared(body: dict, chat: bool) -> dict[str, Any]:
    stream = boolean_field(body, "stream")
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
        seed=_integer(body, "seed", *SEED_RANGE),
        stop=_stops(body),
        stream=stream,
        include_usage=_stream_options(body, stream),
        n=_integer(body, "n", 1, MAX_CHOICES) or 1,
        top_k=max(_integer(body, "top_k", minimum=-1) or 0, 0),
        min_p=_number(body, "min_p", 0.0, 1.0, 0.0),
        presence_penalty=_number(body, "presence_penalty", -2.0, 2.0, 0.0),
        frequency_penalty=_number(body, "frequency_penalty", -2.0, 2.0, 0.0),
        repetition_penalty=_number(body, "repetition_penalty", 0.0, MAX_REPETITION_PENALTY, 1.0, open_low=True),
        logprobs=_logprobs(body, chat),
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
    raise invalid("prompt", f"expected a string or an array of token ids, got {kind_of(value)}", "invalid_type")


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
    raise invalid(f"messages[{index}].content", f"expected a string or an array of text parts, got {kind_of(content)}",
                  "invalid_type")  # fmt: skip


def _messages(value: Any) -> tuple[dict, ...]:
    if value is None:
        raise invalid("messages", "required: an array of {role, content} objects", "missing_required_parameter")
    if not isinstance(value, list) or not value:
        raise invalid("messages", f"expected a non-empty array of messages, got {kind_of(value)}", "invalid_type")
    messages = []
    for index, message in enumerate(value):
        if not isinstance(message, dict):
            raise invalid(f"messages[{index}]", f"expected an object, got {kind_of(message)}", "invalid_type")
        role = message.get("role")
        if role not in ROLES:
            raise invalid(f"messages[{index}].role", f"must be one of {', '.join(ROLES)}, got {shown(role)}")
        if role == "tool" or message.get("tool_calls") is not None:
            content = None if message.get("content") is None else _content(message, index)
            messages.append(tool_turn(message, index, content))
            continue
        if set(message) - {"role", "content", "name"}:
            extra = shown(sorted(set(message) - {"role", "content", "name"})[0])
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
    tools = tool_request(body)
    schema = _json_schema(body.get("response_format"))
    if schema is not None and tools is not None and tools.constrained:
        raise invalid("tool_choice", "a forced call and response_format cannot both hold the answer; send one")
    return GenerationRequest(chat=True, messages=_messages(body.get("messages")), **_shared(body, chat=True),
                             json_schema=schema, tools=tools)  # fmt: skip


def _json_schema(value: Any) -> str | None:
    """`response_format` as the JSON Schema text it asks for (`structured.response_format`), None for text."""
    from assisted_backends.structured.response_format import ResponseFormatError, schema_text

    try:
        return schema_text(value)
    except ResponseFormatError as error:
        raise invalid(error.field, str(error), "invalid_value") from None
