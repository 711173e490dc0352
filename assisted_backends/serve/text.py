"""A request's tokens as text: the increments a stream sends, its stop strings, why it finished, what it used.

Stop strings are the server's: the text ends before the first stop string (OpenAI leaves it out), and the
completion's token count is that of the shortest prefix whose text holds it, the token at which plain decoding
with `stop_strings` would stop; tokens a round committed past it are dropped. A stream sends what was added,
holding back an unfinished character and the tail that could still become a stop string.

Detokenization is incremental, so an answer of n tokens costs O(n): each token is decoded in a window that
starts a few tokens back (the tokens since the last complete character, and the one before them, so that a
tokenizer's leading-space and merging rules see their context); the window's new characters are appended once
they end in a complete character. Stop strings are searched in the new text only. The finished answer is decoded
once whole (special tokens skipped), the text a plain `decode` gives.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

REPLACEMENT = "\ufffd"  # an incomplete UTF-8 sequence, completed by a later token
MAX_PENDING = 8  # tokens that may wait for a character to complete (UTF-8 has at most 4 bytes): then they are shown


@dataclass
class TextTracker:
    """One request's text. `update(new, count, final)` with the tokens added since the last call returns the text
    to send now; `finish_reason` is set once it finished ("stop": EOS or a stop string; "length": `max_tokens`)."""

    tokenizer: object
    stops: tuple[str, ...]
    eos_ids: frozenset[int]
    max_tokens: int
    sent: str = ""
    finish_reason: str | None = None
    completion_tokens: int = 0
    _tokens: list[int] = field(default_factory=list)
    _text: str = ""  # the text of _tokens[:_read], decoded incrementally
    _ends: list[int] = field(default_factory=list)  # len(_text) once token i was decoded
    _window: int = 0  # the first token of the decoding window
    _read: int = 0  # tokens whose characters are in _text
    _searched: int = 0  # characters of _text searched for stop strings

    def decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def update(self, new: list[int], count: int | None = None, final: bool = False) -> str:
        """The text to send after `new` tokens (`count`: the row's tokens now, when the engine dropped some it
        had sent; `final`: the engine ended the row)."""
        if self.finish_reason is not None:
            return ""
        count = len(self._tokens) + len(new) if count is None else count
        if count < len(self._tokens) + len(new):  # the engine took tokens back: decode again from the start
            tokens = (self._tokens + new)[:count]
            self._tokens, self._text, self._ends, self._window, self._read, self._searched = [], "", [], 0, 0, 0
            new = tokens
        for token in new:
            self._decode_next(token)
        stop = self._first_stop()
        if stop is not None:
            cut, completed = stop
            self.completion_tokens = next(n for n, end in enumerate(self._ends, 1) if end >= completed)
            self.finish_reason = "stop"
            whole = self.decode(self._tokens[: self.completion_tokens])
            found = [i for i in (whole.find(s) for s in self.stops) if i >= 0]
            text = whole[: min(found)] if found else self._text[:cut]
        elif final or len(self._tokens) >= self.max_tokens:
            tokens = self._tokens
            ended_by_eos = bool(tokens) and tokens[-1] in self.eos_ids
            self.finish_reason = "stop" if ended_by_eos or len(tokens) < self.max_tokens else "length"
            self.completion_tokens = len(tokens)
            text = self.decode(tokens)
        else:
            self.completion_tokens = len(self._tokens)
            hold = max((len(stop) - 1 for stop in self.stops), default=0)
            text = self._text[: len(self._text) - hold] if hold else self._text
            text = text.rstrip(REPLACEMENT)
        if not text.startswith(self.sent):  # a tokenizer whose decoding of a prefix changed: wait
            return ""
        delta, self.sent = text[len(self.sent) :], text
        return delta

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def tokens_shown(self) -> int:
        """The tokens whose characters are all in `sent` (once finished: the completion's tokens)."""
        if self.finished:
            return self.completion_tokens
        return bisect.bisect_right(self._ends, len(self.sent))

    def _decode_next(self, token: int) -> None:
        """Append `token`; its characters join the text once the window's text ends in a complete character (or
        `MAX_PENDING` tokens wait: invalid bytes, shown as the replacement character)."""
        self._tokens.append(token)
        before = self.decode(self._tokens[self._window : self._read])
        after = self.decode(self._tokens[self._window :])
        if after == before:  # no text (a special token): read, the window stays
            self._read = len(self._tokens)
        elif not after.endswith(REPLACEMENT) or len(self._tokens) - self._read > MAX_PENDING:
            self._text += after[len(before) :]
            self._window, self._read = self._read, len(self._tokens)
        self._ends.append(len(self._text))

    def _first_stop(self) -> tuple[int, int] | None:
        """(where the text is cut: the first stop string's start, where the first-completed one ends) in the text
        not yet searched (with the tail a stop string could straddle), or None."""
        if not self.stops:
            return None
        start = max(0, self._searched - max(len(stop) for stop in self.stops) + 1)
        self._searched = len(self._text)
        hits = [(index, index + len(stop)) for stop in self.stops if (index := self._text.find(stop, start)) >= 0]
        if not hits:
            return None
        return min(index for index, _ in hits), min(end for _, end in hits)
