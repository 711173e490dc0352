"""The output directory of a training run, and what lets it resume.

    <output>/config.json, model.safetensors     the head in SpecForge's layout (written at every checkpoint)
    <output>/training.json                      settings, data, vocabulary coverage, held-out acceptance history
    <output>/state/head.pt, optimizer.pt        the training state (weights_only tensors)
    <output>/state/progress.json                seconds spent per phase, steps, prompts consumed, history
    <output>/data/held_out.pt, shard-NNNNN.pt    the target's continuations, features and choices

Everything is written to a `.partial` file first and renamed, so an interrupted run resumes from its last
complete checkpoint and shard.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from assisted_backends.drafters.eagle.checkpoint import TRAINING_RECORD
from assisted_backends.train_draft.data import Example, load_shard, save_shard


class RunDirectory:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.data = self.root / "data"
        self.state = self.root / "state"
        for folder in (self.root, self.data, self.state):
            folder.mkdir(parents=True, exist_ok=True)

    # --- progress -------------------------------------------------------------------------------------------

    def progress(self) -> dict:
        path = self.state / "progress.json"
        return json.loads(path.read_text()) if path.is_file() else {}

    def save_progress(self, progress: dict) -> None:
        _write_text(self.state / "progress.json", json.dumps(progress, indent=2, sort_keys=True) + "\n")

    # --- data -----------------------------------------------------------------------------------------------

    def held_out(self) -> list[Example] | None:
        path = self.data / "held_out.pt"
        return load_shard(path) if path.is_file() else None

    def save_held_out(self, examples: list[Example]) -> None:
        save_shard(examples, self.data / "held_out.pt")

    def shards(self) -> list[Path]:
        return sorted(self.data.glob("shard-*.pt"))

    def training_examples(self) -> list[Example]:
        return [e for shard in self.shards() for e in load_shard(shard)]

    def add_shard(self, examples: list[Example]) -> None:
        save_shard(examples, self.data / f"shard-{len(self.shards()):05d}.pt")

    # --- training state -------------------------------------------------------------------------------------

    def save_state(self, head_state: dict, optimizer_state: dict) -> None:
        for name, value in (("head.pt", head_state), ("optimizer.pt", optimizer_state)):
            partial = self.state / (name + ".partial")
            torch.save(value, partial)
            partial.rename(self.state / name)

    def load_state(self) -> tuple[dict, dict] | None:
        head, optimizer = self.state / "head.pt", self.state / "optimizer.pt"
        if not (head.is_file() and optimizer.is_file()):
            return None
        return torch.load(head, weights_only=True), torch.load(optimizer, weights_only=True)

    def write_report(self, report: dict) -> None:
        _write_text(self.root / TRAINING_RECORD, json.dumps(report, indent=2, sort_keys=True) + "\n")


def _write_text(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.rename(path)
