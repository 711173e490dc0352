"""load_gguf_quantized on tiny GGUF files written here (one per format, and a Q4_K_M-like mix)."""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("gguf", reason="the GGUF tests need the gguf package: pip install gguf")
pytest.importorskip("accelerate", reason="building the model with empty weights needs accelerate")

from quantized_fixtures import Q4_K_M_LIKE, write_tiny_llama_gguf  # noqa: E402

from assisted_backends.native import extension  # noqa: E402
from assisted_backends.quantized import kernels  # noqa: E402
from assisted_backends.quantized.linear import QuantizedEmbedding, QuantizedLinear  # noqa: E402
from assisted_backends.quantized.model import load_gguf_quantized  # noqa: E402

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif(not kernels.available().int4, reason=kernels.available().missing("int4") or "int4"),
]
KINDS = {"q4_0": "Q4_0", "q4_1": "Q4_1", "q5_0": "Q5_0", "q8_0": "Q8_0", "q4_k_m": Q4_K_M_LIKE}
IDS = torch.tensor([[256, 72, 101, 108, 108, 111, 32, 119]])


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gguf")
    return {name: write_tiny_llama_gguf(folder / f"tiny-{name}.gguf", kinds) for name, kinds in KINDS.items()}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ASSISTED_BACKENDS_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def aten(monkeypatch):
    """The fallback path: PyTorch's int4/int8 kernels, as on a machine where the package's cannot build."""
    monkeypatch.setenv(extension.SWITCH_VARIABLE, "aten")


needs_blocks = pytest.mark.skipif(not extension.available(), reason=extension.status().reason or "no kernels")


