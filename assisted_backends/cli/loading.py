"""The CLI's model choice: the draft the seed scripts pair with each target family when none is given
(no torch at import: `preflight` asks it before anything loads)."""

from __future__ import annotations

from assisted_backends.cli.errors import CLIError

DEFAULT_ASSISTANTS = {
    "opt": "facebook/opt-125m",
    "llama": "PY007/TinyLlama-1.1B-intermediate-step-715k-1.5T",
    "gpt_bigcode": "bigcode/tiny_starcoder_py",
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
