"""Token trees (`engine.token_tree`): the mask, the node logits against one-token steps along each path (bit for bit
on the quantized path's batch-invariant attention), the accepted path's compaction, the tree acceptance rule."""

from __future__ import annotations

from functools import cache

import pytest
import torch
from architectures import UnknownArchitecture, build, refused_here
from transformers import DynamicCache

from assisted_backends.engine.acceptance import residual_distribution, tree_accept
from assisted_backends.engine.kv_cache import make_layout
from assisted_backends.engine.runner import ModelRunner
from assisted_backends.engine.token_tree import TokenTree, attention_mask

pytestmark = pytest.mark.usefixtures("one_thread")
needs_layered_caches = pytest.mark.skipif(
    not hasattr(DynamicCache(), "layers"),
    reason="token trees need transformers >= 4.54 (per-layer caches); before it they are refused and the chain runs",
)
TREE = TokenTree.from_paths([[5, 6, 7], [5, 9], [11, 12], [11, 13]])  # a chain of 3, then branches
FLOAT_ARCHS = ("llama", "qwen3_moe", "gemma", "phi", "gpt_neox", "opt", "bloom", "falcon", "gpt2")


def _model(arch: str, scheme: str | None = None):
    if refused_here(arch):
        pytest.skip(f"{arch} needs a newer transformers here")
    try:
        return _built(arch, scheme)
    except UnknownArchitecture as error:
        pytest.skip(str(error))


@cache
def _built(arch: str, scheme: str | None):
    model = build(arch, seed=0)
    if scheme is None:
        return model
    from assisted_backends.backends.base import BackendOptions
    from assisted_backends.backends.cpu.backend import CPUBackend

    return CPUBackend(BackendOptions(dtype=scheme)).prepare(model, "target")


def _runner(model, prefix: torch.Tensor) -> ModelRunner:
    runner = ModelRunner(model, make_layout("dynamic", model, torch.zeros(1, dtype=torch.long), 64, 16))
    runner.forward(prefix)
    return runner


def test_the_trie_and_its_mask():
    assert TREE.tokens == (5, 6, 7, 9, 11, 12, 13) and TREE.parents == (-1, 0, 1, 0, -1, 4, 4)
    assert TREE.chain_length() == 3 and TREE.depths() == [0, 1, 2, 3, 2, 1, 2, 2]
    assert TREE.children() == [[1, 5], [2, 4], [3], [], [], [6, 7], [], []]
    mask = attention_mask(TREE, 4, "sdpa", torch.float32)
    assert mask.shape == (1, 1, 8, 12) and mask.dtype == torch.bool and bool(mask[..., :4].all())
    seen = mask[0, 0, :, 4:].int().tolist()
    assert seen[3] == [1, 1, 1, 1, 0, 0, 0, 0]  # node 7: root, 5, 6, itself
    assert seen[4] == [1, 1, 0, 0, 1, 0, 0, 0]  # node 9: root, 5, itself
    assert seen[7] == [1, 0, 0, 0, 0, 1, 0, 1]  # node 13: root, 11, itself (not its sibling 12)
    additive = attention_mask(TREE, 4, "eager", torch.bfloat16)
    assert additive.dtype == torch.bfloat16 and torch.equal(additive == 0, mask)
    with pytest.raises(ValueError, match="parent 2 must be"):
        TokenTree((1, 2), (-1, 2))


def _path_steps(model, prefix: torch.Tensor, root: torch.Tensor, path: list[int]) -> torch.Tensor:
    """The logits of one-token steps feeding the root, then `path`'s tokens: [1, 1 + len(path), V]."""
    runner = _runner(model, prefix)
    tokens = [root] + [torch.tensor([[t]]) for t in path]
    return torch.cat([runner.forward(t) for t in tokens], dim=1)


def _rows_of_paths():
    """Each row's path of tokens from the root (row 0: none)."""
    paths = [[]]
    for parent, token in zip(TREE.query_parents()[1:], TREE.tokens):
        paths.append(paths[parent] + [token])
    return paths


