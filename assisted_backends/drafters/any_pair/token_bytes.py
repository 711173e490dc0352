"""ByteCodec: a tokenizer seen as a map between token ids and the exact bytes they stand for.

Translating between two tokenizers goes through bytes, not through `decode`: `decode` strips
leading spaces (Metaspace), turns half a UTF-8 character into U+FFFD (byte-level BPE) and merges
byte-fallback tokens, none of which can be undone. Here every ordinary token has its bytes b(t),
every special token has none (it is a marker, translated by role), and `encode` takes bytes, so
text cut anywhere (inside a word, inside a character) survives a round trip:
b(encode(x)) == x whenever the tokenizer can spell x (byte-level and byte-fallback ones always can).

Supported: fast tokenizers whose decoder is ByteLevel (GPT-2, Llama-3, Qwen, StarCoder, ...) or
Metaspace / Replace("▁", " ") with optional ByteFallback (Llama-2, Mistral, Gemma, T5, ...).
"""

from __future__ import annotations

import json
import re
import weakref
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from tokenizers import Tokenizer

_METASPACE = "\u2581"
_BYTE_PIECE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@lru_cache(maxsize=1)
def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's printable stand-in character for each byte, inverted: character -> byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    characters = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            characters.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, characters)}


def _decoder_types(node: Any) -> list[dict]:
    if not isinstance(node, dict):
        return []
    found = [node]
    for child in node.get("decoders") or []:
        found += _decoder_types(child)
    return found


