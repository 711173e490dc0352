"""Function calling through real `assisted-serve` processes (the demo pair, its test template, which knows no tools:
the tools are written into a system message, `serve.tools`) driven by the official `openai` client: forced calls
(required, named) parse and validate against their function's schema and are the non-speculative server's
calls; the streamed calls reassemble to the whole answer's; a call's result goes back through the template; `none`
leaves the tools out."""

from __future__ import annotations

import json

import pytest
from serve_process import running_server

from assisted_backends.serve.tools import MAX_PARALLEL_CALLS, ToolRequest, as_generic

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

FORECAST = {
    "type": "object",
    "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer", "minimum": 1,
                                                                        "maximum": 7}},
    "required": ["unit", "days"],
    "additionalProperties": False,
}  # fmt: skip
LOOKUP = {
    "type": "object",
    "properties": {"path": {"enum": ["/tmp", "/usr"]}, "recursive": {"type": "boolean"}},
    "required": ["path", "recursive"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "forecast", "description": "The weather", "parameters": FORECAST}},
    {"type": "function", "function": {"name": "list_files", "description": "Files in a folder", "parameters": LOOKUP}},
]
SCHEMAS = {"forecast": FORECAST, "list_files": LOOKUP}
QUESTION = [{"role": "user", "content": "What is in /tmp?"}]


@pytest.fixture(scope="module")
def clients():
    with running_server("--slots", "4", "--no-assisted") as plain, running_server("--slots", "4") as draft:
        yield {name: openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)
               for name, server in (("plain", plain), ("draft", draft))}  # fmt: skip


def _ask(client, messages=QUESTION, **options):
    options.setdefault("max_tokens", 160)
    return client.chat.completions.create(model="demo", messages=messages, temperature=0, tools=TOOLS, **options)


def _calls(reply) -> list[tuple[str, dict]]:
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    calls = choice.message.tool_calls
    for call in calls:
        assert call.id.startswith("call_") and call.type == "function"
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    return [(call.function.name, json.loads(call.function.arguments)) for call in calls]


def test_required_calls_validate_and_equal_the_plain_servers(clients):
    for parallel in (False, True):
        answers = {name: _calls(_ask(c, tool_choice="required", parallel_tool_calls=parallel, max_tokens=600))
                   for name, c in clients.items()}  # fmt: skip
        assert answers["draft"] == answers["plain"]
        assert len(answers["plain"]) == 1 or parallel and len(answers["plain"]) <= MAX_PARALLEL_CALLS


def test_a_named_function_is_the_one_called(clients):
    for name in SCHEMAS:
        choice = {"type": "function", "function": {"name": name}}
        answers = {server: _calls(_ask(c, tool_choice=choice)) for server, c in clients.items()}
        assert answers["draft"] == answers["plain"]
        assert [called for called, _ in answers["plain"]] == [name]


def test_streamed_calls_reassemble_to_the_whole_answer(clients):
    client = clients["draft"]
    whole = _calls(_ask(client, tool_choice="required", max_tokens=600))
    chunks = list(_ask(client, tool_choice="required", max_tokens=600, stream=True))
    pieces: dict[int, dict] = {}
    for chunk in chunks:
        for delta in chunk.choices[0].delta.tool_calls or ():
            piece = pieces.setdefault(delta.index, {"id": delta.id, "name": "", "arguments": ""})
            piece["name"] += (delta.function.name or "") if delta.function else ""
            piece["arguments"] += (delta.function.arguments or "") if delta.function else ""
    assert len(pieces) > 1 and all(piece["id"].startswith("call_") for piece in pieces.values())
    assert [(p["name"], json.loads(p["arguments"])) for _, p in sorted(pieces.items())] == whole
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["tool_calls"]


def test_a_tool_result_goes_back_through_the_template(clients, reference):
    reply = _ask(clients["draft"], tool_choice={"type": "function", "function": {"name": "list_files"}})
    call = reply.choices[0].message.tool_calls[0]
    history = [*QUESTION, reply.choices[0].message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": "notes.txt"}]  # fmt: skip
    answers = {name: _ask(c, history, tool_choice="none", max_tokens=12) for name, c in clients.items()}
    text = answers["plain"].choices[0].message.content
    assert answers["draft"].choices[0].message.content == text and not answers["plain"].choices[0].message.tool_calls
    called = json.dumps({"name": "list_files", "arguments": json.loads(call.function.arguments)})
    result = json.dumps({"tool_response": {"name": "list_files", "content": "notes.txt"}})
    rendered = [*QUESTION, {"role": "assistant", "content": called}, {"role": "user", "content": result}]
    assert text == reference.text(messages=rendered, max_tokens=12)


def test_tool_choice_none_answers_as_without_tools(clients, reference):
    client = clients["draft"]
    plain = client.chat.completions.create(model="demo", messages=QUESTION, temperature=0, max_tokens=12)
    none = _ask(client, tool_choice="none", max_tokens=12)
    assert none.choices[0].message.content == plain.choices[0].message.content
    assert none.choices[0].message.tool_calls is None
    assert plain.choices[0].message.content == reference.text(messages=QUESTION, max_tokens=12)


def test_auto_answers_with_the_tools_in_the_system_message(clients, reference):
    reply = _ask(clients["draft"], max_tokens=12)
    tools = ToolRequest(tuple(tool["function"] for tool in TOOLS))
    expected = reference.text(messages=as_generic(list(QUESTION), tools), max_tokens=12)
    message = reply.choices[0].message
    assert message.tool_calls is None and message.content == expected  # the demo model writes no call


@pytest.mark.parametrize(
    "options,param",
    [
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}]},
         "tools[0].function.parameters"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice.function.name"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}],
          "tool_choice": "required"}, "tools"),
    ],
)  # fmt: skip
def test_bad_tools_are_refused_by_field(clients, options, param):
    with pytest.raises(openai.BadRequestError) as caught:
        clients["plain"].chat.completions.create(model="demo", messages=QUESTION, max_tokens=4, **options)
    assert caught.value.body["param"] == param, caught.value.body
