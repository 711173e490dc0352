"""Models the benchmarks run: random Llamas from configs, the embedded demo pair, and `--pair` selection.

Real pretrained models (PyPI wheels holding GGUF files) are in `gguf_wheels`; the byte-level pair trained
here is in `byte_pair`.
"""

from __future__ import annotations

import argparse
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def random_llama(
    hidden: int,
    layers: int,
    vocab: int,
    heads: int = 8,
    kv_heads: int | None = None,
    intermediate: int | None = None,
    max_positions: int = 2048,
    seed: int | None = None,
    **config,
) -> LlamaForCausalLM:
    """A randomly initialised Llama in eval mode (torch.manual_seed(seed) first when given). Defaults:
    `kv_heads` heads // 2, `intermediate` 8/3 hidden rounded up to 64, no BOS/EOS/pad ids; `config`
    overrides any other LlamaConfig field."""
    settings = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate or (hidden * 8 // 3 + 63) // 64 * 64,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads or max(1, heads // 2),
        max_position_embeddings=max_positions,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    settings.update(config)
    if seed is not None:
        torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**settings)).eval()


@dataclass
class DemoModels:
    """The embedded demo pair, loaded: a 6 x 384 Llama target, a 1 x 128 draft, their 4096-token tokenizer,
    the held-out text (standard-library source the pair never trained on), and the pair's folder."""

    target: torch.nn.Module
    draft: torch.nn.Module
    tokenizer: object
    held_out_text: str
    directory: Path


def demo_pair(dtype: torch.dtype = torch.float32, directory: Path | None = None) -> DemoModels:
    """The demo pair from `assisted_backends.demo` (its shipped weights, else trained once and cached), or a
    folder laid out like it (target/, draft/, held_out.txt), loaded in `dtype`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if directory is None:
        from assisted_backends.demo.pair import ensure_demo_pair, shipped_pair

        directory = (shipped_pair() or ensure_demo_pair()).target_dir.parent
    return DemoModels(
        target=AutoModelForCausalLM.from_pretrained(directory / "target", dtype=dtype).eval(),
        draft=AutoModelForCausalLM.from_pretrained(directory / "draft", dtype=dtype).eval(),
        tokenizer=AutoTokenizer.from_pretrained(directory / "target"),
        held_out_text=(directory / "held_out.txt").read_text(encoding="utf-8"),
        directory=directory,
    )


def load_pair(name: str) -> tuple[torch.nn.Module, torch.nn.Module, torch.Tensor, str]:
    """(target, draft, held-out token ids, description) for `--pair`: `demo` (the embedded demo pair),
    `bytes` (the byte-level pair trained here), or a folder laid out like the demo pair. fp32."""
    if name == "bytes":
        from benchmarks.harness.byte_pair import trained_pair

        target, draft, held_out = trained_pair()
        return target, draft, held_out, "byte-level Llama target 4x256, draft 1x128 (benchmarks.harness.byte_pair)"
    pair = demo_pair(directory=None if name == "demo" else Path(name))
    held_out = torch.tensor(pair.tokenizer(pair.held_out_text, add_special_tokens=False).input_ids)
    target, draft = pair.target.config, pair.draft.config
    shape = f"{target.num_hidden_layers}x{target.hidden_size}"
    draft_shape = f"{draft.num_hidden_layers}x{draft.hidden_size}"
    description = f"{name}: Llama target {shape}, draft {draft_shape}, vocabulary {target.vocab_size}"
    return pair.target, pair.draft, held_out, description


def prompts(held_out: torch.Tensor, count: int, length: int, seed: int = 0) -> list[torch.Tensor]:
    """`count` [1, length] windows of `held_out` at seeded random offsets."""
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(held_out) - length, (count,), generator=generator).tolist()
    return [held_out[s : s + length][None, :].clone() for s in starts]


def add_pair_arguments(parser: argparse.ArgumentParser, prompts: int) -> None:
    """The flags every pair benchmark takes: which pair, how many prompts of what length, γ, threads."""
    parser.add_argument("--prompts", type=int, default=prompts)
    parser.add_argument("--prompt-length", type=int, default=96)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--pair", default="demo", help="demo (the embedded pair), bytes, or a directory")


def pair_and_prompts(
    args: argparse.Namespace, seed: int = 0
) -> tuple[torch.nn.Module, torch.nn.Module, list[torch.Tensor], str]:
    """(target, draft, prompts, description) from the `add_pair_arguments` flags; sets the thread count."""
    warnings.filterwarnings("ignore")
    if args.threads:
        torch.set_num_threads(args.threads)
    target, draft, held_out, description = load_pair(args.pair)
    return target, draft, prompts(held_out, args.prompts, args.prompt_length, seed=seed), description
