"""Graph capture of fixed-shape decode steps: one captured graph per (role, input signature).

A captured graph replays a recorded sequence of kernels on the same memory. So every tensor a step
reads must live at a fixed address (the static input buffers here, the KV cache, the weights), and
every value that changes between steps must be *data* in such a tensor, never a Python number
baked in at capture. With a static KV cache that holds: the write position is the device counter
`cumulative_length` of each layer (transformers 5.x), which the core moves on rollback, and the
positions γ+1 verification and the one-token draft step need arrive as tensors (`cache_position`,
`position_ids`) copied into the static buffers before each replay.

Life of one signature (shapes, dtypes and the non-tensor arguments of a call) on one KV cache:
1. first call: run the step eagerly (this is also the warm-up the device needs before capture) and
   return its result; then capture it on the same static buffers. Capture runs nothing on a real
   device; the cache's write position is set back to where the eager step left it, so a runtime whose
   capture does execute (the CPU test fake) leaves the same state.
2. later calls: copy the new inputs into the static buffers, replay, return a copy of the output.
Graphs hold raw pointers to one cache's tensors: a new cache (a new `generate` call) drops them all, from
its second call on. Prefill (the first call on a cache) and calls with more than `max_query_tokens` tokens
run eagerly; a cache that gets one call only (a queue's joining prompt pass, `engine.joins`) is never bound,
so the batch's graphs survive it.

The device side is a `GraphRuntime` (CUDA: `backends/cuda/backend.py`); this module imports no device API.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from transformers import PreTrainedModel

from assisted_backends import hf_compat

Signature = tuple[tuple[str, Any], ...]


class Replayable(Protocol):
    def replay(self) -> None: ...


class GraphRuntime(Protocol):
    """How a device warms up, captures and replays one step."""

    def warmup(self, step: Callable[[], Any]) -> Any:
        """Run `step` eagerly, the way capture needs (CUDA: on a side stream) and return its result."""

    def capture(self, step: Callable[[], Any]) -> tuple[Replayable, Any]:
        """Record `step`; return the graph and the output tensors a replay writes into."""


@dataclass
class CapturedStep:
    graph: Replayable
    inputs: dict[str, torch.Tensor]  # static buffers the graph reads
    logits: torch.Tensor  # static buffer the graph writes
    replays: int = 0


@dataclass
class GraphStats:
    """Counts for tests and the CLI: captures, replays, eager calls, and caches seen."""

    captures: int = 0
    replays: int = 0
    eager_calls: int = 0
    caches_bound: int = 0
    signatures: list[Signature] = field(default_factory=list)


def is_capturable_cache(cache: Any) -> bool:
    """Whether a cache keeps its tensors at fixed addresses (a static cache; a dynamic one grows)."""
    return bool(getattr(cache, "is_compileable", False))


def graph_capturable(model: torch.nn.Module) -> bool:
    """Whether the model declares a step free of host-side data-dependent control flow.

    transformers 5.x: `_can_compile_fullgraph` (False for e.g. MoE routing with `torch.where(cond)`);
    4.5x: `_supports_static_cache`. Such models need the static cache, so they are also the ones that
    get the static layout; the others fall back to the dynamic layout and eager steps.
    """
    for flag in ("_can_compile_fullgraph", "_supports_static_cache"):
        value = getattr(model, flag, None)
        if value is not None:
            return bool(value)
    return False


class StepGraphs:
    """The captured steps of one model (`role`) on one KV cache, keyed by call signature."""

    def __init__(self, role: str, runtime: GraphRuntime, max_query_tokens: int) -> None:
        if max_query_tokens < 1:
            raise ValueError(f"max_query_tokens must be >= 1, got {max_query_tokens}")
        self.role = role
        self.runtime = runtime
        self.max_query_tokens = max_query_tokens
        self.stats = GraphStats()
        self._steps: dict[Signature, CapturedStep] = {}
        self._cache: Any = None  # strong reference: the graphs point into its tensors
        self._first: Any = None  # a cache seen once (its prefill ran eagerly): bound at its second call

    @property
    def keys(self) -> list[tuple[str, Signature]]:
        return [(self.role, signature) for signature in self._steps]

    def _bind(self, cache: Any) -> bool:
        """True when this is `cache`'s first call (it runs eagerly, the bound cache's graphs kept); at its second
        call `cache` becomes current and the graphs of the previous one are dropped."""
        if cache is self._cache:
            return False
        if cache is not self._first:
            self._first = cache
            return True
        self._steps.clear()
        self._cache, self._first = cache, None
        self.stats.caches_bound += 1
        return False

    def run(
        self,
        call: Callable[..., Any],
        tensors: dict[str, torch.Tensor],
        options: dict[str, Any],
        cache: Any,
        start_position: Callable[[], int],
    ) -> torch.Tensor:
        """Logits of `call(**tensors, **options, cache=cache)`, replayed from a graph when possible (the cache
        argument is `past_key_values` before transformers 5.24).

        `start_position` returns the cache length before this step (asked only when capturing: a host sync).
        """
        query_length = tensors["input_ids"].shape[-1]
        first_on_cache = self._bind(cache)
        if first_on_cache or query_length > self.max_query_tokens or not is_capturable_cache(cache):
            self.stats.eager_calls += 1
            return call(**tensors, **options, **hf_compat.cache_kwargs(call, cache)).logits
        signature = _signature(tensors, options)
        step = self._steps.get(signature)
        if step is not None:
            for name, value in tensors.items():
                step.inputs[name].copy_(value)
            step.graph.replay()
            step.replays += 1
            self.stats.replays += 1
            return step.logits.clone()  # the next replay overwrites the static buffer
        return self._capture(signature, call, tensors, options, cache, start_position() + query_length)

    def _capture(self, signature, call, tensors, options, cache, length: int) -> torch.Tensor:
        inputs = {name: value.clone() for name, value in tensors.items()}

        def step() -> torch.Tensor:
            return call(**inputs, **options, **hf_compat.cache_kwargs(call, cache)).logits

        logits = self.runtime.warmup(step)  # the real result of this call
        graph, static_logits = self.runtime.capture(step)
        hf_compat.set_static_cache_length(cache, length)  # capture must leave the write position as the eager step did
        self._steps[signature] = CapturedStep(graph, inputs, static_logits)
        self.stats.captures += 1
        self.stats.signatures.append(signature)
        return logits


def _signature(tensors: dict[str, torch.Tensor], options: dict[str, Any]) -> Signature:
    described = [(name, (tuple(value.shape), value.dtype, str(value.device))) for name, value in tensors.items()]
    return tuple(sorted(described) + sorted(options.items()))


class GraphedCausalLM(torch.nn.Module):
    """A causal LM whose fixed-shape decode steps are captured and replayed (see the module docstring).

    Called exactly like the model by `ModelRunner` (input_ids, attention_mask, position_ids,
    past_key_values, use_cache, cache_position, logits_to_keep); arguments the wrapped model does not
    take are dropped or translated, and the result has the `logits` the runner reads.
    """

    def __init__(self, model: PreTrainedModel, role: str, runtime: GraphRuntime, max_query_tokens: int = 16) -> None:
        super().__init__()
        self.model = model
        self.graphs = StepGraphs(role, runtime, max_query_tokens)
        self._takes_cache_position = hf_compat.forward_accepts(model, "cache_position")

    @property
    def prepared_from(self) -> PreTrainedModel:
        """The wrapped model (`backends.base.unprepared` reads this)."""
        return self.model

    @property
    def config(self):
        return self.model.config

    @property
    def generation_config(self):
        return self.model.generation_config

    def get_output_embeddings(self):
        return self.model.get_output_embeddings()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values: Any = None,
        use_cache: bool = True,
        cache_position: torch.Tensor | None = None,
        logits_to_keep: int | None = None,
    ) -> _StepOutput:
        tensors = {"input_ids": input_ids}
        for name, value in (("attention_mask", attention_mask), ("position_ids", position_ids)):
            if value is not None:
                tensors[name] = value
        if cache_position is not None and self._takes_cache_position:
            tensors["cache_position"] = cache_position
        options: dict[str, Any] = {"use_cache": use_cache}
        if logits_to_keep is not None:
            options.update(hf_compat.logits_to_keep_kwargs(self.model, logits_to_keep))
        start = _start_position(cache_position, past_key_values)
        logits = self.graphs.run(self.model, tensors, options, past_key_values, start_position=start)
        if logits_to_keep is not None:
            logits = logits[:, -logits_to_keep:, :]  # models that ignore the request return every position
        return _StepOutput(logits=logits, past_key_values=past_key_values)


@dataclass
class _StepOutput:
    logits: torch.Tensor
    past_key_values: Any


def _start_position(cache_position: torch.Tensor | None, cache: Any) -> Callable[[], int]:
    """Where this step starts writing, read lazily (a host sync, taken only when a graph is captured)."""
    if cache_position is not None:
        return lambda: int(cache_position[0])
    return lambda: int(cache.get_seq_length())
