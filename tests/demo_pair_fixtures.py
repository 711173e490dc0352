"""The shipped demo pair (a trained target/draft with its trained tokenizer) in fp32, loaded once.

Real text and a draft that is sometimes right and sometimes wrong: what streaming, stop strings and
the drop-in need to be tested against transformers' own `generate`.
"""

from __future__ import annotations

import functools
import json

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from assisted_backends.demo.pair import shipped_pair
from assisted_backends.hf_compat import dtype_kwargs

PROMPT = "import os\nimport sys\n\n\ndef main(argv=None):\n"


@functools.cache
def demo_pair():
    """(target, draft, tokenizer), fp32, eval mode; skips when the installation has no shipped weights."""
    pair = shipped_pair()
    if pair is None:
        pytest.skip("the shipped demo weights are not in this installation")
    load = functools.partial(AutoModelForCausalLM.from_pretrained, **dtype_kwargs(torch.float32))
    target, draft = load(str(pair.target_dir)).eval(), load(str(pair.draft_dir)).eval()
    return target, draft, demo_tokenizer()


def demo_tokenizer() -> PreTrainedTokenizerFast:
    """The demo target's tokenizer, built from its files so that transformers 4.x loads it too (the
    saved config names 5.x's tokenizer class)."""
    pair = shipped_pair()
    if pair is None:
        pytest.skip("the shipped demo weights are not in this installation")
    config = json.loads((pair.target_dir / "tokenizer_config.json").read_text())
    specials = {name: config[name] for name in ("bos_token", "eos_token", "pad_token") if name in config}
    return PreTrainedTokenizerFast(
        tokenizer_file=str(pair.target_dir / "tokenizer.json"),
        model_input_names=["input_ids", "attention_mask"],
        **specials,
    )


def prompt_ids(tokenizer, text: str = PROMPT) -> torch.Tensor:
    return tokenizer(text, return_tensors="pt").input_ids
