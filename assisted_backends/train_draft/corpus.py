"""Local text as training prompts: files and directories read once, split by document into training and
held-out, and cut into prompts.

A prompt is a window of about `prompt_tokens` tokens starting at a line of a document. When the target's
tokenizer has a chat template, a share `chat_share` of the prompts are instead a user turn that asks something
about a window (explain it, continue it, summarise it, a story inspired by it, ...), rendered with the template
up to the assistant's opener: the target then answers as it does in a chat, which is the text it drafts for in
use. The draws are seeded.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

DEFAULT_EXTENSIONS = (".py", ".txt", ".md", ".rst")
INSTRUCTIONS = (
    "Explain what the following does, step by step.",
    "Summarize the following in a few sentences.",
    "Continue the following.",
    "Rewrite the following in plain English.",
    "What could go wrong here? Answer briefly.",
    "Write a short story inspired by the following.",
    "Ask one question about the following and answer it.",
)


@dataclass(frozen=True)
class Document:
    name: str
    text: str


def read_documents(paths: list[str | Path], extensions: tuple[str, ...] = DEFAULT_EXTENSIONS) -> list[Document]:
    """Every readable UTF-8 file under `paths` (files as given, directories recursively by extension), sorted."""
    files: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            files += [p for p in path.rglob("*") if p.is_file() and p.suffix in extensions]
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"no such file or directory: {path}")
    documents = []
    for file in sorted(set(files)):
        try:
            text = file.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if len(text.strip()) >= 200:
            documents.append(Document(str(file), text))
    if not documents:
        raise ValueError(f"no text of at least 200 characters found under {[str(p) for p in paths]}")
    return documents


def split_documents(documents: list[Document], held_out_share: float = 0.05) -> tuple[list[Document], list[Document]]:
    """(training, held-out), by a hash of each document's name: stable when files are added."""

    def held(doc: Document) -> bool:
        return int(hashlib.sha256(doc.name.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF < held_out_share

    held_out = [d for d in documents if held(d)] or documents[-1:]
    training = [d for d in documents if d not in held_out] or documents
    return training, held_out


class PromptSource:
    """Seeded prompts (token id lists) from `documents` for the target's `tokenizer`."""

    def __init__(self, documents: list[Document], tokenizer, prompt_tokens: int, seed: int, chat_share: float) -> None:
        self.documents = documents
        self.tokenizer = tokenizer
        self.prompt_tokens = prompt_tokens
        self.random = random.Random(seed)
        self.chat_share = chat_share if getattr(tokenizer, "chat_template", None) is not None else 0.0

    def _window(self) -> str:
        doc = self.random.choice(self.documents)
        starts = [0] + [i + 1 for i, c in enumerate(doc.text) if c == "\n"]
        start = self.random.choice(starts[: max(1, len(starts) - 5)])
        text = doc.text[start : start + 6 * self.prompt_tokens]
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"][: self.prompt_tokens]
        return self.tokenizer.decode(ids)

    def __iter__(self) -> Iterator[list[int]]:
        while True:
            window = self._window()
            if not window.strip():
                continue
            if self.random.random() < self.chat_share:
                message = f"{self.random.choice(INSTRUCTIONS)}\n\n{window}"
                ids = self.tokenizer.apply_chat_template(
                    [{"role": "user", "content": message}], add_generation_prompt=True, tokenize=True
                )
                ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
            else:
                ids = self.tokenizer(window)["input_ids"]
            if len(ids) >= 2:
                yield list(ids)
