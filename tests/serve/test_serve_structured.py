"""`response_format` through a real `assisted-serve` process (the demo pair): json_schema and json_object answers
parse, match their schema, and are the non-speculative server's answers whatever drafts them (the draft model,
prompt lookup); requests with different schemas share the batch; bad formats get a 400 naming the field."""

from __future__ import annotations

import concurrent.futures
import json

import pytest
from json_schemas import FLAG, PERSON
from serve_process import running_server

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

QUESTIONS = ["Describe the os module as JSON.", "Is /tmp writable? Answer as JSON.", "def main(argv=None):"]
SERVERS = {"plain": ("--no-assisted",), "draft model": (), "prompt lookup": ("--prompt-lookup", "4")}


def _format(schema: dict | None) -> dict:
    if schema is None:
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}


@pytest.fixture(scope="module")
def clients():
    with (
        running_server("--slots", "4", *SERVERS["plain"]) as plain,
        running_server("--slots", "4", *SERVERS["draft model"]) as draft,
        running_server("--slots", "4", *SERVERS["prompt lookup"]) as lookup,
    ):
        yield {
            name: openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)
            for name, server in zip(SERVERS, (plain, draft, lookup))
        }


def _ask(client, question: str, schema: dict | None, max_tokens: int = 64, **options) -> tuple[str, str]:
    reply = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": question}],
                                           max_tokens=max_tokens, temperature=options.pop("temperature", 0),
                                           response_format=_format(schema), **options)  # fmt: skip
    return reply.choices[0].message.content, reply.choices[0].finish_reason


def test_json_schema_answers_parse_and_equal_the_plain_servers(clients):
    for question, schema in zip(QUESTIONS, (PERSON, FLAG, PERSON)):
        answers = {name: _ask(client, question, schema) for name, client in clients.items()}
        text, finish = answers["plain"]
        assert finish == "stop", text
        jsonschema.validate(json.loads(text), schema)
        for name, answer in answers.items():
            assert answer == answers["plain"], (name, question)


def test_concurrent_requests_with_different_schemas_share_the_batch(clients):
    """Three requests at once on each server (two schemas and json_object, rows of one batch): each answer is the
    one the plain server gives it, and a json_object answer opens an object."""
    asked = [(QUESTIONS[0], PERSON), (QUESTIONS[1], FLAG), (QUESTIONS[2], None)]
    answers = {}
    for name, client in clients.items():
        with concurrent.futures.ThreadPoolExecutor(len(asked)) as pool:
            answers[name] = list(pool.map(lambda item, c=client: _ask(c, *item, max_tokens=32), asked))
    for name in clients:
        assert answers[name] == answers["plain"], name
    for (_, schema), (text, finish) in zip(asked, answers["plain"]):
        assert text.startswith("{"), text
        if finish == "stop":
            jsonschema.validate(json.loads(text), schema or {"type": "object"})


def test_seeded_sampled_answers_repeat_and_parse(clients):
    client = clients["draft model"]
    first, second = (_ask(client, QUESTIONS[0], PERSON, temperature=0.9, seed=5) for _ in range(2))
    assert first == second
    if first[1] == "stop":
        jsonschema.validate(json.loads(first[0]), PERSON)


@pytest.mark.parametrize(
    "response_format,param",
    [
        ({"type": "yaml"}, "response_format.type"),
        ({"type": "json_schema"}, "response_format.json_schema"),
        ({"type": "json_schema", "json_schema": {"schema": PERSON}}, "response_format.json_schema.name"),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}, "response_format.json_schema.schema"),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}},
         "response_format.json_schema.schema"),
        ({"type": "json_object", "schema": {}}, "response_format.schema"),
    ],
)  # fmt: skip
def test_bad_response_formats_are_refused_by_field(clients, response_format, param):
    with pytest.raises(openai.BadRequestError) as caught:
        clients["plain"].chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=4, response_format=response_format)  # fmt: skip
    assert caught.value.body["param"] == param, caught.value.body
