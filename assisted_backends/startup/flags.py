"""The flags both command lines take (`run-assisted-generation`, `assisted-serve`): the models, the device and
precision, the draft length and its schedule, each mapped one to one onto a `generate(...)` argument; the parser
both use (one-line errors naming the program's own `--help`); how an option is spelled as a flag.

Both spellings the seed scripts use are accepted (`--assistant-model` and `--assistant_model`). Nothing here
imports torch: `--help` and every flag error answer before the heavy imports.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from importlib.metadata import entry_points
from typing import Any, NoReturn, Protocol

from assisted_backends.options import ranges
from assisted_backends.options.errors import NO_VALUE, api_spelling
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
KV_CACHE_DTYPES = ("fp32", "fp16", "bf16")  # the names of native.decoder_cache.KV_CACHE_DTYPES (torch-free here)
DRAFT_PRECISIONS = ("fp32", "bf16", "int8", "int4", "w8af32")
HEAD_PRECISIONS = ("auto", "float", "bf16", "int8", "int4")  # drafters/eagle/precision.py's (a test keeps them equal)


BUILTIN_DEVICES = ("cpu", "cuda", "hpu")
ENTRY_POINT_GROUP = "assisted_backends.backends"  # the registry's group, read here without importing backends
USAGE_ERROR = 2


def device_names() -> list[str]:
    """`--device` choices from the entry-point metadata (no backend module is imported)."""
    names = {entry.name for entry in entry_points(group=ENTRY_POINT_GROUP)} | set(BUILTIN_DEVICES)
    return ["auto", *sorted(names)]


def both(name: str) -> list[str]:
    """`--some-flag` and `--some_flag`."""
    dashed, underscored = name.replace("_", "-"), name.replace("-", "_")
    return [f"--{dashed}"] if dashed == underscored else [f"--{dashed}", f"--{underscored}"]


def integer(text: str) -> int:
    """Text to int for a `generate` option; its range is `options.ranges`' rule, checked in `validate`."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None


def positive_int(text: str) -> int:
    """Text to int >= 1, for the CLI's own counts (threads, batch size, prompt lengths, repeats)."""
    value = integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """Text to int >= 0 (0 meaning off, as the flag's help says)."""
    value = integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or a positive integer, got {value}")
    return value


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
        print(f"error: {one_line(message, self.flags(), self.prog)}", file=sys.stderr)
        sys.exit(USAGE_ERROR)


def suggest(word: str, choices: list[str], cutoff: float = 0.6) -> str:
    """'; did you mean --x?' for the closest of `choices`, or '' when none is close."""
    close = difflib.get_close_matches(word, choices, n=1, cutoff=cutoff)
    return f"; did you mean {close[0]}?" if close else ""


def _unrecognized(tokens: list[str], flags: list[str], prog: str) -> str:
    """`unrecognized arguments: --prompt-lookpu 10` -> the unknown flags, each with its closest flag."""
    unknown = [token.split("=", 1)[0] for token in tokens if token.startswith("-")]
    if not unknown:
        return f"unexpected argument {tokens[0]!r} (every input is given with a flag, e.g. --prompt TEXT)"
    parts = [f"unknown flag {flag}{suggest(flag, flags)}" for flag in unknown]
    hint = "" if "did you mean" in parts[-1] else f" ({prog} --help lists the flags)"
    return "; ".join(parts) + hint


def one_line(message: str, flags: list[str], prog: str) -> str:
    """argparse's message, shortened to what the user needs: the flag as typed first, then what is wrong."""
    message = " ".join(message.split())
    if message.startswith("unrecognized arguments: "):
        return _unrecognized(message.split(": ", 1)[1].split(), flags, prog)
    matched = re.match(r"argument (\S+?)(?:/\S+)?: (.*)", message)
    if matched is None:
        return message
    flag, problem = matched.groups()
    choice = re.match(r"invalid choice: '([^']*)' \(choose from (.*)\)", problem)
    if choice is not None:
        options = [option.strip(" '") for option in choice.group(2).split(",")]
        return f"{flag}: {choice.group(1)!r} is not one of {', '.join(options)}{suggest(choice.group(1), options, 0.7)}"
    return f"{flag}: {problem}"


class FlagGroup(Protocol):
    """A parser or one of its argument groups."""

    def add_argument(self, *names: str, **options: Any) -> argparse.Action: ...


