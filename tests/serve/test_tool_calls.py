"""Function calling without a server: the parsers of each format, the stream splitter against the whole parse,
the forced call's JSON Schema, the request checks, and the prompt with a template that renders tools and one that
does not (`serve.tools`, `serve.tool_calls`)."""

from __future__ import annotations

import json

import pytest

from assisted_backends.serve.errors import APIError
from assisted_backends.serve.tool_calls import CallStream, assistant_message, parse
from assisted_backends.serve.tools import MAX_PARALLEL_CALLS, ToolRequest, as_generic, closed, tool_request

jsonschema = pytest.importorskip("jsonschema")

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
FUNCTIONS = ({"name": "weather", "description": "Weather", "parameters": WEATHER},
             {"name": "time", "parameters": {"type": "object", "properties": {}}})  # fmt: skip
PARIS = ("weather", {"city": "Paris"})
PARSED = [
    ('<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>', None, [PARIS]),
    ('Let me look.\n<tool_call>{"name": "weather", "arguments": {"city": "Paris"}}</tool_call>\n'
     '<tool_call>{"name": "time", "arguments": {}}</tool_call>', "Let me look.", [PARIS, ("time", {})]),
    ('<tool_call>{"name": "weather", "arguments": {"city": "Paris"}}', None, [PARIS]),
    ('{"name": "weather", "parameters": {"city": "Paris"}}', None, [PARIS]),
    ('  {"name": "weather", "arguments": "{\\"city\\": \\"Paris\\"}"}', None, [PARIS]),
    ('<|python_tag|>{"name": "weather", "parameters": {"city": "Paris"}}', None, [PARIS]),
    ('{"name": "weather", "parameters": {"city": "Paris"}}; {"name": "time", "parameters": {}}', None,
     [PARIS, ("time", {})]),
    ('[{"name": "weather", "arguments": {"city": "Paris"}}, {"name": "time", "arguments": {}}]', None,
     [PARIS, ("time", {})]),
    ('[TOOL_CALLS][{"name": "weather", "arguments": {"city": "Paris"}}]', None, [PARIS]),
    ('[TOOL_CALLS]weather[ARGS]{"city": "Paris"}[TOOL_CALLS]time[ARGS]{}', None, [PARIS, ("time", {})]),
]  # fmt: skip
NOT_CALLS = [
    "It is sunny in Paris.",
    '{"city": "Paris"}',
    '[1, 2, 3]',
    'I would call {"name": "weather", "arguments": {"city": "Paris"}} here',
    '<tool_call>{"name": "weather", "arguments": {"city": "Par',
    '<tool_call>{"name": "weather", "arguments": {}}</tool_call> and some words',
    '{"name": "weather", "arguments": [1]}',
    "[TOOL_CALLS]weather[ARGS]not json",
]  # fmt: skip


def _named(calls) -> list[tuple[str, dict]]:
    return [(call.name, json.loads(call.arguments)) for call in calls]


@pytest.mark.parametrize("text,content,calls", PARSED)
def test_each_format_parses(text, content, calls):
    found_content, found = parse(text)
    assert (found_content, _named(found)) == (content, calls)
    assert all(call.id.startswith("call_") and len(call.id) > 20 for call in found)


@pytest.mark.parametrize("text", NOT_CALLS)
def test_text_that_is_no_complete_call_stays_content(text):
    assert parse(text) == (text, [])
    assert assistant_message(text) == {"role": "assistant", "content": text}


