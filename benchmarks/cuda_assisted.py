"""One run, one pair, five ways of decoding on a GPU: which is fastest at the same greedy output.

Modes (interleaved A/B: every repeat runs each mode once, in order; medians reported):
  plain        the target's own `model.generate` (greedy, dynamic cache)
  hf_assisted  transformers' assisted `generate(assistant_model=draft)`, constant γ
  ours_dynamic assisted_backends on cuda, dynamic cache, eager steps
  ours_graphs  assisted_backends on cuda, static cache, fixed γ, CUDA-graph-captured steps
  ours_plain_graphs  the target alone (no draft) through the same static cache and graphs: the part of
               ours_graphs' gain that graphs give; ours_graphs / ours_plain_graphs is speculation's own
Speedups are against `plain` and `hf_assisted`; Leviathan et al.'s expected speedup S is computed
from the measured α, γ and c = t_draft / t_target (one decode step each, timed here).

    python -m benchmarks.cuda_assisted --json benchmarks/results/cuda_assisted.json
    python -m benchmarks.cuda_assisted --target path/to/target --draft path/to/draft --dtype bf16

Without --target/--draft a random Llama pair is built from configs (no downloads): the draft is the
target's first layer with its embeddings and head, and the target's later layers have their output
projections scaled by --residual-scale, so the two agree often (a mechanics benchmark, not text). `--device cpu`
is a smoke test of the script itself (the graph mode needs CUDA and is skipped there).
"""

from __future__ import annotations

import argparse
import copy
import statistics

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

import assisted_backends
from assisted_backends.backends.base import DTYPES, BackendOptions
from assisted_backends.backends.cpu.backend import CPUBackend
from assisted_backends.backends.cuda.backend import CUDABackend
from benchmarks.harness import command_line, cost_ratio, interleaved, leviathan_speedup, random_llama, write_result


