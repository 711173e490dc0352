"""Self-speculative drafting: the target's first N layers + its own head, sharing the target's weights."""

import pytest
import torch
from tiny_models import ARCHITECTURES, random_prompt, reference_greedy, tiny_model

from assisted_backends import generate
from assisted_backends.drafters.early_exit import decoder_layers_path, early_exit_view


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_view_equals_a_truncated_copy_and_shares_weights(arch):
    target = tiny_model(arch, seed=0, layers=4)
    view = early_exit_view(target, 2)
    truncated = tiny_model(arch, seed=5, layers=2)
    missing, unexpected = truncated.load_state_dict(target.state_dict(), strict=False)
    assert not missing and unexpected  # layers 2 and 3 are the only extra keys
    prompt = random_prompt(7, seed=1)
    with torch.inference_mode():
        torch.testing.assert_close(view(prompt).logits, truncated(prompt).logits, rtol=0, atol=0)
    shared = {p.data_ptr() for p in target.parameters()}
    assert all(p.data_ptr() in shared for p in view.parameters())
    assert target.config.num_hidden_layers == 4 and len(target.get_submodule(decoder_layers_path(target))) == 4


def test_hooks_on_the_view_do_not_reach_the_target():
    target = tiny_model("llama", seed=0, layers=3)
    view = early_exit_view(target, 1)
    calls = []
    view.register_forward_hook(lambda *args: calls.append("view"))
    with torch.inference_mode():
        target(random_prompt(3, seed=2))
    assert calls == []


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("layout", ["dynamic", "static"])
def test_early_exit_drafting_is_token_identical(arch, layout):
    target = tiny_model(arch, seed=0, layers=4)
    prompt = random_prompt(6, seed=3)
    result = generate(
        target, prompt, assistant_early_exit=2, max_new_tokens=19, num_assistant_tokens=3, cache_layout=layout
    )
    assert torch.equal(result.sequences, reference_greedy(target, prompt, 19))
    assert result.stats.drafter == "early_exit" and result.stats.drafted > 0


@pytest.mark.parametrize("layers", [0, 4, 9])
def test_early_exit_depth_is_validated(layers):
    target = tiny_model("llama", seed=0, layers=4)
    with pytest.raises(ValueError, match="assistant_early_exit must be between 1 and 3"):
        generate(target, random_prompt(3, seed=0), assistant_early_exit=layers, max_new_tokens=2)


@pytest.mark.parametrize("arch", ["llama", "opt"])
def test_the_view_reads_its_layers_keys_and_values_from_the_target_cache(arch):
    """Dynamic layout: the view runs no prompt pass and no catch-up of its own (one draft forward per drafted
    token), and what it copied equals what it would have computed; tokens stay those of model.generate."""
    target = tiny_model(arch, seed=0, layers=4)
    prompt = random_prompt(9, seed=3)
    result = generate(target, prompt, assistant_early_exit=2, max_new_tokens=20, num_assistant_tokens=3)
    assert torch.equal(result.sequences, reference_greedy(target, prompt, 20))
    assert result.stats.draft_forwards == result.stats.drafted  # no prompt pass: the copy replaced it
    static = generate(
        target, prompt, assistant_early_exit=2, max_new_tokens=20, num_assistant_tokens=3, cache_layout="static"
    )
    assert static.stats.draft_forwards == static.stats.drafted + 1  # the static layout feeds the prompt itself

    from assisted_backends import hf_compat
    from assisted_backends.engine.kv_cache import make_layout
    from assisted_backends.engine.runner import ModelRunner

    def runner(model):
        return ModelRunner(model, make_layout("dynamic", model, torch.zeros(1, dtype=torch.long), 64, 16))

    full, copied, computed = runner(target), runner(early_exit_view(target, 2)), runner(early_exit_view(target, 2))
    full.forward(prompt)
    assert copied.extend_from(full, 2, 8) and copied.length == 8
    computed.forward(prompt[:, :8])
    for layer in range(2):
        for mine, theirs in zip(
            hf_compat.layer_keys_values(copied.layout.cache, layer),
            hf_compat.layer_keys_values(computed.layout.cache, layer),
        ):
            torch.testing.assert_close(mine, theirs)
