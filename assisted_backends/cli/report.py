"""The generate task's statistics, each number defined in the words printed next to it."""

from __future__ import annotations

from assisted_backends.engine.stats import GenerationStats


def describe_stats(stats: GenerationStats) -> str:
    """Timing line, then speculative rounds and plain rounds reported separately (a batch: summed over its
    rows, each round counted once per row, plus the aggregate rate and each row's latency)."""
    per_token = 1000 * stats.decode_s / max(1, stats.new_tokens - 1)
    lines = [
        f"[{stats.new_tokens} new tokens in {stats.total_s:.2f} s: prefill {1000 * stats.prefill_s:.1f} ms "
        f"(prompt pass + first token), then {per_token:.2f} ms/token]"
    ]
    if stats.batch_size > 1:
        latencies = ", ".join(f"{row.finished_s:.2f}" for row in stats.rows)
        lines.append(
            f"[batch of {stats.batch_size}: {stats.new_tokens / stats.total_s:.1f} tokens/s in all, "
            f"{stats.verify_passes} target passes; each row finished after (s): {latencies}]"
        )
    speculative, plain = stats.speculative_rounds, stats.plain_rounds
    if speculative:
        lines.append(
            f"[speculative rounds: {speculative}; drafted {stats.drafted} tokens, accepted {stats.accepted}: "
            f"acceptance rate {stats.acceptance_rate:.2f} (accepted / drafted); "
            f"{stats.tokens_per_speculative_round:.2f} tokens per speculative round "
            f"(accepted + the target's own token)]"
        )
    else:
        lines.append("[speculative rounds: 0 (nothing drafted): acceptance rate -]")
    lines.append(f"[plain rounds: {plain} (γ = 0: no draft, one target token each)]")
    return "\n".join(lines)
