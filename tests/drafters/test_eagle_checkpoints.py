"""Published EAGLE-3 checkpoints: tiny heads written in the EAGLE authors' layout (config `LlamaForCausalLM`,
fp16 `pytorch_model.bin`, no `embed_tokens`) and SpecForge's (`LlamaForCausalLMEagle3`, bf16
`model.safetensors` with `embed_tokens`, feature layers as outputs in `eagle_config`), recognised by their keys,
loaded from a directory by `generate` and the CLI, and refused with a clear message when they cannot serve."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch
from eagle_fixtures import DEMO_DIR, demo_head, demo_target, random_head
from safetensors.torch import save_file
from tiny_models import random_prompt, reference_greedy, tiny_model

from assisted_backends import generate
from assisted_backends.cli import main as cli_main
from assisted_backends.drafters.eagle import is_eagle_checkpoint, load_head, save_head
from assisted_backends.drafters.eagle.checkpoint import HeadCheckpointError
from assisted_backends.drafters.eagle.config import Eagle3Config
from assisted_backends.drafters.eagle.features import LayerTap
from assisted_backends.options.errors import OptionError

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16)


def _target(layers: int = 6, hidden: int = 64):
    return tiny_model("llama", seed=0, layers=layers, hidden=hidden)


def _head_state(config: dict, vocab: int, draft_vocab: int, with_embeddings: bool, dtype: torch.dtype) -> dict:
    """A state dict with exactly the published key set and shapes, random values."""
    g = torch.Generator().manual_seed(0)
    h, i, heads, kv, d = (config[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                              "num_key_value_heads", "head_dim"))  # fmt: skip
    shapes = {
        "fc.weight": (h, 3 * h),
        "midlayer.input_layernorm.weight": (h,),
        "midlayer.hidden_norm.weight": (h,),
        "midlayer.post_attention_layernorm.weight": (h,),
        "midlayer.self_attn.q_proj.weight": (heads * d, 2 * h),
        "midlayer.self_attn.k_proj.weight": (kv * d, 2 * h),
        "midlayer.self_attn.v_proj.weight": (kv * d, 2 * h),
        "midlayer.self_attn.o_proj.weight": (h, heads * d),
        "midlayer.mlp.gate_proj.weight": (i, h),
        "midlayer.mlp.up_proj.weight": (i, h),
        "midlayer.mlp.down_proj.weight": (h, i),
        "norm.weight": (h,),
        "lm_head.weight": (draft_vocab, h),
    }
    if with_embeddings:
        shapes["embed_tokens.weight"] = (vocab, h)
    state = {k: (0.1 * torch.randn(shape, generator=g)).to(dtype) for k, shape in shapes.items()}
    for k in state:
        if k.endswith("norm.weight"):
            state[k] = torch.ones_like(state[k])
    kept = torch.arange(0, vocab, vocab // draft_vocab)[:draft_vocab]
    state["d2t"] = kept - torch.arange(draft_vocab)
    state["t2d"] = torch.zeros(vocab, dtype=torch.bool)
    state["t2d"][kept] = True
    return state


def write_eagle_authors(directory: Path, vocab: int = 128, draft_vocab: int = 32) -> Path:
    """The EAGLE authors' files: config.json naming LlamaForCausalLM, fp16 pytorch_model.bin, no embed_tokens."""
    directory.mkdir(parents=True)
    config = dict(
        architectures=["LlamaForCausalLM"], model_type="llama", num_hidden_layers=1, bos_token_id=0, eos_token_id=1,
        hidden_act="silu", initializer_range=0.02, max_position_embeddings=2048, pad_token_id=0, rms_norm_eps=1e-5,
        tie_word_embeddings=False, torch_dtype="float16", transformers_version="4.28.1", use_cache=True,
        vocab_size=vocab, draft_vocab_size=draft_vocab, rope_theta=10000.0, **TINY,
    )  # fmt: skip
    (directory / "config.json").write_text(json.dumps(config))
    torch.save(_head_state(config, vocab, draft_vocab, False, torch.float16), directory / "pytorch_model.bin")
    return directory


