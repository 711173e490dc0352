"""Function calling, the answer side: tool calls parsed out of a model's text, whole or while it streams.

Formats read (the first one found from the start of the calls to the end of the text):

    <tool_call>{"name": ..., "arguments": {...}}</tool_call> ...     Hermes, Qwen (closing tag optional at the end)
    [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]            Mistral (also [TOOL_CALLS]name[ARGS]{...})
    <|python_tag|>{"name": ..., "parameters": {...}}                 Llama 3.x
    {"name": ..., "arguments"/"parameters": {...}}  or  [ ... ]      Llama 3.x bare JSON, `tools.GENERIC_INSTRUCTIONS`

Text before the calls is the message's content (None when blank); the calls must run to the end of the text, or
the whole text is content and no call is made. Arguments come back as JSON text, as OpenAI sends them.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

HERMES = "<tool_call>"
HERMES_END = "</tool_call>"
MISTRAL = "[TOOL_CALLS]"
MISTRAL_ARGS = "[ARGS]"
PYTHON_TAG = "<|python_tag|>"
MARKERS = (HERMES, MISTRAL, PYTHON_TAG)
_DECODER = json.JSONDecoder()
_SEPARATORS = re.compile(r"[\s;,]*")


@dataclass(frozen=True)
class ToolCall:
    """One call: the function's name, its arguments as JSON text, and its id (`call_...`)."""

    name: str
    arguments: str
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}", compare=False)

    def openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def assistant_message(text: str) -> dict:
    """The assistant message of a whole answer: its calls in `tool_calls` when it made some."""
    content, calls = parse(text)
    if not calls:
        return {"role": "assistant", "content": text}
    return {"role": "assistant", "content": content, "tool_calls": [call.openai() for call in calls]}


def parse(text: str) -> tuple[str | None, list[ToolCall]]:
    """(content, calls) of a whole answer; no calls: the text unchanged as content."""
    start = calls_start(text)
    if start is not None:
        calls = _calls(text[start:])
        if calls:
            return text[:start].rstrip() or None, calls
    return text, []


def calls_start(text: str) -> int | None:
    """Where the calls would begin: the first marker, or the text itself when it opens with JSON."""
    stripped = text.lstrip()
    if stripped[:1] in ("{", "["):
        return len(text) - len(stripped)
    found = [text.find(marker) for marker in MARKERS if marker in text]
    return min(found) if found else None


def _calls(text: str) -> list[ToolCall] | None:
    """The calls making up all of `text` (from its start), or None."""
    if text.startswith(HERMES):
        return _hermes(text)
    if text.startswith(MISTRAL):
        rest = text[len(MISTRAL) :]
        return _named_arguments(rest) if MISTRAL_ARGS in rest.split("{", 1)[0] else _json_calls(rest)
    if text.startswith(PYTHON_TAG):
        return _json_calls(text[len(PYTHON_TAG) :])
    return _json_calls(text)


def _hermes(text: str) -> list[ToolCall] | None:
    calls: list[ToolCall] = []
    while text:
        if not text.startswith(HERMES):
            return None
        body, _, text = text[len(HERMES) :].partition(HERMES_END)
        found = _json_calls(body)
        if found is None:
            return None
        calls += found
        text = text.lstrip()
    return calls


def _named_arguments(text: str) -> list[ToolCall] | None:
    """Mistral's newer form: name[ARGS]{...}, repeated after [TOOL_CALLS]."""
    calls: list[ToolCall] = []
    for part in text.split(MISTRAL):
        name, _, arguments = part.partition(MISTRAL_ARGS)
        value = _whole_json(arguments)
        if not name.strip() or not isinstance(value, dict):
            return None
        calls.append(ToolCall(name.strip(), json.dumps(value, ensure_ascii=False)))
    return calls


def _json_calls(text: str) -> list[ToolCall] | None:
    """JSON call objects (or arrays of them), separated by spaces, commas or semicolons, filling `text`."""
    calls: list[ToolCall] = []
    index = _SEPARATORS.match(text, 0).end()
    while index < len(text):
        try:
            value, index = _DECODER.raw_decode(text, index)
        except json.JSONDecodeError:
            return None
        for item in value if isinstance(value, list) else [value]:
            call = _call(item)
            if call is None:
                return None
            calls.append(call)
        index = _SEPARATORS.match(text, index).end()
    return calls or None


def _call(value: object) -> ToolCall | None:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        arguments = _whole_json(arguments)
    if not isinstance(arguments, dict) or set(value) - {"name", "arguments", "parameters", "id", "type"}:
        return None
    return ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False))


def _whole_json(text: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


class CallStream:
    """A streamed answer's content split from its calls: `feed` returns the text that is certainly content (it
    stops before anything that may open a call, and before trailing spaces); `finish` the rest of the content and
    the calls, so that what was fed and finished equals `parse` of the whole text."""

    def __init__(self) -> None:
        self.text = ""
        self.sent = 0
        self.called = False  # whether the finished answer made calls

    def feed(self, delta: str) -> str:
        self.text += delta
        safe = self._safe_end()
        piece, self.sent = self.text[self.sent : max(safe, self.sent)], max(safe, self.sent)
        return piece

    def deltas(self, delta: str, finished: bool) -> list[dict]:
        """The chat deltas for `delta`: content, then (once `finished`) the content held back and each call as a
        delta with its `index`, id and name, then one with its arguments."""
        content = self.feed(delta)
        if not finished:
            return [{"content": content}] if content else []
        rest, calls = self.finish()
        self.called = bool(calls)
        content += rest
        found = [{"content": content}] if content else []
        for index, call in enumerate(calls):
            head = {"index": index, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}
            found += [
                {"tool_calls": [head]},
                {"tool_calls": [{"index": index, "function": {"arguments": call.arguments}}]},
            ]
        return found

    def finish(self) -> tuple[str, list[ToolCall]]:
        """(content not yet returned, calls) once the answer is complete."""
        content, calls = parse(self.text)
        return (content or "")[self.sent :], calls

    def _safe_end(self) -> int:
        text = self.text
        if not text.strip() or text.lstrip()[:1] in ("{", "["):
            return 0
        end = calls_start(text)
        end = len(text) if end is None else end
        for marker in MARKERS:  # a marker's beginning at the end of the text
            for size in range(min(len(marker) - 1, end), 0, -1):
                if text[:end].endswith(marker[:size]):
                    end = min(end, len(text[:end]) - size)
                    break
        return len(text[:end].rstrip())
