"""Locating, or preparing once, the embedded demo pair.

The package ships the pair's weights (bf16 safetensors under `demo/weights/`, made by
`python -m assisted_backends.demo --out DIR` with the default budget), so the default run needs no
preparation at all. `ensure_demo_pair(budget)` instead trains a pair: tokenizer, then target and draft
together, then `save_pretrained` of both (each directory self-contained, tokenizer included) and the
held-out text the benchmark draws prompts from. Writing goes to a temporary directory renamed at the
end, so an interrupted run never leaves a half-written pair behind; a finished one is cached.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from transformers import LlamaForCausalLM

from assisted_backends.cache_dir import cache_root
from assisted_backends.demo.corpus import read_corpus
from assisted_backends.demo.tokenizer import train_tokenizer
from assisted_backends.demo.train import ModelShape, distill, train_models

DEMO_VERSION = 1
HELD_OUT_CHARS = 200_000  # prompts for the benchmark: enough for 2 x 2048-token prompts
NOTICE = (
    "note: using the embedded DEMO pair (a {target} target and a {draft} draft trained by this project on the "
    "Python standard library). It writes Python-like fragments, not good code; pass -m and --assistant-model "
    "for real models."
)
DEMO_REPETITION_PENALTY = 1.2  # the demo's generate task default: greedy decoding of so small a model loops


@dataclass(frozen=True)
class DemoBudget:
    """How much to train. The default made the shipped weights (joint training, then distillation of
    the draft; about 25 minutes on 2 idle cores); the smoke budget trains in seconds and writes noise."""

    corpus_bytes: int = 4_000_000
    vocab_size: int = 4096
    steps: int = 420
    batch_size: int = 16
    sequence_length: int = 128
    target: ModelShape = field(default_factory=lambda: ModelShape(layers=6, hidden=384, heads=6))
    draft: ModelShape = field(default_factory=lambda: ModelShape(layers=1, hidden=128, heads=4))
    distill_steps: int = 300  # then the draft alone learns the target's distribution (KL), raising α
    seed: int = 0
    threads: int = 2

    def key(self) -> str:
        """Identifies the weights: the budget plus the torch build (other builds give other weights)."""
        blob = json.dumps({**asdict(self), "torch": torch.__version__, "v": DEMO_VERSION}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


SMOKE_BUDGET = DemoBudget(
    corpus_bytes=60_000,
    vocab_size=300,
    steps=3,
    batch_size=2,
    sequence_length=32,
    target=ModelShape(layers=1, hidden=32, heads=2),
    draft=ModelShape(layers=1, hidden=16, heads=2),
    distill_steps=2,
)
SHIPPED = Path(__file__).resolve().parent / "weights"


@dataclass(frozen=True)
class DemoPair:
    target_dir: Path
    draft_dir: Path
    held_out_text: Path

    @classmethod
    def at(cls, directory: Path) -> DemoPair:
        return cls(directory / "target", directory / "draft", directory / "held_out.txt")


def shipped_pair() -> DemoPair | None:
    """The pair whose weights ship inside the package, when this installation has them."""
    pair = DemoPair.at(SHIPPED)
    return pair if is_prepared(pair) else None


def demo_pair_dirs(root: Path | None = None, budget: DemoBudget | None = None) -> DemoPair:
    """Where the pair for `budget` lives (whether or not it was prepared yet)."""
    budget = budget or DemoBudget()
    return DemoPair.at(Path(root or cache_root()) / f"demo-pair-v{DEMO_VERSION}-{budget.key()}")


def is_prepared(pair: DemoPair) -> bool:
    return (
        all((d / "config.json").is_file() for d in (pair.target_dir, pair.draft_dir)) and pair.held_out_text.is_file()
    )


def ensure_demo_pair(root: Path | None = None, budget: DemoBudget | None = None, progress: bool = True) -> DemoPair:
    """The demo pair's directories, training and saving it first if it is not cached yet."""
    budget = budget or DemoBudget()
    pair = demo_pair_dirs(root, budget)
    if is_prepared(pair):
        return pair
    final = pair.target_dir.parent
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".demo-staging-", dir=final.parent))
    try:
        _prepare(staging, budget, progress)
        if final.exists():
            shutil.rmtree(final)
        staging.rename(final)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return pair


def _prepare(directory: Path, budget: DemoBudget, progress: bool, save_dtype: torch.dtype = torch.float32) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(budget.threads)  # same seed + same threads -> bit-identical weights
    try:
        text, held_out = read_corpus(budget.corpus_bytes)
        tokenizer = train_tokenizer(text, budget.vocab_size)
        tokens = torch.tensor(tokenizer(text).input_ids, dtype=torch.long)
        special = dict(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        torch.manual_seed(budget.seed)
        target = LlamaForCausalLM(budget.target.config(len(tokenizer), **special))
        draft = LlamaForCausalLM(budget.draft.config(len(tokenizer), **special))
        bar = _progress_bar(budget.steps, progress)
        losses = train_models(
            [target, draft],
            tokens,
            budget.steps,
            budget.batch_size,
            budget.sequence_length,
            budget.seed,
            on_step=lambda step, values: (
                bar.update(1) or bar.set_postfix(target=f"{values[0]:.2f}", draft=f"{values[1]:.2f}")
            ),
        )
        bar.close()
        if budget.distill_steps:
            bar = _progress_bar(budget.distill_steps, progress, "distilling the draft from the target")
            distill(
                draft,
                target,
                tokens,
                budget.distill_steps,
                budget.batch_size,
                budget.sequence_length,
                budget.seed,
                on_step=lambda step, value: bar.update(1) or bar.set_postfix(kl=f"{value:.3f}"),
            )
            bar.close()
        for name, model in (("target", target), ("draft", draft)):
            model.generation_config.eos_token_id = tokenizer.eos_token_id
            model.generation_config.pad_token_id = tokenizer.pad_token_id
            model.to(save_dtype).save_pretrained(directory / name)
            tokenizer.save_pretrained(directory / name)
        (directory / "held_out.txt").write_text(held_out[:HELD_OUT_CHARS], encoding="utf-8")
        (directory / "training.json").write_text(
            json.dumps(
                {
                    "budget": asdict(budget),
                    "final_loss": {"target": losses[0], "draft": losses[1]},
                    "torch": torch.__version__,
                    "python": sys.version.split()[0],
                },
                indent=2,
            )
        )
    finally:
        torch.set_num_threads(threads)


def _progress_bar(total: int, enabled: bool, description: str = "training the demo pair (once)"):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=description, unit="step", disable=not enabled, file=sys.stderr)
