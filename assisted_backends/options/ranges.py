"""The range and combination rules of `generate`'s options, each written once, in plain Python.

No torch here: the CLI checks its flags with these same functions before anything heavy is imported,
and renders the errors (`OptionError`) with its own flag names. Integral floats (5.0) are refused as
ints: the fix (`int(...)`) is the caller's, and nothing is truncated silently. Here too: the drafting a call
asked for, stated (`DraftingRequest`, from `check_drafting`), streaming with a batch, what a queue takes, and
the buffer's capacity and the target's lengths (`capacity_and_keys`, `check_target_length`). The checks are
named in `options.fields.RANGE_CHECKS`.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from assisted_backends.options.errors import refusal
from assisted_backends.options.fields import DRAFTING_OPTIONS, QUEUE_REFUSED, SUFFIX_CACHE_REFUSED

LAYOUT_NAMES = ("dynamic", "static")
SCHEDULE_NAMES = ("adaptive", "constant")
AssistantKind = Literal["draft_model", "eagle_head"]  # what `assistant_model` is: a language model, or an EAGLE-3 head
DrafterKind = Literal["none", "draft_model", "eagle", "prompt_lookup", "early_exit", "suffix"]
# The option that asks for each drafter (`DRAFTING_OPTIONS`).
DRAFTER_OPTION: dict[str, str] = {
    "draft_model": "assistant_model", "eagle": "assistant_model", "prompt_lookup": "prompt_lookup_num_tokens",
    "early_exit": "assistant_early_exit", "suffix": "suffix_cache",
}  # fmt: skip
# Per-batch inputs a queue of prompts takes from its prompts itself (`QUEUE_REFUSED`'s reasons).
PER_BATCH = ("input_ids", "attention_mask", "token_type_ids", "position_ids", "streamer")


@dataclass(frozen=True)
class DraftingRequest:
    """The drafter a call asked for, stated (`check_drafting`): `drafter` names it; `lookup_tokens` (prompt lookup,
    or an EAGLE head's lookup matches first), `suffix` (the suffix drafter, or an EAGLE head's suffix matches first),
    `exit_layers` (early exit) and `num_assistant_tokens` (γ) as given, None where not."""

    drafter: DrafterKind = "none"
    lookup_tokens: int | None = None
    exit_layers: int | None = None
    suffix: bool = False
    num_assistant_tokens: int | None = None

    @property
    def option(self) -> str | None:
        """The option that asked for the drafter (None: no drafter)."""
        return DRAFTER_OPTION.get(self.drafter)


def check_integer(name: str, value: Any, minimum: int | None = None) -> int | None:
    """`value` as a Python int (numpy integers accepted), or None; OptionTypeError for a non-integer
    (a bool included), OptionError below `minimum`."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise refusal("integer_type", {"found": f"{type(value).__name__} {value!r}", "option": name}, name=name)
    if minimum is not None and value < minimum:
        raise refusal("integer_minimum", {"minimum": minimum, "value": value}, name=name)
    return int(value)


def check_sampling(
    do_sample: bool | None,
    temperature: float | None,
    top_k: int | None,
    top_p: float | None,
    repetition_penalty: float | None,
) -> None:
    """The sampling parameters' ranges (temperature only matters, and is only checked, when sampling)."""
    if do_sample and temperature is not None and temperature <= 0:
        raise refusal("temperature", {"value": temperature}, name="temperature")
    if top_k is not None and top_k < 0:
        raise refusal("top_k", {"value": top_k}, name="top_k")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise refusal("top_p", {"value": top_p}, name="top_p")
    if repetition_penalty is not None and repetition_penalty <= 0:
        raise refusal("repetition_penalty", {"value": repetition_penalty}, name="repetition_penalty")


def check_drafting(given: Mapping[str, Any]) -> DraftingRequest:
    """At most one way of drafting among `given` (option -> value; None or False: not given), counts in range; the
    request, stated. `assistant_model`'s value is what the assistant is (`AssistantKind`): an EAGLE-3 head
    ("eagle_head") takes prompt lookup or the suffix drafter beside it (a match when there is one, else the head)."""
    chosen = [name for name in DRAFTING_OPTIONS if given.get(name) is not None and given.get(name) is not False]
    head = given.get("assistant_model") == "eagle_head"
    if head and len(chosen) == 2 and {"prompt_lookup_num_tokens", "suffix_cache"} & set(chosen):
        chosen = ["assistant_model"]  # an EAGLE-3 head: a lookup (or suffix) match when there is one, else the head
    if len(chosen) == 2 and "suffix_cache" in chosen:
        other = chosen[0] if chosen[1] == "suffix_cache" else chosen[1]
        raise refusal("drafting_with_suffix", {"reason": SUFFIX_CACHE_REFUSED[other]}, d0=other, d1="suffix_cache")
    if len(chosen) > 1:
        placeholders = {f"d{i}": name for i, name in enumerate(chosen)}
        listed = " and ".join("{" + key + "}" for key in placeholders)
        raise refusal("drafting_several", {"listed": listed}, **placeholders)
    lookup = given.get("prompt_lookup_num_tokens")
    if lookup is not None and (isinstance(lookup, bool) or not isinstance(lookup, numbers.Integral) or lookup < 1):
        raise refusal("lookup_count", {"value": repr(lookup)}, name="prompt_lookup_num_tokens")
    exit_layers = check_integer("assistant_early_exit", given.get("assistant_early_exit"))  # range: at planning
    gamma = check_integer("num_assistant_tokens", given.get("num_assistant_tokens"), minimum=1)
    drafter: DrafterKind = "none"
    if chosen == ["assistant_model"]:
        drafter = "eagle" if head else "draft_model"
    elif chosen:
        drafter = {"prompt_lookup_num_tokens": "prompt_lookup", "assistant_early_exit": "early_exit",
                   "suffix_cache": "suffix"}[chosen[0]]  # fmt: skip
    suffix = given.get("suffix_cache") not in (None, False)
    return DraftingRequest(drafter, None if lookup is None else int(lookup), exit_layers, suffix, gamma)


