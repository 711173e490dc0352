"""A byte-level BPE tokenizer trained locally with `tokenizers`, wrapped for transformers."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<|endoftext|>", "<|pad|>"]


def train_tokenizer(text: str, vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE with `vocab_size` entries; deterministic for a given text."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    chunks = [text[i : i + 4096] for i in range(0, len(text), 4096)]
    tokenizer.train_from_iterator(chunks, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=SPECIAL_TOKENS[0],
        pad_token=SPECIAL_TOKENS[1],
        bos_token=SPECIAL_TOKENS[0],
    )
