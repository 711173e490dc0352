"""Crafted `.gguf` files (`crafted_gguf.CASES`: a tiny Llama whose tensors or header were changed) stop with one line
on every route a user opens a file by, before any kernel or native code reads a tensor: the file checks
(`quantized.file_checks`, through `hf_config.load_config`), `AssistedGenerator(path)` and `generate(path)` (a
ValueError), and `run-assisted-generation -m FILE` with and without `--prompt-lookup` (exit status 2, one `error:`
line, no traceback, no signal). The native decoder and the row-attention op refuse wrong shapes of their own on a
direct call. The well-formed file the crafted ones start from loads and generates."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("gguf")
from crafted_gguf import CASES, write_base, write_crafted  # noqa: E402

from assisted_backends.quantized.gguf_header import read_header  # noqa: E402
from assisted_backends.quantized.hf_config import load_config  # noqa: E402

NAMES = sorted(CASES)
ADVICE = "download it again"


@pytest.fixture(scope="module")
def crafted(tmp_path_factory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("crafted")
    return {name: write_crafted(directory, name) for name in NAMES}


def _one_line(message: str, path: Path, name: str, cli: bool = False) -> None:
    assert "\n" not in message.strip(), message
    if cli and CASES[name].cli_subject:  # the command's own checks refused it before loading: what they name
        assert CASES[name].cli_subject in message, message
        return
    assert str(path) in message and CASES[name].subject in message, message


@pytest.mark.parametrize("name", NAMES)
def test_the_file_checks_refuse_each_crafted_file_in_one_line(crafted, name):
    path = crafted[name]
    with pytest.raises(ValueError) as raised:
        load_config(read_header(path))
    _one_line(str(raised.value), path, name)


@pytest.mark.parametrize("value", [None, "", ["llama", "qwen2"], 7, "lla\nma"])
def test_a_header_without_an_architecture_name_is_refused_in_one_line(tmp_path, value):
    from assisted_backends.quantized.gguf_header import GGUFFormatError, GGUFHeader

    header = GGUFHeader(tmp_path / "x.gguf", {} if value is None else {"general.architecture": value}, {})
    with pytest.raises(GGUFFormatError) as raised:
        _ = header.architecture
    assert "\n" not in str(raised.value) and "general.architecture" in str(raised.value)


def test_the_well_formed_files_pass_the_checks(tmp_path):
    for tied in (False, True):
        config = load_config(read_header(write_base(tmp_path, tied)))
        assert config.num_hidden_layers == 2 and config.tie_word_embeddings == tied


@pytest.mark.parametrize("name", NAMES)
def test_the_python_api_refuses_each_crafted_file(crafted, name):
    from assisted_backends import AssistedGenerator

    path = crafted[name]
    with pytest.raises(ValueError) as raised:
        AssistedGenerator(str(path))
    _one_line(str(raised.value), path, name)


@pytest.mark.parametrize("name", ["token_embd_wide", "heads_zero", "layers_zero", "vocab_empty", "data_overlap"])
def test_generate_refuses_a_crafted_file(crafted, name):
    import assisted_backends

    path = crafted[name]
    with pytest.raises(ValueError) as raised:
        assisted_backends.generate(str(path), torch.tensor([[5, 6, 7]]), max_new_tokens=4)
    _one_line(str(raised.value), path, name)


def _error_lines(stderr: str) -> list[str]:
    assert "Traceback" not in stderr, stderr
    return [line for line in stderr.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("lookup", [(), ("--prompt-lookup", "10")], ids=["draft", "prompt-lookup"])
@pytest.mark.parametrize("name", NAMES)
def test_the_command_line_refuses_each_crafted_file(crafted, name, lookup, capsys):
    from assisted_backends.cli.main import main

    path = crafted[name]
    code = main(["-m", str(path), "--prompt", "hi", "--max-new-tokens", "4", *lookup])
    captured = capsys.readouterr()
    (line,) = _error_lines(captured.err)
    assert code == 2 and not captured.out.strip(), captured
    _one_line(line, path, name, cli=True)


def _command(path: Path, *extra: str) -> subprocess.CompletedProcess:
    code = "import sys; from assisted_backends.cli.main import main; sys.exit(main(sys.argv[1:]))"
    argv = [sys.executable, "-c", code, "-m", str(path), "--prompt", "hi", "--max-new-tokens", "4", *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    "name",
    [
        "token_embd_wide_tied",
        "attn_output_rows_short",
        "heads_zero",
        "vocab_empty",
        "bos_id_past_the_vocabulary",
        "merges_a_number",
    ],
)
def test_the_command_in_its_own_process_exits_2_with_one_line(crafted, name):
    """What the issue saw as signals (heap corruption, SIGSEGV, SIGFPE) and tracebacks, in a process of its own."""
    done = _command(crafted[name], "--prompt-lookup", "10")
    (line,) = _error_lines(done.stderr)
    assert done.returncode == 2 and not done.stdout.strip(), (done.returncode, done.stderr)
    _one_line(line, crafted[name], name, cli=True)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_every_crafted_file_in_its_own_process(crafted, name):
    """A fresh process per case (a signal would show here); the routes alternate by case (both run in-process on
    every case in the default suite), so the lane spends ~4 minutes, not 8."""
    lookup = ("--prompt-lookup", "10") if NAMES.index(name) % 2 else ()
    done = _command(crafted[name], *lookup)
    (line,) = _error_lines(done.stderr)
    assert done.returncode == 2 and not done.stdout.strip(), (done.returncode, done.stderr)
    _one_line(line, crafted[name], name, cli=True)


def test_the_well_formed_file_generates_on_every_route(tmp_path, capsys):
    """The control: the file the crafted ones come from gives tokens through the API and the command line."""
    from assisted_backends import AssistedGenerator
    from assisted_backends.cli.main import main

    path = write_base(tmp_path)
    result = AssistedGenerator(str(path)).generate(torch.tensor([[5, 6, 7]]), max_new_tokens=4)
    sequences = getattr(result, "sequences", result)
    assert sequences.shape == (1, 7)
    assert main(["-m", str(path), "--prompt", "hi", "--max-new-tokens", "4", "--prompt-lookup", "10"]) == 0
    assert "error" not in capsys.readouterr().err


# -- the native code's own checks: a direct call with wrong shapes raises, never reads or writes out of bounds -----


@pytest.fixture(scope="module")
def native_parts(tmp_path_factory):
    """(decoder module, the well-formed model on the block kernels, its Linear of each matrix by role)."""
    from assisted_backends.native import decoder_build
    from assisted_backends.native.decoder_model import native_linear, why_unavailable
    from assisted_backends.quantized.model import load_gguf_quantized

    path = write_base(tmp_path_factory.mktemp("native"))
    model = load_gguf_quantized(path, tokenizer=False, use_cache=False).model
    model = getattr(model, "reference", model)  # transformers' modeling on the kernels, where a native step wraps it
    if why_unavailable(model):
        pytest.skip(why_unavailable(model))
    module = decoder_build.module()
    layer = model.model.layers[0]
    attention, mlp = layer.self_attn, layer.mlp
    shared = attention.q_proj.shared.fused if hasattr(attention.q_proj, "shared") else None
    gate_up = mlp.gate_proj.shared.fused if hasattr(mlp.gate_proj, "shared") else None
    parts = {"qkv": native_linear(module, shared), "o": native_linear(module, attention.o_proj),
             "gate_up": native_linear(module, gate_up), "down": native_linear(module, mlp.down_proj),
             "head": native_linear(module, model.lm_head)}  # fmt: skip
    return module, model, parts


def _decoder(module, parts, **change):
    sizes = {"hidden": 256, "heads": 4, "kv_heads": 2, "head_dim": 64, "intermediate": 512,
             "final_norm": torch.ones(256)} | change  # fmt: skip
    return module.Decoder(sizes["hidden"], sizes["heads"], sizes["kv_heads"], sizes["head_dim"], sizes["intermediate"],
                          1e-5, 0.125, sizes["final_norm"], module.no_linear(), 0.0, parts["head"], 0)  # fmt: skip


@pytest.mark.parametrize(
    ("change", "says"),
    [({"heads": 0}, "heads"), ({"kv_heads": 0}, "heads"), ({"kv_heads": 3}, "multiple"), ({"head_dim": 63}, "even"),
     ({"hidden": 0}, "at least 1"), ({"final_norm": torch.ones(128)}, "final norm"),
     ({"final_norm": torch.ones(256, dtype=torch.float64)}, "final norm"),
     ({"hidden": 512, "final_norm": torch.ones(512)}, "LM head")],
)  # fmt: skip
def test_the_native_decoder_refuses_sizes_that_cannot_hold(native_parts, change, says):
    module, _, parts = native_parts
    with pytest.raises(RuntimeError, match=says):
        _decoder(module, parts, **change)


def _layer(parts, **change):
    norm = torch.ones(256)
    arguments = {"qkv": [parts["qkv"]], "o": parts["o"], "gate_up": [parts["gate_up"]], "down": parts["down"],
                 "input_norm": norm, "attention_out_norm": None, "mlp_norm": norm, "mlp_out_norm": None,
                 "q_norm": None, "k_norm": None, "window": 0, "table": 0} | change  # fmt: skip
    return list(arguments.values())


@pytest.mark.parametrize(
    ("change", "says"),
    [({"o": "gate_up"}, "output projection"), ({"down": "o"}, "down projection"),
     ({"qkv": ["o"]}, "fused q/k/v"), ({"gate_up": ["down"]}, "fused gate/up"),
     ({"qkv": ["o", "o", "o"]}, "k projection"), ({"input_norm": torch.ones(128)}, "input norm"),
     ({"mlp_norm": torch.ones(512)}, "MLP norm"), ({"q_norm": torch.ones(32)}, "q / k norm"),
     ({"mlp_out_norm": torch.ones(255)}, "output norm"), ({"window": -1}, "window")],
)  # fmt: skip
def test_the_native_decoder_refuses_a_layer_of_the_wrong_shapes(native_parts, change, says):
    module, _, parts = native_parts
    named = {}
    for key, value in change.items():  # role names stand for the well-formed model's matrices
        if isinstance(value, list):
            named[key] = [parts[role] for role in value]
        else:
            named[key] = parts[value] if isinstance(value, str) else value
    decoder = _decoder(module, parts)
    with pytest.raises(RuntimeError, match=says):
        decoder.add_layer(*_layer(parts, **named))
    assert decoder.layers() == 0


def test_the_native_step_refuses_caches_of_the_wrong_shape_and_a_model_without_layers(native_parts):
    module, _, parts = native_parts
    decoder = _decoder(module, parts)
    tokens = torch.tensor([[5, 6]])
    positions = torch.arange(2)[None]
    embedded = torch.zeros(2, 256)

    def step(keys, values):
        return decoder.step(tokens, positions, 0, keys, values, None, 0, 0, embedded, [], None)

    with pytest.raises(RuntimeError, match="no layers"):
        step([], [])
    decoder.add_layer(*_layer(parts))
    decoder.set_rotary(0, torch.ones(16, 64), torch.zeros(16, 64))
    good = torch.zeros(1, 2, 8, 64)
    for keys, values in [(torch.zeros(1, 4, 8, 64), good), (good, torch.zeros(1, 2, 8, 32)),
                         (torch.zeros(2, 2, 8, 64), good), (good, torch.zeros(1, 2, 4, 64)),
                         (good, torch.zeros(1, 2, 8, 64, dtype=torch.float64))]:  # fmt: skip
        with pytest.raises(RuntimeError, match="cache"):
            step([keys], [values])
    assert step([good.clone()], [good.clone()]).shape == (1, 2, 272)  # the well-formed cache: logits [B, M, V]


@pytest.mark.parametrize(
    ("q", "k", "mask", "lengths", "says"),
    [((1, 4, 2, 8), (1, 0, 3, 8), None, 2, "key/value heads"), ((1, 4, 2, 8), (1, 3, 3, 8), None, 2, "multiple"),
     ((1, 4, 2, 8), (2, 2, 3, 8), None, 2, "disagree"), ((1, 4, 2, 8), (1, 2, 3, 4), None, 2, "disagree"),
     ((1, 4, 2, 8), (1, 2, 3, 8), (1, 3, 2, 3), 2, "mask"), ((1, 4, 2, 8), (1, 2, 3, 8), None, 3, "lengths")],
)  # fmt: skip
def test_row_attention_refuses_shapes_that_disagree(q, k, mask, lengths, says):
    from assisted_backends.native import extension

    if not extension.available():
        pytest.skip("the package's kernels are not built here")
    query, key = torch.randn(q), torch.randn(k)
    value = key.clone()
    bools = None if mask is None else torch.ones(mask, dtype=torch.bool)
    with pytest.raises(RuntimeError, match=says):
        torch.ops.assisted_backends.row_attention(query, key, value, bools, torch.full((lengths,), 3), 0.35, 0)
