"""EAGLE-3 head checkpoints on disk: recognise, load and write both published layouts.

- SpecForge (`LlamaForCausalLMEagle3`): `config.json` + bf16 `model.safetensors`, with `embed_tokens.weight`;
- the EAGLE authors (`LlamaForCausalLM`, one layer, `draft_vocab_size`): `config.json` + fp16
  `pytorch_model.bin`, without `embed_tokens` (the target's embedding is used).

A directory is an EAGLE-3 head when its weights hold `fc.weight` and `midlayer.*` keys (the config alone does
not tell: the EAGLE authors' names a plain `LlamaForCausalLM`). A `.bin` is read with
`torch.load(weights_only=True)` only: a downloaded head is untrusted input, never unpickled as objects.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from assisted_backends.drafters.eagle.config import EAGLE_AUTHORS_ARCHITECTURE, Eagle3Config, default_feature_layers
from assisted_backends.drafters.eagle.head import Eagle3Head
from assisted_backends.drafters.eagle.precision import check_head_precision

SAFETENSORS, PYTORCH_BIN = "model.safetensors", "pytorch_model.bin"
REQUIRED_KEYS = (
    "fc.weight", "midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight",
    "midlayer.post_attention_layernorm.weight", "midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.v_proj.weight", "midlayer.self_attn.o_proj.weight", "midlayer.mlp.gate_proj.weight",
    "midlayer.mlp.up_proj.weight", "midlayer.mlp.down_proj.weight", "norm.weight", "lm_head.weight",
)  # fmt: skip


class HeadCheckpointError(ValueError):
    """A directory that looks like an EAGLE-3 head but cannot be one (missing or unexpected tensors)."""


def weights_file(directory: str | Path) -> Path | None:
    """The head's weights file in `directory` (safetensors first), or None."""
    for name in (SAFETENSORS, PYTORCH_BIN):
        path = Path(directory) / name
        if path.is_file():
            return path
    return None


def _keys(path: Path) -> list[str]:
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as handle:
            return list(handle.keys())
    return list(torch.load(path, map_location="cpu", weights_only=True, mmap=True).keys())


def is_eagle_checkpoint(directory: str | Path) -> bool:
    """Whether `directory` holds an EAGLE-3 head (its weights have `fc.weight` and `midlayer.*`). Only small
    one-layer configs are opened: a full model's directory is never read here."""
    directory = Path(directory)
    config_path, weights = directory / "config.json", weights_file(directory)
    if not directory.is_dir() or not config_path.is_file() or weights is None:
        return False
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError):
        return False
    if config.get("num_hidden_layers") != 1 and "draft_vocab_size" not in config:
        return False
    try:
        keys = _keys(weights)
    except Exception:  # noqa: BLE001 - not readable as a state dict: not a head this loader can use
        return False
    return "fc.weight" in keys and any(key.startswith("midlayer.") for key in keys)


def _state_dict(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise HeadCheckpointError(f"{path}: not a flat dictionary of tensors")
    return state


def load_head(directory: str | Path, dtype: torch.dtype | None = None, precision: str = "auto") -> Eagle3Head:
    """The head in `directory`, in its stored dtype unless `dtype` is given, in eval mode, drafting at `precision`
    ("auto", "float", "bf16", "int8", "int4": `drafters.eagle.precision`)."""
    check_head_precision(precision)
    directory = Path(directory)
    weights = weights_file(directory)
    if weights is None:
        raise HeadCheckpointError(f"{directory}: no {SAFETENSORS} or {PYTORCH_BIN}")
    config = Eagle3Config.from_file(directory / "config.json")
    state = _state_dict(weights)
    missing = [key for key in REQUIRED_KEYS if key not in state]
    if missing:
        raise HeadCheckpointError(f"{directory}: not an EAGLE-3 head, missing {missing}")
    if "d2t" not in state or "t2d" not in state:
        if config.draft_vocab_size != config.vocab_size:
            raise HeadCheckpointError(
                f"{directory}: a draft vocabulary of {config.draft_vocab_size} tokens (target {config.vocab_size}) "
                "needs the d2t and t2d tensors, which the checkpoint lacks"
            )
        state.setdefault("d2t", torch.zeros(config.vocab_size, dtype=torch.long))  # the identity map
        state.setdefault("t2d", torch.ones(config.vocab_size, dtype=torch.bool))
    head = Eagle3Head(config, with_embeddings="embed_tokens.weight" in state)
    expected = set(head.state_dict())
    unexpected = sorted(set(state) - expected)
    if unexpected:
        raise HeadCheckpointError(f"{directory}: tensors this EAGLE-3 head does not have: {unexpected[:8]}")
    stored = state["lm_head.weight"].dtype
    head.to(stored)
    try:
        head.load_state_dict({k: v for k, v in state.items()}, strict=True)
    except RuntimeError as error:  # shapes that disagree with the config
        raise HeadCheckpointError(f"{directory}: the tensors do not fit its config.json: {error}") from None
    head.precision = precision
    head.held_out_alpha = held_out_alpha(directory)
    return head.to(dtype or stored).eval()


TRAINING_RECORD = "training.json"  # what `train-draft` writes beside a head (`train_draft.store`)


def held_out_alpha(directory: Path) -> float | None:
    """α_1 of the head in `directory` on its training run's held-out prompts: the latest evaluation `train-draft`
    wrote to training.json beside it (None for heads trained elsewhere). The schedule's prior for α_1: a head known
    to be rarely right is not drafted with for rounds before its own counts say so."""
    try:
        report = json.loads((directory / TRAINING_RECORD).read_text())
        alpha = float((report.get("latest") or report["untrained"])[0])
    except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None
    return alpha if 0.0 <= alpha <= 1.0 else None


def save_head(
    head: Eagle3Head,
    directory: str | Path,
    layout: str = "specforge",
    target_layers: int | None = None,
    embeddings: torch.Tensor | None = None,
) -> Path:
    """Write `head` in a published layout: "specforge" (bf16 safetensors, `embed_tokens` = `embeddings` or
    the head's own when given) or "eagle" (the EAGLE authors': fp16 `pytorch_model.bin`, no embeddings, config
    `LlamaForCausalLM` with the default feature layers, so only a head using them can be written this way)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu() for k, v in head.state_dict().items()}
    if layout == "specforge":
        if embeddings is not None:
            state["embed_tokens.weight"] = embeddings.detach().cpu()
        state = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v).contiguous() for k, v in state.items()}
        config = head.config.to_dict(target_layers)
        config["torch_dtype"] = "bfloat16"
        from safetensors.torch import save_file

        save_file(state, str(directory / SAFETENSORS), metadata={"format": "pt"})
    elif layout == "eagle":
        if target_layers is not None and head.config.feature_layers not in (
            None,
            default_feature_layers(target_layers),
        ):
            raise ValueError("the EAGLE authors' layout has no field for feature layers other than the defaults")
        state.pop("embed_tokens.weight", None)
        state = {k: (v.to(torch.float16) if v.is_floating_point() else v).contiguous() for k, v in state.items()}
        config = head.config.to_dict()
        config.pop("eagle_config", None)
        config.update(architectures=[EAGLE_AUTHORS_ARCHITECTURE], torch_dtype="float16")
        torch.save(state, directory / PYTORCH_BIN)
    else:
        raise ValueError(f"layout must be 'specforge' or 'eagle', got {layout!r}")
    (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return directory