def add_model_flags(parser: argparse.ArgumentParser) -> None:
    """The "models" group: the target, the drafter, the demo pair."""
    models = parser.add_argument_group("models")
    models.add_argument(
        "-m",
        *both("model_name_or_path"),
        "--model",
        dest="model",
        default=None,
        help="target: a local directory, a .gguf file (or a folder holding one) or a Hub id (default: the demo pair)",
    )
    models.add_argument(
        *both("assistant_model"),
        dest="assistant_model",
        default=None,
        help="draft: a local directory, a .gguf file or a Hub id (default: the target family's usual draft, used only "
        "when it is already on this machine; it is never downloaded implicitly), or an EAGLE-3 head's directory "
        "(with --prompt-lookup N too: a lookup match when there is one, the head otherwise)",
    )
    models.add_argument(
        *both("no_assisted"),
        dest="no_assisted",
        action="store_true",
        help="plain decoding through the same loop (for benchmarking)",
    )
    models.add_argument(
        *both("prompt_lookup"),
        dest="prompt_lookup",
        type=integer,
        default=None,
        metavar="N",
        help="draft N tokens by prompt lookup instead of a draft model",
    )
    models.add_argument(
        *both("suffix_cache"),
        dest="suffix_cache",
        action="store_true",
        help="draft by suffix decoding, no draft model: the longest earlier match in this run's prompts and outputs "
        "(every prompt of --prompt-file with --batch-size N shares one index) and in the current request. The "
        "default when -m comes without a draft and the family's usual draft is larger than the target or not on "
        "this machine",
    )
    models.add_argument(
        *both("assistant_early_exit"),
        dest="assistant_early_exit",
        type=integer,
        default=None,
        metavar="N",
        help="draft with the target's first N layers and its own head",
    )
    models.add_argument(
        *both("demo_pair"),
        dest="demo_pair",
        choices=("shipped", "train", "smoke"),
        default="shipped",
        help="the demo pair: the weights shipped in the package (default), 'train' to retrain them here "
        "(about 25 minutes on 2 idle cores, then cached), or 'smoke' (a noise pair trained in seconds on a "
        "small text sample; for tests and CI)",
    )
    models.add_argument(
        *both("demo_dir"),
        dest="demo_dir",
        default=None,
        help="cache directory for the demo pair (default: ~/.cache/assisted_backends, or $ASSISTED_BACKENDS_CACHE)",
    )


def add_device_flags(parser: argparse.ArgumentParser, devices: list[str]) -> None:
    """The "device and precision" group: where (`devices`: `device_names()`) and in which precision the models
    run, and the threads."""
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
        type=positive_int,
        default=None,
        metavar="N",
        help="CPU threads for torch (default: $OMP_NUM_THREADS if set, else measured on the loaded target: 1 "
        "thread against the cores this process may use, its CPU affinity capped by a cgroup CPU quota and divided "
        "by the ranks a launcher started on this host; more than those cores is lowered to them)",
    )
    device.add_argument(*both("draft_precision"), dest="draft_precision", choices=DRAFT_PRECISIONS, default=None,
                        help="draft precision (default: as --dtype)")  # fmt: skip
    device.add_argument(*both("head_precision"), dest="head_precision", choices=HEAD_PRECISIONS, default=None,
                        help="an EAGLE-3 head's precision (default auto: its linear layers int8 on the package's "
                        "kernels when the target runs on them, else float, the target's activation dtype)")  # fmt: skip
    device.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default=None,
                        help="what a .gguf target's native step keeps its keys and values in (default fp32: tokens "
                        "equal transformers' modeling on the same weights; fp16/bf16 halve the cache's bytes, which "
                        "long contexts read every step: plain and assisted decoding still agree, but the tokens may "
                        "differ from fp32's by the cache's rounding)")  # fmt: skip
    device.add_argument("--no-prefix-cache", action="store_true",
                        help="compute every prompt in full (default: keys and values of earlier prompts' prefixes "
                        "are reused where that is exact: a .gguf target on the native step)")  # fmt: skip
    device.add_argument(
        *both("static_shapes"),
        dest="static_shapes",
        action="store_true",
        help="bucketed prompt, static KV cache, fixed draft length (what HPU graphs need)",
    )
    device.add_argument(*both("bucket_size"), dest="bucket_size", type=integer, default=None)


def add_draft_length_flags(decoding: FlagGroup) -> None:
    """The draft length γ and its schedule."""
    decoding.add_argument(
        *both("num_assistant_tokens"),
        dest="num_assistant_tokens",
        type=integer,
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


def check_model_flags(args: argparse.Namespace) -> None:
    """Reject model and drafting flags that cannot work together, with the fix in the message (`options.ranges`'
    rules: their errors name the option, the command line says its flag)."""
    for option in ("num_assistant_tokens", "bucket_size"):
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
    if args.no_assisted and request.option is not None:
        raise ValueError(f"--no-assisted conflicts with {FLAGS[request.option]}; drop one of them")