def _scheme(tokenizer: Any) -> tuple[str, bool]:
    """('byte_level' | 'metaspace', byte_fallback) from the fast tokenizer's decoder."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise NotImplementedError(
            f"{type(tokenizer).__name__} is not a fast tokenizer; load it with AutoTokenizer.from_pretrained(..., "
            "use_fast=True) so its token bytes can be read"
        )
    decoders = _decoder_types(json.loads(backend.to_str()).get("decoder"))
    kinds = {d.get("type") for d in decoders}
    if "ByteLevel" in kinds:
        return "byte_level", False
    replaces_metaspace = any(
        d.get("type") == "Replace" and (d.get("pattern") or {}).get("String") == _METASPACE for d in decoders
    )
    if "Metaspace" in kinds or replaces_metaspace:
        return "metaspace", "ByteFallback" in kinds
    raise NotImplementedError(
        f"tokenizer decoder {sorted(k for k in kinds if k)} is not supported for translation between tokenizers; "
        "supported: ByteLevel, Metaspace, Replace('▁', ' ') with ByteFallback"
    )


@dataclass(frozen=True)
class Piece:
    """One run of an encoding: `ids` spell `data` exactly when `exact`; with `virtual_space` they spell
    b" " + data (a SentencePiece-style tokenizer's word-start space at the start of a text)."""

    ids: list[int]
    exact: bool
    virtual_space: bool = False


class ByteCodec:
    """Token ids <-> bytes for one fast tokenizer.

    `token_bytes[t]` is b(t), or None for special tokens and ids past the tokenizer (padded heads).
    `special_ids` maps the roles bos/eos/unk/pad to ids, for translating markers.
    """

    def __init__(self, tokenizer: Any) -> None:
        scheme, byte_fallback = _scheme(tokenizer)
        self.tokenizer = tokenizer
        # A private copy of the Rust tokenizer that spells special-token text as ordinary text:
        # "<s>" inside generated text is text, never a marker.
        self._backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
        self._backend.encode_special_tokens = True
        specials = set(getattr(tokenizer, "all_special_ids", []) or [])
        for token_id, added in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).items():
            if getattr(added, "special", False):
                specials.add(int(token_id))
        vocab = tokenizer.get_vocab()
        size = max(vocab.values()) + 1 if vocab else 0
        alphabet = _byte_level_alphabet()
        self.token_bytes: list[bytes | None] = [None] * size
        self.byte_ids: list[int | None] = [None] * 256
        added_text = {int(i): a for i, a in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).items()}
        for token, token_id in vocab.items():
            if token_id in specials:
                continue
            if token_id in added_text:  # added, non-special tokens are stored as plain text
                self.token_bytes[token_id] = added_text[token_id].content.encode("utf-8")
                continue
            if scheme == "byte_level":
                if all(ch in alphabet for ch in token):
                    self.token_bytes[token_id] = bytes(alphabet[ch] for ch in token)
                continue
            match = _BYTE_PIECE.match(token) if byte_fallback else None
            self.token_bytes[token_id] = (
                bytes([int(match.group(1), 16)]) if match else token.replace(_METASPACE, " ").encode("utf-8")
            )
        for token_id, data in enumerate(self.token_bytes):  # <0xNN> first: the tokenizer's own lone-byte spelling
            if (
                data is not None
                and len(data) == 1
                and _BYTE_PIECE.match(self.tokenizer.convert_ids_to_tokens(token_id))
            ):
                self.byte_ids[data[0]] = token_id
        for token_id, data in enumerate(self.token_bytes):
            if data is not None and len(data) == 1 and self.byte_ids[data[0]] is None:
                self.byte_ids[data[0]] = token_id
        self._id_of_bytes: dict[bytes, int] = {}
        for token_id, data in enumerate(self.token_bytes):
            if data is not None and not _BYTE_PIECE.match(self.tokenizer.convert_ids_to_tokens(token_id)):
                self._id_of_bytes.setdefault(data, token_id)
        self.special_ids = {role: getattr(tokenizer, f"{role}_token_id", None) for role in ("bos", "eos", "unk", "pad")}
        self.unk_id = self.special_ids["unk"]

    @property
    def size(self) -> int:
        return len(self.token_bytes)

    def bytes_of(self, ids: list[int]) -> bytes | None:
        """b(t_1) ... b(t_n), or None when any of them is a special token."""
        parts = [self.token_bytes[t] if 0 <= t < self.size else None for t in ids]
        return None if any(p is None for p in parts) else b"".join(parts)

    def is_special(self, token_id: int) -> bool:
        return not 0 <= token_id < self.size or self.token_bytes[token_id] is None

    def role_of(self, token_id: int) -> str | None:
        return next((role for role, i in self.special_ids.items() if i == token_id), None)

    def encode(self, data: bytes, at_text_start: bool = False) -> Piece:
        """Ids spelling `data`: valid UTF-8 runs through the tokenizer, stray bytes as byte tokens.

        `at_text_start`: `data` begins a text, so keep the space a Metaspace tokenizer prepends there
        (the draft then sees its prompt tokenized as it was trained: "▁The", not "The").
        """
        ids: list[int] = []
        exact, virtual = True, False
        for index, (run, valid) in enumerate(utf8_runs(data)):
            if index == 0 and valid and at_text_start:
                natural = self._backend.encode(run.decode("utf-8"), add_special_tokens=False).ids
                if self.bytes_of(natural) == b" " + run:
                    ids += natural
                    virtual = True
                    continue
            piece = self._encode_text(run) if valid else self._encode_bytes(run)
            ids += piece.ids
            exact = exact and piece.exact
        return Piece(ids, exact, virtual)

    def last_word_start(self, data: bytes) -> int:
        """Byte offset where the last pre-token of `data` starts (0 when unknown).

        Tokens never cross pre-token boundaries, so appending text can only re-tokenize the last
        pre-token: every token ending at or before this offset is final.
        """
        pre_tokenizer = self._backend.pre_tokenizer
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return 0
        if pre_tokenizer is None or not text:
            return 0
        words = pre_tokenizer.pre_tokenize_str(text)
        return len(text[: words[-1][1][0]].encode("utf-8")) if words else 0

    def _encode_bytes(self, run: bytes) -> Piece:
        if all(self.byte_ids[b] is not None for b in run):
            return Piece([self.byte_ids[b] for b in run], True)
        return Piece([self.unk_id] if self.unk_id is not None else [], False)

    def _encode_text(self, run: bytes) -> Piece:
        ids = self._backend.encode(run.decode("utf-8"), add_special_tokens=False).ids
        spelled = self.bytes_of(ids)
        if spelled == run:
            return Piece(ids, True)
        if spelled is not None and spelled == b" " + run and ids:  # a prepended word-start space (Metaspace)
            first = self.token_bytes[ids[0]][1:]
            if not first:
                return Piece(ids[1:], True)
            if first in self._id_of_bytes:
                return Piece([self._id_of_bytes[first]] + ids[1:], True)
            spelled_first = self._encode_bytes(first)
            if spelled_first.exact:
                return Piece(spelled_first.ids + ids[1:], True)
        return self._encode_bytes(run)


def utf8_runs(data: bytes) -> list[tuple[bytes, bool]]:
    """Split `data` into maximal valid UTF-8 runs (True) and invalid bytes (False), in order."""
    runs: list[tuple[bytes, bool]] = []
    rest = data
    while rest:
        try:
            rest.decode("utf-8")
            runs.append((rest, True))
            break
        except UnicodeDecodeError as error:
            if error.start:
                runs.append((rest[: error.start], True))
            runs.append((rest[error.start : error.end], False))
            rest = rest[error.end :]
    return runs


_CODECS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def codec_for(tokenizer: Any) -> ByteCodec:
    """The ByteCodec of `tokenizer`, built once per tokenizer object (building reads the whole vocabulary)."""
    try:
        codec = _CODECS.get(tokenizer)
    except TypeError:  # not weak-referenceable: build every time
        return ByteCodec(tokenizer)
    if codec is None:
        codec = _CODECS[tokenizer] = ByteCodec(tokenizer)
    return codec
