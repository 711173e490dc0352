"""The target's output head on demand: greedy verification computes logits only where it reads them.

A verify pass feeds γ + 1 positions, but greedy acceptance reads position j + 1 only when the draft
tokens x_1..x_j were all accepted: p_1 decides x_1, and p_{n+1} gives the target's own token after the
n accepted. Where the head is a large part of a step (Gemma 3: a 262k × 640 head, 63% of the
parameters, whose cost on a CPU grows with the positions it covers) computing it on all γ + 1 positions is
most of the verify pass. Here the model runs up to its head, the head's input
h [B, γ+1, D] is kept, and the head is applied to position 1 alone; only if some row accepted x_1 are
the other γ positions computed, in one call.

Exactness: the logits must be the model's own. The head module's input is captured with a forward
pre-hook (so the final norm and anything else before the head are the model's), and the model's own
transform after the head (Gemma 2/3's final soft-capping, Cohere's logit scale, Granite's logits
scaling) is reproduced from its config. At the first prefill of a model in a dtype the result is
compared bit for bit with the logits the model itself returned; any difference (a transform this
module does not know) keeps the head on the model's own path for that model.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from assisted_backends import hf_compat
from assisted_backends.engine.acceptance import greedy_accept

# head module -> (dtype it was checked in, whether head(h) reproduced the model's logits)
_CHECKED: weakref.WeakKeyDictionary[torch.nn.Module, tuple[torch.dtype, bool]] = weakref.WeakKeyDictionary()


class OnDemandHead:
    """The model's output head and the transform after it, applied by the loop to chosen positions."""

    def __init__(self, model: torch.nn.Module, head: torch.nn.Module) -> None:
        self.head = head
        config = hf_compat.text_config(model)
        self._scale = getattr(model, "logit_scale", None)  # Cohere: logits * logit_scale
        self._divide = getattr(config, "logits_scaling", None)  # Granite: logits / logits_scaling
        self._cap = getattr(config, "final_logit_softcapping", None)  # Gemma 2/3: cap * tanh(logits / cap)
        self.captured: torch.Tensor | None = None

    @classmethod
    def of(cls, model: torch.nn.Module) -> OnDemandHead | None:
        get = getattr(model, "get_output_embeddings", None)
        head = get() if callable(get) else None
        return cls(model, head) if isinstance(head, torch.nn.Module) else None

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float logits [B, q, V] for head inputs `hidden` [B, q, D], as the model's forward computes them."""
        with torch.inference_mode():
            logits = self.head(hidden)
            if self._scale is not None:
                logits = logits * self._scale
            if self._divide is not None:
                logits = logits / self._divide
            if self._cap is not None:
                logits = logits / self._cap
                logits = torch.tanh(logits)
                logits = logits * self._cap
        return logits.float()

    @contextmanager
    def capture(self, skip: bool) -> Iterator[None]:
        """During the block, keep the head's input in `captured`; with `skip` the head itself sees no position."""

        def hook(_module: torch.nn.Module, args: tuple) -> tuple | None:
            self.captured = args[0]
            return (args[0][..., :0, :],) + tuple(args[1:]) if skip else None

        handle = self.head.register_forward_pre_hook(hook)
        try:
            yield
        finally:
            handle.remove()

    def _dtype(self) -> torch.dtype:
        return next(self.head.parameters(), torch.empty(0)).dtype

    def checked(self) -> bool | None:
        """Whether the check passed for the head's current dtype; None if it has not run in that dtype."""
        known = _CHECKED.get(self.head)
        return known[1] if known is not None and known[0] == self._dtype() else None

    def check(self, model_logits: torch.Tensor) -> bool:
        """Compare `logits(captured)` with the logits the model returned for the same positions; remember."""
        captured, self.captured = self.captured, None
        same = (
            captured is not None
            and captured.shape[:-1] == model_logits.shape[:-1]
            and torch.equal(self.logits(captured), model_logits.float())
        )
        _CHECKED[self.head] = (self._dtype(), same)
        return same


class HeadSplit:
    """Whether this round computes position 1's logits alone first.

    Splitting costs t_1 + π·t_rest and saves the full head's ≈ t_rest, π being the recent rate at which
    some row accepts x_1 (exponentially weighted, from 1/2): worth it while π < 1 − t_1 / t_rest. Both
    times are measured on split rounds; until t_rest is known the split is taken while π < 1/2.
    Measured on Gemma 3 270M (1 thread): t_1 / t_rest ≈ 0.4 in fp32, 0.75 in bf16.
    `head`: the target's head on demand; while its check has not passed (`OnDemandHead.checked`) no round splits.
    Whether a call has a split at all is decided once, when its decoding state is built (`engine.state`).
    """

    def __init__(self, head: OnDemandHead | None = None, weight: float = 0.3) -> None:
        self.head = head
        self.weight = weight
        self.first_accepted = 0.5  # π
        self.first_s: float | None = None  # t_1
        self.rest_s: float | None = None  # t_rest

    def wanted(self) -> bool:
        if self.head is not None and not self.head.checked():
            return False  # the head alone did not reproduce the model's logits: the model's own path
        if self.first_s is None or self.rest_s is None:
            return self.first_accepted < 0.5
        return self.first_accepted < 1.0 - self.first_s / max(self.rest_s, 1e-9)

    def record_outcome(self, accepted: bool) -> None:
        """Whether some row accepted x_1 this round (split or not)."""
        self.first_accepted += self.weight * (float(accepted) - self.first_accepted)

    def record_first(self, accepted: bool, seconds: float) -> None:
        """A split round's position 1: the outcome, and what its head cost."""
        self.record_outcome(accepted)
        self.first_s = self._average(self.first_s, seconds)

    def record_rest(self, seconds: float) -> None:
        self.rest_s = self._average(self.rest_s, seconds)

    def _average(self, old: float | None, seconds: float) -> float:
        return seconds if old is None else old + self.weight * (seconds - old)


def greedy_accept_on_demand(
    draft: torch.Tensor,
    hidden: torch.Tensor,
    head: OnDemandHead,
    choose: Callable[[torch.Tensor, int], torch.Tensor],
    split: HeadSplit,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Greedy verification from head inputs: (n [B], next token [B], logits [B, m, V]) with m = 1 when no row
    accepted x_1, else γ + 1.

    draft [B, γ], hidden [B, γ+1, D]; `choose(logits, end)` is the target's processed argmax [B, q] for the
    logits of positions end − q .. end − 1 (it needs the prefix that ends at each of them).
    """
    began = time.perf_counter()
    first = head.logits(hidden[:, :1])  # [B, 1, V]
    choice = choose(first, 1)  # [B, 1]
    any_first = bool((choice[:, 0] == draft[:, 0]).any())  # host read: a CPU's is free
    split.record_first(any_first, time.perf_counter() - began)
    if not any_first:
        return torch.zeros_like(choice[:, 0]), choice[:, 0], first
    began = time.perf_counter()
    rest = head.logits(hidden[:, 1:])  # [B, γ, V]
    choice = torch.cat([choice, choose(rest, hidden.shape[1])], dim=1)  # [B, γ+1]
    split.record_rest(time.perf_counter() - began)
    n, next_token = greedy_accept(draft, choice)
    return n, next_token, torch.cat([first, rest], dim=1)