def random_pair(
    hidden: int, layers: int, vocab: int, seed: int, residual_scale: float
) -> tuple[LlamaForCausalLM, LlamaForCausalLM]:
    """(target, draft): a random Llama whose layers after the first are damped, and its first layer alone."""
    target = random_llama(
        hidden,
        layers,
        vocab,
        heads=max(1, hidden // 64),
        kv_heads=max(1, hidden // 256),
        intermediate=4 * hidden,
        max_positions=4096,
        seed=seed,
        bos_token_id=1,  # LlamaConfig's defaults, which this pair has always had
        eos_token_id=2,
    )
    with torch.no_grad():  # later layers add little to the residual stream, so layer 0 alone agrees often
        for layer in target.model.layers[1:]:
            layer.self_attn.o_proj.weight.mul_(residual_scale)
            layer.mlp.down_proj.weight.mul_(residual_scale)
    draft = copy.deepcopy(target)
    draft.model.layers = draft.model.layers[:1]
    draft.config.num_hidden_layers = 1
    return target, draft


def load_pair(args) -> tuple[torch.nn.Module, torch.nn.Module]:
    """--target/--draft folders, or the random pair."""
    if (args.target is None) != (args.draft is None):
        raise SystemExit("pass both --target and --draft, or neither (a random pair is built)")
    if args.target:
        return AutoModelForCausalLM.from_pretrained(args.target), AutoModelForCausalLM.from_pretrained(args.draft)
    return random_pair(args.hidden, args.layers, args.vocab, args.seed, args.residual_scale)


def make_runners(args, target, draft, prompt, sync):
    gamma, new = args.num_assistant_tokens, args.max_new_tokens
    ones = torch.ones_like(prompt)
    draft.generation_config.num_assistant_tokens = gamma
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0
    on_cuda = args.device == "cuda"
    dynamic = CUDABackend(BackendOptions(graphs=False)) if on_cuda else CPUBackend()
    graphed = CUDABackend(BackendOptions(graphs=True, bucket_size=args.bucket_size)) if on_cuda else None

    def hf(assistant):
        with torch.inference_mode():
            out = target.generate(
                prompt, attention_mask=ones, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                assistant_model=assistant, pad_token_id=0,
            )  # fmt: skip
        return out, None

    def ours(backend, static):
        result = assisted_backends.generate(
            target, prompt, assistant_model=draft, max_new_tokens=new, min_new_tokens=new, num_assistant_tokens=gamma,
            cache_layout="static" if static else "dynamic", static_shapes=static, backend=backend,
        )  # fmt: skip
        return result.sequences, result.stats

    def plain_graphs(backend):  # the target alone through the same static cache and graphs: what graphs give
        result = assisted_backends.generate(
            target, prompt, max_new_tokens=new, min_new_tokens=new, cache_layout="static", static_shapes=True,
            backend=backend,
        )  # fmt: skip
        return result.sequences, result.stats

    runners = {
        "plain": lambda: hf(None),
        "hf_assisted": lambda: hf(draft),
        "ours_dynamic": lambda: ours(dynamic, False),
    }
    if graphed is not None:
        runners["ours_graphs"] = lambda: ours(graphed, True)
        runners["ours_plain_graphs"] = lambda: plain_graphs(graphed)
    return runners


def first_difference(tokens: torch.Tensor, reference: torch.Tensor, prompt_length: int) -> int | None:
    """The index of the first new token where `tokens` and `reference` differ (None: identical)."""
    if torch.equal(tokens, reference):
        return None
    width = min(tokens.shape[1], reference.shape[1])
    differs = (tokens[0, :width] != reference[0, :width]).nonzero()
    return (int(differs[0, 0]) if len(differs) else width) - prompt_length


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--target")
    parser.add_argument("--draft")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--residual-scale", type=float, default=0.05, help="random pair: scale of layers 1.. outputs")
    parser.add_argument("--prompt-length", type=int, default=128, help="random prompt ids (without --prompt)")
    parser.add_argument("--prompt", help="text, tokenized with --target's tokenizer, in place of random ids")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--num-assistant-tokens", type=int, default=4)
    parser.add_argument("--bucket-size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run on a GPU machine, or pass --device cpu for a smoke test")

    dtype = DTYPES[args.dtype]
    target, draft = load_pair(args)
    target, draft = target.to(args.device, dtype).eval(), draft.to(args.device, dtype).eval()
    if args.prompt is not None:
        if args.target is None:
            raise SystemExit("--prompt needs --target (its tokenizer encodes the text)")
        prompt = AutoTokenizer.from_pretrained(args.target)(args.prompt, return_tensors="pt").input_ids.to(args.device)
    else:
        prompt = torch.randint(0, target.config.vocab_size, (1, args.prompt_length), device=args.device)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    runners = make_runners(args, target, draft, prompt, sync)

    timings = interleaved(runners, args.repeats, warmup=args.warmup, synchronize=sync)
    times = timings.seconds
    outputs = {name: timings.last(name)[0] for name in runners}

    # c = one draft decode step / one target decode step (dynamic cache, after the prompt)
    c, _, _ = cost_ratio(target, draft, prompt, repeats=args.repeats, synchronize=sync)
    reference = outputs["plain"]
    ours_stats = timings.last("ours_dynamic")[1]
    alpha = ours_stats.acceptance_rate
    rows = []
    for name, samples in times.items():
        median = statistics.median(samples)
        rows.append(
            {
                "mode": name,
                "median_s": median,
                "tokens_per_s": args.max_new_tokens / median,
                "speedup_vs_plain": statistics.median(times["plain"]) / median,
                "speedup_vs_hf_assisted": statistics.median(times["hf_assisted"]) / median,
                "same_tokens_as_plain": bool(torch.equal(outputs[name], reference)),
                "first_difference": first_difference(outputs[name], reference, prompt.shape[1]),
                "samples_s": samples,
            }
        )
    expected = leviathan_speedup(alpha, args.num_assistant_tokens, c)
    print(f"{'mode':<18}{'median ms':>11}{'tok/s':>9}{'vs plain':>10}{'vs hf':>8}  same tokens (first difference)")
    for row in rows:
        where = "" if row["first_difference"] is None else f" (new token {row['first_difference']})"
        print(
            f"{row['mode']:<18}{1e3 * row['median_s']:>11.1f}{row['tokens_per_s']:>9.1f}"
            f"{row['speedup_vs_plain']:>9.2f}x{row['speedup_vs_hf_assisted']:>7.2f}x"
            f"  {row['same_tokens_as_plain']}{where}"
        )
    print(f"alpha={alpha:.3f} gamma={args.num_assistant_tokens} c={c:.3f} Leviathan S={expected:.2f}")
    if args.json:  # the machine (with the GPU's name) goes in the file's header
        result = {
            "command_args": vars(args),
            "alpha": alpha,
            "mean_accepted_length": ours_stats.mean_accepted_length,
            "c": c,
            "leviathan_speedup": expected,
            "rows": rows,
        }
        write_result("cuda_assisted", command_line("cuda_assisted"), result, args.json)


if __name__ == "__main__":
    main()
