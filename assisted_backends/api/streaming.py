"""Streaming committed tokens to a transformers-style streamer (anything with `put` and `end`).

As `model.generate` does, `put` first receives the prompt ([1, P], user padding included, bucket
padding not), then each round's committed tokens as a 1-D CPU tensor, and `end()` once at the end.
Only committed tokens are put: a draft token the target rejected never reaches the streamer. The
loop hands the tokens over from the round's one host transfer, so streaming adds no device sync.
"""

from __future__ import annotations

import torch


def check_streamer(streamer) -> None:
    """TypeError unless `streamer` has callable `put` and `end` (transformers' BaseStreamer protocol)."""
    missing = [name for name in ("put", "end") if not callable(getattr(streamer, name, None))]
    if missing:
        raise TypeError(
            f"streamer must have put(tokens) and end() methods (like transformers.TextStreamer); "
            f"{type(streamer).__name__} lacks {' and '.join(missing)}"
        )


class StreamSink:
    """Hands committed tokens to `streamer`; `commit` is the loop's per-round hook."""

    def __init__(self, streamer) -> None:
        check_streamer(streamer)
        self.streamer = streamer

    def start(self, prompt: torch.Tensor) -> None:
        """prompt [1, P]: what `model.generate` puts first."""
        self.streamer.put(prompt.detach().cpu())

    def commit(self, tokens: list[int]) -> None:
        if tokens:
            self.streamer.put(torch.tensor(tokens, dtype=torch.long))

    def end(self) -> None:
        self.streamer.end()
