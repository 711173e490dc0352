"""`run-assisted-generation`: generate text or benchmark assisted vs plain decoding."""

from __future__ import annotations

import argparse
import json
import os
import sys

from assisted_backends import distributed
from assisted_backends.backends.registry import DeviceUnavailableError, discover
from assisted_backends.cli import benchmark, prompting
from assisted_backends.cli.args import build_parser, validate
from assisted_backends.cli.loading import CLIError
from assisted_backends.cli.session import Session, open_session
from assisted_backends.demo.pair import DEMO_REPETITION_PENALTY

DEMO_PROMPT = "import os\nimport sys\n\n\ndef main(argv=None):\n"


def _read_prompt(args: argparse.Namespace, session: Session) -> str:
    if args.prompt_file is not None:
        try:
            text = open(args.prompt_file, encoding="utf-8").read()
        except OSError as error:
            raise CLIError(f"--prompt-file {args.prompt_file}: {error.strerror}") from None
    elif args.prompt is not None:
        text = args.prompt
    else:
        text = DEMO_PROMPT if session.held_out_text is not None else "Speculative decoding makes language models"
    if not text.strip():
        raise CLIError("the prompt is empty; pass some text with --prompt or --prompt-file")
    return text


def _print_runtime(session: Session, log) -> dict:
    runtime = session.backend.describe()
    for notice in session.notices:
        print(notice, file=log)
    for key, value in runtime.items():
        print(f"{key}: {value}", file=log)
    return runtime


def _generate_task(session: Session, log) -> None:
    args = session.args
    text = _read_prompt(args, session)
    input_ids, shown = prompting.encode(session.tokenizer, text, args)
    if session.held_out_text is not None and args.repetition_penalty is None:
        args.repetition_penalty = DEMO_REPETITION_PENALTY
        print(f"note: demo pair: --repetition-penalty {DEMO_REPETITION_PENALTY} (pass 1.0 for plain greedy)", file=log)
    streamer = prompting.streamer(session.tokenizer) if prompting.wants_stream(args) else None
    if streamer is not None:
        print(shown, end="", flush=True)
    result = session.generate(input_ids, args.max_new_tokens, assisted=session.assisted, streamer=streamer)
    new_ids = result.sequences[0, input_ids.shape[1] :]
    completion = session.tokenizer.decode(new_ids, skip_special_tokens=True)
    stats = result.stats
    if streamer is None:  # streamed text already ends with the completion and a newline
        print(shown + completion)
    rate = "-" if stats.acceptance_rate is None else f"{stats.acceptance_rate:.2f}"
    length = "-" if stats.mean_accepted_length is None else f"{stats.mean_accepted_length:.2f}"
    print(
        f"\n[{stats.new_tokens} new tokens in {stats.total_s:.2f} s: prefill {1000 * stats.prefill_s:.1f} ms, "
        f"{1000 * stats.decode_s / max(1, stats.new_tokens - 1):.2f} ms/token after it; "
        f"acceptance rate {rate}, mean accepted length {length}]",
        file=log,
    )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(
                {
                    "text": completion,
                    "generated_token_ids": new_ids.tolist(),
                    "stats": stats.to_dict(),
                    "runtime": session.backend.describe(),
                },
                handle,
                indent=2,
            )


def _benchmark_task(session: Session, log) -> None:
    args = session.args
    rows, sample = benchmark.run_benchmark(session)
    print(f"sample continuation: {sample[:400]!r}", file=log)
    print(benchmark.format_table(rows, assisted=session.assisted, compare=args.compare))
    settings = {k: v for k, v in vars(args).items() if k not in ("json", "csv", "plot")}
    if args.json:
        benchmark.write_json(args.json, rows, session.backend.describe(), settings)
    if args.csv:
        benchmark.write_csv(args.csv, rows)
    if args.plot:
        benchmark.write_plot(args.plot, rows)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(["auto", *sorted(discover())])
    args = parser.parse_args(argv)
    try:
        validate(args)
        session = open_session(args)
        if not distributed.is_main_process():  # under deepspeed/torchrun every rank runs the loop; only rank 0 speaks
            sys.stdout = sys.stderr = open(os.devnull, "w")
            args.json = args.csv = args.plot = None
        log = sys.stderr
        _print_runtime(session, log)
        (_benchmark_task if args.task == "benchmark" else _generate_task)(session, log)
    except (CLIError, ValueError, NotImplementedError, DeviceUnavailableError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        distributed.shutdown(wait_for_peers=False)
        return 2
    distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
