"""A request's tokens as text: the increments a stream sends, its stop strings, why it finished, what it used.

Stop strings are the server's: the text ends before the first stop string (OpenAI leaves it out), and the
completion's token count is that of the shortest prefix whose text holds it, the token at which plain decoding
with `stop_strings` would stop; tokens a round committed past it are dropped. Text is the tokenizer's decoding
of all tokens so far (special tokens skipped); a stream sends what was added, holding back an unfinished
character and the tail that could still become a stop string.
"""

from __future__ import annotations

from dataclasses import dataclass, field

REPLACEMENT = "\ufffd"  # an incomplete UTF-8 sequence, completed by a later token


@dataclass
class TextTracker:
    """One request's text. `update(tokens, final)` with all its tokens so far returns the text to send now;
    `finish_reason` is set once it finished ("stop": EOS or a stop string; "length": `max_tokens`)."""

    tokenizer: object
    stops: tuple[str, ...]
    eos_ids: frozenset[int]
    max_tokens: int
    sent: str = ""
    finish_reason: str | None = None
    completion_tokens: int = 0
    _clear: int = 0  # a prefix length of the tokens known to hold no stop string
    _tokens: list[int] = field(default_factory=list)

    def decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def update(self, tokens: list[int], final: bool) -> str:
        """The text to send after `tokens` (every token so far; `final`: the engine ended the row)."""
        if self.finish_reason is not None:
            return ""
        self._tokens = tokens
        text = self.decode(tokens)
        found = self._stop_in(text)
        if found is not None:
            text, count = found
            self.finish_reason, self.completion_tokens = "stop", count
        elif final or len(tokens) >= self.max_tokens:
            ended_by_eos = bool(tokens) and tokens[-1] in self.eos_ids
            self.finish_reason = "stop" if ended_by_eos or len(tokens) < self.max_tokens else "length"
            self.completion_tokens = len(tokens)
        else:
            self.completion_tokens = len(tokens)
            hold = max((len(stop) - 1 for stop in self.stops), default=0)
            text = text[: len(text) - hold] if hold else text
            text = text.rstrip(REPLACEMENT)
        if not text.startswith(self.sent):  # a tokenizer whose decoding of a prefix changed: wait
            return ""
        delta, self.sent = text[len(self.sent) :], text
        return delta

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def _stop_in(self, text: str) -> tuple[str, int] | None:
        """(the text before the first stop string, the tokens through the one that completed it), or None."""
        if not self.stops:
            return None
        hits = [index for index in (text.find(stop) for stop in self.stops) if index >= 0]
        if not hits:
            self._clear = max(0, len(self._tokens) - 1)
            return None
        count = self._clear + 1
        while count < len(self._tokens) and not any(stop in self.decode(self._tokens[:count]) for stop in self.stops):
            count += 1
        return text[: min(hits)], count
