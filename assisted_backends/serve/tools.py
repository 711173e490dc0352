"""Function calling, the request side: `tools`, `tool_choice`, `parallel_tool_calls` and the tool turns of
`messages` checked; the tools written into the prompt; the JSON Schema that forces a call.

A chat template that mentions `tools` renders them itself (`apply_chat_template(..., tools=...)`). Any other
template gets them as text (`GENERIC_INSTRUCTIONS`, added to the first system message or as a new one), asking
for a bare JSON call `{"name": ..., "arguments": {...}}` (an array of them for parallel calls); history turns are
rewritten in that format: an assistant's calls as that JSON, a tool's result as a user turn
`{"tool_response": {"name": ..., "content": ...}}`. `tool_choice` `required` or a named function constrains the
answer to `call_schema`'s JSON (`structured`; objects held to their declared properties, `closed`); `none`
leaves the tools out of the prompt and the answer unparsed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from assisted_backends.serve.errors import invalid, unsupported

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for a function's name
CHOICES = "auto, none, required or {'type': 'function', 'function': {'name': ...}}"
GENERIC_INSTRUCTIONS = (
    "You can call these functions (each with the JSON Schema of its arguments):\n{functions}\n"
    'To call one, answer with only a JSON object: {{"name": <function name>, "arguments": {{<its arguments>}}}}.'
    "{parallel} Otherwise answer in plain text."
)
PARALLEL = " To call several at once, answer with a JSON array of such objects."
SUBSCHEMAS = frozenset({"items", "anyOf", "oneOf", "allOf", "prefixItems", "not", "if", "then", "else"})
MAX_PARALLEL_CALLS = 8  # a forced array of calls ends by then, so that a looping model still gives a parsable answer


@dataclass(frozen=True)
class ToolRequest:
    """The functions offered (name, description, parameters: OpenAI's `function` objects), `choice` (auto,
    required, or function: `named` must be called) and whether several calls may come at once (`parallel`)."""

    functions: tuple[dict, ...]
    choice: str = "auto"
    named: str | None = None
    parallel: bool = True

    @property
    def constrained(self) -> bool:
        """Whether the answer must be a call (`call_schema` holds it to one)."""
        return self.choice != "auto"

    def template_tools(self) -> list[dict]:
        """The tools as a chat template takes them (OpenAI's shape)."""
        return [{"type": "function", "function": function} for function in self.functions]

    def instructions(self) -> str:
        """The system text describing the tools to a template that does not render them."""
        listed = "\n".join(json.dumps(function, ensure_ascii=False) for function in self.functions)
        return GENERIC_INSTRUCTIONS.format(functions=listed, parallel=PARALLEL if self.parallel else "")

    def call_schema(self) -> str:
        """The JSON Schema (text) of the answer when a call is forced: one call of `named`, or one call of any
        function, or (parallel) an array of 1 to `MAX_PARALLEL_CALLS` calls."""
        chosen = [f for f in self.functions if self.named in (None, f["name"])]
        calls = [_one_call(function) for function in chosen]
        one = calls[0] if len(calls) == 1 else {"anyOf": calls}
        if self.parallel and self.named is None:
            return json.dumps({"type": "array", "items": one, "minItems": 1, "maxItems": MAX_PARALLEL_CALLS})
        return json.dumps(one)


def _one_call(function: dict) -> dict:
    arguments = closed(function.get("parameters") or {"type": "object", "properties": {}})
    return {"type": "object", "properties": {"name": {"const": function["name"]}, "arguments": arguments},
            "required": ["name", "arguments"], "additionalProperties": False}  # fmt: skip


def closed(schema: Any) -> Any:
    """`schema` with each object that lists `properties` and says nothing of `additionalProperties` held to them: a
    forced call's arguments are the declared parameters (a model would otherwise invent keys without end)."""
    if isinstance(schema, list):
        return [closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    held = {key: closed(value) if key in SUBSCHEMAS else value for key, value in schema.items()}
    if isinstance(schema.get("properties"), dict):
        held["properties"] = {name: closed(value) for name, value in schema["properties"].items()}
        held.setdefault("additionalProperties", False)
    return held


def tool_request(body: dict[str, Any]) -> ToolRequest | None:
    """A chat body's tools and tool choice, checked; None when no tool may be called (no tools, or `none`)."""
    functions = _functions(body.get("tools"))
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise invalid("parallel_tool_calls", "expected a boolean", "invalid_type")
    choice = body.get("tool_choice")
    if choice is None:
        choice = "auto" if functions else "none"
    if choice == "none":
        return None
    if not functions:
        raise invalid("tool_choice", "needs tools: send the functions in tools, or omit tool_choice")
    if choice in ("auto", "required"):
        return ToolRequest(functions, choice, None, parallel)
    if not isinstance(choice, dict) or choice.get("type") != "function" or not isinstance(choice.get("function"), dict):
        raise invalid("tool_choice", f"expected one of {CHOICES}")
    named = choice["function"].get("name")
    if named not in {function["name"] for function in functions}:
        raise invalid("tool_choice.function.name", f"{named!r} is not one of the tools' names")
    return ToolRequest(functions, "function", named, parallel)


def _functions(value: Any) -> tuple[dict, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise invalid("tools", "expected an array of {'type': 'function', 'function': {...}}", "invalid_type")
    functions: list[dict] = []
    for index, tool in enumerate(value):
        field = f"tools[{index}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise invalid(f"{field}.type", "only function tools: {'type': 'function', 'function': {...}}")
        if set(tool) - {"type", "function"}:
            raise invalid(f"{field}.{sorted(set(tool) - {'type', 'function'})[0]}", "not a field of a tool")
        functions.append(_function(tool.get("function"), f"{field}.function"))
    names = [function["name"] for function in functions]
    if len(set(names)) < len(names):
        raise invalid("tools", "two tools share a name; give each function its own")
    return tuple(functions)


def _function(value: Any, field: str) -> dict:
    if not isinstance(value, dict):
        raise invalid(field, "required: an object with name, description and parameters", "missing_required_parameter")
    unknown = sorted(set(value) - {"name", "description", "parameters", "strict"})
    if unknown:
        raise invalid(f"{field}.{unknown[0]}", "not a field of a function (name, description, parameters, strict)")
    if not isinstance(value.get("name"), str) or not NAME.match(value["name"]):
        raise invalid(f"{field}.name", "required: 1 to 64 letters, digits, underscores or dashes")
    if not isinstance(value.get("description", ""), str):
        raise invalid(f"{field}.description", "expected a string", "invalid_type")
    if not isinstance(value.get("parameters", {}), dict):
        raise invalid(f"{field}.parameters", "expected a JSON Schema object", "invalid_type")
    if not isinstance(value.get("strict", False), bool):
        raise invalid(f"{field}.strict", "expected a boolean", "invalid_type")
    return {key: value[key] for key in ("name", "description", "parameters") if key in value}


def tool_turn(message: dict, index: int, content: str | None) -> dict:
    """A `tool` message or an assistant message with `tool_calls`, checked, as templates take it (arguments as
    objects, a tool result's `name` kept); `content` is its text (None: none). Null fields count as absent."""
    field = f"messages[{index}]"
    tool = message["role"] == "tool"
    allowed = {"role", "content", "name", "tool_call_id"} if tool else {"role", "content", "name", "tool_calls"}
    extra = sorted(key for key in set(message) - allowed if message[key] is not None)
    if extra:
        raise unsupported(f"{field}.{extra[0]}", f"a {message['role']} message here has {', '.join(sorted(allowed))}")
    if tool:
        if not isinstance(message.get("tool_call_id"), str):
            raise invalid(f"{field}.tool_call_id", "required: the id of the call this message answers")
        named = {"name": message["name"]} if isinstance(message.get("name"), str) else {}
        return {"role": "tool", "tool_call_id": message["tool_call_id"], "content": content or "", **named}
    calls = message.get("tool_calls")
    if message["role"] != "assistant":
        raise invalid(f"{field}.tool_calls", "only assistant messages carry tool calls")
    if not isinstance(calls, list) or not calls:
        raise invalid(f"{field}.tool_calls", "expected a non-empty array of calls", "invalid_type")
    return {"role": "assistant", "content": content or "",
            "tool_calls": [_call(call, f"{field}.tool_calls[{i}]") for i, call in enumerate(calls)]}  # fmt: skip


def _call(call: Any, field: str) -> dict:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise invalid(field, "expected {'id', 'type': 'function', 'function': {'name', 'arguments'}}")
    try:
        arguments = json.loads(function.get("arguments") or "{}")
    except (TypeError, json.JSONDecodeError):
        arguments = None
    if not isinstance(arguments, dict):
        raise invalid(f"{field}.function.arguments", "expected a JSON object as a string, as the call returned it")
    return {"id": str(call.get("id", "")), "type": "function",
            "function": {"name": function["name"], "arguments": arguments}}  # fmt: skip


def as_generic(messages: list[dict], tools: ToolRequest | None) -> list[dict]:
    """`messages` for a template that does not render tools: the tools described in the first system message,
    calls and results as plain text turns (the format of `GENERIC_INSTRUCTIONS`)."""
    names = {call["id"]: call["function"]["name"] for m in messages for call in m.get("tool_calls", ())}
    turns = [_generic_turn(message, names) for message in messages]
    if tools is None:
        return turns
    if turns and turns[0]["role"] == "system":
        return [{"role": "system", "content": f"{turns[0]['content']}\n\n{tools.instructions()}"}, *turns[1:]]
    return [{"role": "system", "content": tools.instructions()}, *turns]


def _generic_turn(message: dict, names: dict[str, str]) -> dict:
    if message["role"] == "tool":
        response = {"name": names.get(message["tool_call_id"], message.get("name", "")), "content": message["content"]}
        return {"role": "user", "content": json.dumps({"tool_response": response}, ensure_ascii=False)}
    if "tool_calls" not in message:
        return message
    calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in message["tool_calls"]]
    text = json.dumps(calls[0] if len(calls) == 1 else calls, ensure_ascii=False)
    return {"role": "assistant", "content": f"{message['content']}\n{text}" if message["content"] else text}


def renders_tools(template: Any) -> bool:
    """Whether a chat template (its text, or a dict of named templates) writes `tools` itself."""
    return "tools" in (template if isinstance(template, str) else json.dumps(template))