def check_streaming(streaming: bool, rows: int, rows_option: str = "input_ids") -> None:
    """A streamer follows one sequence: refused with `rows` > 1 prompts (`rows_option` gave them)."""
    if streaming and rows > 1:
        raise refusal("streaming_batch", {"count": rows}, name="streamer", rows=rows_option)


def check_queue_arguments(arguments: Mapping[str, Any], on_finish: Any, live: bool = False) -> None:
    """A queue of prompts pads and positions its prompts itself (`PER_BATCH` refused by name), and calls
    `on_finish(index, tokens)` as each ends; a `live` queue (its batch grows and shrinks) has no static shapes.
    (What the queue cannot serve among the resolved options is refused by planning: `api.plan`.)"""
    for name in PER_BATCH:
        if arguments.get(name) is not None:
            raise refusal("queue_refused", {"reason": QUEUE_REFUSED[name]}, name=name)
    if on_finish is not None and not callable(on_finish):
        raise refusal("queue_on_finish", name="on_finish")
    if live and arguments.get("static_shapes"):
        raise refusal("live_static", name="static_shapes")


def check_shapes(cache_layout: str | None, static_shapes: bool, schedule: str | None, bucket_size: int | None) -> None:
    """Cache layout, static shapes, schedule and bucket size: names known, combinations possible."""
    if cache_layout is not None and cache_layout not in LAYOUT_NAMES:
        raise refusal("not_one_of", {"choices": LAYOUT_NAMES}, name=("cache_layout", cache_layout))
    if static_shapes and cache_layout == "dynamic":
        raise refusal("static_dynamic", shapes=("static_shapes", True), layout=("cache_layout", "dynamic"))
    if schedule is not None and schedule not in SCHEDULE_NAMES:
        raise refusal("not_one_of", {"choices": SCHEDULE_NAMES}, name=("schedule", schedule))
    if schedule == "adaptive" and static_shapes:
        raise refusal("adaptive_static", schedule=("schedule", "adaptive"), constant=("schedule", "constant"))
    check_integer("bucket_size", bucket_size, minimum=1)


def check_early_exit(depth: int | None, layers: int | None) -> None:
    """An early-exit draft of `depth` layers stops before the target's last of `layers` (1 <= depth < layers)."""
    if depth is not None and layers is not None and not 1 <= depth < layers:
        raise refusal("early_exit_range", {"last": layers - 1, "layers": layers, "value": depth},
                      name="assistant_early_exit")  # fmt: skip


def check_positions(prompt_tokens: int, new_tokens: int, limit: int | None, name: str = "max_new_tokens") -> None:
    """The prompt and the new tokens fit the target's `limit` positions (its config's)."""
    if limit is not None and prompt_tokens + new_tokens > limit:
        total = prompt_tokens + new_tokens
        raise refusal("positions", {"prompt": prompt_tokens, "new": new_tokens, "total": total, "limit": limit},
                      name=name)  # fmt: skip


def capacity_and_keys(
    width: int, max_new_tokens: int, gamma: int | None, static_cache: bool, bucket: int
) -> tuple[int, int]:
    """(capacity, keys): the token buffer's columns for prompts `width` columns wide (padding included) and
    `max_new_tokens`, with room for one round's γ + 1 lookahead (1 without a drafter: `gamma` None); the keys a
    model attends over, which is the preallocated static cache (`capacity` rounded up to `bucket`), else at most the
    committed sequence."""
    lookahead = (gamma + 1) if gamma is not None else 1
    capacity = width + max_new_tokens + lookahead
    return capacity, -(-capacity // bucket) * bucket if static_cache else capacity - lookahead


def check_target_length(
    prompt_tokens: int, new_tokens: int, keys: int | None, max_positions: int | None,
    key_limit: tuple[str, int] | None, name: str = "max_new_tokens",
) -> None:  # fmt: skip
    """The prompt and new tokens fit the target's positions (`check_positions`), and the `keys` it attends over
    (padding included) its config's `key_limit` (field, value)."""
    check_positions(prompt_tokens, new_tokens, max_positions, name)
    if keys is not None and key_limit is not None and keys > key_limit[1]:
        raise refusal("key_limit", {"keys": keys, "field": key_limit[0], "limit": key_limit[1]}, name=name)