@pytest.mark.parametrize("text", [t for t, _, _ in PARSED] + NOT_CALLS + ["Sure <tool", "a  \n", "<|python"])
@pytest.mark.parametrize("size", [1, 2, 5, 1000])
def test_the_stream_reassembles_to_the_whole_parse(text, size):
    stream, deltas = CallStream(), []
    pieces = [text[i : i + size] for i in range(0, len(text), size)]
    for i, piece in enumerate(pieces):
        deltas += stream.deltas(piece, i == len(pieces) - 1)
    content = "".join(d.get("content", "") for d in deltas)
    heads = [d["tool_calls"][0] for d in deltas if "tool_calls" in d and "id" in d["tool_calls"][0]]
    arguments = {}
    for delta in deltas:
        for call in delta.get("tool_calls", ()):
            arguments[call["index"]] = arguments.get(call["index"], "") + call["function"]["arguments"]
    whole_content, whole = parse(text)
    assert content == (whole_content or "")
    assert [(h["function"]["name"], json.loads(arguments[h["index"]])) for h in heads] == _named(whole)
    assert [h["index"] for h in heads] == list(range(len(whole))) and stream.called == bool(whole)


def test_the_stream_holds_back_only_what_may_open_a_call():
    stream = CallStream()
    assert stream.deltas("Let me check ", False) == [{"content": "Let me check"}]
    assert stream.deltas("<tool_", False) == []
    assert stream.deltas("x> done", False) == [{"content": " <tool_x> done"}]
    assert CallStream().deltas(' {"name"', False) == []


def test_the_forced_call_schemas_admit_exactly_the_calls():
    single = json.loads(ToolRequest(FUNCTIONS, "required", None, parallel=False).call_schema())
    several = json.loads(ToolRequest(FUNCTIONS, "required", None, parallel=True).call_schema())
    named = json.loads(ToolRequest(FUNCTIONS, "function", "time", parallel=True).call_schema())
    call = {"name": "weather", "arguments": {"city": "Paris"}}
    jsonschema.validate(call, single)
    jsonschema.validate([call, {"name": "time", "arguments": {}}], several)
    jsonschema.validate({"name": "time", "arguments": {}}, named)
    refused = [(single, {"name": "weather", "arguments": {}}), (single, {"name": "other", "arguments": {}}),
               (single, {**call, "extra": 1}), (several, []), (several, [call] * (MAX_PARALLEL_CALLS + 1)),
               (several, call), (named, call), (single, {"name": "weather", "arguments": {"city": "P", "x": 1}}),
               ]  # fmt: skip
    for schema, value in refused:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(value, schema)


def test_a_forced_calls_objects_are_held_to_their_declared_properties():
    schema = {"type": "object", "properties": {"where": {"type": "object", "properties": {"x": {"type": "number"}}},
              "tags": {"type": "array", "items": {"properties": {"t": {}}}}, "free": {"additionalProperties": True,
              "properties": {}}}, "anyOf": [{"properties": {"where": {}}}]}  # fmt: skip
    held = closed(schema)
    assert held["additionalProperties"] is False and held["properties"]["where"]["additionalProperties"] is False
    assert held["properties"]["tags"]["items"]["additionalProperties"] is False
    assert (
        held["properties"]["free"]["additionalProperties"] is True and held["anyOf"][0]["additionalProperties"] is False
    )
    assert "additionalProperties" not in schema and closed({"type": "string"}) == {"type": "string"}


def test_requests_are_read_with_their_defaults():
    tools = [{"type": "function", "function": function} for function in FUNCTIONS]
    assert tool_request({}) is None and tool_request({"tools": tools, "tool_choice": "none"}) is None
    auto = tool_request({"tools": tools})
    assert (auto.choice, auto.parallel, auto.constrained, auto.functions) == ("auto", True, False, FUNCTIONS)
    named = tool_request({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "time"}},
                          "parallel_tool_calls": False})  # fmt: skip
    assert (named.choice, named.named, named.parallel, named.constrained) == ("function", "time", False, True)


@pytest.mark.parametrize(
    "body,param",
    [
        ({"tools": {"a": 1}}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "f", "oops": 1}}]}, "tools[0].function.oops"),
        ({"tools": [{"type": "function", "function": {"name": "f", "description": 3}}]},
         "tools[0].function.description"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}] * 2}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "f"}, "x": 1}]}, "tools[0].x"),
        ({"tools": [{"type": "function"}]}, "tools[0].function"),
    ],
)  # fmt: skip
def test_bad_tools_name_their_field(body, param):
    with pytest.raises(APIError) as caught:
        tool_request(body)
    assert caught.value.status == 400 and caught.value.param == param and param in caught.value.message


