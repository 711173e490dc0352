"""The engine side of serving, in process: `api.queue.generate_live` fed while it runs (a source whose prompts
arrive between rounds), rows with their own limits, rows cancelled mid-way, the batch growing to its slots;
every finished row's tokens equal `generate` on its prompt alone. And `import assisted_backends.serve` loads no
web framework."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from live_sources import ArrivingSource
from serve_process import Reference, demo_prompts

from assisted_backends.api.queue import generate_live


@pytest.fixture(scope="module")
def reference():
    return Reference()


@pytest.mark.parametrize("drafted", [True, False], ids=["draft", "plain"])
def test_live_rows_equal_generate_alone(reference, drafted):
    from assisted_backends.api.generation import AssistedGenerator
    from assisted_backends.demo.pair import shipped_pair

    pair = shipped_pair()
    generator = AssistedGenerator(str(pair.target_dir), str(pair.draft_dir) if drafted else None, dtype="fp32")
    prompts = [reference.ids(text) for text in demo_prompts(10)]
    limits = [3 + (7 * i) % 16 for i in range(10)]
    source = ArrivingSource(prompts, limits, arrive_after=[0, 0, 3, 3, 3, 4, 9, 9, 15, 16], cancel_at={4: 8})
    finished, progress = {}, {}
    stats = generate_live(
        generator, source, 4, 512, lambda i, t: finished.setdefault(i, t.tolist()),
        lambda i, t: progress.setdefault(i, []).append(t.shape[0]), do_sample=False, pad_token_id=1,
    )  # fmt: skip
    assert source.taken == 10 and sorted(finished) == list(range(10))
    assert stats.joins >= 7  # the first batch had 2 rows: the others joined while the loop ran
    for i, (prompt, limit) in enumerate(zip(prompts, limits)):
        alone = reference.tokens(prompt, limit)
        if i == 4:  # cancelled: what it had committed, a prefix of its answer
            assert finished[i] == alone[: len(finished[i])] and len(finished[i]) < len(alone)
        else:
            assert finished[i] == alone
        assert all(a < b for a, b in zip(progress.get(i, []), progress.get(i, [])[1:]))  # growing, once per round


def test_importing_the_server_loads_no_web_framework():
    code = (
        "import sys, assisted_backends, assisted_backends.serve, assisted_backends.serve.cli; "
        "heavy = ('fastapi', 'uvicorn', 'starlette', 'prometheus_client', 'torch'); "
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


def test_live_rows_on_the_native_decoder_equal_generate_alone(tmp_path):
    """A `.gguf` model served natively (the loader's default where the native decoder covers it): rows joining the
    batch while it runs must get their prompt's tokens alone, as on transformers' modeling."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "native"))
    from decoder_models import prompt, tiny_llama

    from assisted_backends.api.generation import AssistedGenerator
    from assisted_backends.native import decoder_build, extension

    if not extension.available() or decoder_build.why_unavailable():
        pytest.skip("the native decoder needs the package's kernels and a compiler")
    _, native = tiny_llama(str(tmp_path), tied=True)
    generator = AssistedGenerator(native)
    prompts = [prompt(length, seed)[0].tolist() for seed, length in enumerate((5, 12, 9, 20))]
    finished = {}
    source = ArrivingSource(prompts, [24] * 4, arrive_after=[0, 0, 2, 3])
    generate_live(generator, source, 2, 256, lambda i, t: finished.setdefault(i, t.tolist()), pad_token_id=0)
    for i, ids in enumerate(prompts):
        alone = generator.generate(torch.tensor([ids]), max_new_tokens=24).sequences[0, len(ids) :].tolist()
        assert finished[i] == alone, i
