"""`assisted-serve` (and `python -m assisted_backends.serve`): flags, loading, and the uvicorn server.

The model and device flags are `run-assisted-generation`'s own (its parser's "models" and "device and
precision" groups, and the draft length and schedule), checked by its `validate` and `preflight` and loaded
by its `open_session`, so `-m` takes a directory, a `.gguf` file or a Hub id, and no `-m` serves the embedded
demo pair. The server's flags: `--host` (127.0.0.1), `--port` (8000; 0 picks a free one), `--slots`,
`--max-waiting`, `--context`, `--served-model-name`, `--chat-template`, `--max-body-mb`. Nothing here imports
torch or fastapi before the flags are checked. SIGTERM (or Ctrl-C): the listening socket closes, requests in
flight finish, the engine thread ends, exit status 0.
"""

from __future__ import annotations

import argparse
import socket
import sys
from pathlib import Path

PROG = "assisted-serve"
COPIED_GROUPS = ("models", "device and precision")
COPIED_DECODING = ("num_assistant_tokens", "schedule")
DEFAULT_SLOTS = 8
DEFAULT_CONTEXT = 2048


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port in 0-65535 (0: any free port), got {value}")
    return value


def build_parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """(the server's parser, the generate CLI's parser it copies its model, device and drafting flags from)."""
    from assisted_backends.cli.args import OneLineParser
    from assisted_backends.cli.args import build_parser as cli_parser
    from assisted_backends.cli.main import device_names

    source = cli_parser(device_names())
    parser = OneLineParser(
        prog=PROG,
        description="An OpenAI-compatible server (/v1/completions, /v1/chat/completions, streaming) that batches "
        "requests continuously and speculates; with no -m it serves the embedded demo pair.",
    )
    for group in source._action_groups:
        if group.title in COPIED_GROUPS:
            copy = parser.add_argument_group(group.title)
            for action in group._group_actions:
                copy._add_action(action)
    drafting = parser.add_argument_group("drafting")
    for action in source._actions:
        if action.dest in COPIED_DECODING:
            drafting._add_action(action)
    server = parser.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine "
                        "only; 0.0.0.0 for every interface)")  # fmt: skip
    server.add_argument("--port", type=_port, default=8000, help="port (default 8000; 0: any free port, printed)")
    server.add_argument("--slots", type=_positive, default=DEFAULT_SLOTS, metavar="N",
                        help=f"requests generated together in one batch (default {DEFAULT_SLOTS})")  # fmt: skip
    server.add_argument(
        "--max-waiting",
        type=_positive,
        default=None,
        metavar="N",
        help="requests that may wait for a slot; more are answered 429 (default 4 x --slots)",
    )
    server.add_argument("--context", type=_positive, default=None, metavar="TOKENS",
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
        "--max-body-mb", type=_positive, default=32, metavar="MB", help="largest request body accepted (default 32)"
    )
    server.add_argument(
        "--log-level",
        choices=("critical", "error", "warning", "info", "debug"),
        default="warning",
        help="uvicorn's log level (info: one line per request)",
    )
    return parser, source


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The server's flags over the generate CLI's defaults (so its checks and loading read every attribute)."""
    parser, source = build_parser()
    args = parser.parse_args(argv)
    for name, value in vars(source.parse_args([])).items():
        if not hasattr(args, name):
            setattr(args, name, value)
    if args.static_shapes:
        parser.error("--static-shapes: the server's batch grows and shrinks with its requests; drop it")
    if args.chat_template is not None and not Path(args.chat_template).is_file():
        parser.error(f"--chat-template {args.chat_template}: no such file; give a Jinja template file")
    args.max_waiting = args.max_waiting or 4 * args.slots
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


def main(argv: list[str] | None = None) -> int:
    from assisted_backends.cli.args import cli_spelling, validate
    from assisted_backends.cli.errors import CLIError
    from assisted_backends.cli.main import _quiet_libraries
    from assisted_backends.cli.preflight import preflight
    from assisted_backends.extras import install_hint
    from assisted_backends.loading.files import MissingGGUFError
    from assisted_backends.options.errors import OptionError

    args = parse_args(argv)
    try:
        validate(args)
        preflight(args)
        for module in ("fastapi", "uvicorn", "prometheus_client"):
            if __import__("importlib").util.find_spec(module) is None:
                raise CLIError(f"{PROG} needs {module}: {install_hint('serve')}")
        sock = listen(args.host, args.port)
        _quiet_libraries(args)
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
