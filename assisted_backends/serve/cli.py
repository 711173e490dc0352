"""`assisted-serve` (and `python -m assisted_backends.serve`): flags and their checks, then the server.

The model and device flags, the draft length and its schedule are the ones `run-assisted-generation` takes too
(`startup.flags`), checked the same way (`startup.flags.check_model_flags`, `startup.checks`) and opened the same
way (`startup.pair`, through `loading.open`), so `-m` takes a directory, a `.gguf` file or a Hub id, and no `-m`
serves the embedded demo pair. The server's flags: `--host` (127.0.0.1), `--port` (8000; 0 picks a free
one), `--slots`, `--max-waiting`, `--context`, `--served-model-name`, `--chat-template`, `--max-body-mb`. Nothing
here imports torch or fastapi before the flags are checked. SIGTERM (or Ctrl-C): the listening socket closes,
requests in flight finish, the engine thread ends, exit status 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import socket
import sys
from pathlib import Path

from assisted_backends.extras import install_hint
from assisted_backends.serve.protection import add_protection_flags, check_protection
from assisted_backends.serve.server import DEFAULT_CONTEXT
from assisted_backends.startup.errors import CLIError
from assisted_backends.startup.flags import (
    OneLineParser,
    add_device_flags,
    add_draft_length_flags,
    add_model_flags,
    check_model_flags,
    device_names,
    non_negative_int,
    positive_int,
)

PROG = "assisted-serve"
DEFAULT_SLOTS = 8


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port in 0-65535 (0: any free port), got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The server's flags: the models, device and draft-length flags both command lines take, then its own."""
    parser = OneLineParser(
        prog=PROG,
        description="An OpenAI-compatible server (/v1/completions, /v1/chat/completions, streaming) that batches "
        "requests continuously and speculates; with no -m it serves the embedded demo pair.",
    )
    add_model_flags(parser)
    add_device_flags(parser, device_names())
    add_draft_length_flags(parser.add_argument_group("drafting"))
    server = parser.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine "
                        "only; 0.0.0.0 for every interface)")  # fmt: skip
    server.add_argument("--port", type=_port, default=8000, help="port (default 8000; 0: any free port, printed)")
    server.add_argument("--slots", type=positive_int, default=DEFAULT_SLOTS, metavar="N",
                        help=f"requests generated together in one batch (default {DEFAULT_SLOTS})")  # fmt: skip
    server.add_argument(
        "--max-waiting",
        type=positive_int,
        default=None,
        metavar="N",
        help="requests that may wait for a slot; more are answered 429 (default 4 x --slots)",
    )
    server.add_argument("--context", type=positive_int, default=None, metavar="TOKENS",
                        help=f"prompt + completion tokens per request (default: the model's positions, at most "
                        f"{DEFAULT_CONTEXT} when its config states none)")  # fmt: skip
    server.add_argument(
        "--served-model-name",
        default=None,
        metavar="NAME",
        help="the model id clients send (default: -m's last path part, or 'demo')",
    )
    server.add_argument(
        "--chat-template",
        default=None,
        metavar="FILE",
        help="a Jinja chat template for /v1/chat/completions (default: the tokenizer's)",
    )
    server.add_argument(
        "--max-body-mb", type=positive_int, default=32, metavar="MB", help="largest request body accepted (default 32)"
    )
    server.add_argument("--prefill-chunk", type=non_negative_int, default=None, metavar="TOKENS",
                        help="a prompt that arrives while others generate is computed this many tokens per round, so "
                        "the running requests wait at most one chunk (default 256 where chunks are exact: a .gguf "
                        "target on the native step; else whole; 0: whole)")  # fmt: skip
    server.add_argument("--prefix-cache-mb", type=positive_int, default=512, metavar="MB",
                        help="prefix cache memory; least recently used blocks go first (default 512)")  # fmt: skip
    server.add_argument(
        "--log-level",
        choices=("critical", "error", "warning", "info", "debug"),
        default="warning",
        help="uvicorn's log level (info: one line per request)",
    )
    add_protection_flags(parser)
    return parser


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The server's flags, with the checks argparse cannot make."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.static_shapes:
        parser.error("--static-shapes: the server's batch grows and shrinks with its requests; drop it")
    if args.chat_template is not None and not Path(args.chat_template).is_file():
        parser.error(f"--chat-template {args.chat_template}: no such file; give a Jinja template file")
    args.max_waiting = args.max_waiting or 4 * args.slots
    check_protection(parser, args)
    return args


def model_name(args: argparse.Namespace) -> str:
    if args.served_model_name:
        return args.served_model_name
    if args.model is None:
        return "demo"
    return Path(args.model.rstrip("/")).name or args.model


def listen(host: str, port: int) -> socket.socket:
    """A bound, listening socket (port 0: the system picks)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise ValueError(f"--host {host} --port {port}: cannot listen there ({error.strerror}); choose another "
                         "port (0: any free one)") from None  # fmt: skip
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def check(args: argparse.Namespace) -> None:
    """What can be checked before anything loads: the model flags together, the models' files, the device, the
    server's packages."""
    from assisted_backends.options import ranges
    from assisted_backends.startup.checks import check_drafting_files, read_models

    check_model_flags(args)
    target = read_models(args)
    if target is not None:
        ranges.check_early_exit(args.assistant_early_exit, target.layers)
    check_drafting_files(args, target)
    for module in ("fastapi", "uvicorn", "prometheus_client"):
        if importlib.util.find_spec(module) is None:
            raise CLIError(f"{PROG} needs {module}: {install_hint('serve')}")


def main(argv: list[str] | None = None) -> int:
    from assisted_backends.loading.files import MissingGGUFError
    from assisted_backends.options.errors import OptionError
    from assisted_backends.startup.environment import quiet_libraries
    from assisted_backends.startup.flags import cli_spelling

    args = parse_args(argv)
    try:
        check(args)
        sock = listen(args.host, args.port)
        quiet_libraries(args)
        from assisted_backends.serve.server import run

        return run(args, sock, model_name(args))
    except KeyboardInterrupt:
        print("interrupted (Ctrl-C)", file=sys.stderr)
        return 130
    except (CLIError, ValueError, NotImplementedError, RuntimeError, MissingGGUFError, OSError) as error:
        print(f"error: {error.render(cli_spelling) if isinstance(error, OptionError) else error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
