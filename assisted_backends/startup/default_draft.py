"""The draft the seed scripts pair with each target family when none is given, and where none suits or none is on
this machine, suffix decoding (no draft model) instead: decided from the family and size the files state (no torch,
no download), before anything loads (`cli.preflight`) or, for a target whose files said nothing, once it is open."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from assisted_backends.startup.errors import CLIError

DEFAULT_ASSISTANTS = {
    "opt": "facebook/opt-125m",
    "llama": "PY007/TinyLlama-1.1B-intermediate-step-715k-1.5T",
    "gpt_bigcode": "bigcode/tiny_starcoder_py",
}
# Their sizes, so that a default is never offered to a target it is not smaller than (known without downloading).
DEFAULT_ASSISTANT_PARAMETERS = {
    "facebook/opt-125m": 125_000_000,
    "PY007/TinyLlama-1.1B-intermediate-step-715k-1.5T": 1_100_000_000,
    "bigcode/tiny_starcoder_py": 164_000_000,
}


def default_assistant(family: str | None) -> str:
    """The seed scripts' draft for the target's family, or an error listing the options."""
    if family not in DEFAULT_ASSISTANTS:
        options = ", ".join(f"{k} -> {v}" for k, v in DEFAULT_ASSISTANTS.items())
        raise CLIError(
            f"no default draft for a {family!r} target; pass --assistant-model DIR (any causal LM; another tokenizer "
            f"works too), --prompt-lookup N, --assistant-early-exit N, or --no-assisted. Defaults exist for: {options}"
        )
    return DEFAULT_ASSISTANTS[family]


def too_large_default(draft: str, target_parameters: int | None, family: str) -> CLIError | None:
    """The error for a default draft that is not smaller than its target (None when it is, or sizes are unknown):
    a draft as large as its target cannot be faster; prompt lookup needs no draft model."""
    draft_parameters = DEFAULT_ASSISTANT_PARAMETERS.get(draft)
    if draft_parameters is None or target_parameters is None or draft_parameters < target_parameters:
        return None
    return CLIError(
        f"no --assistant-model given, and this {family} target ({_count(target_parameters)} parameters) is not "
        f"larger than its family's usual draft {draft} ({_count(draft_parameters)}): a draft must be "
        "smaller than its target. Use --prompt-lookup 10 (drafts from the prompt, no draft model), "
        "--assistant-model DIR (a smaller model), --assistant-early-exit N, or --no-assisted"
    )


def _count(parameters: int) -> str:
    """135M, 1.1B, 112K."""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if parameters >= scale:
            return f"{parameters / scale:.3g}{suffix}"
    return str(parameters)


@dataclass(frozen=True)
class DefaultDrafting:
    """What `-m` without a drafter drafts with: the family's usual `draft` (on this machine and smaller than the
    target), else suffix decoding, with the `reason` there is no draft model."""

    draft: str | None
    reason: str | None = None

    def note(self) -> str:
        """The run report's one line for the suffix default."""
        return (
            f"note: drafting by suffix decoding (no draft model: {self.reason}); it drafts from this run's prompts "
            "and outputs and decodes plainly where nothing matches. --assistant-model DIR, --prompt-lookup N, "
            "--assistant-early-exit N or --no-assisted to choose otherwise"
        )


def is_local(draft: str) -> bool:
    """Whether the draft is on this machine (a directory, or a Hub id in the local cache): never a download."""
    from huggingface_hub import try_to_load_from_cache

    return Path(draft).is_dir() or isinstance(try_to_load_from_cache(draft, "config.json"), str)


def default_drafting(family: str | None, target_parameters: int | None) -> DefaultDrafting:
    """The family's usual draft where it suits and is here, else suffix decoding and why (no torch, no network)."""
    try:
        draft = default_assistant(family)
    except CLIError:
        known = ", ".join(f"{k} -> {v}" for k, v in DEFAULT_ASSISTANTS.items())
        return DefaultDrafting(None, f"no default draft for a {family!r} target; defaults exist for: {known}")
    if too_large_default(draft, target_parameters, family or "") is not None:
        return DefaultDrafting(
            None,
            f"this {family} target ({_count(target_parameters)} parameters) is not larger than its family's usual "
            f"draft {draft} ({_count(DEFAULT_ASSISTANT_PARAMETERS[draft])})",
        )
    if not is_local(draft):
        return DefaultDrafting(
            None,
            f"this target's default draft {draft} is not on this machine and is never downloaded implicitly; "
            f"`hf download {draft}` once, or pass --assistant-model {draft}",
        )
    return DefaultDrafting(draft)