def _transformers_model(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


@pytest.mark.parametrize("name", KINDS)
def test_dense_scheme_equals_transformers_gguf_loading(files, name):
    # Same fp32 weights through the same modules: names, Llama's q/k row order and norms all match.
    ours = load_gguf_quantized(files[name], scheme="dense", tokenizer=False).model
    with torch.no_grad():
        assert torch.equal(ours(IDS).logits, _transformers_model(files[name])(IDS).logits)


@pytest.mark.parametrize("name", KINDS)
def test_fp32_compute_is_the_gguf_model(files, name):
    # Quantized storage, fp32 kernels: weights equal gguf's values, so only summation order differs.
    loaded = load_gguf_quantized(files[name], dtype=torch.float32, tokenizer=False)
    assert isinstance(loaded.model.lm_head, QuantizedLinear)
    assert isinstance(loaded.model.get_input_embeddings(), QuantizedEmbedding)
    with torch.no_grad():
        ours, reference = loaded.model(IDS).logits, _transformers_model(files[name])(IDS).logits
    assert (ours - reference).abs().max() <= 1e-4 * reference.abs().max()


@pytest.mark.parametrize("name", KINDS)
def test_bf16_compute_generates_and_caches(files, name):
    first = load_gguf_quantized(files[name])
    assert not first.from_cache and first.tokenizer is not None
    report = first.report
    assert report["lm_head"].startswith("tied")
    with torch.no_grad():
        logits = first.model(IDS).logits
        reference = _transformers_model(files[name])(IDS).logits
    assert (logits - reference).abs().max() <= 0.1 * reference.abs().max()
    out = first.model.generate(IDS, max_new_tokens=4, do_sample=False)
    assert out.shape == (1, IDS.shape[1] + 4)

    second = load_gguf_quantized(files[name])
    assert second.from_cache and second.cache_dir == first.cache_dir
    with torch.no_grad():
        assert torch.equal(second.model(IDS).logits, logits)
    assert second.tokenizer("hello world")["input_ids"] == first.tokenizer("hello world")["input_ids"]
    entries = sorted(p.name for p in first.cache_dir.iterdir())
    assert "config.json" in entries and "tokenizer" in entries
    assert any(p.startswith("weights-") and p.endswith(".safetensors") for p in entries)
    assert not [p for p in entries if p.startswith(".")], f"temporary files left behind: {entries}"
    assert first.cache_dir.name.startswith(files[name].stem + "-") and len(first.cache_dir.name.split("-")[-1]) == 16


@pytest.mark.parametrize("name", ("q4_0", "q4_1", "q8_0", "q4_k_m"))
@needs_blocks
def test_blocks_keep_resident_weights_near_the_file_size(files, name):
    # 4-bit formats half a byte a weight, 8-bit ones (Q8_0, Q6_K) one byte, fp16 fields as in the file.
    loaded = load_gguf_quantized(files[name], tokenizer=False)
    assert loaded.weight_bytes() <= 1.25 * os.path.getsize(files[name])


@pytest.mark.parametrize("name", ("q4_0", "q4_1", "q8_0", "q4_k_m"))
def test_resident_weights_stay_near_the_file_size(files, name, aten):
    # Q6_K's exact form takes 2 bytes a weight (2.4x its file size); `compact` stores it as int8.
    compact = ("Q6_K",) if name == "q4_k_m" else ()
    loaded = load_gguf_quantized(files[name], tokenizer=False, compact=compact)
    assert loaded.weight_bytes() <= 1.5 * os.path.getsize(files[name])
    if compact:
        assert loaded.report["model.layers.0.mlp.down_proj"] == "Q6_K -> int8"


def test_tied_embedding_and_head_are_one_storage(files, aten):
    model = load_gguf_quantized(files["q4_k_m"], tokenizer=False).model
    embedding, head = model.get_input_embeddings(), model.lm_head
    assert embedding.packed.data_ptr() == head.packed.data_ptr()
    assert torch.equal(embedding(IDS)[0], head.dequantized_weight()[IDS[0]])


@needs_blocks
def test_tied_embedding_and_head_share_blocks(files):
    model = load_gguf_quantized(files["q4_k_m"], tokenizer=False).model
    embedding, head = model.get_input_embeddings(), model.lm_head
    assert head.kernel == "blocks" and embedding.block_codes.data_ptr() == head.block_codes.data_ptr()
    assert torch.equal(embedding(IDS)[0], head.dequantized_weight()[IDS[0]])


@needs_blocks
def test_every_format_goes_to_the_package_kernels(files):
    report = load_gguf_quantized(files["q4_k_m"], tokenizer=False).report
    assert report["model.layers.0.self_attn.q_proj"].startswith("Q4_K -> 4-bit blocks")
    assert report["model.layers.0.mlp.down_proj"].startswith("Q6_K -> 6-bit blocks")
    assert report["model.embed_tokens"].startswith("Q8_0 -> 8-bit blocks")
    assert "rows reordered" in report["model.layers.0.self_attn.k_proj"]


def test_formats_land_in_the_layouts_the_docstring_promises(files, aten):
    report = load_gguf_quantized(files["q4_k_m"], tokenizer=False).report
    assert report["model.layers.0.self_attn.q_proj"].startswith("Q4_K -> int4 x1")
    assert report["model.layers.0.mlp.down_proj"].startswith("Q6_K -> int4 x4")
    assert report["model.embed_tokens"].startswith("Q8_0 -> int4 x2")
    assert "rows reordered" in report["model.layers.0.self_attn.k_proj"]


@pytest.mark.parametrize("scheme", ("int8", "int4"))
def test_requantizing_schemes_stay_within_half_a_step_of_the_file(files, scheme):
    loaded = load_gguf_quantized(files["q8_0"], scheme=scheme, dtype=torch.float32, tokenizer=False)
    dense = load_gguf_quantized(files["q8_0"], scheme="dense", tokenizer=False).model
    layer = loaded.model.model.layers[0].mlp.up_proj
    assert isinstance(layer, QuantizedLinear) and layer.scheme == scheme
    if scheme == "int8":
        step = layer.scales[:, None]
    else:
        step = layer.scale_zeros[..., 0].t().repeat_interleave(layer.group_size, dim=1)
    error = (layer.dequantized_weight() - dense.model.layers[0].mlp.up_proj.weight).abs()
    assert (error <= step / 2 * (1 + 1e-5)).all()


def test_unknown_scheme_is_refused(files):
    with pytest.raises(ValueError, match="scheme"):
        load_gguf_quantized(files["q4_0"], scheme="int3")


@pytest.mark.parametrize("name", ["q4_0", "q8_0"])
def test_a_quantized_table_gives_a_head_the_dense_embedding_rows(files, name):
    from assisted_backends.drafters.eagle.build import target_embedding

    dense = load_gguf_quantized(files[name], scheme="dense", tokenizer=False).model.get_input_embeddings()
    rows, count, width = target_embedding(load_gguf_quantized(files[name], tokenizer=False).model)
    assert (count, width) == tuple(dense.weight.shape)
    assert (rows(IDS) - dense(IDS)).abs().max() <= 1e-2 * dense.weight.abs().max()  # bf16 scales: ~0.4%


def test_an_eagle_head_without_embeddings_drafts_for_a_gguf_target(files):
    # A quantized table has no `weight`: a head that carries no embed_tokens embeds with its dequantized rows,
    # and drafts for the quantized target as it does for the same weights dense.
    from eagle_fixtures import trained_head

    from assisted_backends import generate

    dense = load_gguf_quantized(files["q4_0"], scheme="dense", tokenizer=False).model
    head = trained_head(dense, steps=150, sequences=48)
    assert head.embed_tokens is None
    target = load_gguf_quantized(files["q4_0"], tokenizer=False).model
    assert isinstance(target.get_input_embeddings(), QuantizedEmbedding)
    plain = generate(target, IDS, max_new_tokens=24).sequences
    drafted = generate(target, IDS, max_new_tokens=24, assistant_model=head, num_assistant_tokens=3)
    on_dense = generate(dense, IDS, max_new_tokens=24, assistant_model=head, num_assistant_tokens=3)
    assert torch.equal(drafted.sequences, plain)
    assert drafted.stats.accepted > 0 and drafted.stats.accepted == on_dense.stats.accepted
