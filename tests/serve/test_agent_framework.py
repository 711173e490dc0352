"""An agent framework from PyPI drives real `assisted-serve` processes (the demo pair, the test chat template) as it
drives any OpenAI-compatible server: its own tool loop, structured output and streaming, all greedy, and the
speculative server gives it exactly what the `--no-assisted` one gives.

The framework is pydantic-ai (`pydantic-ai-slim[openai]`): it installs from PyPI with few dependencies beyond the
`openai` client and pydantic, which the serve tests already use, and its chat path needs no network (its `tiktoken`
dependency is loaded only by its realtime and embedding code). Its requests carry the fields real clients send
(`max_completion_tokens`, `parallel_tool_calls`, `strict` tools, `stream_options`, `response_format`); each
request body is recorded off the HTTP client (`Wire`) to show what went over the wire."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Literal

import pytest
from serve_process import running_server

openai = pytest.importorskip("openai")
pydantic = pytest.importorskip("pydantic")
pydantic_ai = pytest.importorskip("pydantic_ai")
openai_models = pytest.importorskip("pydantic_ai.models.openai")
openai_providers = pytest.importorskip("pydantic_ai.providers.openai")
pytest.importorskip("fastapi")
pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

GREEDY = {"temperature": 0, "max_tokens": 40}
WEATHER = "What is the weather?"


class City(pydantic.BaseModel):
    name: Literal["Paris", "Rome", "Oslo"]
    population: Annotated[int, pydantic.Field(ge=0, le=10**8)]


class Wire:
    """The JSON bodies one agent's HTTP client sent, in order."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []

    async def record(self, request) -> None:
        self.bodies.append(json.loads(request.content))


@pytest.fixture(scope="module")
def servers():
    with running_server("--slots", "2", "--no-assisted") as plain, running_server("--slots", "2") as draft:
        yield {"plain": plain, "draft": draft}


def _agent(server, wire: Wire, **options):
    """A pydantic-ai agent on `server`'s chat completions (no retries: a failure shows as it happened)."""
    http = openai.DefaultAsyncHttpxClient(event_hooks={"request": [wire.record]})
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120,
                                http_client=http)  # fmt: skip
    model = openai_models.OpenAIChatModel("demo", provider=openai_providers.OpenAIProvider(openai_client=client))
    return pydantic_ai.Agent(model, **options)


def _weather_round_trip(server) -> tuple[list[dict], object, Wire]:
    """The agent loop with one tool: step 1 must call it (`tool_choice="required"`, a call llguidance holds to the
    schema), the framework runs it and sends its result back, step 2 (`"none"`) answers in text and ends the run."""
    ran: list[dict] = []

    def forecast(unit: Literal["celsius", "fahrenheit"], days: Annotated[int, pydantic.Field(ge=1, le=7)]) -> str:
        """The weather for the next `days` days."""
        ran.append({"unit": unit, "days": days})
        return f"sunny for {days} days"

    def call_first(context) -> dict:
        choice = "required" if context.run_step == 1 else "none"
        return {**GREEDY, "parallel_tool_calls": False, "tool_choice": choice}

    wire = Wire()
    agent = _agent(server, wire, tools=[forecast], model_settings=call_first)
    result = agent.run_sync(WEATHER, usage_limits=pydantic_ai.UsageLimits(request_limit=2))
    return ran, result, wire


def test_a_tool_round_trip_through_the_agent_loop(servers):
    runs = {name: _weather_round_trip(server) for name, server in servers.items()}
    ran, result, wire = runs["draft"]
    first, second = wire.bodies
    assert first["tool_choice"] == "required" and [t["function"]["name"] for t in first["tools"]] == ["forecast"]
    assert len(ran) == 1
    jsonschema.validate(ran[0], first["tools"][0]["function"]["parameters"])
    user, assistant, tool = second["messages"]
    assert user == {"role": "user", "content": WEATHER} and second["tool_choice"] == "none"
    [call] = assistant["tool_calls"]
    assert call["function"]["name"] == "forecast" and json.loads(call["function"]["arguments"]) == ran[0]
    assert tool == {"role": "tool", "tool_call_id": call["id"], "content": f"sunny for {ran[0]['days']} days"}
    returned = [part for message in result.all_messages() for part in message.parts
                if isinstance(part, pydantic_ai.ToolReturnPart)]  # fmt: skip
    assert [(part.tool_call_id, part.content) for part in returned] == [(call["id"], tool["content"])]
    last = result.all_messages()[-1]
    assert isinstance(last, pydantic_ai.ModelResponse) and result.output
    assert [part.content for part in last.parts if isinstance(part, pydantic_ai.TextPart)] == [result.output]
    plain_ran, plain_result, _ = runs["plain"]
    assert plain_ran == ran and plain_result.output == result.output
    assert plain_result.usage.output_tokens == result.usage.output_tokens


@pytest.mark.parametrize("mode", ["tool", "native"])
def test_structured_output_validates_and_equals_the_plain_servers(servers, mode):
    """`ToolOutput` sends the model as a forced `final_result` tool, `NativeOutput` as a `json_schema`
    `response_format`; either way one request must give a valid `City` (no retry is allowed)."""
    output_type = pydantic_ai.ToolOutput(City) if mode == "tool" else pydantic_ai.NativeOutput(City)
    outputs = {}
    for name, server in servers.items():
        wire = Wire()
        agent = _agent(server, wire, output_type=output_type, model_settings={**GREEDY, "parallel_tool_calls": False})
        city = agent.run_sync("Name a city.", usage_limits=pydantic_ai.UsageLimits(request_limit=1)).output
        [body] = wire.bodies
        if mode == "tool":
            assert body["tool_choice"] == "required"
            schema = body["tools"][0]["function"]["parameters"]
        else:
            assert body["response_format"]["type"] == "json_schema" and "tools" not in body
            schema = body["response_format"]["json_schema"]["schema"]
        assert isinstance(city, City)
        jsonschema.validate(city.model_dump(), schema)
        outputs[name] = city
    assert outputs["draft"] == outputs["plain"]


async def _streamed(server, prompt: str) -> tuple[list[str], int, Wire]:
    wire = Wire()
    async with _agent(server, wire, model_settings=GREEDY).run_stream(prompt) as result:
        deltas = [delta async for delta in result.stream_text(delta=True, debounce_by=None)]
    return deltas, result.usage.output_tokens, wire


def test_streamed_text_is_the_whole_answer(servers):
    prompt = "Tell me about the old library."
    texts = {}
    for name, server in servers.items():
        deltas, streamed_tokens, wire = asyncio.run(_streamed(server, prompt))
        whole = _agent(server, Wire(), model_settings=GREEDY).run_sync(prompt)
        assert wire.bodies[0]["stream"] is True and wire.bodies[0]["stream_options"] == {"include_usage": True}
        assert len(deltas) > 1 and "".join(deltas) == whole.output
        assert streamed_tokens == whole.usage.output_tokens > 0
        texts[name] = whole.output
    assert texts["draft"] == texts["plain"]
