"""EAGLE-3 heads trained on chat (`train-draft --chat sharegpt`) measured on held-out dialogue: α, E, c and the
speed-ups of the head, prompt lookup and both combined over plain decoding, on first turns and on later turns.

    python -m benchmarks.eagle_chat                                   # both targets, 1 and 2 threads
    python -m benchmarks.eagle_chat --targets smollm2-135m-instruct --threads 1 --conversations 2 --repeats 1

Prompts: conversations of ShareGPT V3's held-out side (the seeded split `train-draft` uses, so no head saw them),
those with at least two user turns whose first turn renders in at most `--max-prompt` tokens, in file order.
A first turn is the conversation's first user turn alone; a later turn is its second user turn after the first
and the target's own greedy answer to it (not the log's), as a user's next message would follow. Targets run at
the fastest precision here, the `.gguf` kept quantized on the package's kernels; the head at its `auto` precision
(int8 next to such a target). Greedy, EOS ignored, exactly `--new-tokens` tokens; each case round-robin
`--repeats` times after a warm-up, medians; every output checked token-identical to plain decoding.

Peer on the same quantized model and prompts: transformers' own `generate`, plain and with its prompt lookup (no
transformers API drafts with an EAGLE-3 head); its lookup output is compared with its own plain output, not
required equal. Reported per prompt: each method's speed-up over this package's plain decoding; α and E of the
head at constant γ = 4 (E: tokens per speculative round, the target's own token included); pooled over a turn
kind: α = accepted / drafted, E = (accepted + rounds) / rounds, the median speed-ups, and c (one head draft step /
one target decode step).
Heads: `<cache>/chat_heads/<target>` (`--heads TARGET=DIR` for others).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from assisted_backends import generate
from assisted_backends.drafters.eagle import load_head
from assisted_backends.loading.files import cache_root
from assisted_backends.train_draft import chat
from benchmarks.eagle import TARGETS, head_step_seconds, load_target, tokens_of
from benchmarks.harness import command_line, interleaved, step_seconds, write_result
from benchmarks.real_models import LOOKUP_TOKENS

GAMMA = 4  # the E(4)


def held_out_conversations(tokenizer, count: int, max_prompt: int, seed: int = 0) -> list[list[dict[str, str]]]:
    """The first `count` held-out conversations (train-draft's split for `seed`) with two user turns and a first
    turn of at most `max_prompt` tokens."""
    index = chat.load_index(chat.resolve_chat_file(chat.SHAREGPT))
    _, held = chat.split_entries(index.entries, seed)
    chosen = []
    for entry in held:
        if entry.user_turns < 2:
            continue
        messages = chat.read_conversation(index.path, entry)
        users = [i for i, m in enumerate(messages) if m["role"] == "user"]
        if len(chat.render(tokenizer, messages[: users[0] + 1])) <= max_prompt:
            chosen.append(messages)
        if len(chosen) == count:
            break
    return chosen


def turn_prompts(target, tokenizer, messages: list[dict[str, str]], new_tokens: int, limit: int) -> dict:
    """{"first": ids, "later": ids}: the first user turn; the second after it and the target's own answer."""
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    first_turn = messages[: users[0] + 1]
    first = torch.tensor([chat.fit_context(tokenizer, first_turn, limit)])
    answer = generate(target, first, max_new_tokens=new_tokens, eos_token_id=[], device="cpu")
    reply = tokenizer.decode(tokens_of(answer), skip_special_tokens=True)
    history = [*first_turn, {"role": "assistant", "content": reply}, messages[users[1]]]
    return {"first": first, "later": torch.tensor([chat.fit_context(tokenizer, history, limit)])}


def measure_prompt(target, head, prompt: torch.Tensor, new_tokens: int, repeats: int) -> dict:
    common = dict(max_new_tokens=new_tokens, eos_token_id=[], device="cpu")

    def run(**extra):
        return lambda: generate(target, prompt, **common, **extra)

    def transformers(**extra):  # the peer: transformers' own `generate` on the same quantized model
        def call() -> list[int]:
            with torch.inference_mode():  # EOS is off (`load_target`): exactly `new_tokens` tokens
                out = target.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                                      do_sample=False, **extra)  # fmt: skip
            return out[0, prompt.shape[1] :].tolist()

        return call

    cases = {
        "plain": run(),
        "lookup": run(prompt_lookup_num_tokens=LOOKUP_TOKENS),
        "head": run(assistant_model=head),
        f"head_constant_{GAMMA}": run(assistant_model=head, num_assistant_tokens=GAMMA),
        "head+lookup": run(assistant_model=head, prompt_lookup_num_tokens=LOOKUP_TOKENS),
        "transformers_plain": transformers(),
        "transformers_lookup": transformers(prompt_lookup_num_tokens=LOOKUP_TOKENS),
    }
    reference = tokens_of(cases["plain"]())
    outputs = {name: tokens_of(case()) for name, case in cases.items()}
    identical = {name: out == reference for name, out in outputs.items() if not name.startswith("transformers")}
    timings = interleaved(cases, repeats, warmup=0)
    median = timings.medians()
    stats = timings.last(f"head_constant_{GAMMA}").stats
    return {
        "prompt_tokens": int(prompt.shape[1]),
        "median_s": {n: round(v, 4) for n, v in median.items()},
        "speedup_vs_plain": {n: round(median["plain"] / v, 3) for n, v in median.items()},
        "identical_to_plain": identical,
        "transformers_lookup_equals_its_plain": outputs["transformers_lookup"] == outputs["transformers_plain"],
        "drafted": stats.drafted,
        "accepted": stats.accepted,
        "rounds": stats.speculative_rounds,
        "alpha": round(stats.acceptance_rate or 0.0, 3),
        "E": round(stats.tokens_per_speculative_round or 1.0, 3),
        "head_alpha_adaptive": round(timings.last("head").stats.acceptance_rate or 0.0, 3),
    }


