"""Loading models and tokenizers for the CLI, with one-line errors instead of tracebacks.

`-m` and `--assistant-model` take a saved model directory, a `.gguf` file or a directory holding one
(converted once and cached, `loading.files`), or a Hub id (local cache first).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from assisted_backends import hf_compat
from assisted_backends.cli.errors import CLIError
from assisted_backends.loading import files as model_files

# The draft the seed scripts pair with each target family when none is given.
DEFAULT_ASSISTANTS = {
    "opt": "facebook/opt-125m",
    "llama": "PY007/TinyLlama-1.1B-intermediate-step-715k-1.5T",
    "gpt_bigcode": "bigcode/tiny_starcoder_py",
}
TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@functools.lru_cache(maxsize=8)
def _resolve(name: str, what: str) -> str:
    """A saved model directory as is; a `.gguf` file or a directory holding one as its cached converted
    directory (`loading.files`); a Hub id unchanged (local cache first); a one-line error otherwise."""
    try:
        return model_files.model_dir(name, what)
    except (model_files.ModelFileError, model_files.MissingGGUFError) as error:
        raise CLIError(str(error)) from None


def _offline_hint(name: str, what: str) -> str:
    return (
        f"{what} {name!r} is not on disk and could not be downloaded (this machine may be offline): "
        f"download it where the Hub is reachable (`hf download {name}`) and pass its directory to {what}"
    )


def load_model(name: str, what: str, torch_dtype: torch.dtype | None) -> PreTrainedModel:
    """`AutoModelForCausalLM.from_pretrained`, trying the local cache first."""
    resolved = _resolve(name, what)
    kwargs = hf_compat.dtype_kwargs(torch_dtype)  # `dtype=` or, before transformers 4.56, `torch_dtype=`
    try:
        return AutoModelForCausalLM.from_pretrained(resolved, local_files_only=True, **kwargs).eval()
    except (OSError, ValueError) as local_error:
        if Path(resolved).is_dir():
            raise CLIError(f"cannot load {what} from {resolved}: {local_error}") from None
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise CLIError(_offline_hint(name, what))
    try:
        return AutoModelForCausalLM.from_pretrained(resolved, **kwargs).eval()
    except OSError:
        raise CLIError(_offline_hint(name, what)) from None


def load_tokenizer(name: str, what: str):
    resolved = _resolve(name, what)
    try:
        return AutoTokenizer.from_pretrained(resolved, local_files_only=True)
    except (OSError, ValueError):
        if Path(resolved).is_dir() or os.environ.get("HF_HUB_OFFLINE") == "1":
            raise CLIError(f"no tokenizer found for {what} {name!r}; save the tokenizer next to the model") from None
    try:
        return AutoTokenizer.from_pretrained(resolved)
    except OSError:
        raise CLIError(_offline_hint(name, what)) from None


def model_type(name: str) -> str:
    """The `model_type` in a model's config.json (read without loading weights)."""
    from transformers import AutoConfig

    resolved = _resolve(name, "-m/--model")
    try:
        return AutoConfig.from_pretrained(resolved, local_files_only=Path(resolved).is_dir()).model_type
    except OSError:
        raise CLIError(_offline_hint(name, "-m/--model")) from None


def default_assistant(target: str) -> str:
    """The seed scripts' draft for the target's family, or an error listing the options."""
    family = model_type(target)
    if family not in DEFAULT_ASSISTANTS:
        options = ", ".join(f"{k} -> {v}" for k, v in DEFAULT_ASSISTANTS.items())
        raise CLIError(
            f"no default draft for a {family!r} target; pass --assistant-model DIR (any causal LM; another tokenizer "
            f"works too), --prompt-lookup N, --assistant-early-exit N, or --no-assisted. Defaults exist for: {options}"
        )
    return DEFAULT_ASSISTANTS[family]
