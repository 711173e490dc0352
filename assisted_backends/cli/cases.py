"""The benchmark task's cases (prompt length x new tokens), kept free of torch so flags can be checked early."""

from __future__ import annotations

import argparse

DEFAULT_PROMPT_LENGTHS = (256, 512)
DEFAULT_NEW_TOKENS = (64, 128, 256, 512, 1024)
QUICK_PROMPT_LENGTHS = (128,)
QUICK_NEW_TOKENS = (64, 128)


def benchmark_cases(args: argparse.Namespace) -> list[tuple[int, int]]:
    """(prompt tokens, new tokens) of every case, in the order they run."""
    prompt_lengths = args.prompt_lengths or (QUICK_PROMPT_LENGTHS if args.quick else DEFAULT_PROMPT_LENGTHS)
    new_token_counts = args.new_tokens or (QUICK_NEW_TOKENS if args.quick else DEFAULT_NEW_TOKENS)
    return [(prompt, new) for prompt in prompt_lengths for new in new_token_counts]
