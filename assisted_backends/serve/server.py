"""Loading and running: the models the flags name (`startup.pair`: opened through `loading.open`, on a backend,
with the thread count chosen), the engine, uvicorn.

`run` opens the pair as `run-assisted-generation` does, builds an `AssistedGenerator` on its models (read once),
starts the engine thread and serves the app on the socket `cli.listen` bound. uvicorn owns SIGTERM and
SIGINT: it stops accepting connections, lets requests in flight finish, then the app's lifespan ends the engine.
"""

from __future__ import annotations

import argparse
import socket
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_CONTEXT = 2048  # tokens per request when the model's config states no positions


def eos_ids(model, tokenizer) -> frozenset[int]:
    """The tokens that end a completion: the model's generation config's EOS ids and the tokenizer's."""
    config = getattr(model, "generation_config", None)
    found = getattr(config, "eos_token_id", None)
    ids = set(found if isinstance(found, (list, tuple)) else [] if found is None else [found])
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(int(i) for i in ids)


def context_of(args: argparse.Namespace, facts) -> int:
    """--context, else the model's positions (a default when its config states none); never past the positions."""
    limit = facts.max_positions
    if args.context is None:
        return limit if limit is not None else DEFAULT_CONTEXT
    if limit is not None and args.context > limit:
        raise ValueError(f"--context {args.context}: the model has {limit} positions; give at most {limit}")
    return args.context


def drafter_of(assisted: bool, arguments: dict, assistant_model) -> str:
    """The drafter the engine runs, for the startup line."""
    if not assisted:
        return "none (--no-assisted)"
    named = [f"{key}={arguments[key]}" for key in ("prompt_lookup_num_tokens", "assistant_early_exit")
             if key in arguments]  # fmt: skip
    if named:
        return ", ".join(named)
    if assistant_model is not None:
        from assisted_backends.drafters.eagle.build import is_eagle_head

        return "an EAGLE-3 head" if is_eagle_head(assistant_model) else "a draft model"
    if arguments.get("suffix_cache") is not None:
        return "suffix decoding (an index of earlier requests)"
    return "the model's own"


def prefix_cache_of(args: argparse.Namespace, target) -> Any:
    """The server's prefix cache (`--prefix-cache-mb`): on where reuse is exact (`api.prefix`), off with
    `--no-prefix-cache` (False) or elsewhere (None: the default, off there)."""
    from assisted_backends.api.prefix import exact_reuse
    from assisted_backends.engine.prefix_cache import PrefixCache

    if args.no_prefix_cache:
        return False
    return PrefixCache(max_bytes=args.prefix_cache_mb << 20) if exact_reuse(target) else None


def build_state(args: argparse.Namespace, name: str):
    """(the app's state, a one-line description): the pair opened, the generator, the engine (not started)."""
    from assisted_backends.api.generation import AssistedGenerator
    from assisted_backends.serve.app import ServerState
    from assisted_backends.serve.engine import Engine
    from assisted_backends.serve.metrics import Metrics
    from assisted_backends.serve.prompts import PromptMaker
    from assisted_backends.serve.protection import limits_of
    from assisted_backends.serve.security import Keys
    from assisted_backends.startup.pair import open_pair

    pair = open_pair(args)
    drafting = pair.drafting_arguments() if pair.assisted else {}
    models = {key: drafting.pop(key, None) for key in ("assistant_model", "tokenizer", "assistant_tokenizer")}
    generator = AssistedGenerator(
        pair.target,
        models["assistant_model"],
        tokenizer=models["tokenizer"],
        assistant_tokenizer=models["assistant_tokenizer"],
        backend=pair.backend,
        prefix_cache=prefix_cache_of(args, pair.target),
    )
    context = context_of(args, generator.facts)
    arguments = {key: value for key, value in drafting.items() if value is not None}
    arguments.update(pad_token_id=pair.pad_id(), repetition_penalty=1.0)
    if args.num_assistant_tokens is not None:
        arguments["num_assistant_tokens"] = args.num_assistant_tokens
    if args.schedule is not None:
        arguments["schedule"] = args.schedule
    if args.prefill_chunk is not None:
        arguments["prefill_chunk"] = args.prefill_chunk
    metrics = Metrics(args.slots)
    threads = pair.threads.threads if pair.threads is not None else None
    engine = Engine(generator, args.slots, args.max_waiting, context, arguments, metrics, threads,
                    isolated=bool(args.api_keys))  # fmt: skip
    template = Path(args.chat_template).read_text(encoding="utf-8") if args.chat_template else None
    vocab = generator.model.get_input_embeddings().num_embeddings
    prompts = PromptMaker.of(pair.tokenizer, template, context, vocab)
    state = ServerState(engine, prompts, name, eos_ids(pair.target, pair.tokenizer), metrics, limits_of(args),
                        int(time.time()), Keys.of(args.api_keys) if args.api_keys else None,
                        tuple(args.cors_origins or ()))  # fmt: skip
    for notice in pair.notices:
        print(notice, file=sys.stderr)
    drafter = drafter_of(pair.assisted, arguments, models["assistant_model"])
    line = (f"{pair.summary()}; {args.slots} slots, {args.max_waiting} may wait, context {context} tokens, "
            f"drafting: {drafter}")  # fmt: skip
    return state, line


def run(args: argparse.Namespace, sock: socket.socket, name: str) -> int:
    """Serve until SIGTERM / SIGINT (0 once every request in flight has finished) or an engine fault (nonzero):
    `runner.serve`."""
    from assisted_backends.serve.runner import serve

    state, line = build_state(args, name)
    host, port = sock.getsockname()[:2]
    return serve(state, sock, args.log_level,
                 [line, f"{name} served at http://{host}:{port}/v1 (OpenAI API; GET /health, /metrics)"])  # fmt: skip
