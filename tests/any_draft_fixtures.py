"""Fixtures for drafting across tokenizers.

Two tokenizers trained here with `tokenizers`, on different text, with different algorithms and sizes:

- target: byte-level BPE (GPT-2 style, `Ġ` for spaces, every byte a token), ~570 tokens, trained on prose.
- draft: Unigram (SentencePiece style, `▁` for spaces, prepend "first", byte fallback `<0xNN>`),
  250 pieces plus 256 byte pieces, trained on code and numbers.

Both are wrapped as `PreTrainedTokenizerFast`, saved with `save_pretrained` and loaded back with
`AutoTokenizer.from_pretrained`, so tests go through the real loading code.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from tiny_models import tiny_model
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

PROSE = """The quick brown fox jumps over the lazy dog. A speculative decoder drafts a few tokens and the
target model checks them all at once; accepted tokens cost one pass instead of many.
Rain in the valley, snow on the hills: the village waited for spring, counting the days.
She said "hello" to the teacher, then walked home along the river in the evening light.
Über den Wolken muss die Freiheit wohl grenzenlos sein. Café, naïve, résumé, façade.
Numbers like 3.14159 and 2718 appear in tables; the year 2024 had 366 days.
"""

CODE = """def fibonacci(n):
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a

class Counter:
    def __init__(self, start=0):
        self.value = start

    def step(self, amount=1):
        self.value += amount
        return self.value

