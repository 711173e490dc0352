"""Command-line flags of `run-assisted-generation`, mapped one to one onto `generate(...)` arguments.

Both spellings the seed scripts use are accepted (`--assistant-model` and `--assistant_model`).
Nothing here imports torch: `--help` and every flag error answer before the heavy imports.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from typing import Any, NoReturn

from assisted_backends.options import ranges
from assisted_backends.options.errors import NO_VALUE, OptionError, api_spelling
from assisted_backends.options.fields import DEFAULT_NUM_ASSISTANT_TOKENS, MAX_ADAPTIVE_GAMMA

# The flag of each `generate` option (errors name options; the CLI says them as the flags the user typed).
FLAGS = {
    "draft_precision": "--draft-precision",
    "head_precision": "--head-precision",
    "dtype": "--dtype",
    "temperature": "--temperature",
    "top_p": "--top-p",
    "top_k": "--top-k",
    "repetition_penalty": "--repetition-penalty",
    "max_new_tokens": "--max-new-tokens",
    "new_tokens": "--new-tokens",
    "num_assistant_tokens": "--num-assistant-tokens",
    "bucket_size": "--bucket-size",
    "prompt_lookup_num_tokens": "--prompt-lookup",
    "assistant_early_exit": "--assistant-early-exit",
    "suffix_cache": "--suffix-cache",
    "static_shapes": "--static-shapes",
    "assistant_model": "--assistant-model",
    "do_sample": "--do_sample",
    "device": "--device",
    "schedule": "--schedule",
    "seed": "--seed",
    "input_ids": "the prompt",
    "streamer": "--stream",
    "batch_size": "--batch-size",
}


def cli_spelling(option: str, value: Any = NO_VALUE) -> str:
    """An option as the user typed it: `--dtype bf16`, `--max-new-tokens`; options with no flag as the API's."""
    flag = FLAGS.get(option)
    if flag is None:
        return api_spelling(option, value)
    return flag if value is NO_VALUE or value is True else f"{flag} {value}"


DTYPES = ("auto", "fp32", "bf16", "fp16", "int8", "int4")
DRAFT_PRECISIONS = ("fp32", "bf16", "int8", "int4", "w8af32")
HEAD_PRECISIONS = ("auto", "float", "bf16", "int8", "int4")  # drafters/eagle/precision.py's (a test keeps them equal)


def _both(name: str) -> list[str]:
    """`--some-flag` and `--some_flag`."""
    dashed, underscored = name.replace("_", "-"), name.replace("-", "_")
    return [f"--{dashed}"] if dashed == underscored else [f"--{dashed}", f"--{underscored}"]


def _integer(text: str) -> int:
    """Text to int for a `generate` option; its range is `options.ranges`' rule, checked in `validate`."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None


def _positive_int(text: str) -> int:
    """Text to int >= 1, for the CLI's own counts (threads, batch size, prompt lengths, repeats)."""
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {value}")
    return value


PROG = "run-assisted-generation"
USAGE_ERROR = 2


class OneLineParser(argparse.ArgumentParser):
    """argparse with one-line errors (`error: --flag: what is wrong`), the closest flag suggested for a
    typo, and no prefix matching (`--max-new-token` is a typo, not `--max-new-tokens`)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(allow_abbrev=False, **kwargs)

    def flags(self) -> list[str]:
        """Every spelling of every flag this parser knows."""
        return [flag for action in self._actions for flag in action.option_strings if flag.startswith("--")]

    def error(self, message: str) -> NoReturn:
        """Print argparse's complaint as one line and exit with status 2."""
        print(f"error: {one_line(message, self.flags())}", file=sys.stderr)
        sys.exit(USAGE_ERROR)


def suggest(word: str, choices: list[str], cutoff: float = 0.6) -> str:
    """'; did you mean --x?' for the closest of `choices`, or '' when none is close."""
    close = difflib.get_close_matches(word, choices, n=1, cutoff=cutoff)
    return f"; did you mean {close[0]}?" if close else ""


def _unrecognized(tokens: list[str], flags: list[str]) -> str:
    """`unrecognized arguments: --prompt-lookpu 10` -> the unknown flags, each with its closest flag."""
    unknown = [token.split("=", 1)[0] for token in tokens if token.startswith("-")]
    if not unknown:
        return f"unexpected argument {tokens[0]!r} (every input is given with a flag, e.g. --prompt TEXT)"
    parts = [f"unknown flag {flag}{suggest(flag, flags)}" for flag in unknown]
    hint = "" if "did you mean" in parts[-1] else f" ({PROG} --help lists the flags)"
    return "; ".join(parts) + hint