def write_specforge(directory: Path, vocab: int = 128, draft_vocab: int = 32, layer_outputs=(1, 2, 3)) -> Path:
    """SpecForge's files: config.json naming LlamaForCausalLMEagle3 with eagle_config, bf16 model.safetensors
    with embed_tokens."""
    directory.mkdir(parents=True)
    config = dict(
        architectures=["LlamaForCausalLMEagle3"], model_type="llama", num_hidden_layers=1, hidden_act="silu",
        max_position_embeddings=2048, rms_norm_eps=1e-6, rope_theta=10000.0, rope_scaling=None,
        tie_word_embeddings=False, torch_dtype="bfloat16", vocab_size=vocab, draft_vocab_size=draft_vocab,
        eagle_config=dict(eagle_aux_hidden_state_layer_ids=list(layer_outputs), use_aux_hidden_state=True), **TINY,
    )  # fmt: skip
    (directory / "config.json").write_text(json.dumps(config))
    save_file(_head_state(config, vocab, draft_vocab, True, torch.bfloat16), str(directory / "model.safetensors"))
    return directory


@pytest.mark.parametrize("writer", [write_eagle_authors, write_specforge], ids=["eagle-authors", "specforge"])
def test_published_layouts_load_and_draft_exactly(writer, tmp_path):
    head_dir = writer(tmp_path / "head")
    assert is_eagle_checkpoint(head_dir)
    head = load_head(head_dir)
    assert (head.embed_tokens is None) == (writer is write_eagle_authors)
    assert head.fc.weight.dtype == (torch.float16 if writer is write_eagle_authors else torch.bfloat16)
    target = _target()
    prompt = random_prompt(8, seed=3)
    for static in (False, True):
        result = generate(
            target, prompt, assistant_model=str(head_dir), max_new_tokens=16, num_assistant_tokens=3,
            static_shapes=static,
        )  # fmt: skip
        assert torch.equal(result.sequences, reference_greedy(target, prompt, 16))
        assert result.stats.drafter == "eagle3" and result.stats.drafted > 0


def test_feature_layers_from_each_config_convention():
    base = dict(vocab_size=128, draft_vocab_size=32, **TINY)
    assert Eagle3Config.from_dict(base).layers_for(32) == (2, 16, 29)  # the authors' 2, L//2, L − 3
    vllm = Eagle3Config.from_dict({**base, "eagle_aux_hidden_state_layer_ids": [1, 3, 5]})
    assert vllm.layers_for(6) == (1, 3, 5)  # layer inputs
    specforge = Eagle3Config.from_dict({**base, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 5]}})
    assert specforge.layers_for(6) == (2, 3, 6)  # layer outputs: the inputs of the next layers (6: the last output)
    assert Eagle3Config.from_dict(Eagle3Config.from_dict(base).to_dict(32)).layers_for(32) == (2, 16, 29)
    with pytest.raises(ValueError, match="three target layers"):
        Eagle3Config.from_dict({**base, "eagle_aux_hidden_state_layer_ids": [1, 3, 9]}).layers_for(6)


def test_the_tap_captures_the_residual_stream_entering_each_layer():
    target = _target()
    prompt = random_prompt(7, seed=1)
    tap = LayerTap(target, (0, 3, 6))
    with torch.inference_mode(), tap.capture() as captured:
        out = target(prompt, output_hidden_states=True)
    features = tap.features(captured)
    states = out.hidden_states  # embeddings, then each layer's output (the last one after the final norm)
    torch.testing.assert_close(features[..., :64], states[0], rtol=0, atol=0)
    torch.testing.assert_close(features[..., 64:128], states[3], rtol=0, atol=0)
    final_norm = target.model.norm
    torch.testing.assert_close(final_norm(features[..., 128:]), states[6])


