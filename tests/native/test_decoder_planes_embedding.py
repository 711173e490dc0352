"""Token tables with bit planes (`quantized.blocks`: Q5_0 and Q5_K in 5 bits, Q6_K in 6): the native decoder reads
their rows itself (`Linear::dequantize_row` in decoder.cpp, the kernels' `stored_value`) and they are the Python
table's rows (gguf's values) bit for bit."""

from __future__ import annotations

import decoder_models
import pytest
import torch

from assisted_backends.native import decoder_build, extension

pytestmark = pytest.mark.skipif(
    not extension.available() or bool(decoder_build.why_unavailable()),
    reason="the native decoder needs the package's kernels and a compiler",
)


@pytest.mark.parametrize(("kind", "bits"), [("Q5_0", 5), ("Q5_K", 5), ("Q6_K", 6)])
def test_the_native_decoder_reads_a_token_table_with_planes_as_python_does(tmp_path, monkeypatch, kind, bits):
    monkeypatch.setitem(decoder_models.FORMATS, "token_embd", kind)
    reference, native = decoder_models.tiny_llama(str(tmp_path))
    embedding = reference.get_input_embeddings()
    assert embedding.block_meta["bits"] == bits  # the table is stored with its planes
    assert native._embed is None  # and the native code reads its rows, not the Python module
    tokens = decoder_models.prompt(12, 3, batch=2)
    with torch.inference_mode(), native.capturing_hidden_states([0]) as captured:
        native(tokens, past_key_values=native.new_native_cache())
    assert torch.equal(captured[0], embedding(tokens).float())
