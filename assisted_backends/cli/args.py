"""Command-line flags of `run-assisted-generation`, mapped one to one onto `generate(...)` arguments: the models,
device and draft-length flags both command lines take (`startup.flags`), and this command's decoding, prompt, task
and output flags.

Nothing here imports torch: `--help` and every flag error answer before the heavy imports.
"""

from __future__ import annotations

import argparse

from assisted_backends.options import ranges
from assisted_backends.startup.flags import (
    OneLineParser,
    add_device_flags,
    add_draft_length_flags,
    add_model_flags,
    both,
    check_model_flags,
    integer,
    positive_int,
)

PROG = "run-assisted-generation"


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {value}")
    return value


def build_parser(devices: list[str]) -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=PROG,
        description="Assisted generation (speculative decoding) with a draft model; "
        "with no model arguments it runs the embedded demo pair.",
    )
    add_model_flags(parser)
    add_device_flags(parser, devices)

    decoding = parser.add_argument_group("decoding")
    decoding.add_argument(*both("max_new_tokens"), dest="max_new_tokens", type=integer, default=128)
    add_draft_length_flags(decoding)
    decoding.add_argument(*both("do_sample"), dest="do_sample", action="store_true")
    decoding.add_argument("--temperature", type=float, default=None)
    decoding.add_argument(*both("top_k"), dest="top_k", type=int, default=None)
    decoding.add_argument(*both("top_p"), dest="top_p", type=float, default=None)
    decoding.add_argument(*both("repetition_penalty"), dest="repetition_penalty", type=float, default=None)
    decoding.add_argument("--seed", type=int, default=None)
    decoding.add_argument(
        *both("batch_size"),
        dest="batch_size",
        type=positive_int,
        default=1,
        metavar="N",
        help="prompts per generate call (left-padded batch): generate takes one prompt per line of --prompt-file "
        "(in batches of N) or --prompt repeated N times; benchmark runs N different prompts per case",
    )
    decoding.add_argument("--prompt", default=None)
    decoding.add_argument(*both("prompt_file"), dest="prompt_file", default=None)
    decoding.add_argument(
        "--chat",
        action="store_true",
        help="wrap the prompt in the tokenizer's chat template as a user turn (instruct models)",
    )
    decoding.add_argument("--system", default=None, metavar="TEXT", help="system message for --chat (implies it)")

    task = parser.add_argument_group("task and output")
    task.add_argument("--task", choices=("generate", "benchmark"), default="generate")
    task.add_argument(
        "--stream",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="generate: print tokens as rounds commit them (default: on when stdout is a terminal)",
    )
    task.add_argument("--quick", action="store_true", help="benchmark: a short preset of cases")
    task.add_argument(
        "--compare",
        action="store_true",
        help="benchmark: run plain and assisted interleaved on the same cases and add a Speedup column",
    )
    task.add_argument(*both("prompt_lengths"), dest="prompt_lengths", type=positive_int, nargs="+", default=None)
    task.add_argument(
        *both("new_tokens"),
        dest="new_tokens",
        type=positive_int,
        nargs="+",
        default=None,
        help="benchmark: new-token counts per case",
    )
    task.add_argument(
        "--repeats",
        type=positive_int,
        default=3,
        help="benchmark: timed runs per case (median); with --compare the least number of plain/assisted pairs",
    )
    task.add_argument(
        *both("time_limit"),
        dest="time_limit",
        type=_non_negative_float,
        default=60.0,
        metavar="SECONDS",
        help="benchmark --compare: keep adding pairs to a case until its speedup interval settles (excludes 1, or "
        "lies within 0.95-1.05) or this many seconds have passed on the case (default 60; 0: exactly --repeats)",
    )
    task.add_argument(
        "--json", default=None, metavar="PATH", help="write the run as JSON ({rank} in PATH: one file per rank)"
    )
    task.add_argument("--csv", default=None, metavar="PATH")
    task.add_argument(
        "--plot", default=None, metavar="PNG", help="benchmark --compare: the speedup per case with its interval"
    )
    task.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="the full backend report (precision, threads, placement) and transformers' loading messages",
    )
    return parser


def validate(args: argparse.Namespace) -> None:
    """Reject flag combinations that cannot work, with the fix in the message: the model flags' (`startup.flags`),
    then this command's. The rules `generate` has for its options are `options.ranges`' (their errors name the
    option; the CLI says its flag)."""
    ranges.check_integer("max_new_tokens", args.max_new_tokens, minimum=1)
    check_model_flags(args)
    ranges.check_sampling(args.do_sample, args.temperature, args.top_k, args.top_p, args.repetition_penalty)
    if args.no_assisted and args.compare:
        raise ValueError("--compare already runs plain decoding next to assisted; drop --no-assisted")
    if args.compare and args.task != "benchmark":
        raise ValueError("--compare belongs to --task benchmark")
    if args.plot and not args.compare:
        raise ValueError("--plot draws the speedup per case and needs --task benchmark --compare")
    if args.prompt is not None and args.prompt_file is not None:
        raise ValueError("give either --prompt or --prompt-file, not both")
    ranges.check_streaming(bool(args.stream), args.batch_size, rows_option="batch_size")
    if args.task == "benchmark" and (args.chat or args.system is not None or args.stream):
        raise ValueError("--chat, --system and --stream belong to --task generate")
    if args.task == "generate" and (args.prompt_lengths or args.new_tokens or args.quick):
        raise ValueError("--prompt-lengths, --new-tokens and --quick belong to --task benchmark")
    sampling_only = [
        flag
        for flag, value in (("--temperature", args.temperature), ("--top-k", args.top_k), ("--top-p", args.top_p))
        if value is not None
    ]
    if sampling_only and not args.do_sample:
        raise ValueError(f"{', '.join(sampling_only)} only apply when sampling; add --do_sample")