def _check_tree(model, exact: bool) -> None:
    prompt = torch.randint(3, 100, (1, 9), generator=torch.Generator().manual_seed(3))
    prefix, root = prompt[:, :-1], prompt[:, -1:]
    runner = _runner(model, prefix)
    assert runner.tree_refusal() is None
    tokens = torch.cat([root, torch.tensor([TREE.tokens])], dim=1)
    logits = runner.forward_tree(tokens, TREE)  # [1, 8, V]
    for row, path in enumerate(_rows_of_paths()):
        steps = _path_steps(model, prefix, root, path)[:, -1]
        if exact:
            assert torch.equal(logits[:, row], steps), (row, float((logits[:, row] - steps).abs().max()))
        else:
            torch.testing.assert_close(logits[:, row], steps, atol=2e-4, rtol=1e-4)
    # keep the path root → 11 → 13 (rows 5, 7), then step on: the cache is the chain's
    runner.keep_path(prefix.shape[1], [5, 7])
    assert runner.length == prefix.shape[1] + 3
    after = runner.forward(torch.tensor([[42]]))
    chain = _path_steps(model, prefix, root, [11, 13, 42])[:, -1:]
    if exact:
        assert torch.equal(after, chain)
    else:
        torch.testing.assert_close(after, chain, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", FLOAT_ARCHS)
def test_each_node_sees_its_path_only_and_the_kept_path_is_a_chain(arch):
    model = _model(arch)
    refusal = _runner(model, torch.tensor([[1, 2]])).tree_refusal()
    if refusal is not None:
        pytest.skip(f"{arch}: {refusal}")
    _check_tree(model, exact=False)


@pytest.mark.parametrize("attention", ["row kernel", "SDPA"])
@pytest.mark.parametrize("scheme", ["int4", "int8"])
@pytest.mark.parametrize("arch", ["llama", "gemma", "phi", "granite"])
def test_on_the_quantized_path_each_node_has_its_one_token_steps_logits_bit_for_bit(
    arch, scheme, attention, monkeypatch
):
    """The batch-invariant attention: the native row kernel (masked keys add exact zeros, in position order) and
    its SDPA fallback (a tree row attends to its gathered keys alone, as the step along its path does)."""
    from assisted_backends.backends.cpu import invariant_attention
    from assisted_backends.backends.cpu.invariant_attention import verify_pass_difference

    if attention == "SDPA":
        monkeypatch.setattr(invariant_attention, "_row_kernel_serves", lambda *args: False)
    model = _model(arch, scheme)
    if verify_pass_difference(model) is not None:
        pytest.skip(f"{arch}: {verify_pass_difference(model)}")  # not even a chain's verify pass is exact there
    _check_tree(model, exact=True)


@needs_layered_caches
def test_windowed_and_batched_caches_refuse_trees():
    mistral = _model("mistral")
    assert "sliding window" in _runner(mistral, torch.tensor([[1, 2]])).tree_refusal()
    bloom = _model("bloom")
    assert "ALiBi" in _runner(bloom, torch.tensor([[1, 2]])).tree_refusal()
    llama = _model("llama")
    runner = ModelRunner(llama, make_layout("static", llama, torch.zeros(1, dtype=torch.long), 64, 16))
    assert "dynamic" in runner.tree_refusal()
    two = ModelRunner(llama, make_layout("dynamic", llama, torch.zeros(2, dtype=torch.long), 64, 16))
    assert "one row" in two.tree_refusal()


def _scores(table: dict[int, list[float]]):
    return lambda row, path: torch.log(torch.tensor(table[row], dtype=torch.float64))


def test_greedy_takes_the_deepest_path_the_target_agrees_with():
    # rows: 0 root; tokens per row; the target's argmax after row r is table[r]'s top index
    tokens = [0, 1, 2, 3, 2]  # row 1 (token 1) and row 4 (token 2) are the root's children; rows 2, 3 below row 1
    children = [[1, 4], [2, 3], [], [], []]
    onehot = lambda t: [1.0 if i == t else 1e-3 for i in range(5)]  # noqa: E731
    table = {0: onehot(1), 1: onehot(3), 3: onehot(4), 4: onehot(0), 2: onehot(0)}
    assert tree_accept(children, tokens, _scores(table), False, None) == ([1, 3], 4)
    table[0] = onehot(2)  # the second sibling
    assert tree_accept(children, tokens, _scores(table), False, None) == ([4], 0)
    table[0] = onehot(4)  # no child
    assert tree_accept(children, tokens, _scores(table), False, None) == ([], 4)


def test_recursive_rejection_over_siblings_gives_the_target_distribution_exactly():
    """Exact, V = 5: with point-mass drafts x_1..x_k tried in turn, P(accept x_i) = Π_{j<i}(1 − ρ_j(x_j))·ρ_i(x_i)
    with ρ_{i+1} = norm(max(0, ρ_i − ρ_i(x_i)δ_{x_i})) (`residual_distribution`), and the rest goes by ρ_{k+1}: the
    token added must be distributed as p for every sibling order."""
    p = torch.tensor([0.05, 0.4, 0.25, 0.2, 0.1], dtype=torch.float64)
    for drafts in ([1, 2], [2, 1], [0, 3, 4], [4], [1, 2, 3, 4, 0]):
        law = torch.zeros_like(p)
        reach, residual = 1.0, p.clone()
        for x in drafts:
            law[x] += reach * residual[x]
            reach *= 1 - residual[x]
            removed = residual.clone()
            removed[x] = 0
            residual = residual_distribution(residual, residual - removed)
        law += reach * residual
        torch.testing.assert_close(law, p, atol=1e-12, rtol=0)


def test_sampled_siblings_follow_the_target_distribution():
    """χ² (false alarm 1e-4): the token the rule adds at a root with three point-mass children, 20000 draws."""
    from stats_tools import chi_square_p_value

    p = torch.tensor([0.05, 0.4, 0.25, 0.2, 0.1])
    tokens, children = [0, 1, 3, 2], [[1, 2, 3], [], [], []]
    generator = torch.Generator().manual_seed(0)
    counts = torch.zeros(5, dtype=torch.float64)
    for _ in range(20000):
        path, token = tree_accept(children, tokens, lambda r, _: torch.log(p), True, generator)
        counts[tokens[path[0]] if path else token] += 1
    assert chi_square_p_value(counts, p.double()) > 1e-4
    wrong = torch.tensor([0.2, 0.3, 0.2, 0.2, 0.1], dtype=torch.float64)  # power: the test tells this apart
    assert chi_square_p_value(counts, wrong) < 1e-4


def test_a_tree_is_verified_only_where_its_expected_tokens_pay_for_the_wider_pass():
    from assisted_backends.engine.schedule import TreePrice

    price = TreePrice()
    assert price.worth(5, 9, 2.0, 2.5)  # nothing measured: try it
    for _ in range(2):
        price.observe(5, 1.0)  # a chain's pass over 5 rows
        price.observe(9, 2.0)  # a tree's over 9: twice the time
    assert not price.worth(5, 9, 2.0, 2.5) and price.declined == 1  # (2.5 + 1) / 2 < (2 + 1) / 1
    assert price.worth(5, 9, 1.0, 4.0)  # (4 + 1) / 2 >= (1 + 1) / 1
    assert price.worth(5, 7, 2.0, 3.6) and not price.worth(5, 7, 2.0, 3.4)  # 7 rows: 1.5 s between the two


def test_the_option_takes_booleans_only():
    from assisted_backends.drafters.suffix import SuffixCache

    with pytest.raises(ValueError, match=r"SuffixCache\(token_trees=...\) must be True or False, got 'yes'"):
        SuffixCache(token_trees="yes")
