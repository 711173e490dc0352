"""The cache layouts on their own (`engine/kv_cache.py`): rollback keeps exactly the committed tokens.

docs/design.md rule 5: after a rollback to n positions a model's cache holds the first n positions it was fed and
nothing of the rejected tail. The dynamic layout crops; the static layout only moves its write position (the
tensors keep their addresses, the stale entries are masked, then overwritten). Both hold for sliding-window
layers too, whose caches keep every position so that a rollback never needs one the window dropped
(docs/design.md, "Cache rollback across layer kinds"). Checked through the one thing that matters: after
rollback, the model's next logits are those of a fresh cache fed only the kept prefix.
"""

from __future__ import annotations

import pytest
import torch
from architectures import WINDOW, build

from assisted_backends import hf_compat
from assisted_backends.engine.kv_cache import DynamicLayout, StaticLayout, bucketed, make_layout
from assisted_backends.engine.runner import ModelRunner

pytestmark = pytest.mark.usefixtures("one_thread")

LAYOUTS = ("dynamic", "static")
CAPACITY = 48  # columns of a static cache: more than every sequence fed here
BUCKET = 16


def runner(model, layout: str, pad: list[int] | None = None) -> ModelRunner:
    pads = torch.tensor(pad or [0])
    return ModelRunner(model, make_layout(layout, model, pads, CAPACITY, BUCKET))


def tokens(length: int, seed: int, rows: int = 1) -> torch.Tensor:
    return torch.randint(0, 128, (rows, length), generator=torch.Generator().manual_seed(seed))


def fresh_logits(model, layout: str, prefix: torch.Tensor, nxt: torch.Tensor) -> torch.Tensor:
    """The logits of `nxt` after `prefix`, from a cache that never saw anything else."""
    reference = runner(model, layout)
    reference.forward(prefix)
    return reference.forward(nxt)


@pytest.fixture(scope="module")
def llama():
    return build("llama", seed=0)


@pytest.fixture(scope="module")
def mistral():
    """Every layer a sliding window of `WINDOW` positions."""
    return build("mistral", seed=0)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_rollback_forgets_the_rejected_tail(llama, layout):
    fed = runner(llama, layout)
    sequence = tokens(20, seed=1)
    fed.forward(sequence[:, :12])
    fed.forward(sequence[:, 12:])  # 8 drafted tokens, say; 3 of them accepted
    fed.rollback(15)
    assert fed.length == 15
    replacement = tokens(1, seed=2)
    expected = fresh_logits(llama, layout, sequence[:, :15], replacement)
    torch.testing.assert_close(fed.forward(replacement), expected, rtol=1e-5, atol=1e-5)


def test_dynamic_rollback_crops_the_cache(llama):
    fed = runner(llama, "dynamic")
    fed.forward(tokens(10, seed=3))
    kept = [[t[..., :6, :].clone() for t in layer] for layer in hf_compat.cache_tensors(fed.layout.cache)]
    fed.rollback(6)
    assert fed.layout.cache.get_seq_length() == 6
    after = hf_compat.cache_tensors(fed.layout.cache)
    for layer, kept_layer in zip(after, kept):
        for tensor, before in zip(layer, kept_layer):
            assert tensor.shape[-2] == 6
            assert torch.equal(tensor, before)  # the kept prefix is untouched


def test_static_rollback_moves_the_write_position_only(llama):
    fed = runner(llama, "static")
    assert isinstance(fed.layout, StaticLayout) and fed.layout.capacity == bucketed(CAPACITY, BUCKET)
    fed.forward(tokens(10, seed=4))
    before = [[(t.data_ptr(), t.clone()) for t in layer] for layer in hf_compat.cache_tensors(fed.layout.cache)]
    mask = fed.layout.attention_mask(1)
    fed.rollback(6)
    after = hf_compat.cache_tensors(fed.layout.cache)
    for layer, old in zip(after, before):
        for tensor, (address, content) in zip(layer, old):
            assert tensor.data_ptr() == address  # no slice, no copy: graphs captured these addresses
            assert torch.equal(tensor, content)  # stale entries stay until overwritten
    assert fed.layout.attention_mask(1).shape == mask.shape == (1, fed.layout.capacity)  # fixed shapes


def test_static_layout_refuses_to_overflow(llama):
    fed = runner(llama, "static")
    with pytest.raises(RuntimeError, match="static KV cache overflow"):
        fed.layout.attention_mask(fed.layout.capacity + 1)


def test_rollback_to_the_current_length_or_past_it_changes_nothing(llama):
    for layout in LAYOUTS:
        fed = runner(llama, layout)
        fed.forward(tokens(5, seed=5))
        fed.rollback(5)
        fed.rollback(9)
        assert fed.length == 5


@pytest.mark.parametrize("layout", LAYOUTS)
def test_sliding_window_layers_roll_back_past_their_window(mistral, layout):
    """The window has moved past the rollback point (a sliding cache would have dropped those positions), and
    the next logits still equal those of the kept prefix alone."""
    sequence = tokens(WINDOW + 14, seed=6)
    fed = runner(mistral, layout)
    fed.forward(sequence[:, :WINDOW])
    for column in range(WINDOW, sequence.shape[1]):  # one-token steps: the window slides
        fed.forward(sequence[:, column : column + 1])
    keep = WINDOW + 2  # positions WINDOW + 2 - WINDOW ... were out of the window of the last step
    fed.rollback(keep)
    replacement = tokens(3, seed=7)
    expected = fresh_logits(mistral, layout, sequence[:, :keep], replacement)
    torch.testing.assert_close(fed.forward(replacement), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_left_padding_is_masked_in_both_layouts(llama, layout):
    """A left-padded row computes what the same row alone computes (position ids are column minus padding)."""
    row = tokens(6, seed=8)
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), row], dim=1)
    fed = runner(llama, layout, pad=[3])
    logits = fed.forward(padded)[:, -1]
    alone = runner(llama, layout).forward(row)[:, -1]
    torch.testing.assert_close(logits, alone, rtol=1e-4, atol=1e-4)


def test_make_layout_names_the_layout(llama):
    pad = torch.tensor([0])
    assert isinstance(make_layout("dynamic", llama, pad, 10, 16), DynamicLayout)
    static = make_layout("static", llama, pad, 17, 16)
    assert isinstance(static, StaticLayout) and static.capacity == 32
