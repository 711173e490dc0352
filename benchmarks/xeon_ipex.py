"""IPEX against native PyTorch on this CPU: decode and verify steps, fp32 and bf16 (run in the IPEX venv).

Measures what the CPU backend would gain from intel-extension-for-pytorch: `ipex.optimize` (what
the backend uses; transformers' forward and caches unchanged) against the same torch without it, on
one decode step and one 5-token verify step; and, for reference, transformers' own `generate` with
`ipex.llm.optimize` (IPEX's fused attention and its own KV cache, which the backend does not use).
Cases interleaved; medians.

    .ci/lanes/ipex.sh --co -q >/dev/null   # builds /tmp/venv-ipex (torch 2.8 + IPEX 2.8 + transformers 4.51.3)
    /tmp/venv-ipex/bin/python -m benchmarks.xeon_ipex
"""

from __future__ import annotations

import argparse
import copy
import warnings

import torch

from assisted_backends.backends.cpu import ipex as ipex_support
from benchmarks.harness import command_line, forward_step, interleaved, median_ms, random_llama, write_result

SHAPE = (1024, 4, 32000)  # hidden, layers, vocab


def _step(model, tokens: int, context: int = 256):
    """One forward of `tokens` random tokens on a cache of `context` random tokens."""
    prompt = torch.randint(0, SHAPE[2], (1, context))
    return forward_step(model, prompt, tokens, fed=torch.randint(0, SHAPE[2], (1, tokens)))


def _generate(model, new_tokens: int = 16):
    prompt = torch.randint(0, SHAPE[2], (1, 128))

    def run():
        with torch.inference_mode():
            model.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=0,
            )

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=12)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    status = ipex_support.status()
    if not status.loadable:
        raise SystemExit(f"IPEX cannot load here ({status.reason}); run this in the IPEX venv")
    ipex = ipex_support.load()
    if args.threads:
        torch.set_num_threads(args.threads)
    base = random_llama(*SHAPE, seed=0)
    base.config.architectures = ["LlamaForCausalLM"]  # ipex.llm.optimize looks the family up here

    steps, generation = {}, {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        native = copy.deepcopy(base).to(dtype)
        optimized = ipex_support.optimize(copy.deepcopy(base).to(dtype), dtype)
        llm = ipex.llm.optimize(copy.deepcopy(base).to(dtype), dtype=dtype, inplace=True, deployment_mode=False)
        cases = {
            f"{name} native q=1": _step(native, 1),
            f"{name} ipex.optimize q=1": _step(optimized, 1),
            f"{name} native q=5": _step(native, 5),
            f"{name} ipex.optimize q=5": _step(optimized, 5),
        }
        medians = {case: median_ms(v) for case, v in interleaved(cases, args.repeats).seconds.items()}
        steps[name] = {
            "median_ms": medians,
            "ipex_vs_native_q1": round(medians[f"{name} ipex.optimize q=1"] / medians[f"{name} native q=1"], 3),
            "ipex_vs_native_q5": round(medians[f"{name} ipex.optimize q=5"] / medians[f"{name} native q=5"], 3),
        }
        print(name, steps[name], flush=True)
        cases = {
            f"{name} native generate": _generate(native),
            f"{name} ipex.optimize generate": _generate(optimized),
            f"{name} ipex.llm.optimize generate": _generate(llm),
        }
        timings = interleaved(cases, max(3, args.repeats // 3), warmup=1)
        medians = {case: median_ms(v) for case, v in timings.seconds.items()}
        generation[name] = {
            "median_ms": medians,
            "ipex.optimize_vs_native": round(
                medians[f"{name} ipex.optimize generate"] / medians[f"{name} native generate"], 3
            ),
            "ipex.llm.optimize_vs_native": round(
                medians[f"{name} ipex.llm.optimize generate"] / medians[f"{name} native generate"], 3
            ),
        }
        print(name, generation[name], flush=True)
        del native, optimized, llm

    payload = {
        "what": "ratios < 1: IPEX faster. Steps: one forward of q tokens on a 256-position cache. Generate: "
        "transformers' generate, 128-token prompt, 16 new tokens",
        "model": f"random Llama hidden {SHAPE[0]} x {SHAPE[1]} layers, vocabulary {SHAPE[2]}",
        "ipex": ipex.__version__,
        "threads": torch.get_num_threads(),
        "steps": steps,
        "generate": generation,
    }
    write_result("xeon_ipex", command_line("xeon_ipex", python="/tmp/venv-ipex/bin/python"), payload)


if __name__ == "__main__":
    main()