@pytest.mark.parametrize("layout", ["specforge", "eagle"])
def test_round_trip_of_a_trained_head(layout, tmp_path):
    target, _ = demo_target()
    head = demo_head()
    embeddings = target.get_input_embeddings().weight if layout == "specforge" else None
    save_head(head, tmp_path / "head", layout, target_layers=6, embeddings=embeddings)
    config = json.loads((tmp_path / "head" / "config.json").read_text())
    assert config["architectures"] == (["LlamaForCausalLMEagle3"] if layout == "specforge" else ["LlamaForCausalLM"])
    loaded = load_head(tmp_path / "head", torch.float32)
    expected = {k: v.to(torch.bfloat16 if layout == "specforge" else torch.float16).float() for k, v in
                head.state_dict().items() if v.is_floating_point()}  # fmt: skip
    for name, value in loaded.state_dict().items():
        if name in expected:
            torch.testing.assert_close(value, expected[name], rtol=0, atol=0)
    assert torch.equal(loaded.d2t, head.d2t) and torch.equal(loaded.t2d, head.t2d)
    assert loaded.config.layers_for(6) == head.config.layers_for(6)
    prompt = torch.tensor([[5, 17, 300, 41, 9, 77, 12, 8]])
    result = generate(target, prompt, assistant_model=str(tmp_path / "head"), max_new_tokens=20)
    assert torch.equal(result.sequences, reference_greedy(target, prompt, 20))


def test_a_heads_held_out_acceptance_becomes_the_schedules_prior(tmp_path):
    """train-draft writes training.json beside the head: its latest held-out α_1 is the adaptive schedule's prior
    for α_1 (a head known to be rarely right is not drafted with for rounds first); heads from elsewhere, or a
    record that cannot be read, leave the uninformed prior."""
    from assisted_backends import AssistedGenerator

    target, _ = demo_target()
    directory = save_head(demo_head(), tmp_path / "head", "specforge", target_layers=6)
    assert load_head(directory).held_out_alpha is None
    (directory / "training.json").write_text(json.dumps({"latest": [0.07, 0.2, 0.1], "untrained": [0.0, 0.0, 0.0]}))
    head = load_head(directory)
    assert head.held_out_alpha == 0.07
    prompt = torch.tensor([[5, 17, 300, 41, 9, 77, 12, 8]])
    plan = AssistedGenerator(target, assistant_model=head).plan(prompt, max_new_tokens=8)
    assert plan.schedule.acceptance_prior == 0.07
    assert plan.schedule.build().acceptance.rates()[0] == pytest.approx(0.07)
    (directory / "training.json").write_text("{not json")
    assert load_head(directory).held_out_alpha is None
    result = generate(target, prompt, assistant_model=head, max_new_tokens=20)
    assert torch.equal(result.sequences, reference_greedy(target, prompt, 20))


def test_a_head_for_another_target_is_refused(tmp_path):
    head = random_head(_target())
    with pytest.raises(OptionError, match="trained for another target.*hidden size is 32"):
        generate(_target(hidden=32), random_prompt(5, seed=0), assistant_model=head, max_new_tokens=4)
    with pytest.raises(OptionError, match="vocabulary of 128 tokens.*200"):
        generate(tiny_model("llama", seed=0, layers=6, vocab=200), random_prompt(5, seed=0), assistant_model=head,
                 max_new_tokens=4)  # fmt: skip


def test_only_heads_are_recognised(tmp_path):
    plain = tiny_model("llama", seed=0, layers=1)
    plain.save_pretrained(tmp_path / "one_layer_llama")
    assert not is_eagle_checkpoint(tmp_path / "one_layer_llama")
    broken = write_specforge(tmp_path / "broken")
    from safetensors.torch import load_file

    state = load_file(str(broken / "model.safetensors"))
    del state["midlayer.mlp.down_proj.weight"]
    save_file(state, str(broken / "model.safetensors"))
    with pytest.raises(HeadCheckpointError, match="missing.*down_proj"):
        load_head(broken)


class _Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path(self.marker).write_text, ("unpickled",))


