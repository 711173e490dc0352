"""Which models the flags name: without `-m`, the demo pair (its notice, its held-out text); with `-m`, the draft
`--assistant-model` names, or the drafter the model's `generation_config.json` asks for, or the family's default
draft where it suits and is on this machine, or else suffix decoding (said in one line)."""

from __future__ import annotations

import argparse
from pathlib import Path

from assisted_backends.demo.pair import NOTICE, SMOKE_BUDGET, DemoBudget, ensure_demo_pair, shipped_pair
from assisted_backends.loading.open import LoadedModel
from assisted_backends.options.fields import DRAFTER_FIELDS
from assisted_backends.startup.default_draft import default_drafting

SMOKE_NOTICE = (
    "note: using a SMOKE demo pair ({target} target, {draft} draft, a few training steps on a small text sample): "
    "it writes noise; it exists for tests and CI"
)


def demo_models(args: argparse.Namespace, notices: list[str]) -> tuple[str, str | None, str]:
    """(target, draft, held-out text path) of the demo pair (no draft when a flag drafts otherwise)."""
    if args.assistant_model is not None:
        raise ValueError("--assistant-model needs -m/--model (the demo pair brings its own draft)")
    budget = SMOKE_BUDGET if args.demo_pair == "smoke" else DemoBudget()
    pair = shipped_pair() if args.demo_pair == "shipped" else None
    if pair is None:
        pair = ensure_demo_pair(root=Path(args.demo_dir) if args.demo_dir else None, budget=budget)
    notice = SMOKE_NOTICE if args.demo_pair == "smoke" else NOTICE
    notices.append(notice.format(target=_size(budget.target), draft=_size(budget.draft)))
    drafting = args.no_assisted or args.prompt_lookup or args.assistant_early_exit or args.suffix_cache
    return str(pair.target_dir), None if drafting else str(pair.draft_dir), str(pair.held_out_text)


def _size(shape) -> str:
    return f"{shape.layers}-layer x {shape.hidden}"


def draft_for(args: argparse.Namespace, target: LoadedModel, notices: list[str]) -> str | None:
    """The draft model `-m`'s target drafts with (None: none; the suffix default sets `args.suffix_cache`). An
    EAGLE head with lookup or suffix decoding beside it is `--assistant-model` too."""
    lookup_alone = (args.prompt_lookup or args.suffix_cache) and args.assistant_model is None
    if args.no_assisted or lookup_alone or args.assistant_early_exit:
        return None
    if args.assistant_model is not None:
        return args.assistant_model
    saved = target.generation_settings
    if any(saved.get(field) for field in DRAFTER_FIELDS):
        notices.append("note: drafting as the model's generation_config.json asks (" + ", ".join(
            f"{field}={saved[field]}" for field in DRAFTER_FIELDS if saved.get(field)) + ")")  # fmt: skip
        return None
    chosen = getattr(args, "default_drafting", None) or default_drafting(target.model_type, None)
    if chosen.draft is None:  # no suitable draft model at hand: suffix decoding, said in one line
        notices.append(chosen.note())
        args.suffix_cache = True
        return None
    notices.append(f"note: no --assistant-model given; using the default draft for this family: {chosen.draft}")
    return chosen.draft
