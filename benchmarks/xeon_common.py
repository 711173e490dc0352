"""Shared pieces of the xeon_* benchmarks: timing, a JSON writer, and a small trained pair.

The pair is byte-level (vocabulary 256, no tokenizer to train) on the Python standard library's own
source: a 4-layer x 256 Llama target and a 1-layer x 128 draft trained on the same batches for a fixed
number of steps, so the draft agrees with the target often but not always (a real acceptance rate,
not a copy's). Weights are cached under $ASSISTED_BACKENDS_CACHE (default ~/.cache/assisted_backends).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import sysconfig
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from assisted_backends.backends.cpu import (
    affinity,  # noqa: E402
    cpu_features,  # noqa: E402
)

RESULTS = Path(__file__).resolve().parent / "results"


def median_ms(samples: list[float]) -> float:
    return round(1000 * statistics.median(samples), 4)


def interleaved(
    cases: dict[str, Callable[[], object]], repeats: int, warmup: int = 2, last: dict | None = None
) -> dict[str, list[float]]:
    """Time every case `repeats` times, round-robin (so drift and neighbours hit all cases alike); `last`, when
    given, receives each case's last output."""
    for _ in range(warmup):
        for run in cases.values():
            run()
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, run in cases.items():
            start = time.perf_counter()
            out = run()
            samples[name].append(time.perf_counter() - start)
            if last is not None:
                last[name] = out
    return samples


def machine() -> dict[str, str]:
    import transformers

    features = cpu_features.detect()
    info = {
        "cpu": features.summary(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "platform": sysconfig.get_platform(),
        "load_average_1m": f"{os.getloadavg()[0]:.2f}",
    }
    info.update(affinity.placement().as_dict())
    return info


def write_result(name: str, command: str, payload: dict, path: Path | None = None) -> Path:
    """benchmarks/results/<name>.json (or `path`): the command, the date, the machine, then `payload`."""
    path = path or RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {"command": command, "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    document["machine"] = machine()
    document.update(payload)
    path.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {path}")
    return path


def llama(hidden: int, layers: int, vocab: int, heads: int = 8, max_positions: int = 2048) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=(hidden * 8 // 3 + 63) // 64 * 64,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        max_position_embeddings=max_positions,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    return LlamaForCausalLM(config).eval()


# --- the trained pair --------------------------------------------------------------------------------

PAIR_STEPS = 300
PAIR_SEQ = 128
PAIR_BATCH = 8


def _corpus(max_bytes: int = 4_000_000) -> tuple[torch.Tensor, torch.Tensor]:
    """Bytes of the standard library's .py files: (train, held-out)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for path in sorted(root.rglob("*.py")):
        if "test" in path.parts or "site-packages" in path.parts:
            continue
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    data = torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8).long()
    split = int(0.95 * len(data))
    return data[:split], data[split:]


def _train(model: LlamaForCausalLM, train: torch.Tensor, steps: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.0)
    model.train()
    for step in range(steps):
        lr_scale = min(1.0, (step + 1) / 30) * (0.1 + 0.9 * (1 - step / steps))
        for group in optimizer.param_groups:
            group["lr"] = 3e-3 * lr_scale
        starts = torch.randint(0, len(train) - PAIR_SEQ - 1, (PAIR_BATCH,), generator=generator)
        batch = torch.stack([train[s : s + PAIR_SEQ] for s in starts.tolist()])
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=batch, labels=batch).loss  # transformers shifts the labels itself
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if (step + 1) % 100 == 0:
            print(f"  step {step + 1}/{steps}: loss {loss.item():.3f}", flush=True)
    model.eval()


def trained_pair(steps: int = PAIR_STEPS) -> tuple[LlamaForCausalLM, LlamaForCausalLM, torch.Tensor]:
    """(target, draft, held-out bytes) — trained once (a minute or two on 2 cores), then loaded from the cache."""
    cache = Path(os.environ.get("ASSISTED_BACKENDS_CACHE", Path.home() / ".cache" / "assisted_backends"))
    directory = cache / f"xeon_bench_pair_v2_{steps}x{PAIR_BATCH}"
    train, held_out = _corpus()
    if (directory / "target" / "config.json").exists() and (directory / "draft" / "config.json").exists():
        target = LlamaForCausalLM.from_pretrained(directory / "target").eval()
        draft = LlamaForCausalLM.from_pretrained(directory / "draft").eval()
        return target, draft, held_out
    torch.manual_seed(0)
    target = llama(hidden=256, layers=4, vocab=256, heads=4)
    torch.manual_seed(1)
    draft = llama(hidden=128, layers=1, vocab=256, heads=2)
    started = time.perf_counter()
    _train(target, train, steps, seed=0)
    _train(draft, train, steps, seed=0)
    print(f"trained the pair in {time.perf_counter() - started:.0f} s; cached in {directory}", flush=True)
    target.save_pretrained(directory / "target")
    draft.save_pretrained(directory / "draft")
    return target, draft, held_out


def load_pair(name: str) -> tuple[torch.nn.Module, torch.nn.Module, torch.Tensor, str]:
    """(target, draft, held-out token ids, description) for `--pair`.

    "demo": the package's embedded demo pair (a 6 x 384 Llama target, a 1 x 128 draft, a 4096-token
    BPE vocabulary, trained on the standard library; its weights ship under assisted_backends/demo/);
    "bytes": the byte-level pair trained here (trained_pair); or a directory laid out like the demo
    pair (target/, draft/, held_out.txt).
    """
    if name == "bytes":
        target, draft, held_out = trained_pair()
        return target, draft, held_out, "byte-level Llama target 4x256, draft 1x128 (xeon_common.trained_pair)"
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if name == "demo":
        from assisted_backends.demo.pair import shipped_pair

        pair = shipped_pair()
        if pair is None:
            raise SystemExit("the demo pair's weights are not in this checkout: pass --pair bytes or --pair DIR")
        directory = pair.target_dir.parent
    else:
        directory = Path(name)
    target = AutoModelForCausalLM.from_pretrained(directory / "target").float().eval()
    draft = AutoModelForCausalLM.from_pretrained(directory / "draft").float().eval()
    tokenizer = AutoTokenizer.from_pretrained(directory / "target")
    text = (directory / "held_out.txt").read_text(encoding="utf-8")
    held_out = torch.tensor(tokenizer(text, add_special_tokens=False).input_ids)
    shape = f"{target.config.num_hidden_layers}x{target.config.hidden_size}"
    draft_shape = f"{draft.config.num_hidden_layers}x{draft.config.hidden_size}"
    return (
        target,
        draft,
        held_out,
        f"{name}: Llama target {shape}, draft {draft_shape}, vocabulary {target.config.vocab_size}",
    )


def prompts(held_out: torch.Tensor, count: int, length: int, seed: int = 0) -> list[torch.Tensor]:
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


def pair_and_prompts(args: argparse.Namespace, seed: int = 0):
    """(target, draft, prompts, description) from the add_pair_arguments flags; sets the thread count."""
    warnings.filterwarnings("ignore")
    if args.threads:
        torch.set_num_threads(args.threads)
    target, draft, held_out, description = load_pair(args.pair)
    return target, draft, prompts(held_out, args.prompts, args.prompt_length, seed=seed), description