CALL = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}
USER = {"role": "user", "content": "Paris?"}


@pytest.mark.parametrize(
    "messages,param",
    [
        ([USER, {"role": "tool", "content": "sunny"}], "messages[1].tool_call_id"),
        ([{**USER, "tool_calls": [CALL]}], "messages[0].tool_calls"),
        ([USER, {"role": "assistant", "tool_calls": []}], "messages[1].tool_calls"),
        ([USER, {"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "weather", "arguments": "{"}}]}],
         "messages[1].tool_calls[0].function.arguments"),
        ([USER, {"role": "assistant", "tool_calls": [{"id": "x"}]}], "messages[1].tool_calls[0]"),
        ([USER, {"role": "tool", "tool_call_id": "call_1", "content": "x", "mood": "ok"}], "messages[1].mood"),
    ],
)  # fmt: skip
def test_bad_tool_turns_name_their_field(messages, param):
    from assisted_backends.serve.schemas import chat_request

    with pytest.raises(APIError) as caught:
        chat_request({"model": "m", "messages": messages})
    assert caught.value.status == 400 and caught.value.param == param and param in caught.value.message


def test_tool_turns_reach_the_template_with_arguments_as_objects():
    from assisted_backends.serve.schemas import chat_request

    history = [USER, {"role": "assistant", "content": None, "refusal": None, "tool_calls": [CALL]},
               {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "sunny"}]}]  # fmt: skip
    _, assistant, tool = chat_request({"model": "m", "messages": history}).messages
    assert assistant == {"role": "assistant", "content": "", "tool_calls": [{**CALL, "function": {
        "name": "weather", "arguments": {"city": "Paris"}}}]}  # fmt: skip
    assert tool == {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}


def test_a_template_without_tools_gets_them_as_text_and_history_in_their_format():
    tools = ToolRequest(FUNCTIONS)
    call = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Paris?"},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]  # fmt: skip
    system, user, assistant, result = as_generic(messages, tools)
    assert system["content"].startswith("Be brief.\n\nYou can call these functions")
    assert json.dumps(FUNCTIONS[0]) in system["content"] and "JSON array" in system["content"]
    assert "JSON array" not in ToolRequest(FUNCTIONS, parallel=False).instructions()
    assert user == messages[1]
    assert assistant == {"role": "assistant", "content": '{"name": "weather", "arguments": {"city": "Paris"}}'}
    assert json.loads(result["content"]) == {"tool_response": {"name": "weather", "content": "sunny"}}
    assert result["role"] == "user"
    assert as_generic(messages[1:2], tools)[0] == {"role": "system", "content": tools.instructions()}


def test_the_prompt_uses_the_templates_own_tools_when_it_has_them():
    from transformers import AutoTokenizer

    from assisted_backends.demo.pair import shipped_pair
    from assisted_backends.serve.prompts import PromptMaker
    from assisted_backends.serve.schemas import chat_request

    template = ("{% if tools %}TOOLS {% for t in tools %}{{ t.function.name }};{% endfor %}|{% endif %}"
                "{% for m in messages %}{{ m.role }}: {{ m.content }}{% for c in m.tool_calls or [] %}"
                "CALL {{ c.function.name }} {{ c.function.arguments | tojson }}{% endfor %}|{% endfor %}")  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(str(shipped_pair().target_dir))
    maker = PromptMaker.of(tokenizer, template, 4096, len(tokenizer))
    tools = [{"type": "function", "function": function} for function in FUNCTIONS]
    history = [{"role": "user", "content": "Paris?"},
               {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]  # fmt: skip
    rendered = maker._render(chat_request({"model": "m", "messages": history, "tools": tools}))
    assert rendered == 'TOOLS weather;time;|user: Paris?|assistant: CALL weather {"city": "Paris"}|tool: sunny|'
    plain = maker._render(chat_request({"model": "m", "messages": history, "tools": tools, "tool_choice": "none"}))
    assert not plain.startswith("TOOLS")
