"""The one GGUF header reader (`quantized.gguf_header`): what it reads equals `gguf.GGUFReader`'s reading; a file
cut anywhere in its header, or not a GGUF file, is one `GGUFFormatError`; its callers (the command line's checks,
the loader's truncation check) turn that into their one-line messages; reading imports no torch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from quantized_fixtures import write_tiny_llama_gguf  # noqa: E402

from assisted_backends.loading import files  # noqa: E402
from assisted_backends.quantized.gguf_header import GGUFFormatError, read_header  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return write_tiny_llama_gguf(tmp_path_factory.mktemp("reader") / "tiny.gguf", {"default": "Q4_K", "attn_v": "Q8_0"})


def _gguf_value(field):
    """gguf.GGUFReader's value of a metadata field (a scalar, a string, or a list)."""
    kind = field.types[0]
    if kind == gguf.GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    if kind != gguf.GGUFValueType.ARRAY:
        return field.parts[field.data[0]].item()
    if field.types[1] == gguf.GGUFValueType.STRING:
        return [bytes(field.parts[index]).decode("utf-8") for index in field.data]
    return [field.parts[index].item() for index in field.data]


def test_the_reader_reads_what_gguf_reads(tiny_gguf):
    header, reference = read_header(tiny_gguf), gguf.GGUFReader(tiny_gguf)
    keys = [key for key in reference.fields if not key.startswith("GGUF.")]
    assert sorted(header.metadata) == sorted(keys)
    for key in keys:
        expected = _gguf_value(reference.fields[key])
        value = header.metadata[key]
        if value is None:  # a long string array, read on demand
            value = header.strings(key)
        if isinstance(value, np.ndarray):
            value = value.tolist()
        assert value == expected, key
        if isinstance(expected, list):
            assert header.array_length(key) == len(expected), key
    assert header.metadata["tokenizer.ggml.tokens"] is None  # 272 strings: kept unread until asked for
    assert [tensor.name for tensor in reference.tensors] == list(header.tensors)
    for tensor in reference.tensors:
        info = header.tensors[tensor.name]
        assert info.shape == tuple(reversed([int(size) for size in tensor.shape])), tensor.name
        assert info.kind == tensor.tensor_type.name and info.offset == tensor.data_offset, tensor.name
        assert info.nbytes == tensor.n_bytes and info.elements == tensor.n_elements, tensor.name
        assert np.array_equal(header.tensor_bytes(info).reshape(-1), np.asarray(tensor.data).view(np.uint8).reshape(-1))
    assert header.size == tiny_gguf.stat().st_size and header.data_end() <= header.size
    assert header.architecture == "llama"


def _header_bytes(path: Path) -> int:
    """Where the tensor table ends (the data section follows, aligned)."""
    return min(info.offset for info in read_header(path).tensors.values())


def test_a_file_cut_inside_its_header_is_one_format_error(tiny_gguf, tmp_path):
    data = tiny_gguf.read_bytes()
    cut = tmp_path / "cut.gguf"
    end = _header_bytes(tiny_gguf)
    sizes = sorted({*range(0, 64), *range(64, end - 32, 97), end - 32})  # the table ends past end - 32 (padding < 32)
    for size in sizes:
        cut.write_bytes(data[:size])
        with pytest.raises(GGUFFormatError) as caught:
            read_header(cut)
        assert caught.value.reason and "\n" not in str(caught.value), size
        assert str(cut) in str(caught.value) and str(cut) not in caught.value.reason, size
    cut.write_bytes(data[: (end + len(data)) // 2])  # the header whole, the tensors cut: the caller's check
    header = read_header(cut)
    assert header.data_end() > header.size == cut.stat().st_size


@pytest.mark.parametrize(
    "mangle, words",
    [
        (lambda data: b"GGML" + data[4:], "not a GGUF file"),
        (lambda data: data[:4] + (7).to_bytes(4, "little") + data[8:], "GGUF version 7"),
        (lambda data: data[:24] + (2**40).to_bytes(8, "little") + data[32:], "runs past the end of the file"),
    ],
)
def test_what_is_wrong_is_named(tiny_gguf, tmp_path, mangle, words):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(mangle(tiny_gguf.read_bytes()))
    with pytest.raises(GGUFFormatError, match=words):
        read_header(bad)


def test_the_callers_messages_are_one_line_and_name_the_fix(tiny_gguf, tmp_path):
    from assisted_backends.startup import model_files
    from assisted_backends.startup.errors import CLIError

    data = tiny_gguf.read_bytes()
    cut = tmp_path / "cut.gguf"
    for size, words in ((len(data) // 2, "the GGUF file is truncated"), (10, "not a complete GGUF file"),
                        (100, "not a complete GGUF file")):  # fmt: skip
        cut.write_bytes(data[:size])
        with pytest.raises(files.ModelFileError, match=words) as loader:
            files.check_complete(cut, "model")
        with pytest.raises(CLIError, match=words) as cli:
            model_files.from_gguf(cut, str(cut), "-m")
        for message in (str(loader.value), str(cli.value)):
            assert "\n" not in message and "download or copy it again" in message and str(cut) in message
            assert message.count(str(cut)) == 1, message
    files.check_complete(tiny_gguf, "model")
    found = model_files.from_gguf(tiny_gguf, str(tiny_gguf), "-m")
    assert found.config == {"num_hidden_layers": 2, "max_position_embeddings": 256, "model_type": "llama"}
    assert found.counted_parameters == sum(info.elements for info in read_header(tiny_gguf).tensors.values())


def test_reading_a_header_imports_no_torch(tiny_gguf):
    code = (
        "import sys\n"
        "from assisted_backends.quantized.gguf_header import read_header\n"
        f"header = read_header({str(tiny_gguf)!r})\n"
        "assert header.tensors and header.data_end() <= header.size\n"
        "print(sorted(name for name in ('torch', 'transformers') if name in sys.modules))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
