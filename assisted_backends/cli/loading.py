"""The CLI's model choice: the draft the seed scripts pair with each target family when none is given
(no torch at import: `preflight` asks it before anything loads)."""

from __future__ import annotations

from assisted_backends.cli.errors import CLIError

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


def default_assistant(target: str, family: str | None = None) -> str:
    """The seed scripts' draft for the target's family (read from its config unless given), or an error listing
    the options."""
    if family is None:
        from assisted_backends.loading.models import model_type

        family = model_type(target, "-m/--model")
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
