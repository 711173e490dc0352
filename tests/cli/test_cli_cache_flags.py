"""The cache flags both command lines take (`startup.flags`): `--kv-cache-dtype` keeps a `.gguf` target's native
cache in half precision (opened so; a target off the native step is one error naming the flag), and
`--no-prefix-cache` turns the prefix cache off for `run-assisted-generation`'s calls, which reuse prefixes by default
on the native step."""

from __future__ import annotations

import pytest
import torch
from cli_fixtures import messages, run_cli
from decoder_models import write_tiny_llama

from assisted_backends.cli.args import build_parser
from assisted_backends.cli.session import Session
from assisted_backends.native.decoder_cache import KV_CACHE_DTYPES
from assisted_backends.startup import flags
from assisted_backends.startup.pair import open_pair

pytestmark = pytest.mark.usefixtures("one_thread")


def opened(*argv: str) -> Session:
    return open_pair(build_parser(flags.device_names()).parse_args([*argv, "--threads", "1"]), Session)


@pytest.fixture(scope="module")
def quantized_gguf(tmp_path_factory):
    """A tiny random block-quantized Llama `.gguf` (its tokenizer in the file): the native step runs it."""
    pytest.importorskip("gguf")
    return write_tiny_llama(tmp_path_factory.mktemp("cache-flags") / "tiny.gguf")


def test_the_flag_names_every_cache_type_the_native_step_keeps():
    assert flags.KV_CACHE_DTYPES == tuple(KV_CACHE_DTYPES)


def test_a_half_precision_cache_is_the_native_steps_own(quantized_gguf):
    session = opened("-m", str(quantized_gguf), "--kv-cache-dtype", "fp16", "--no-assisted")
    assert session.target.new_native_cache(1).dtype == torch.float16
    ids = torch.randint(3, 100, (1, 12), generator=torch.Generator().manual_seed(1))
    assert session.generate(ids, 4, assisted=False).sequences.shape == (1, 16)
    assert opened("-m", str(quantized_gguf), "--no-assisted").target.new_native_cache(1).dtype == torch.float32


def test_a_target_off_the_native_step_refuses_the_flag_in_one_line(target_gguf):
    run = run_cli("-m", str(target_gguf), "--dtype", "fp32", "--kv-cache-dtype", "bf16", "--max-new-tokens", "2",
                  "--prompt", "def f():")  # fmt: skip
    assert run.returncode == 2
    assert [line for line in messages(run) if line.startswith("error: --kv-cache-dtype bf16")], run.stderr


@pytest.mark.parametrize("off", [False, True], ids=["default", "no-prefix-cache"])
def test_no_prefix_cache_turns_reuse_off(quantized_gguf, off):
    session = opened("-m", str(quantized_gguf), "--no-assisted", *(["--no-prefix-cache"] if off else []))
    ids = torch.randint(3, 100, (1, 40), generator=torch.Generator().manual_seed(0))
    first, again = (session.generate(ids, 4, assisted=False) for _ in range(2))
    assert torch.equal(first.sequences, again.sequences)
    assert (again.stats.prefix_reused == 0) == off, again.stats.prefix_reused
