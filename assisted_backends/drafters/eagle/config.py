"""`Eagle3Config`: the shape of an EAGLE-3 head and which target layers feed it, read from a published config.json.

Two published layouts describe the same head (one Llama decoder layer whose attention takes 2H inputs):

- the EAGLE authors' (SafeAILab/EAGLE): `"architectures": ["LlamaForCausalLM"]`, fp16 `pytorch_model.bin`
  without `embed_tokens` (the target's embedding is used), features from the inputs of target layers
  2, L//2 and L-3 (`modeling_llama_kv.py` collects the residual stream before those layers);
- SpecForge's (sgl-project/SpecForge): `"architectures": ["LlamaForCausalLMEagle3"]`, bf16
  `model.safetensors` with `embed_tokens`; `eagle_config.eagle_aux_hidden_state_layer_ids` names layer
  *outputs* (default [1, L//2 − 1, L − 4], the same residual stream as the inputs of 2, L//2, L − 3).

vLLM (`llama_eagle3.py`) also reads a top-level `eagle_aux_hidden_state_layer_ids`, as layer *inputs*, and
`norm_before_residual` (the residual taken after `hidden_norm`). Here every choice is normalised to layer
inputs: index k means the residual stream entering target layer k (k = L: the last layer's output, before
the final norm).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SPECFORGE_ARCHITECTURE = "LlamaForCausalLMEagle3"
EAGLE_AUTHORS_ARCHITECTURE = "LlamaForCausalLM"


def default_feature_layers(depth: int) -> tuple[int, int, int]:
    """EAGLE-3's low, middle and high feature: the inputs of layers 2, L//2 and L − 3 (clamped for tiny targets)."""
    low, mid, high = 2, depth // 2, depth - 3
    return tuple(min(max(k, 0), depth - 1) for k in (low, mid, high))  # type: ignore[return-value]


@dataclass(frozen=True)
class Eagle3Config:
    """One EAGLE-3 head.

    H = `hidden_size` (the head's width), H_t = `target_hidden_size` (the target's; fc is [H, 3 H_t]),
    V = `vocab_size` (the target's vocabulary: `t2d` has V entries), V_d = `draft_vocab_size` (rows of `lm_head`).
    `feature_layers`: target layer inputs (see the module docstring), None: the default for the target's depth.
    """

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int | None = None
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    hidden_act: str = "silu"
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 2048
    norm_before_residual: bool = False
    attention_bias: bool = False
    feature_layers: tuple[int, ...] | None = None
    extra: dict = field(default_factory=dict, compare=False, repr=False)  # other fields, written back unchanged

    @property
    def fused_width(self) -> int:
        """3 H_t: the width of the concatenated target features fc reads."""
        return 3 * (self.target_hidden_size or self.hidden_size)

    @property
    def attention_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    def layers_for(self, depth: int) -> tuple[int, ...]:
        """The target layer inputs to capture for a target of `depth` layers."""
        layers = self.feature_layers if self.feature_layers is not None else default_feature_layers(depth)
        bad = [k for k in layers if not 0 <= k <= depth]
        if len(layers) != 3 or bad:
            raise ValueError(
                f"an EAGLE-3 head reads three target layers between 0 and {depth}; its config names {list(layers)}"
            )
        return tuple(layers)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Eagle3Config:
        """Parse a config.json of either published layout (module docstring)."""
        known = {
            "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size",
            "draft_vocab_size", "target_hidden_size", "head_dim", "rms_norm_eps", "hidden_act", "rope_theta",
            "rope_scaling", "max_position_embeddings", "norm_before_residual", "attention_bias",
        }  # fmt: skip
        values = {name: raw[name] for name in known if raw.get(name) is not None}
        values.setdefault("num_key_value_heads", raw["num_attention_heads"])
        values.setdefault("draft_vocab_size", raw["vocab_size"])
        return cls(
            **values, feature_layers=_feature_layers(raw), extra={k: v for k, v in raw.items() if k not in known}
        )

    @classmethod
    def from_file(cls, path: str | Path) -> Eagle3Config:
        return cls.from_dict(json.loads(Path(path).read_text()))

    def to_dict(self, target_layers: int | None = None) -> dict[str, Any]:
        """config.json in SpecForge's layout (`LlamaForCausalLMEagle3`, one layer, feature layers as outputs)."""
        values = {k: v for k, v in asdict(self).items() if k not in ("extra", "feature_layers") and v is not None}
        config = {**self.extra, **values}
        config.update(architectures=[SPECFORGE_ARCHITECTURE], model_type="llama", num_hidden_layers=1)
        layers = self.feature_layers
        if layers is None and target_layers is not None:
            layers = default_feature_layers(target_layers)
        if layers is not None:
            eagle = dict(config.get("eagle_config") or {})
            eagle.update(eagle_aux_hidden_state_layer_ids=[k - 1 for k in layers], use_aux_hidden_state=True)
            config["eagle_config"] = eagle
            config.pop("eagle_aux_hidden_state_layer_ids", None)
        return config


def _feature_layers(raw: dict[str, Any]) -> tuple[int, ...] | None:
    """Layer inputs from vLLM's top-level ids (inputs) or SpecForge's `eagle_config` ids (outputs: + 1)."""
    if raw.get("eagle_aux_hidden_state_layer_ids"):
        return tuple(int(k) for k in raw["eagle_aux_hidden_state_layer_ids"])
    eagle = raw.get("eagle_config") or {}
    if eagle.get("eagle_aux_hidden_state_layer_ids"):
        return tuple(int(k) + 1 for k in eagle["eagle_aux_hidden_state_layer_ids"])
    return None
