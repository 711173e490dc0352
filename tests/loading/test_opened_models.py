"""A model named by its path is opened once per process: `generate(path, ...)` and `AssistedGenerator(path)` reuse
it, so what is kept per model (the suffix index) learns across calls; a file written again is opened again; at most
`OPENED_LIMIT` models are kept."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

pytest.importorskip("gguf")
pytest.importorskip("accelerate")

from quantized_fixtures import write_tiny_llama_gguf  # noqa: E402

import assisted_backends  # noqa: E402
from assisted_backends.loading import models  # noqa: E402
from assisted_backends.loading import open as opening

IDS = torch.tensor([[256, 72, 101, 108, 108, 111, 32, 119]])
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def tiny_gguf(tmp_path) -> Path:
    return write_tiny_llama_gguf(tmp_path / "tiny-reuse.gguf", "Q8_0")


@pytest.fixture
def loads(monkeypatch) -> list[str]:
    """The names `loading.models.load_model` opened (each a load of weights)."""
    opened: list[str] = []
    load = models.load_model

    def counted(name, *args, **kwargs):
        opened.append(str(name))
        return load(name, *args, **kwargs)

    monkeypatch.setattr(models, "load_model", counted)
    return opened


def test_a_path_is_opened_once_and_its_suffix_index_learns_across_calls(tiny_gguf, loads):
    runs = [assisted_backends.generate(str(tiny_gguf), IDS, max_new_tokens=24, suffix_cache=True) for _ in range(2)]
    assert loads == [str(tiny_gguf)], "the second call opened the file again"
    assert torch.equal(runs[0].sequences, runs[1].sequences)
    first, second = (run.stats for run in runs)
    assert second.accepted > first.accepted and second.accepted >= second.drafted - 1, (first, second)
    plain = assisted_backends.generate(str(tiny_gguf), IDS, max_new_tokens=24)
    assert torch.equal(plain.sequences, runs[0].sequences)
    generator = assisted_backends.AssistedGenerator(str(tiny_gguf))
    assert len(loads) == 1 and torch.equal(generator.generate(IDS, max_new_tokens=24).sequences, plain.sequences)


def test_a_file_written_again_is_opened_again(tiny_gguf, loads):
    assisted_backends.generate(str(tiny_gguf), IDS, max_new_tokens=4)
    write_tiny_llama_gguf(tiny_gguf, "Q8_0", seed=1)  # other weights under the same name
    stat = tiny_gguf.stat()
    os.utime(tiny_gguf, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assisted_backends.generate(str(tiny_gguf), IDS, max_new_tokens=4)
    assert loads == [str(tiny_gguf)] * 2


def test_at_most_the_limit_is_kept_least_recently_used_first(tmp_path, monkeypatch):
    monkeypatch.setattr(opening, "open_model", lambda name, what, precision, tokenizer: opening.LoadedModel(
        str(name), what, object()))  # fmt: skip
    names = [tmp_path / f"m{index}" for index in range(opening.OPENED_LIMIT + 1)]
    for name in names:
        name.mkdir()
        (name / "config.json").write_text("{}")
    kept = [opening.opened_model(name, "model", None) for name in names[:-1]]
    assert opening.opened_model(names[0], "model", None) is kept[0]  # used again: now the most recent
    opening.opened_model(names[-1], "model", None)  # one over the limit: names[1], the least recent, goes
    assert opening.opened_model(names[0], "model", None) is kept[0]
    assert opening.opened_model(names[2], "model", None) is kept[2]
    assert opening.opened_model(names[1], "model", None) is not kept[1]  # opened again
    first = kept[0]
    assert opening.opened_model(names[0], "model", "int8") is not first  # another precision: another model
