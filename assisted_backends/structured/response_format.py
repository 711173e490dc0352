"""OpenAI's `response_format` for the server: checked into a JSON Schema's text, then compiled once per schema.

    {"type": "text"}                                                   plain text (None)
    {"type": "json_object"}                                            any JSON object
    {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": true, "description": ...}}

`strict` is accepted either way: the text always follows the schema (llguidance refuses a schema it cannot
enforce exactly). No heavy import here: the server checks bodies without the library.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

KINDS = "text, json_object, json_schema"
JSON_OBJECT = json.dumps({"type": "object"})
_SCHEMA_KEYS = {"name", "schema", "strict", "description"}
_CACHED = 64  # compiled schemas kept by a server


class ResponseFormatError(ValueError):
    """A `response_format` that cannot be served: `field` names the part of it (dotted), the message why."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def schema_text(value: Any) -> str | None:
    """The JSON Schema (canonical JSON text) a `response_format` value asks for; None for plain text."""
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise ResponseFormatError("response_format", f'expected an object with a "type" ({KINDS})')
    kind = value["type"]
    extra = sorted(set(value) - {"type", "json_schema"} if kind == "json_schema" else set(value) - {"type"})
    if extra:
        raise ResponseFormatError(f"response_format.{extra[0]}", f"not a field of a {kind!r} response_format")
    if kind == "text":
        return None
    if kind == "json_object":
        return JSON_OBJECT
    if kind != "json_schema":
        raise ResponseFormatError("response_format.type", f"{kind!r} is not served; use one of {KINDS}")
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise ResponseFormatError("response_format.json_schema", 'required: an object with "name" and "schema"')
    unknown = sorted(set(spec) - _SCHEMA_KEYS)
    if unknown:
        raise ResponseFormatError(f"response_format.json_schema.{unknown[0]}", "not a field of json_schema")
    if not isinstance(spec.get("name"), str) or not spec["name"]:
        raise ResponseFormatError("response_format.json_schema.name", "required: a non-empty string")
    if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
        raise ResponseFormatError("response_format.json_schema.strict", "expected a boolean")
    schema = spec.get("schema", {})
    if not isinstance(schema, dict):
        raise ResponseFormatError("response_format.json_schema.schema", "expected a JSON Schema object")
    return json.dumps(schema, sort_keys=True)


class SchemaProcessors:
    """Compiled schemas of one server's tokenizer (`tokenizer_of()`: the calling thread's copy), EOS ids and
    vocabulary, the last `_CACHED` kept: `get(text)` gives a `structured.GrammarProcessor` (the package copies it
    per row) or raises ResponseFormatError."""

    def __init__(self, tokenizer_of: Callable[[], Any], eos_ids: Iterable[int], vocab_size: int) -> None:
        self.tokenizer_of, self.eos_ids, self.vocab_size = tokenizer_of, sorted(eos_ids), vocab_size
        self._compiled: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, text: str) -> Any:
        with self._lock:
            if text in self._compiled:
                self._compiled.move_to_end(text)
                return self._compiled[text]
        from assisted_backends.structured import json_schema

        try:
            processor = json_schema(text, self.tokenizer_of(), eos_token_id=self.eos_ids, vocab_size=self.vocab_size)
        except ImportError as error:
            raise ResponseFormatError("response_format", f"not served by this installation: {error}") from None
        except ValueError as error:
            raise ResponseFormatError("response_format.json_schema.schema", str(error)) from None
        with self._lock:
            self._compiled[text] = processor
            while len(self._compiled) > _CACHED:
                self._compiled.popitem(last=False)
        return processor
