"""c of an EAGLE-3 head on SmolLM2-135M-Instruct int4 (the PyPI `.gguf`, Q4_1 on the package's kernels): one head
chain step over one target decode step, by draft vocabulary V_d and head precision.

    python -m benchmarks.eagle_head_cost                       # V_d 32k, 8k, 4k, 2k x float, bf16, int8, int4
    python -m benchmarks.eagle_head_cost --threads 2 --repeats 60

Cases run interleaved (round-robin) after a warm-up, medians reported: the target's decode step (one token on a
cache of `--context` positions, its logits included) and, per (V_d, precision), one head chain step as drafting
runs it (`prepared_head`, the layer on one column of a warm cache of the same length, its logits over the draft
vocabulary carried onto the target's, the argmax). The head has random weights: a step's cost does not depend on
their values. It carries its own embedding table (train-draft's default). "float" is the target's activation
dtype (fp32 next to a quantized target); "int8"/"int4" run its linear layers on the package's kernels. Also
reported: the bytes of weights a head step reads over the target's (`draft_costs`' prior for c).
"""

from __future__ import annotations

import argparse

import torch

from assisted_backends import AssistedGenerator
from assisted_backends.drafters.eagle.build import prepared_head
from assisted_backends.drafters.eagle.cache import HeadCache
from assisted_backends.drafters.eagle.config import default_feature_layers
from assisted_backends.drafters.eagle.copies import step_bytes
from assisted_backends.drafters.eagle.head import Eagle3Head
from assisted_backends.drafters.eagle.precision import choose_precision
from assisted_backends.model_facts import ModelFacts
from assisted_backends.quantized.linear import kernel_report
from assisted_backends.train_draft.head_init import head_config
from assisted_backends.train_draft.vocab import choose_vocabulary
from benchmarks.harness import RESULTS, command_line, ensure_real_gguf, interleaved, write_result
from benchmarks.harness.llama_cpp_tools import cpu_model_and_flags
from benchmarks.harness.steps import forward_step, random_context

TARGET = "smollm2-135m-instruct"
VOCAB_SIZES = (32768, 8192, 4096, 2048)
PRECISIONS = ("float", "bf16", "int8", "int4")
GOAL = 0.07


def load_target(name: str) -> torch.nn.Module:
    """The target's `.gguf` with its quantization kept, prepared by the CPU backend as `generate` prepares it."""
    generator = AssistedGenerator(str(ensure_real_gguf(name)), device="cpu")
    return generator.backend.prepare(generator.model, "target").eval()


def random_head(target: torch.nn.Module, draft_vocab: int, seed: int = 0) -> Eagle3Head:
    """A head for `target` with random weights over its `draft_vocab` first token ids, with an embedding table."""
    facts = ModelFacts.of(target)
    counts = torch.zeros(facts.vocab_size, dtype=torch.long)
    counts[:draft_vocab] = 1
    d2t, t2d = choose_vocabulary(counts, draft_vocab)
    torch.manual_seed(seed)
    head = Eagle3Head(head_config(target, d2t, t2d, default_feature_layers(facts.layers)), with_embeddings=True)
    head.load_state_dict({**head.state_dict(), "d2t": d2t, "t2d": t2d})
    return head.eval()


def head_step(head: Eagle3Head, target: torch.nn.Module, context: int, vocab: int):
    """One chain step of the prepared `head` after `context` columns (a callable)."""
    config = head.config
    cache = HeadCache(1, config.num_key_value_heads, config.attention_head_dim, context + 8,
                      torch.zeros(1, dtype=torch.long), False, head.compute_dtype, head.compute_device)  # fmt: skip
    cache.length = context
    token = torch.tensor([[1]])
    hidden = torch.randn(1, 1, config.hidden_size, dtype=head.compute_dtype)
    position = torch.tensor([[context]])
    attend = cache.attend_at(context)

    def step() -> None:
        with torch.inference_mode():
            out = head(token, hidden, position, attend)
            head.target_logits(head.draft_logits(out), vocab).argmax(-1)

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab-sizes", nargs="+", type=int, default=list(VOCAB_SIZES))
    parser.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=list(PRECISIONS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--context", type=int, default=128, help="cache positions before the step")
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--out", default=str(RESULTS / "eagle_head_cost.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = load_target(TARGET)
    facts = ModelFacts.of(target)
    cpu = torch.device("cpu")
    cases = {"target": forward_step(target, random_context(facts.vocab_size, args.context, seed=0))}
    bytes_read = {}
    for size in args.vocab_sizes:
        head = random_head(target, size)
        for name in args.precisions:
            prepared = prepared_head(head, target, choose_precision(name, facts.quantized_kernels, cpu))
            cases[f"{size}/{name}"] = head_step(prepared, target, args.context, facts.vocab_size)
            bytes_read[f"{size}/{name}"] = step_bytes(prepared)
    print(f"{TARGET} int4 (.gguf): {kernel_report(target)}; {args.threads} thread(s); {args.repeats} interleaved "
          f"rounds; heads with random weights (a step's cost does not depend on their values)", flush=True)  # fmt: skip
    timings = interleaved(cases, args.repeats, warmup=3)
    medians = timings.medians()
    target_s = medians["target"]
    print(f"target decode step: {target_s * 1e3:.2f} ms; weights read {facts.weight_bytes / 1e6:.1f} MB")
    print(f"{'V_d':>6} {'precision':>9} {'head step':>10} {'c':>6} {'bytes c':>8}")
    rows = []
    for key, seconds in medians.items():
        if key == "target":
            continue
        size, name = key.split("/")
        c, c_bytes = seconds / target_s, bytes_read[key] / facts.weight_bytes
        print(f"{size:>6} {name:>9} {seconds * 1e3:>8.3f} ms {c:>6.3f} {c_bytes:>8.3f}")
        rows.append(dict(draft_vocab=int(size), precision=name, head_step_ms=round(seconds * 1e3, 4), c=round(c, 4),
                         head_bytes=bytes_read[key], c_bytes=round(c_bytes, 4),
                         spread_ms=[round(t * 1e3, 4) for t in timings.spread()[key]]))  # fmt: skip
    best = min(rows, key=lambda row: row["c"])
    print(
        f"lowest c: {best['c']:.3f} (V_d {best['draft_vocab']}, {best['precision']}); goal c <= {GOAL}: "
        f"{'reached' if best['c'] <= GOAL else 'not reached'}"
    )
    write_result("eagle_head_cost", command_line("eagle_head_cost"), dict(
        cpu_model=cpu_model_and_flags()[0], target=f"{TARGET} Q4_1 .gguf", kernels=kernel_report(target),
        threads=args.threads, context=args.context, repeats=args.repeats,
        note="heads with random weights: a step's cost does not depend on their values; own embedding table",
        target_step_ms=round(target_s * 1e3, 4), target_weight_bytes=facts.weight_bytes,
        target_spread_ms=[round(t * 1e3, 4) for t in timings.spread()["target"]], cases=rows,
    ), path=args.out)  # fmt: skip


if __name__ == "__main__":
    main()
