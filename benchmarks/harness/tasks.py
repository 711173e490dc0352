"""The real-model benchmarks' three tasks: `edit` (add type hints and docstrings to a given function),
`summarize` (a given passage, with quotes) and `open` (a short story), as token ids for a tokenizer."""

from __future__ import annotations

import torch

FUNCTION = """def merge_intervals(intervals, gap=0):
    result = []
    for start, end in sorted(intervals):
        if result and start - result[-1][1] <= gap:
            previous_start, previous_end = result[-1]
            result[-1] = (previous_start, max(previous_end, end))
        else:
            result.append((start, end))
    return result


def total_covered(intervals, gap=0):
    merged = merge_intervals(intervals, gap)
    return sum(end - start for start, end in merged)
"""

PASSAGE = (
    "The harbour master kept two ledgers. The first recorded every ship that entered the bay: its name, "
    "its cargo, the hour it dropped anchor. The second, which he showed to no one, recorded the ships "
    'that never arrived. "A ledger of absences," his daughter called it when she found it after his '
    "death, and she read it through one winter night. Some entries were a single line: a schooner out of "
    "Lisbon, expected in March, never seen. Others ran for pages, with letters from wives and owners "
    'pasted between the leaves. On the last page he had written: "Every ship is late until it is lost, '
    'and lost only when we stop waiting." She closed the book, and in the morning she took his place at '
    "the window above the quay, with both ledgers open on the desk."
)

TASKS = {
    "edit": "Add type hints and a one-line docstring to each function below. Return the full code.\n\n"
    f"```python\n{FUNCTION}```\n",
    "summarize": "Summarize the following passage in three sentences, quoting its two most important "
    f"sentences word for word.\n\n{PASSAGE}\n",
    "open": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
}


def prompt_ids(tokenizer, task: str) -> torch.Tensor:
    text = TASKS[task]
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )["input_ids"]
    return tokenizer(text, return_tensors="pt").input_ids