def test_a_bin_is_never_unpickled_as_objects(tmp_path):
    head_dir = write_eagle_authors(tmp_path / "head")
    state = torch.load(head_dir / "pytorch_model.bin", weights_only=True)
    marker = tmp_path / "marker"
    torch.save({**state, "evil": _Payload(str(marker))}, head_dir / "pytorch_model.bin")
    assert not is_eagle_checkpoint(head_dir)  # its keys cannot be read safely: not a head
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        load_head(head_dir)
    assert not marker.exists()


def test_cli_takes_a_head_as_assistant_model(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    target, _ = demo_target()
    save_head(demo_head(), tmp_path / "head", "specforge", target_layers=6)
    common = ["-m", str(DEMO_DIR / "target"), "--max-new-tokens", "16", "--dtype", "fp32", "--prompt", "def add(a, b):"]
    plain, assisted = tmp_path / "plain.json", tmp_path / "assisted.json"
    assert cli_main([*common, "--no-assisted", "--json", str(plain)]) == 0
    code = cli_main([*common, "--assistant-model", str(tmp_path / "head"), "--num-assistant-tokens", "3",
                     "--json", str(assisted)])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    plain_data, assisted_data = json.loads(plain.read_text()), json.loads(assisted.read_text())
    assert plain_data["generated_token_ids"] == assisted_data["generated_token_ids"]
    assert assisted_data["stats"]["drafted"] > 0

    combined = tmp_path / "combined.json"  # a head with prompt lookup: lookup matches first, the head otherwise
    code = cli_main([*common, "--assistant-model", str(tmp_path / "head"), "--prompt-lookup", "4",
                     "--num-assistant-tokens", "3", "--json", str(combined)])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    combined_data = json.loads(combined.read_text())
    assert combined_data["generated_token_ids"] == plain_data["generated_token_ids"]
    assert combined_data["stats"]["drafted"] > 0
    assert cli_main([*common, "--assistant-model", str(DEMO_DIR / "draft"), "--prompt-lookup", "4"]) == 2
    assert "choose one way of drafting" in capsys.readouterr().err  # a draft model does not combine


def test_a_hub_id_whose_snapshot_is_cached_loads_as_a_head(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    repo = tmp_path / "hub" / "models--someone--tiny-eagle3"
    write_specforge(repo / "snapshots" / ("0" * 40))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    from assisted_backends.loading import models

    models.resolve.cache_clear()
    head = models.load_model("someone/tiny-eagle3", "assistant_model")
    assert type(head).__name__ == "Eagle3Head" and head.embed_tokens is not None
    assert models.load_tokenizer("someone/tiny-eagle3", "assistant_model") is None


def test_the_targets_embedding_never_becomes_part_of_the_head():
    target = _target()
    head = random_head(target)
    head.use_target_embedding(target.get_input_embeddings().weight)  # an nn.Parameter
    assert "_target_embedding" not in head.state_dict() and all(p is not None for p in head.parameters())
    assert sum(p.numel() for p in head.parameters()) == head.body_parameters()


def test_a_head_without_embed_tokens_is_refused_while_planning(tmp_path):
    """A head that borrows the target's input embedding (the EAGLE authors' files carry none) is checked against
    that embedding by planning, from the target's facts: no model is prepared for a call it refuses."""
    from assisted_backends import AssistedGenerator

    head = load_head(write_eagle_authors(tmp_path / "authors"))
    assert head.embed_tokens is None
    target = _target()
    target.set_input_embeddings(torch.nn.Embedding(128, 32))  # never run: the call is refused before
    generator = AssistedGenerator(target, head)
    with pytest.raises(OptionError, match="no embed_tokens and its width 64 differs from the target embedding's 32"):
        generator.plan(random_prompt(5, seed=0), max_new_tokens=4)
    prepared = []
    generator.backend.prepare = lambda *args, **kwargs: prepared.append(args)  # a spy: nothing may be prepared
    with pytest.raises(OptionError, match="no embed_tokens"):
        generator.generate(random_prompt(5, seed=0), max_new_tokens=4)
    assert prepared == []
