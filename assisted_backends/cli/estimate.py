"""How long the benchmark's cases will take: a per-mode cost model, seconds = prefill rate x prompt tokens +
decode rate x new tokens, fitted from the runs measured so far (the warm-up, then every run, so a case's estimate
rests on the pair before it). `--compare` runs at least `--repeats` pairs per case and then keeps adding pairs,
up to `--time-limit` seconds, while the speedup interval is wide: a case's estimate counts as many pairs as the
cases before it needed, and says the limit."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field


def seconds_text(value: float) -> str:
    """'0.4 s', '12 s', '3.5 min'."""
    if value >= 120:
        return f"{value / 60:.1f} min"
    return f"{value:.0f} s" if value >= 10 else f"{value:.1f} s"


@dataclass
class CostModel:
    """Seconds per prompt token and per new token (per row: a batch's rows run together) of each mode."""

    prefill: dict[str, float] = field(default_factory=dict)
    decode: dict[str, float] = field(default_factory=dict)
    pairs_seen: list[int] = field(default_factory=list)  # pairs each finished case ran

    def record(self, mode: str, prompt_tokens: int, new_tokens: int, total_s: float, prefill_s: float) -> None:
        """One run of `mode`: its rates replace the earlier ones (the machine's load now is what counts). A run
        with no prefill split (transformers' generate) borrows the package's plain prefill rate."""
        if prefill_s <= 0:
            prefill_s = min(self.prefill.get("plain", 0.0) * prompt_tokens, total_s)
        self.prefill[mode] = prefill_s / max(prompt_tokens, 1)
        self.decode[mode] = max(total_s - prefill_s, 0.0) / max(new_tokens, 1)

    def run_s(self, mode: str, prompt_tokens: int, new_tokens: int) -> float:
        return self.prefill.get(mode, 0.0) * prompt_tokens + self.decode.get(mode, 0.0) * new_tokens

    def pair_s(self, modes: list[str], prompt_tokens: int, new_tokens: int) -> float:
        """One pair (one run of every mode)."""
        return sum(self.run_s(mode, prompt_tokens, new_tokens) for mode in modes)


def expected_pairs(pairs_seen: list[int], pair_s: float, args: argparse.Namespace) -> int:
    """Pairs a case will run: `--repeats`, or with `--compare` as many as the cases before it needed (their
    median), no more than `--time-limit` allows."""
    if not args.compare or not pairs_seen:
        return args.repeats
    ordered = sorted(pairs_seen)
    typical = ordered[len(ordered) // 2]
    allowed = int(args.time_limit / pair_s) + 1 if pair_s > 0 else typical
    return max(args.repeats, min(typical, allowed))


def case_text(pair_s: float, args: argparse.Namespace, pairs_seen: list[int] | None = None) -> str:
    """'about X s' for a case whose pair takes `pair_s`: its expected pairs, and with `--compare` the limit."""
    pairs = expected_pairs(pairs_seen or [], pair_s, args)
    expected = pair_s * pairs
    if args.compare and args.time_limit > expected:
        return (f"about {seconds_text(expected)} ({pairs} pairs of {seconds_text(pair_s)}; more pairs, up to "
                f"{args.time_limit:g} s, while its interval is wide)")  # fmt: skip
    return f"about {seconds_text(expected)}"


def total_text(model: CostModel, modes: list[str], cases: list[tuple[int, int]], args: argparse.Namespace) -> str:
    """The whole run's estimate, said before the first case: the least pairs' time, and with `--compare` the
    most (every case running to `--time-limit`)."""
    pairs = [model.pair_s(modes, prompt, new) for prompt, new in cases]
    least = sum(pair * args.repeats for pair in pairs)
    text = f"{len(cases)} case{'s' if len(cases) > 1 else ''}, about {seconds_text(least)} in all"
    if args.compare and args.time_limit > 0:
        most = sum(max(pair * args.repeats, args.time_limit + pair) for pair in pairs)
        if most > least * 1.2:
            text += f" (up to {seconds_text(most)} if every case keeps adding pairs until --time-limit)"
    return text
