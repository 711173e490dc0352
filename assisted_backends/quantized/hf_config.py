"""A transformers config from GGUF metadata, as transformers builds it, without its slow reader.

transformers turns GGUF metadata into a config in `modeling_gguf_pytorch_utils.load_gguf_checkpoint`:
rename `<arch>.<key>` through `GGUF_TO_TRANSFORMERS_MAPPING["config"]`, add the per-architecture
defaults, tie the embeddings when the file has no `output.weight`, read the vocabulary size from the
token list, and call Gemma 3 `gemma3_text`. That function parses the whole file with
`gguf.GGUFReader` (13-18 s for a 262k-token vocabulary here); the same mapping tables applied to
`gguf_header.read_header`'s metadata take milliseconds. Architectures whose config transformers
assembles with extra code (listed in `_SPECIAL`) go through transformers' own path instead. `load_config` checks
the file against the config it builds (`file_checks`) before anything reads a tensor.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from assisted_backends.quantized import file_checks
from assisted_backends.quantized.gguf_header import GGUFHeader

# Architectures load_gguf_checkpoint special-cases beyond renaming (t5 family, stablelm, lfm2, MoE, gpt-oss).
_SPECIAL = ("t5", "t5encoder", "stablelm", "lfm2", "qwen2moe", "qwen3moe", "gpt-oss", "gpt_oss", "minimax-m2")
_UPDATED = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "gpt-oss": "gpt_oss", "minimax-m2": "minimax_m2"}
_TEXT_ONLY = {"gemma3": "gemma3_text", "gemma4": "gemma4_text"}


def _plain(value: object) -> object:
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, list) and len(value) == 1:
        return value[0]
    return value


def config_dict(header: GGUFHeader) -> dict:
    """The dict transformers' GGUF loader would give to `AutoConfig.for_model`; sizes no model can have (no layers,
    heads, vocabulary; heads that do not divide; an odd head size) refused first (`file_checks.check_config`)."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_CONFIG_DEFAULTS_MAPPING, GGUF_TO_TRANSFORMERS_MAPPING

    architecture = header.architecture
    name = str(header.metadata.get("general.name", ""))
    updated = "mistral" if "llama" in architecture and "mistral" in name.lower() else architecture
    updated = _UPDATED.get(updated, updated)
    config: dict = {"tie_word_embeddings": "output.weight" not in header.tensors or architecture in ("falcon", "bloom")}
    for key, value in (
        GGUF_CONFIG_DEFAULTS_MAPPING.get(updated) or GGUF_CONFIG_DEFAULTS_MAPPING.get(architecture) or {}
    ).items():
        config.setdefault(key, value)
    renames = GGUF_TO_TRANSFORMERS_MAPPING["config"]
    read: dict[str, str] = {}  # GGUF key -> the config field it becomes
    for original, value in header.metadata.items():
        key = original.replace(architecture, updated)
        prefix, _, rest = key.partition(".")
        target = renames.get(prefix, {}).get(rest)
        if target is None or target == -1 or value is None:
            continue
        read[original] = target
        value = _plain(value)
        if isinstance(value, str) and architecture in value:
            value = value.replace(architecture, updated)
        config[target] = value
    config["model_type"] = _TEXT_ONLY.get(config.get("model_type"), config.get("model_type"))
    if "vocab_size" not in config:
        count = header.array_length("tokenizer.ggml.tokens")
        if count is not None:
            config["vocab_size"] = count
    file_checks.check_metadata(header, read)  # values of the wrong kind, before transformers' config takes them
    file_checks.check_config(header, config)  # sizes no model can have, before transformers divides by them
    return config


def load_config(header: GGUFHeader):
    """A transformers PretrainedConfig for the GGUF file `header` describes, once the file's sizes and every tensor
    are checked against it (`file_checks`: a `GGUFModelError`, one line, for a file that does not fit)."""
    from transformers import AutoConfig

    special = header.architecture in _SPECIAL
    values = {} if special else config_dict(header)  # checked already: counts of 0, heads that do not divide, ...
    try:
        if special:
            path = Path(header.path)
            config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
        else:
            config = AutoConfig.for_model(**values)
    except Exception as error:  # noqa: BLE001 - transformers' validation raises its own kinds, over several lines
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        reason = (" ".join(lines[:2]) or type(error).__name__)[:300]
        kind = values.get("model_type", header.architecture)
        raise file_checks.GGUFModelError(
            header.path, "metadata", f"transformers cannot build a {kind} config from it ({reason})"
        ) from None
    file_checks.check_file(header, config)
    return config
