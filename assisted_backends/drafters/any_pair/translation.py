"""Two-way translation between the target's tokens and the draft's tokens, through bytes.

Target -> draft (the draft's context): the committed target tokens only ever grow, so their bytes
are kept in one growing buffer and the draft's context is kept as draft tokens with the byte offset
where each ends. New committed bytes are appended by re-encoding a *bounded window*: the draft
tokens from a cut point on plus the new bytes. The cut is the latest draft token, at least
`window` tokens back, that starts with a space after a non-space byte (a word start: byte-level and
Metaspace pre-tokenizers split there, and no token crosses a pre-token boundary, so the window's
encoding equals that suffix of a whole-text encoding), else exactly `window` tokens back. Special
tokens (and text the draft tokenizer cannot spell) are barriers that are never re-encoded.

Draft -> target (the proposal): the draft's new tokens are spelled as bytes and re-encoded with the
target's tokenizer *together with* the last `tail` committed target tokens, so a token straddling the
boundary merges as the target would merge it; the encoding is used only if it reproduces those
committed tokens (else one fewer is tried, down to none).

Neither direction can affect correctness: every proposal is verified by the target. They decide how
often the draft is right, and they cost O(window + γ) tokens of encoding per round, never O(prefix).
"""

from __future__ import annotations

from dataclasses import dataclass

from assisted_backends.drafters.any_pair.token_bytes import ByteCodec

DEFAULT_WINDOW = 4  # draft tokens re-encoded per round besides the new bytes
DEFAULT_TAIL = 2  # committed target tokens re-encoded with each proposal
_SEARCH = 4  # how many windows further back a word start is looked for


def _ends_in_space(data: bytes | None) -> bool:
    return bool(data) and data[-1:].isspace()


def _starts_word(data: bytes | None) -> bool:
    return bool(data) and data[:1] == b" " and not data[1:2].isspace()


class DraftContext:
    """The draft's tokens for the committed target text, kept in step incrementally.

    `ids` are the draft's context tokens, `ends[i]` the byte offset in `text` where ids[i] ends;
    ids[:frozen] are never re-encoded (padding filler, special tokens, unspellable text).
    """

    def __init__(self, target: ByteCodec, draft: ByteCodec, window: int = DEFAULT_WINDOW) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.target, self.draft, self.window = target, draft, window
        self.text = bytearray()
        self.ids: list[int] = []
        self.ends: list[int] = []
        self.frozen = 0
        self._segment_start = 0  # byte offset where the current text (after the last special token) began

    def add_filler(self, token_id: int, count: int) -> None:
        """`count` draft positions standing for the target's left padding (masked by the runner)."""
        self.ids += [token_id] * count
        self.ends += [0] * count
        self.frozen = len(self.ids)

    def extend(self, target_ids: list[int]) -> None:
        """Append newly committed target tokens."""
        for token_id in target_ids:
            data = self.target.token_bytes[token_id] if not self.target.is_special(token_id) else None
            if data is not None:
                self.text += data
                continue
            self._reencode()
            mapped = special_counterpart(token_id, self.target, self.draft)
            if mapped is not None:
                self.ids.append(mapped)
                self.ends.append(len(self.text))
            self.frozen = len(self.ids)
            self._segment_start = len(self.text)
        self._reencode()

    def _cut(self) -> int:
        last = len(self.ids) - self.window
        if last <= self.frozen:
            return self.frozen
        for i in range(last, max(self.frozen, last - _SEARCH * self.window), -1):
            if _starts_word(self.draft.token_bytes[self.ids[i]]) and not _ends_in_space(
                self.draft.token_bytes[self.ids[i - 1]]
            ):
                return i
        return last

    def _reencode(self) -> None:
        cut = self._cut()
        start = self.ends[cut - 1] if cut > 0 else 0
        if start == len(self.text) and cut == len(self.ids):
            return
        piece = self.draft.encode(
            bytes(self.text[start:]), at_text_start=cut == self.frozen and start == self._segment_start
        )
        ends = []
        offset = start - 1 if piece.virtual_space else start
        for token_id in piece.ids:
            offset = offset + len(self.draft.token_bytes[token_id] or b"") if piece.exact else len(self.text)
            ends.append(offset)
        del self.ids[cut:], self.ends[cut:]
        self.ids += piece.ids
        self.ends += ends
        if not piece.exact:
            self.frozen = len(self.ids)


def special_counterpart(token_id: int, source: ByteCodec, destination: ByteCodec) -> int | None:
    """The destination's special token with the same role (bos/eos/unk/pad), or None."""
    role = source.role_of(token_id)
    return destination.special_ids.get(role) if role is not None else None


@dataclass(frozen=True)
class Translation:
    """Target tokens for a draft's text; the first `final` of them cannot change when the draft writes more."""

    ids: list[int]
    final: int


def translate_proposal(
    draft_ids: list[int], committed_tail: list[int], draft: ByteCodec, target: ByteCodec, tail: int = DEFAULT_TAIL
) -> Translation:
    """Target tokens for the draft's new tokens `draft_ids`, continuing the committed target tokens.

    `committed_tail` are the last committed target tokens (only the last `tail` ordinary ones are used).
    A draft special token ends the proposal with its target counterpart (when the target has one);
    then every token is final. Otherwise tokens of the last, maybe unfinished, word are not final.
    """
    spelled = []
    ending: list[int] = []
    for token_id in draft_ids:
        if draft.is_special(token_id):
            mapped = special_counterpart(token_id, draft, target)
            ending = [mapped] if mapped is not None else []
            break
        spelled.append(draft.token_bytes[token_id])
    new = b"".join(spelled)
    if not new:
        return Translation(ending, len(ending))
    usable = 0
    while usable < min(tail, len(committed_tail)) and not target.is_special(committed_tail[-1 - usable]):
        usable += 1
    for k in range(usable, -1, -1):
        anchor = committed_tail[len(committed_tail) - k :]
        anchor_bytes = target.bytes_of(anchor) or b""
        piece = target.encode(anchor_bytes + new)
        if piece.exact and piece.ids[:k] == anchor and len(piece.ids) > k:
            ids = piece.ids[k:] + ending
            if ending:
                return Translation(ids, len(ids))
            boundary = target.last_word_start(anchor_bytes + new) - len(anchor_bytes)
            final, offset = 0, 0
            for token_id in piece.ids[k:]:
                offset += len(target.token_bytes[token_id])
                if offset > boundary:
                    break
                final += 1
            return Translation(ids, final)
    return Translation(ending, len(ending))
