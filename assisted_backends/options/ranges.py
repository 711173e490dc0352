"""The range and combination rules of `generate`'s options, each written once, in plain Python.

No torch here: the CLI checks its flags with these same functions before anything heavy is imported,
and renders the errors (`OptionError`) with its own flag names. Integral floats (5.0) are refused as
ints: the fix (`int(...)`) is the caller's, and nothing is truncated silently.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

from assisted_backends.options.errors import OptionError, OptionTypeError
from assisted_backends.options.fields import SUFFIX_CACHE_REFUSED

LAYOUT_NAMES = ("dynamic", "static")
SCHEDULE_NAMES = ("adaptive", "constant")
DRAFTING_OPTIONS = ("assistant_model", "prompt_lookup_num_tokens", "assistant_early_exit", "suffix_cache")


def check_integer(name: str, value: Any, minimum: int | None = None) -> int | None:
    """`value` as a Python int (numpy integers accepted), or None; OptionTypeError for a non-integer
    (a bool included), OptionError below `minimum`."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise OptionTypeError(
            f"{{name}} must be an int, got {type(value).__name__} {value!r}; pass {name}=int(...)", name=name
        )
    if minimum is not None and value < minimum:
        raise OptionError(f"{{name}} must be >= {minimum}, got {value}", name=name)
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
        raise OptionError(
            f"{{name}} must be > 0 when sampling, got {temperature}; use greedy decoding for temperature 0",
            name="temperature",
        )
    if top_k is not None and top_k < 0:
        raise OptionError(f"{{name}} must be >= 0 (0 keeps every token), got {top_k}", name="top_k")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise OptionError(f"{{name}} must be in (0, 1], got {top_p}", name="top_p")
    if repetition_penalty is not None and repetition_penalty <= 0:
        raise OptionError(f"{{name}} must be > 0 (1.0 = none), got {repetition_penalty}", name="repetition_penalty")


def check_drafting(given: Mapping[str, Any]) -> None:
    """At most one way of drafting among `given` (option -> value, None: not given); counts in range."""
    chosen = [name for name in DRAFTING_OPTIONS if given.get(name) not in (None, False)]
    free = {"prompt_lookup_num_tokens", "suffix_cache"}  # draft-free sources an EAGLE-3 head can put first
    if (
        len(chosen) == 2
        and "assistant_model" in chosen
        and free & set(chosen)
        and getattr(given["assistant_model"], "takes_prompt_lookup", False)
    ):
        chosen = ["assistant_model"]  # an EAGLE-3 head: a lookup (or suffix) match when there is one, else the head
    if len(chosen) == 2 and "suffix_cache" in chosen:
        other = chosen[0] if chosen[1] == "suffix_cache" else chosen[1]
        raise OptionError(
            f"choose one way of drafting, got {{d0}} and {{d1}}: {SUFFIX_CACHE_REFUSED[other]}",
            d0=other,
            d1="suffix_cache",
        )
    if len(chosen) > 1:
        placeholders = {f"d{i}": name for i, name in enumerate(chosen)}
        listed = " and ".join("{" + key + "}" for key in placeholders)
        raise OptionError(f"choose one way of drafting, got {listed}", **placeholders)
    lookup = given.get("prompt_lookup_num_tokens")
    if lookup is not None and (isinstance(lookup, bool) or not isinstance(lookup, numbers.Integral) or lookup < 1):
        raise OptionError(
            f"{{name}} must be an integer >= 1 (tokens proposed per round), got {lookup!r}",
            name="prompt_lookup_num_tokens",
        )
    check_integer("assistant_early_exit", given.get("assistant_early_exit"))  # its range needs the depth: planning
    check_integer("num_assistant_tokens", given.get("num_assistant_tokens"), minimum=1)


def check_shapes(cache_layout: str | None, static_shapes: bool, schedule: str | None, bucket_size: int | None) -> None:
    """Cache layout, static shapes, schedule and bucket size: names known, combinations possible."""
    if cache_layout is not None and cache_layout not in LAYOUT_NAMES:
        raise OptionError(f"{{name}} is not one of {LAYOUT_NAMES}", name=("cache_layout", cache_layout))
    if static_shapes and cache_layout == "dynamic":
        raise OptionError(
            "{shapes} needs the static cache layout; drop {layout}",
            shapes=("static_shapes", True),
            layout=("cache_layout", "dynamic"),
        )
    if schedule is not None and schedule not in SCHEDULE_NAMES:
        raise OptionError(f"{{name}} is not one of {SCHEDULE_NAMES}", name=("schedule", schedule))
    if schedule == "adaptive" and static_shapes:
        raise OptionError(
            "{schedule} varies γ, which static shapes forbid; use {constant}",
            schedule=("schedule", "adaptive"),
            constant=("schedule", "constant"),
        )
    check_integer("bucket_size", bucket_size, minimum=1)


def check_early_exit(depth: int | None, layers: int | None) -> None:
    """An early-exit draft of `depth` layers stops before the target's last of `layers` (1 <= depth < layers)."""
    if depth is not None and layers is not None and not 1 <= depth < layers:
        raise OptionError(
            f"{{name}} must be between 1 and {layers - 1} (the target has {layers} layers), got {depth}",
            name="assistant_early_exit",
        )


def check_positions(prompt_tokens: int, new_tokens: int, limit: int | None, name: str = "max_new_tokens") -> None:
    """The prompt and the new tokens fit the target's `limit` positions (its config's)."""
    if limit is not None and prompt_tokens + new_tokens > limit:
        raise OptionError(
            f"prompt ({prompt_tokens} tokens) + {{name}} ({new_tokens}) = {prompt_tokens + new_tokens} exceeds the "
            f"target's {limit} positions; shorten the prompt or lower {{name}}",
            name=name,
        )
