"""Local text as training prompts: files and directories read once, split by document into training and
held-out, and cut into prompts.

A prompt is a window of about `prompt_tokens` tokens starting at a line of a document, or, for a share
`chat_share` of the prompts, a request, rendered with the tokenizer's chat template up to the
assistant's opener (as plain text and a blank line for a base model without one), so that the target answers as
it does in use. Of those, a share `open_share` are open-ended requests (a story, an explanation, advice, a poem, ...)
about a topic: one or two words drawn from the prose lines of a document (comments, docstrings, sentences);
the rest ask something about a window (explain it, continue it, summarise it, ...). The draws are seeded.
"""

from __future__ import annotations

import hashlib
import random
import re
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

OPEN_REQUESTS = (
    "Write a short story about {topic}.",
    "Tell me a story in which {topic} plays a part.",
    "Write a poem about {topic}.",
    "Explain {topic} in simple terms.",
    "What is {topic}? Answer in a short paragraph.",
    "Why does {topic} matter? Give a few reasons.",
    "Describe {topic} to someone who has never heard of it.",
    "Give me some advice about {topic}.",
    "List five facts about {topic}.",
    "How would you teach a child about {topic}?",
    "Write a short letter to a friend about {topic}.",
    "What are the pros and cons of {topic}?",
    "Compare {topic} with something from everyday life.",
    "Write a dialogue between two people discussing {topic}.",
    "Describe a day in the life of someone who works with {topic}.",
    "Give step-by-step instructions for getting started with {topic}.",
    "What questions do people often ask about {topic}? Answer two of them.",
    "Summarize the history of {topic} in a few sentences.",
    "Write an encouraging message for someone who finds {topic} hard.",
    "Imagine a world without {topic}. What would change?",
    "Write the opening paragraph of a blog post about {topic}.",
    "What is a common misconception about {topic}?",
)
_WORD = re.compile(r"[A-Za-z]+")


def prose_words(text: str) -> list[str]:
    """Lower-case words of 5-12 letters from the prose lines of `text`: lines of at least five words that are
    mostly plain words (comments, docstrings, sentences), so that code identifiers rarely become topics."""
    words = []
    for line in text.splitlines():
        parts = line.replace("#", " ").split()
        plain = [p.strip(".,;:!?()\"'") for p in parts]
        plain = [p for p in plain if _WORD.fullmatch(p)]
        if len(parts) >= 5 and len(plain) >= 0.8 * len(parts):
            words += [p.lower() for p in plain if 5 <= len(p) <= 12]
    return words


@dataclass(frozen=True)
class Document:
    """A text file: `name` is its path under the root it was read from (the file's own name when given
    directly), so the held-out split does not depend on where the files sit."""

    name: str
    text: str


def read_documents(paths: list[str | Path], extensions: tuple[str, ...] = DEFAULT_EXTENSIONS) -> list[Document]:
    """Every readable UTF-8 file under `paths` (files as given, directories recursively by extension), sorted."""
    files: dict[Path, str] = {}
    for path in map(Path, paths):
        if path.is_dir():
            files.update({p: p.relative_to(path).as_posix() for p in path.rglob("*")
                          if p.is_file() and p.suffix in extensions})  # fmt: skip
        elif path.is_file():
            files[path] = path.name
        else:
            raise FileNotFoundError(f"no such file or directory: {path}")
    documents = []
    for file in sorted(files):
        try:
            text = file.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if len(text.strip()) >= 200:
            documents.append(Document(files[file], text))
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

    def __init__(
        self, documents: list[Document], tokenizer, prompt_tokens: int, seed: int, chat_share: float,
        open_share: float = 0.0,
    ) -> None:  # fmt: skip
        self.documents = documents
        self.tokenizer = tokenizer
        self.prompt_tokens = prompt_tokens
        self.random = random.Random(seed)
        self.chat_share = chat_share
        self.templated = getattr(tokenizer, "chat_template", None) is not None
        self.open_share = open_share
        self._words: dict[int, list[str]] = {}

    def _topic(self) -> str | None:
        """One or two prose words of a random document (None when it has none)."""
        index = self.random.randrange(len(self.documents))
        if index not in self._words:
            self._words[index] = prose_words(self.documents[index].text)
        words = self._words[index]
        if not words:
            return None
        if self.random.random() < 0.3:
            return f"{self.random.choice(words)} and {self.random.choice(words)}"
        return self.random.choice(words)

    def _chat(self, message: str) -> list[int]:
        """`message` as a user turn up to the assistant's opener; as plain text then a blank line when the tokenizer
        has no chat template (a base model continues a request as text)."""
        if not self.templated:
            return list(self.tokenizer(f"{message}\n\n")["input_ids"])
        ids = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": message}], add_generation_prompt=True, tokenize=True
        )
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)

    def _window(self) -> str:
        doc = self.random.choice(self.documents)
        starts = [0] + [i + 1 for i, c in enumerate(doc.text) if c == "\n"]
        start = self.random.choice(starts[: max(1, len(starts) - 5)])
        text = doc.text[start : start + 6 * self.prompt_tokens]
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"][: self.prompt_tokens]
        return self.tokenizer.decode(ids)

    def __iter__(self) -> Iterator[list[int]]:
        while True:
            kind = self.random.random()  # [0, chat·open): open request; [.., chat): about a window; else raw
            if kind < self.chat_share * self.open_share:
                topic = self._topic()
                if topic is not None:
                    yield self._chat(self.random.choice(OPEN_REQUESTS).format(topic=topic))
                continue
            window = self._window()
            if not window.strip():
                continue
            if kind < self.chat_share:
                ids = self._chat(f"{self.random.choice(INSTRUCTIONS)}\n\n{window}")
            else:
                ids = self.tokenizer(window)["input_ids"]
            if len(ids) >= 2:
                yield list(ids)
