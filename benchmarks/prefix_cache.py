"""Time to first token with a warm prefix cache against a cold one, on a real `.gguf` (SmolLM2-135M-Instruct on the
native decoder step): a shared prefix of `--prefix` tokens (an agent's tool catalogue, a chat's history) followed by a
different ask each call.

    python -m benchmarks.prefix_cache [--model smollm2-135m-instruct] [--prefix 2000] [--ask 24] [--repeats 5]

Per call: `generate(max_new_tokens=1)`, prefill included. Cold: `prefix_cache=False` (the whole prompt computed).
Warm: the process's cache for the model, filled once by an earlier call with another ask; each timed call sends a
new ask, so only the shared prefix can be reused. Interleaved medians; the ratio warm / cold is printed (target
≤ 0.25), with the first token of both checked equal.
"""

from __future__ import annotations

import argparse
import itertools

import torch

from benchmarks.harness import ensure_real_gguf, interleaved


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prefix", type=int, default=2000, help="shared prefix tokens (default 2000)")
    parser.add_argument("--ask", type=int, default=24, help="tokens of each call's own ask (default 24)")
    parser.add_argument("--repeats", type=int, default=5)
    arguments = parser.parse_args(argv)

    from assisted_backends.api.generation import AssistedGenerator
    from assisted_backends.backends.cpu import invariant_attention
    from assisted_backends.engine.prefix_cache import PrefixCache
    from assisted_backends.native.decoder_model import NativeCausalLM
    from assisted_backends.quantized.model import load_gguf_quantized

    reference = load_gguf_quantized(ensure_real_gguf(arguments.model), tokenizer=False).reference
    invariant_attention.enable(reference)
    native = NativeCausalLM(reference)
    vocab = native.config.vocab_size
    random = torch.Generator().manual_seed(0)
    prefix = torch.randint(100, vocab - 100, (arguments.prefix,), generator=random)
    asks = (torch.randint(100, vocab - 100, (arguments.ask,), generator=random) for _ in itertools.count())
    cold = AssistedGenerator(native, prefix_cache=False)
    warm = AssistedGenerator(native, prefix_cache=PrefixCache())
    reused = []

    def prompt() -> torch.Tensor:
        return torch.cat([prefix, next(asks)])[None]

    def first_token(generator: AssistedGenerator, ids: torch.Tensor) -> torch.Tensor:
        result = generator.generate(ids, max_new_tokens=1, pad_token_id=0)
        if generator is warm:
            reused.append(result.stats.prefix_reused)
        return result.sequences[0, -1]

    checked = prompt()
    warm.generate(prompt(), max_new_tokens=1, pad_token_id=0)  # fills the cache with the prefix (another ask)
    assert torch.equal(first_token(warm, checked), first_token(cold, checked)), "warm and cold first tokens differ"
    cases = {"cold": lambda: first_token(cold, prompt()), "warm": lambda: first_token(warm, prompt())}
    medians = interleaved(cases, arguments.repeats, warmup=1).medians()
    ratio = medians["warm"] / medians["cold"]
    cache = warm.prefix_cache.cache
    print(f"{arguments.model}: {arguments.prefix}-token shared prefix + {arguments.ask}-token ask, "
          f"{torch.get_num_threads()} threads")  # fmt: skip
    print(f"time to first token: cold {medians['cold'] * 1e3:.0f} ms, warm {medians['warm'] * 1e3:.0f} ms "
          f"(reused {min(reused)}-{max(reused)} tokens): warm / cold = {ratio:.3f} (target <= 0.25)")  # fmt: skip
    print(f"prefix cache: {cache.blocks} blocks, {cache.nbytes / (1 << 20):.1f} MiB, hit rate {cache.hit_rate:.2f}")
    return {"cold_s": medians["cold"], "warm_s": medians["warm"], "ratio": ratio}


if __name__ == "__main__":
    main()