def one_line(message: str, flags: list[str]) -> str:
    """argparse's message, shortened to what the user needs: the flag as typed first, then what is wrong."""
    message = " ".join(message.split())
    if message.startswith("unrecognized arguments: "):
        return _unrecognized(message.split(": ", 1)[1].split(), flags)
    matched = re.match(r"argument (\S+?)(?:/\S+)?: (.*)", message)
    if matched is None:
        return message
    flag, problem = matched.groups()
    choice = re.match(r"invalid choice: '([^']*)' \(choose from (.*)\)", problem)
    if choice is not None:
        options = [option.strip(" '") for option in choice.group(2).split(",")]
        return f"{flag}: {choice.group(1)!r} is not one of {', '.join(options)}{suggest(choice.group(1), options, 0.7)}"
    return f"{flag}: {problem}"


def build_parser(devices: list[str]) -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=PROG,
        description="Assisted generation (speculative decoding) with a draft model; "
        "with no model arguments it runs the embedded demo pair.",
    )
    models = parser.add_argument_group("models")
    models.add_argument(
        "-m",
        *_both("model_name_or_path"),
        "--model",
        dest="model",
        default=None,
        help="target: a local directory, a .gguf file (or a folder holding one) or a Hub id (default: the demo pair)",
    )
    models.add_argument(
        *_both("assistant_model"),
        dest="assistant_model",
        default=None,
        help="draft: a local directory, a .gguf file or a Hub id (default: the target family's usual draft, used only "
        "when it is already on this machine; it is never downloaded implicitly), or an EAGLE-3 head's directory "
        "(with --prompt-lookup N too: a lookup match when there is one, the head otherwise)",
    )
    models.add_argument(
        *_both("no_assisted"),
        dest="no_assisted",
        action="store_true",
        help="plain decoding through the same loop (for benchmarking)",
    )
    models.add_argument(
        *_both("prompt_lookup"),
        dest="prompt_lookup",
        type=_integer,
        default=None,
        metavar="N",
        help="draft N tokens by prompt lookup instead of a draft model",
    )
    models.add_argument(
        *_both("suffix_cache"),
        dest="suffix_cache",
        action="store_true",
        help="draft by suffix decoding, no draft model: the longest earlier match in this run's prompts and outputs "
        "(every prompt of --prompt-file with --batch-size N shares one index) and in the current request. The "
        "default when -m comes without a draft and the family's usual draft is larger than the target or not on "
        "this machine",
    )
    models.add_argument(
        *_both("assistant_early_exit"),
        dest="assistant_early_exit",
        type=_integer,
        default=None,
        metavar="N",
        help="draft with the target's first N layers and its own head",
    )
    models.add_argument(
        *_both("demo_pair"),
        dest="demo_pair",
        choices=("shipped", "train", "smoke"),
        default="shipped",
        help="the demo pair: the weights shipped in the package (default), 'train' to retrain them here "
        "(about 25 minutes on 2 idle cores, then cached), or 'smoke' (a noise pair trained in seconds on a "
        "small text sample; for tests and CI)",
    )
    models.add_argument(
        *_both("demo_dir"),
        dest="demo_dir",
        default=None,
        help="cache directory for the demo pair (default: ~/.cache/assisted_backends, or $ASSISTED_BACKENDS_CACHE)",
    )

    device = parser.add_argument_group("device and precision")
    device.add_argument("--device", choices=devices, default="auto")
    device.add_argument(
        "--dtype",
        choices=DTYPES,
        default=None,
        help="target precision (default: a .gguf file's own quantization, else fp32, where greedy output is "
        "the same on every run); fp32 on a .gguf: its dequantized weights; int8/int4: weight-only quantized "
        "(CPU); auto = bf16 where the device runs it fast (near-ties may resolve differently from fp32)",
    )
    device.add_argument(
        "--threads",
        type=_positive_int,
        default=None,
        metavar="N",
        help="CPU threads for torch (default: $OMP_NUM_THREADS if set, else measured on the loaded target: 1 "
        "thread against the cores this process may use, its CPU affinity capped by a cgroup CPU quota and divided "
        "by the ranks a launcher started on this host; more than those cores is lowered to them)",
    )
    device.add_argument(*_both("draft_precision"), dest="draft_precision", choices=DRAFT_PRECISIONS, default=None,
                        help="draft precision (default: as --dtype)")  # fmt: skip
    device.add_argument(*_both("head_precision"), dest="head_precision", choices=HEAD_PRECISIONS, default=None,
                        help="an EAGLE-3 head's precision (default auto: its linear layers int8 on the package's "
                        "kernels when the target runs on them, else float, the target's activation dtype)")  # fmt: skip
    device.add_argument(
        *_both("static_shapes"),
        dest="static_shapes",
        action="store_true",
        help="bucketed prompt, static KV cache, fixed draft length (what HPU graphs need)",
    )
    device.add_argument(*_both("bucket_size"), dest="bucket_size", type=_integer, default=None)

    decoding = parser.add_argument_group("decoding")
    decoding.add_argument(*_both("max_new_tokens"), dest="max_new_tokens", type=_integer, default=128)
    decoding.add_argument(
        *_both("num_assistant_tokens"),
        dest="num_assistant_tokens",
        type=_integer,
        default=None,
        help=f"draft length γ. Given: γ stays fixed (the constant schedule; with --schedule adaptive, the cap). "
        f"Not given: the adaptive schedule picks γ from 0 to {MAX_ADAPTIVE_GAMMA} before every round; a constant "
        f"schedule (--schedule constant, --static-shapes, --do_sample --seed) uses {DEFAULT_NUM_ASSISTANT_TOKENS}",
    )
    decoding.add_argument(
        "--schedule",
        choices=("adaptive", "constant"),
        default=None,
        help="adaptive (default): γ chosen online from measured acceptance and cost, 0 when speculation cannot "
        "win; constant: always --num-assistant-tokens (the default when that flag is given, and with --do_sample "
        "--seed, so that the seed reproduces the tokens)",
    )
    decoding.add_argument(*_both("do_sample"), dest="do_sample", action="store_true")
    decoding.add_argument("--temperature", type=float, default=None)
    decoding.add_argument(*_both("top_k"), dest="top_k", type=int, default=None)
    decoding.add_argument(*_both("top_p"), dest="top_p", type=float, default=None)
    decoding.add_argument(*_both("repetition_penalty"), dest="repetition_penalty", type=float, default=None)
    decoding.add_argument("--seed", type=int, default=None)
    decoding.add_argument(
        *_both("batch_size"),
        dest="batch_size",
        type=_positive_int,
        default=1,
        metavar="N",
        help="prompts per generate call (left-padded batch): generate takes one prompt per line of --prompt-file "
        "(in batches of N) or --prompt repeated N times; benchmark runs N different prompts per case",
    )
    decoding.add_argument("--prompt", default=None)
    decoding.add_argument(*_both("prompt_file"), dest="prompt_file", default=None)
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
    task.add_argument(*_both("prompt_lengths"), dest="prompt_lengths", type=_positive_int, nargs="+", default=None)
    task.add_argument(
        *_both("new_tokens"),
        dest="new_tokens",
        type=_positive_int,
        nargs="+",
        default=None,
        help="benchmark: new-token counts per case",
    )
    task.add_argument(
        "--repeats",
        type=_positive_int,
        default=3,
        help="benchmark: timed runs per case (median); with --compare the least number of plain/assisted pairs",
    )
    task.add_argument(
        *_both("time_limit"),
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


def assistant_kind(args: argparse.Namespace) -> ranges.AssistantKind | None:
    """What --assistant-model names, as `options.ranges.check_drafting` takes it: an EAGLE-3 head's checkpoint is
    read (torch) only where it matters, with --prompt-lookup or --suffix-cache beside it."""
    if args.assistant_model is None:
        return None
    if args.prompt_lookup is not None or args.suffix_cache:
        from assisted_backends.drafters.eagle.checkpoint import is_eagle_checkpoint  # torch: only when both are given

        if is_eagle_checkpoint(args.assistant_model):  # a head takes lookup (or suffix) matches first
            return "eagle_head"
    return "draft_model"


def validate(args: argparse.Namespace) -> None:
    """Reject flag combinations that cannot work, with the fix in the message. The rules `generate` has for
    its options are `options.ranges`' (their errors name the option; the CLI says its flag)."""
    for option in ("max_new_tokens", "num_assistant_tokens", "bucket_size"):
        ranges.check_integer(option, getattr(args, option), minimum=1)
    request = ranges.check_drafting(
        {
            "assistant_model": assistant_kind(args),
            "prompt_lookup_num_tokens": args.prompt_lookup,
            "assistant_early_exit": args.assistant_early_exit,
            "num_assistant_tokens": args.num_assistant_tokens,
            "suffix_cache": args.suffix_cache,
        }
    )
    ranges.check_shapes(None, args.static_shapes, args.schedule, args.bucket_size)
    ranges.check_sampling(args.do_sample, args.temperature, args.top_k, args.top_p, args.repetition_penalty)
    if args.no_assisted and request.option is not None:
        raise ValueError(f"--no-assisted conflicts with {FLAGS[request.option]}; drop one of them")
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


__all__ = ["FLAGS", "OptionError", "build_parser", "cli_spelling", "validate"]