total = sum(x * x for x in range(100))  # 328350
print(f"total={total:>10d}", 0x1F, 1e-3, [1, 2, 3])
"""

SHARED = """once upon a time there was a little robot who loved to count the stars every night.
one, two, three, four, five: the robot counted and the stars twinkled back at it.
"""

TARGET_TEXTS = [PROSE * 3, SHARED * 4, "    indented  double  spaces\t\ttabs\n\n" * 2]
DRAFT_TEXTS = [CODE * 3, SHARED * 4, "résumé 日本語 emoji 🙂 numbers 0123456789\n"]


def train_byte_level_bpe(vocab_size: int = 600) -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(TARGET_TEXTS, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<|endoftext|>", eos_token="<|endoftext|>", unk_token=None
    )


def train_unigram_byte_fallback(vocab_size: int = 250) -> PreTrainedTokenizerFast:
    """A Unigram model (Viterbi segmentation over scored pieces, as SentencePiece) with byte fallback.

    Its pieces come from a BPE trainer run with Metaspace pre-tokenization and are scored by their
    log frequency in the corpus: the Unigram trainer of `tokenizers` 0.23 gives another vocabulary on
    every run (hash-map order), and tests must be repeatable.
    """
    specials = ["<unk>", "<s>", "</s>"]
    pieces_source = Tokenizer(models.BPE())
    pieces_source.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    pieces_source.train_from_iterator(
        DRAFT_TEXTS, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False)
    )
    corpus = "".join("▁" + text.replace(" ", "▁") for text in DRAFT_TEXTS)
    pieces = sorted(p for p in pieces_source.get_vocab() if p not in specials)
    counts = {p: max(corpus.count(p), 1) for p in pieces}
    total = sum(counts.values())
    vocab = [(s, 0.0) for s in specials] + [(p, math.log(counts[p] / total)) for p in pieces]
    tokenizer = Tokenizer(models.Unigram(vocab, unk_id=0, byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tokenizer.add_special_tokens(specials)
    # SentencePiece-style byte fallback: add the 256 <0xNN> pieces and switch the model's fallback on.
    spec = json.loads(tokenizer.to_str())
    known = {piece for piece, _ in spec["model"]["vocab"]}
    spec["model"]["vocab"] += [[f"<0x{b:02X}>", -100.0] for b in range(256) if f"<0x{b:02X}>" not in known]
    spec["model"]["byte_fallback"] = True
    spec["decoder"] = {
        "type": "Sequence",
        "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0},
        ],
    }
    tokenizer = Tokenizer.from_str(json.dumps(spec))
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def saved_tokenizers(directory: Path) -> tuple[PreTrainedTokenizerFast, PreTrainedTokenizerFast]:
    """(target, draft) tokenizers, trained, saved under `directory` and loaded back with from_pretrained."""
    for name, build in (("target_tokenizer", train_byte_level_bpe), ("draft_tokenizer", train_unigram_byte_fallback)):
        if not (directory / name / "tokenizer.json").exists():
            build().save_pretrained(directory / name)
    return (
        AutoTokenizer.from_pretrained(directory / "target_tokenizer"),
        AutoTokenizer.from_pretrained(directory / "draft_tokenizer"),
    )


PROMPTS = [
    "The quick brown fox",
    "once upon a time there was",
    "def fibonacci(n):\n    a, b = 0, 1",
    "Numbers like 3.14159 and 2718",
    "    indented  double  spaces\t\ttabs",
    "Über den Wolken, café résumé naïve",
    "日本語のテキスト 🙂🚀 emoji",
    "total = sum(x * x for x in range(100))",
    "   leading spaces and trailing   ",
    "0123456789 9876543210 1e-3",
    "one, two, three, four, five: the robot",
    "\n\nnew lines\n\tand a tab",
]


MEMORIZED = SHARED + "Café, naïve: 3.14159 and 2718 🙂 and    four spaces.\n"


def train_to_memorize(model, token_ids: list[int], steps: int = 150, window: int = 40, seed: int = 0):
    """Fit `model` to `token_ids` (a short text) on windows starting anywhere in it (twice over), so it
    recites the text from any point, not from one position."""
    generator = torch.Generator().manual_seed(seed)
    data = torch.tensor(token_ids + token_ids)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    model.train()
    for _ in range(steps):
        starts = torch.randint(0, len(token_ids), (4,), generator=generator).tolist()
        batch = torch.stack([data[s : s + window] for s in starts])
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval(), float(loss.detach())


def saved_memorized_pair(directory: Path):
    """(target, draft, target_tokenizer, draft_tokenizer): a Llama on the byte-level BPE and another on the
    Unigram tokenizer (rotary positions: they recite from any offset), both trained here to recite
    MEMORIZED, saved and loaded back with from_pretrained."""
    target_tokenizer, draft_tokenizer = saved_tokenizers(directory)
    for name, arch, tokenizer, seed, steps in (
        ("target_model", "llama", target_tokenizer, 0, 150),
        ("draft_model", "llama", draft_tokenizer, 1, 150),
    ):
        if not (directory / name / "config.json").exists():
            model = tiny_model(arch, seed, hidden=64, layers=2, vocab=len(tokenizer), init=0.02)
            ids = tokenizer(MEMORIZED, add_special_tokens=False).input_ids
            model, _ = train_to_memorize(model, ids, steps=steps, seed=seed)
            model.save_pretrained(directory / name)
    target = AutoModelForCausalLM.from_pretrained(directory / "target_model").eval()
    draft = AutoModelForCausalLM.from_pretrained(directory / "draft_model").eval()
    return target, draft, target_tokenizer, draft_tokenizer


def handmade_unigram(pieces: list[str], directory: Path) -> PreTrainedTokenizerFast:
    """A SentencePiece-style Unigram tokenizer with exactly `pieces` (pieces[0] is <unk>), saved and loaded back:
    small enough to enumerate every sequence of a 6-token vocabulary."""
    if not (directory / "tokenizer.json").exists():
        model = models.Unigram([(piece, -float(len(piece))) for piece in pieces], unk_id=0, byte_fallback=False)
        tokenizer = Tokenizer(model)
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
        tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
        PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token=pieces[0]).save_pretrained(directory)
    return AutoTokenizer.from_pretrained(directory)


SMALL_TARGET_PIECES = ["<unk>", "a", "b", "c", "▁", "ab"]  # V_target = 6
SMALL_DRAFT_PIECES = ["<unk>", "b", "a", "ba", "c", "▁a", "d", "▁"]  # V_draft = 8; shared: a, b, c, ▁
