"""`run-assisted-generation`: generate text or benchmark assisted vs plain decoding.

Order of work: parse and check every flag, input file and output path (no torch import, so `--help`
and mistakes answer at once), then import torch and load the models, then run. Ctrl-C stops with one
line and exit status 130, after the text generated so far (a benchmark: the rows it finished).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from assisted_backends.cli.args import build_parser, validate
from assisted_backends.cli.preflight import preflight
from assisted_backends.loading.files import MissingGGUFError
from assisted_backends.options.errors import OptionError
from assisted_backends.startup.environment import quiet_libraries
from assisted_backends.startup.errors import CLIError
from assisted_backends.startup.flags import cli_spelling, device_names

INTERRUPTED = 130


def _read_prompt(args: argparse.Namespace, session) -> str:
    if args.prompt_text is not None:
        text = args.prompt_text
    elif args.prompt is not None:
        text = args.prompt
    else:
        text = (
            session.demo_prompt() if session.held_out_text is not None else "Speculative decoding makes language models"
        )
    if not text.strip():
        raise CLIError("the prompt is empty; pass some text with --prompt or --prompt-file")
    return text


def _print_runtime(session, log) -> dict:
    """The notices, then the backend report: one summary line, or every field with -v."""
    runtime = session.runtime()
    for notice in session.notices:
        print(notice, file=log)
    if getattr(session.args, "verbose", False):
        for key, value in runtime.items():
            print(f"{key}: {value}", file=log)
        return runtime
    print(session.summary(), file=log)
    if "thread_warning" in runtime:
        print(f"warning: {runtime['thread_warning']}", file=log)
    return runtime


def _generate_task(session, log) -> None:
    from assisted_backends.cli import prompting
    from assisted_backends.demo.pair import DEMO_REPETITION_PENALTY

    args = session.args
    text = _read_prompt(args, session)
    if session.held_out_text is not None and args.repetition_penalty is None:
        args.repetition_penalty = DEMO_REPETITION_PENALTY
        print(f"note: demo pair: --repetition-penalty {DEMO_REPETITION_PENALTY} (pass 1.0 for plain greedy)", file=log)
    if session.held_out_text is not None and args.prompt_text is None and args.prompt is None:
        from assisted_backends.cli.session import DEMO_EXPLAINED

        print(DEMO_EXPLAINED, file=log)
    if args.batch_size > 1:
        texts = prompting.batch_prompts(text, args.prompt_text is not None, args.batch_size)
        _generate_batches(session, texts, log)
        return
    input_ids, shown = prompting.encode(session.tokenizer, text, args)
    streaming = prompting.wants_stream(args)
    streamer = prompting.streamer(session.tokenizer) if streaming else prompting.Collector()
    if streaming:
        print(shown, end="", flush=True)
    try:
        result = session.generate(input_ids, args.max_new_tokens, assisted=session.assisted, streamer=streamer)
    except KeyboardInterrupt:
        if not streaming:  # streamed text is on the screen already
            so_far = session.tokenizer.decode(streamer.tokens, skip_special_tokens=True)
            print(shown + so_far, flush=True)
            print(f"interrupted after {len(streamer.tokens)} generated token(s), printed above", file=log)
        raise
    new_ids = result.sequences[0, input_ids.shape[1] :]
    completion = session.tokenizer.decode(new_ids, skip_special_tokens=True)
    if not streaming:  # streamed text already ends with the completion and a newline
        print(shown + completion)
    _report_generation(session, [completion], [new_ids.tolist()], [result.stats], log)


def _generate_batches(session, texts: list[str], log) -> None:
    """--batch-size N: the prompts through N batch slots, each refilled as its row ends (`api.queue`); every
    completion printed under its prompt's number."""
    from assisted_backends.cli import prompting

    prompts, shown = prompting.encode_each(session.tokenizer, texts, session.args)
    finished: dict = {}  # prompt index -> its new tokens, as each row ends
    try:
        result = prompting.generate_queue(
            session, prompts, session.args.batch_size, on_finish=lambda row, ids: finished.__setitem__(row, ids)
        )
    except KeyboardInterrupt:  # the prompts that had finished, then the count of those that had not
        for row in sorted(finished):
            text = session.tokenizer.decode(finished[row], skip_special_tokens=True)
            print(f"--- prompt {row + 1} of {len(texts)}\n{shown[row]}{text}", flush=True)
        print(f"interrupted: {len(finished)} of {len(texts)} prompt(s) had finished, printed above", file=log)
        raise
    completions, token_ids = [], []
    for row, new_ids in enumerate(result.tokens):
        completions.append(session.tokenizer.decode(new_ids, skip_special_tokens=True))
        token_ids.append(new_ids.tolist())
        print(f"--- prompt {row + 1} of {len(texts)}\n{shown[row]}{completions[-1]}")
    _report_generation(session, completions, token_ids, [result.stats], log)


