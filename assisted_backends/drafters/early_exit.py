"""Self-speculative drafting: the target's own first N layers, its final norm and its head.

`early_exit_view(model, n)` builds a second model object that *shares* every weight with the target
(no copy, no extra memory for weights) but runs only decoder layers 0..n−1 before the final norm and
the LM head. It works for any causal LM whose decoder layers sit in one `nn.ModuleList` of
`num_hidden_layers` entries (Llama, Mistral, Qwen, OPT, GPT-2, GPTBigCode, ...). The view keeps its own
KV cache of n layers, so a draft step costs about n / L of a target step. Acceptance is highest for
models trained with early-exit losses (LayerSkip); for others it is what it is, and the target's
verification keeps the output exact either way.

`EarlyExitDrafter` does not compute the committed tokens' keys and values a second time: layers
0..n−1 of the target's cache hold them already (same weights, same inputs), so the view's prompt pass
and its catch-up after plain rounds are copies of the target's cache (dynamic layout; the static one
feeds them). Measured on SmolLM2-135M (189-token prompt, 12 of 30 layers): that prompt pass cost
about 8 decode steps, most of what trying the draft cost in a 64-token run.
"""

from __future__ import annotations

import copy

import torch
from transformers import PreTrainedModel

from assisted_backends import hf_compat
from assisted_backends.drafters.draft_model import ModelDrafter
from assisted_backends.engine.drafter import Proposal
from assisted_backends.engine.runner import ModelRunner
from assisted_backends.engine.sampling import TokenSelector
from assisted_backends.engine.slots import Slots


def decoder_layers_path(model: torch.nn.Module) -> str:
    """Dotted path of the `nn.ModuleList` holding the decoder layers, e.g. 'model.layers' or 'transformer.h'."""
    depth = hf_compat.text_config(model).num_hidden_layers
    candidates = [
        name
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.ModuleList) and len(module) == depth
    ]
    if not candidates:
        raise NotImplementedError(
            f"{type(model).__name__}: no list of {depth} decoder layers found; assistant_early_exit needs one"
        )
    return min(candidates, key=lambda name: name.count("."))


def _detached_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A shallow copy whose module/parameter/hook dictionaries are its own (the tensors stay shared)."""
    clone = copy.copy(module)
    for key, value in vars(module).items():
        if isinstance(value, dict):
            setattr(clone, key, copy.copy(value))
    return clone


def early_exit_view(model: PreTrainedModel, layers: int) -> PreTrainedModel:
    """`model` truncated to its first `layers` decoder layers (1 <= layers < depth), sharing all weights with it.
    A model stepped by the native decoder (`native.decoder_model`) gives the same native step over its reference's
    first layers."""
    reference = getattr(model, "reference", None)
    if reference is not None and hasattr(model, "new_native_cache"):
        return type(model)(early_exit_view(reference, layers))
    config = copy.deepcopy(model.config)
    text_config = hf_compat.text_config_of(config)
    text_config.num_hidden_layers = layers
    if isinstance(getattr(text_config, "layer_types", None), list):
        text_config.layer_types = text_config.layer_types[:layers]

    *parents, leaf = decoder_layers_path(model).split(".")
    view = _detached_copy(model)
    holder = view
    for name in parents:
        child = _detached_copy(getattr(holder, name))
        holder._modules[name] = child
        holder = child
    holder._modules[leaf] = torch.nn.ModuleList(list(getattr(holder, leaf))[:layers])
    for module in [view, *(view.get_submodule(".".join(parents[: i + 1])) for i in range(len(parents)))]:
        if hasattr(module, "config"):
            module.config = config if module is view else _config_for(module, config)
    return view


def _config_for(module: torch.nn.Module, config):
    """Sub-models (e.g. LlamaModel inside LlamaForCausalLM) hold the text config."""
    return hf_compat.text_config_of(config) if getattr(module, "config", None) is not None else config


class EarlyExitDrafter(ModelDrafter):
    """Drafts with the target's first `layers` layers (`runner` runs the view), reading the committed
    tokens' keys and values of those layers from the target's cache (`target`) instead of recomputing them."""

    def __init__(self, runner: ModelRunner, target: ModelRunner, layers: int) -> None:
        super().__init__(runner, name="early_exit")
        self.target = target
        self.layers = layers

    def prefill(self, slots: Slots) -> None:
        if not self.runner.extend_from(self.target, self.layers, slots.length - 1):  # the newest stays pending
            super().prefill(slots)

    def propose(self, slots: Slots, gamma: int, selector: TokenSelector, generator: torch.Generator | None) -> Proposal:
        self.runner.extend_from(self.target, self.layers, slots.length - 1)  # catch up on plain rounds
        return super().propose(slots, gamma, selector, generator)

    def insert_row(self, slots: Slots, slot: int, width: int, pad_id: int) -> None:
        """The joining row's keys and values of the first `layers` layers are the target's (same weights, same
        prompt): copied from the target's cache, which took the row first."""
        pad = slots.padding.host[slot]
        held = self.runner.length - pad
        if held <= 0:
            self.runner.layout.set_row_pad(slot, pad)
            return
        self.runner.copy_row_from(self.target, slot, pad, held, self.layers)
