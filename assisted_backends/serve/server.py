"""Loading and running: the CLI's session (models, tokenizer, backend, threads), the engine, uvicorn.

`run` opens the session as `run-assisted-generation` does, builds an `AssistedGenerator` on its models (read
once), starts the engine thread and serves the app on the socket `cli.listen` bound. uvicorn owns SIGTERM and
SIGINT: it stops accepting connections, lets requests in flight finish, then the app's lifespan ends the engine.
"""

from __future__ import annotations

import argparse
import signal
import socket
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path


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
    from assisted_backends.serve.cli import DEFAULT_CONTEXT

    limit = facts.max_positions
    if args.context is None:
        return limit if limit is not None else DEFAULT_CONTEXT
    if limit is not None and args.context > limit:
        raise ValueError(f"--context {args.context}: the model has {limit} positions; give at most {limit}")
    return args.context


def build_state(args: argparse.Namespace, name: str):
    """(the app's state, a one-line description): the session loaded, the generator, the engine (not started)."""
    from assisted_backends.api.generation import AssistedGenerator
    from assisted_backends.cli.session import open_session
    from assisted_backends.serve.app import ServerState
    from assisted_backends.serve.engine import Engine
    from assisted_backends.serve.metrics import Metrics
    from assisted_backends.serve.prompts import PromptMaker

    session = open_session(args)
    drafting = session.drafting_arguments() if session.assisted else {}
    models = {key: drafting.pop(key, None) for key in ("assistant_model", "tokenizer", "assistant_tokenizer")}
    generator = AssistedGenerator(
        session.target,
        models["assistant_model"],
        tokenizer=models["tokenizer"],
        assistant_tokenizer=models["assistant_tokenizer"],
        backend=session.backend,
    )
    context = context_of(args, generator.facts)
    arguments = {key: value for key, value in drafting.items() if value is not None}
    arguments.update(pad_token_id=session.pad_id(), repetition_penalty=1.0)
    if args.num_assistant_tokens is not None:
        arguments["num_assistant_tokens"] = args.num_assistant_tokens
    if args.schedule is not None:
        arguments["schedule"] = args.schedule
    metrics = Metrics(args.slots)
    threads = session.threads.threads if session.threads is not None else None
    engine = Engine(generator, args.slots, args.max_waiting, context, arguments, metrics, threads)
    template = Path(args.chat_template).read_text(encoding="utf-8") if args.chat_template else None
    vocab = generator.model.get_input_embeddings().num_embeddings
    prompts = PromptMaker.of(session.tokenizer, template, context, vocab)
    state = ServerState(engine, prompts, name, eos_ids(session.target, session.tokenizer), metrics,
                        args.max_body_mb * 1024 * 1024, int(time.time()))  # fmt: skip
    for notice in session.notices:
        print(notice, file=sys.stderr)
    drafter = "none (--no-assisted)" if not session.assisted else (
        ", ".join(f"{k}={v}" for k, v in arguments.items() if k in ("prompt_lookup_num_tokens", "assistant_early_exit"))
        or ("a draft model" if models["assistant_model"] is not None else "the model's own"))  # fmt: skip
    line = (f"{session.summary()}; {args.slots} slots, {args.max_waiting} may wait, context {context} tokens, "
            f"drafting: {drafter}")  # fmt: skip
    return state, line


def run(args: argparse.Namespace, sock: socket.socket, name: str) -> int:
    """Serve until SIGTERM / SIGINT; 0 once every request in flight has finished."""
    import uvicorn

    from assisted_backends.serve.app import build_app

    state, line = build_state(args, name)

    @asynccontextmanager
    async def lifespan(app):
        state.engine.start()
        try:
            yield
        finally:
            state.engine.stop()

    app = build_app(state)
    app.router.lifespan_context = lifespan
    config = uvicorn.Config(
        app, log_level=args.log_level, lifespan="on", access_log=args.log_level in ("info", "debug")
    )
    server = uvicorn.Server(config)
    state.server = server
    host, port = sock.getsockname()[:2]
    print(line, file=sys.stderr)
    print(f"{name} served at http://{host}:{port}/v1 (OpenAI API; GET /health, /metrics)", file=sys.stderr, flush=True)
    # uvicorn raises the signal it caught again once it has drained, to the handler found when it started: this
    # one, so that a SIGTERM that drained cleanly ends the process with status 0
    signal.signal(signal.SIGTERM, lambda number, frame: None)
    server.run(sockets=[sock])
    print("stopped: every request in flight finished", file=sys.stderr, flush=True)
    return 0
