"""`ModelFacts`: what planning needs to know about one model, read from it once per call.

Every question the planning step asks a model (vocabulary, position limits, depth, parameter counts,
whether its cache can roll back) is answered here, so the model argument of `generate` is read in
one place and the rest of the call sees a small frozen record.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from assisted_backends import hf_compat

# Set on every model the package quantized (`quantized.linear.quantize_model`, the GGUF loader of `quantized.model`):
# only such a model can hold quantized layers, so callers search no other model for them.
QUANTIZED_MARKER = "quantization_report"

# Config names of a model's position limit; "max_seq_len" (MPT, DBRX) sizes a bias table indexed by key length.
POSITION_LIMIT_NAMES = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")
KEY_LENGTH_LIMIT_NAMES = ("max_seq_len", "context_length")


@dataclass(frozen=True)
class ModelFacts:
    """One model's facts.

    `vocab_size`: the width of its logits (the output head's rows, which may exceed the tokenizer's size);
    `input_vocab_size`: the ids its input embedding can look up (None when it cannot be told);
    `max_positions`: the longest sequence its position encoding supports, when the config states one;
    `position_table`: whether positions past `max_positions` have no encoding at all (a learned table);
    rotary models compute any position and only leave their trained range;
    `key_limit`: (config name, limit) of a bias table indexed by key length (MPT's `max_seq_len`);
    `parameters` / `body_parameters`: counted as the unquantized model has them, the latter without the
    input embeddings and the output head (once if tied): what a pass over a prompt runs per token;
    `rollback_refusal`: why its KV cache cannot move back exactly (None: it can);
    `hidden_size`: the width of its hidden states, when the config states one (an EAGLE head's features
    must have it); `input_embedding_width`: the width of the rows its input embedding can hand out (a weight's
    columns, or a quantized table's `embedding_dim` where it has `unscaled_rows`; None: it cannot hand out rows,
    so an EAGLE head without `embed_tokens` cannot borrow it);
    `weight_bytes`: the bytes of weights a decode step reads (`step_weight_bytes`: quantized layers count their
    packed bytes); `activation_dtype`: its hidden states' dtype; `quantized_kernels`: what its quantized layers
    run on ({"blocks"}: the package's kernels, {"aten"}: PyTorch's, empty: none quantized).
    """

    name: str
    vocab_size: int
    input_vocab_size: int | None
    layers: int
    max_positions: int | None
    position_table: bool
    key_limit: tuple[str, int] | None
    parameters: int
    body_parameters: int
    rollback_refusal: str | None
    hidden_size: int | None = None
    input_embedding_width: int | None = None
    weight_bytes: int | None = None
    activation_dtype: torch.dtype | None = None
    quantized_kernels: frozenset[str] = frozenset()

    @classmethod
    def of(cls, model: torch.nn.Module) -> ModelFacts:
        config = hf_compat.text_config(model)
        positions = next(
            (v for n in POSITION_LIMIT_NAMES if isinstance(v := getattr(config, n, None), int) and v > 0), None
        )
        keys = next(
            ((n, v) for n in KEY_LENGTH_LIMIT_NAMES if isinstance(v := getattr(config, n, None), int) and v > 0), None
        )
        parameters = logical_parameter_count(model)
        matrices = dict(_matrix_size(m) for m in (_input_embeddings(model), _output_embeddings(model)))
        return cls(
            name=type(model).__name__,
            vocab_size=_vocab_size(model, config),
            input_vocab_size=_input_vocab_size(model, config),
            layers=int(getattr(config, "num_hidden_layers", 0) or 0),
            max_positions=positions,
            position_table=_has_position_table(model, positions),
            key_limit=keys,
            parameters=parameters,
            body_parameters=max(parameters - sum(matrices.values()), 1),
            rollback_refusal=hf_compat.rollback_refusal(model),
            hidden_size=hidden if isinstance(hidden := getattr(config, "hidden_size", None), int) else None,
            input_embedding_width=_embedding_width(_input_embeddings(model)),
            weight_bytes=step_weight_bytes(model),
            activation_dtype=hf_compat.activation_dtype(model),
            quantized_kernels=quantized_kernels(model),
        )

    def check_rollback(self, role: str) -> None:
        """NotImplementedError naming the `role` when its cache cannot roll back."""
        if self.rollback_refusal is not None:
            raise NotImplementedError(f"the {role} ({self.name}) {self.rollback_refusal}")


def _embedding_width(embedding: torch.nn.Module | None) -> int | None:
    """The width of the rows `embedding` hands out: its weight's columns, or a quantized table's `embedding_dim`
    (`unscaled_rows`); None when it has neither."""
    weight = getattr(embedding, "weight", None)
    if isinstance(weight, torch.Tensor):
        return int(weight.shape[-1])
    if callable(getattr(embedding, "unscaled_rows", None)):
        return int(embedding.embedding_dim)
    return None


def _input_embeddings(model: torch.nn.Module) -> torch.nn.Module | None:
    get = getattr(model, "get_input_embeddings", None)
    return get() if callable(get) else None


def _output_embeddings(model: torch.nn.Module) -> torch.nn.Module | None:
    get = getattr(model, "get_output_embeddings", None)
    return get() if callable(get) else None


def _vocab_size(model: torch.nn.Module, config) -> int:
    head = _output_embeddings(model)
    out_features = getattr(head, "out_features", None)  # also right for quantized or prepacked (IPEX) heads
    if isinstance(out_features, int):
        return out_features
    weight = getattr(head, "weight", None)
    if isinstance(weight, torch.Tensor):
        return int(weight.shape[0])
    return int(config.vocab_size)


def _input_vocab_size(model: torch.nn.Module, config) -> int | None:
    embeddings = _input_embeddings(model)
    rows = getattr(embeddings, "num_embeddings", None)
    if isinstance(rows, int):
        return rows
    weight = getattr(embeddings, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.dim() == 2:
        return int(weight.shape[0])
    return getattr(config, "vocab_size", None)


def _has_position_table(model: torch.nn.Module, positions: int | None) -> bool:
    """Whether the model looks positions up in a learned table (GPT-2's `wpe`, OPT's offset table): an
    embedding other than the token embedding with `positions` rows (OPT adds 2)."""
    if positions is None:
        return False
    tokens = _input_embeddings(model)
    return any(
        isinstance(module, torch.nn.Embedding)
        and module is not tokens
        and module.num_embeddings in (positions, positions + 2)
        for module in model.modules()
    )


def logical_parameter_count(model: torch.nn.Module) -> int:
    """Parameters as the unquantized model has them: nn.Parameters (shared ones once) plus
    in_features × out_features (+ out_features with a bias) for linear layers whose weights are
    packed buffers instead (int8/int4 layers, prepacked IPEX layers)."""
    total = sum(p.numel() for p in model.parameters())
    for module in model.modules():
        rows, cols = getattr(module, "out_features", None), getattr(module, "in_features", None)
        if not (isinstance(rows, int) and isinstance(cols, int)):
            continue
        if isinstance(getattr(module, "weight", None), torch.nn.Parameter):
            continue  # counted above
        bias = getattr(module, "bias", None)
        has_bias = (callable(bias) and bias() is not None) or isinstance(bias, torch.Tensor)
        total += rows * cols + (rows if has_bias and not isinstance(bias, torch.nn.Parameter) else 0)
    return total


def quantized_kernels(model: torch.nn.Module) -> frozenset[str]:
    """The kernels a quantized model's layers run on (their `kernel`: "blocks" for the package's, "aten" for
    PyTorch's); empty for a model the package did not quantize (no `QUANTIZED_MARKER`)."""
    if not hasattr(model, QUANTIZED_MARKER):
        return frozenset()
    return frozenset(kind for m in model.modules() if isinstance(kind := getattr(m, "kernel", None), str))


def _tensor_key(tensor: torch.Tensor) -> tuple[int, int]:
    pointer = tensor.data_ptr() if tensor.device.type != "meta" else 0
    return (pointer, tensor.nbytes) if pointer else (id(tensor), tensor.nbytes)


def _weights(module: torch.nn.Module) -> list[torch.Tensor]:
    """The weight tensors a module holds itself: its parameters, and the buffers of a packed linear layer or a
    quantized embedding (weights held as buffers: int8/int4 layers, prepacked layers)."""
    tensors = list(module.parameters(recurse=False))
    packed = isinstance(getattr(module, "out_features", None), int) or hasattr(module, "unscaled_rows")
    if packed:
        tensors += [t for t in module.buffers(recurse=False) if t is not None]
    return tensors


def step_weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the weights one decode step reads: every weight tensor once (shared storage once), the input
    embedding's table left out unless the output head shares it (a lookup reads one row per token)."""
    embedding, head = _input_embeddings(model), _output_embeddings(model)
    kept = {_tensor_key(t) for t in _weights(head)} if head is not None else set()
    skipped = {_tensor_key(t) for t in _weights(embedding)} - kept if embedding is not None else set()
    seen: set[tuple[int, int]] = set()
    total = 0
    for module in model.modules():
        for tensor in _weights(module):
            key = _tensor_key(tensor)
            if key not in seen and key not in skipped:
                seen.add(key)
                total += tensor.nbytes
    return total


def _matrix_size(module: torch.nn.Module | None) -> tuple[int, int]:
    """(id of its weight, its element count) for an embedding or output head, packed or not."""
    if module is None:
        return 0, 0
    weight = getattr(module, "weight", None)
    if isinstance(weight, torch.Tensor):
        return id(weight), weight.numel()
    rows, cols = getattr(module, "out_features", 0), getattr(module, "in_features", 0)
    return id(module), int(rows) * int(cols)
