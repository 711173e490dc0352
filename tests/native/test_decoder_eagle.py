"""An EAGLE-3 head drafts for the native decoder step itself: the native call hands out the hidden states the head
reads (the input of layer k, the last layer's output for k = L) for every row it feeds, so the target stays on the
native path; greedy output equals the native model's plain decoding token for token, and the features agree with
the ones hooks catch on transformers' modeling (the reference) to the decoder's stated tolerance."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest
import torch
from decoder_models import VOCAB, prompt, write_tiny_llama

from assisted_backends import generate, hf_compat
from assisted_backends.backends.base import BackendOptions
from assisted_backends.backends.cpu.backend import CPUBackend
from assisted_backends.drafters.eagle.config import default_feature_layers
from assisted_backends.drafters.eagle.features import LayerTap
from assisted_backends.native import decoder_build, extension

pytestmark = [
    pytest.mark.skipif(
        not extension.available() or bool(decoder_build.why_unavailable()),
        reason="the native decoder needs the package's kernels and a compiler",
    ),  # fmt: skip
    pytest.mark.usefixtures("one_thread"),
]
LAYERS = 4
NEW = 40


@cache
def _models(directory: str):
    """(reference, native) for a tiny random 4-layer `.gguf` Llama (distinct feature layers)."""
    from assisted_backends.backends.cpu import invariant_attention
    from assisted_backends.native.decoder_model import NativeCausalLM
    from assisted_backends.quantized.model import load_gguf_quantized

    path = write_tiny_llama(Path(directory) / "tiny-llama-4.gguf", seed=3, layers=LAYERS)
    reference = load_gguf_quantized(path, tokenizer=False, use_cache=False).reference
    invariant_attention.enable(reference)
    return reference, NativeCausalLM(reference)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return _models(str(tmp_path_factory.mktemp("native-eagle")))


def _trained_head(reference, sequences: list[list[int]], steps: int = 20, draft_vocab: int = 96):
    """A head trained for `steps` TTT steps to predict `sequences` (the native model's own greedy text for the test's
    prompts: a random target's text has nothing else a head could learn in seconds), with features from hooks on
    the reference, as `train-draft` reads a `.gguf` target, embedding with the quantized table's rows."""
    from assisted_backends.train_draft import batches, ttt
    from assisted_backends.train_draft.data import featurize
    from assisted_backends.train_draft.head_init import new_head
    from assisted_backends.train_draft.vocab import choose_vocabulary

    layers = default_feature_layers(LAYERS)
    examples = featurize(reference, LayerTap(reference, layers), sequences, [1] * len(sequences), top_k=4)
    d2t, t2d = choose_vocabulary(batches.token_counts(examples, VOCAB), draft_vocab)
    head = new_head(reference, d2t, t2d, layers, seed=0)
    head.use_target_embedding(reference.get_input_embeddings().unscaled_rows, VOCAB)
    optimizer = torch.optim.AdamW(head.parameters(), lr=3e-3)
    lookup = batches.vocabulary_lookup(head.t2d)
    sampler = batches.epochs(examples, len(examples), 0)
    for _ in range(steps):
        loss = ttt.unroll(head, batches.collate(next(sampler), lookup, torch.device("cpu"), torch.float32), 3).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    head.use_target_embedding(None)
    return head.eval()


SEEDS = (11, 12)


@pytest.fixture(scope="module")
def plain(models):
    """The native model's plain greedy output for each test prompt."""
    _, native = models
    backend = CPUBackend(BackendOptions())
    return {seed: generate(native, prompt(10, seed), max_new_tokens=NEW, backend=backend).sequences for seed in SEEDS}


@pytest.fixture(scope="module")
def head(models, plain):
    reference, _ = models
    return _trained_head(reference, [plain[seed][0].tolist() for seed in SEEDS])


def _features(model, layers, **inputs) -> torch.Tensor:
    tap = LayerTap(model, layers)
    with torch.inference_mode(), tap.capture() as captured:
        model(**inputs)
    return tap.features(captured)


@pytest.mark.parametrize("layers", [(0, 2, 4), (1, 3, 3), default_feature_layers(LAYERS)])
def test_native_features_agree_with_the_reference_hooks(models, layers):
    """Layer 0's input is the embedding, equal bit for bit; deeper ones within 3x the change a 1e-7 relative change
    of the embedded input makes in the reference's own features (the logits' tolerance, docs/native.md)."""
    reference, native = models
    tokens = prompt(24, 8)
    ours = _features(native, layers, input_ids=tokens)
    with torch.inference_mode():
        embedded = reference.get_input_embeddings()(tokens)
    nudge = 1 + 1e-7 * torch.randn(embedded.shape, generator=torch.Generator().manual_seed(0))
    theirs = _features(reference, layers, inputs_embeds=embedded)
    nudged = _features(reference, layers, inputs_embeds=embedded * nudge)
    width = hf_compat.text_config(reference).hidden_size
    assert ours.shape == theirs.shape == (1, 24, 3 * width)
    for j, k in enumerate(layers):
        part = slice(j * width, (j + 1) * width)
        difference = float((ours[..., part] - theirs[..., part]).abs().max())
        if k == 0:
            assert difference == 0.0
        else:
            spread = float((theirs[..., part] - nudged[..., part]).abs().max())
            assert 0 < spread and difference <= 3 * spread, (k, difference, spread)


def test_a_verify_pass_hands_out_the_features_of_its_steps_bit_for_bit(models):
    """The features of a verify pass over M rows are, row by row, those of M one-token steps (M = 5)."""
    _, native = models
    layers = (0, 2, 4)
    prefix, rows = prompt(7, 1), prompt(5, 2)
    verify_cache, step_cache = native.new_native_cache(), native.new_native_cache()
    with torch.inference_mode():
        native(prefix, past_key_values=verify_cache)
        native(prefix, past_key_values=step_cache)
    verify = _features(native, layers, input_ids=rows, past_key_values=verify_cache)
    steps = [_features(native, layers, input_ids=rows[:, i : i + 1], past_key_values=step_cache) for i in range(5)]
    assert torch.equal(verify, torch.cat(steps, dim=1))


@pytest.mark.parametrize("layout", ["dynamic", "static"])
def test_eagle_on_the_native_target_equals_its_plain_decoding(models, head, plain, layout):
    _, native = models
    backend = CPUBackend(BackendOptions())
    accepted = 0
    for seed in SEEDS:
        native._native.reset_timings()
        result = generate(native, prompt(10, seed), assistant_model=head, max_new_tokens=NEW, num_assistant_tokens=3,
                          backend=backend, cache_layout=layout)  # fmt: skip
        assert torch.equal(result.sequences, plain[seed]), (layout, seed)
        assert result.stats.drafter == "eagle3" and result.stats.drafted > 0
        assert native._native.timings()[3] > 0  # the target's forwards ran in the native call, not the reference
        accepted += result.stats.accepted
    assert accepted > 0  # the acceptance and rollback paths ran


def test_hooks_on_the_reference_layers_raise_on_the_native_step(models):
    """Hooks would not run inside the native call: a forward with some on says so, with the way out."""
    reference, native = models
    handle = reference.model.layers[0].register_forward_hook(lambda module, args, output: None)
    try:
        with pytest.raises(RuntimeError, match="capturing_hidden_states"):
            native(prompt(4, 1))
    finally:
        handle.remove()
    assert native(prompt(4, 1)).logits.shape == (1, 4, VOCAB)