def pooled(rows: list[dict]) -> dict:
    drafted, accepted, rounds = (sum(r[k] for r in rows) for k in ("drafted", "accepted", "rounds"))
    names = rows[0]["speedup_vs_plain"]
    return {
        "prompts": len(rows),
        "alpha": round(accepted / drafted, 3) if drafted else 0.0,
        f"E({GAMMA})": round((accepted + rounds) / rounds, 3) if rounds else 1.0,
        "median_speedup_vs_plain": {
            n: round(statistics.median(r["speedup_vs_plain"][n] for r in rows), 3) for n in names
        },
        "all_identical": all(all(r["identical_to_plain"].values()) for r in rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", nargs="+", choices=TARGETS, default=list(TARGETS))
    parser.add_argument("--heads", nargs="*", default=[], help="TARGET=DIR (default <cache>/chat_heads/TARGET)")
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--max-prompt", type=int, default=256, help="tokens of a first turn, at most")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="eagle_chat")
    args = parser.parse_args()
    heads = dict(item.split("=", 1) for item in args.heads)
    results = []
    for name in args.targets:
        head_dir = Path(heads.get(name, cache_root() / "chat_heads" / name))
        target, tokenizer = load_target(name, "int4")
        head = load_head(head_dir)
        torch.set_num_threads(1)
        conversations = held_out_conversations(tokenizer, args.conversations, args.max_prompt)
        prompts = [turn_prompts(target, tokenizer, m, args.new_tokens, 1024) for m in conversations]
        for threads in args.threads:
            torch.set_num_threads(threads)
            probe = prompts[0]["first"]
            t_target = step_seconds(target, probe, 1, repeats=9)
            c = head_step_seconds(head, target, probe) / t_target
            for kind in ("first", "later"):
                rows = [measure_prompt(target, head, p[kind], args.new_tokens, args.repeats) for p in prompts]
                summary = {"target": name, "head": str(head_dir), "threads": threads, "turns": kind,
                           "c": round(c, 4), "t_target_step_ms": round(1000 * t_target, 2), **pooled(rows),
                           "per_prompt": rows}  # fmt: skip
                results.append(summary)
                s = summary["median_speedup_vs_plain"]
                print(f"{name:<22} {threads}t {kind:<5} | α {summary['alpha']:.2f} E({GAMMA}) "
                      f"{summary[f'E({GAMMA})']:.2f} c {c:.3f} | head {s['head']:.2f}x, lookup {s['lookup']:.2f}x, "
                      f"head+lookup {s['head+lookup']:.2f}x, constant γ={GAMMA} {s[f'head_constant_{GAMMA}']:.2f}x, "
                      f"transformers plain {s['transformers_plain']:.2f}x, lookup {s['transformers_lookup']:.2f}x"
                      f" | identical: {summary['all_identical']}", flush=True)  # fmt: skip
    write_result(args.out, command_line("eagle_chat"), {"results": results})


if __name__ == "__main__":
    main()