def _report_generation(session, completions: list[str], token_ids: list[list[int]], stats: list, log) -> None:
    """The statistics (one block per generate call) on stderr, and --json."""
    from assisted_backends.cli.report import describe_stats

    for call in stats:
        print("\n" + describe_stats(call), file=log)
    if session.args.json:
        single = len(completions) == 1
        record = {
            "text": completions[0] if single else completions,
            "generated_token_ids": token_ids[0] if single else token_ids,
            "stats": stats[0].to_dict() if len(stats) == 1 else [call.to_dict() for call in stats],
            "runtime": session.runtime(),
        }
        with open(session.args.json, "w", encoding="utf-8") as handle:
            json.dump(record, handle, indent=2)


def _write_benchmark(session, rows: list[dict], log) -> None:
    from assisted_backends.cli import benchmark

    args = session.args
    print(benchmark.format_table(rows, assisted=session.assisted, compare=args.compare))
    print(benchmark.legend(assisted=session.assisted, compare=args.compare), file=log)
    settings = {k: v for k, v in vars(args).items() if k not in ("json", "csv", "plot", "prompt_text")}
    if args.json:
        benchmark.write_json(args.json, rows, session.runtime(), settings)
    if args.csv:
        benchmark.write_csv(args.csv, rows)
    if args.plot and rows:
        benchmark.write_plot(args.plot, rows)


def _benchmark_task(session, log) -> None:
    from assisted_backends.cli import benchmark

    rows: list[dict] = []
    try:
        sample = benchmark.run_benchmark(session, rows)
    except KeyboardInterrupt:
        print(f"interrupted: {len(rows)} finished case(s) follow", file=log)
        _write_benchmark(session, rows, log)
        raise
    print(f"sample continuation: {sample[:400]!r}", file=log)
    _write_benchmark(session, rows, log)


def _run(args: argparse.Namespace) -> None:
    from assisted_backends.cli.session import open_session
    from assisted_backends.distributed import launch as distributed

    session = open_session(args)
    streams = sys.stdout, sys.stderr  # restored below, so that every rank's own error is printed
    if not distributed.is_main_process():  # under deepspeed/torchrun every rank runs the loop; only rank 0 speaks
        sys.stdout = sys.stderr = open(os.devnull, "w")
        args.csv = args.plot = None
    args.json = distributed.per_rank_path(args.json)  # "out.{rank}.json": one file per rank; else rank 0's only
    log = sys.stderr
    try:
        _print_runtime(session, log)
        (_benchmark_task if args.task == "benchmark" else _generate_task)(session, log)
    finally:
        sys.stdout, sys.stderr = streams


def _shutdown(wait_for_peers: bool) -> None:
    if "torch" in sys.modules:  # nothing to shut down when we stopped before loading anything
        from assisted_backends.distributed import launch as distributed

        distributed.shutdown(wait_for_peers=wait_for_peers)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(device_names())
    args = parser.parse_args(argv)
    try:
        validate(args)
        preflight(args)
        quiet_libraries(args)
        _run(args)
    except KeyboardInterrupt:
        print("interrupted (Ctrl-C)", file=sys.stderr)
        _shutdown(wait_for_peers=False)
        return INTERRUPTED
    except (CLIError, ValueError, NotImplementedError, RuntimeError, MissingGGUFError) as error:
        print(f"error: {error.render(cli_spelling) if isinstance(error, OptionError) else error}", file=sys.stderr)
        _shutdown(wait_for_peers=False)
        return 2
    _shutdown(wait_for_peers=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
