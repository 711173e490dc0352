"""The server's flags for who may call it and what a client may hold (`security`, `limits`), and their checks.

`--api-key KEY` (repeatable) and `--api-key-file FILE` (one key a line): requests need `Authorization: Bearer KEY`;
`--cors-origins ORIGIN ...`: the web pages that may call it (none by default); `--max-connections`,
`--body-timeout`, `--send-timeout`, `--shutdown-timeout`: the bounds of `limits.Limits`.
"""

from __future__ import annotations

import argparse

from assisted_backends.serve.limits import Limits
from assisted_backends.startup.flags import positive_int

EXTRA_CONNECTIONS = 32  # beyond the requests that may run or wait: health checks, metrics, refusals


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text}")
    return value


def _origin(text: str) -> str:
    if text != "*" and ("://" not in text or text.endswith("/")):
        raise argparse.ArgumentTypeError(f"expected an origin such as https://app.example.com (no path), got {text!r}")
    return text


def add_protection_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of the "access and limits" group."""
    group = parser.add_argument_group("access and limits")
    group.add_argument("--api-key", action="append", default=None, metavar="KEY",
                       help="a key clients must send as 'Authorization: Bearer KEY' (repeatable; /health stays open); "
                       "each key has its own suffix-decoding index")  # fmt: skip
    group.add_argument("--api-key-file", action="append", default=None, metavar="FILE",
                       help="a file of keys, one a line ('#' comments), as --api-key (repeatable)")  # fmt: skip
    group.add_argument("--cors-origins", nargs="+", action="extend", type=_origin, default=None, metavar="ORIGIN",
                       help="web origins (https://host[:port]) whose pages may call the server (default: "
                       "none)")  # fmt: skip
    group.add_argument("--max-connections", type=positive_int, default=None, metavar="N",
                       help=f"open connections at once; past it a request gets 503 (default --slots + --max-waiting "
                       f"+ {EXTRA_CONNECTIONS})")  # fmt: skip
    group.add_argument("--body-timeout", type=_seconds, default=Limits.body_timeout_s, metavar="S",
                       help="seconds a client may take to send its body; 408 after (default "
                       f"{Limits.body_timeout_s:g})")  # fmt: skip
    group.add_argument("--send-timeout", type=_seconds, default=Limits.send_timeout_s, metavar="S",
                       help="seconds a stream may wait for its client to read; then it ends and its request is "
                       f"cancelled (default {Limits.send_timeout_s:g})")  # fmt: skip
    group.add_argument("--shutdown-timeout", type=_seconds, default=Limits.shutdown_timeout_s, metavar="S",
                       help="seconds requests in flight may take to finish after SIGTERM; then they are cancelled "
                       f"(default {Limits.shutdown_timeout_s:g})")  # fmt: skip


def check_protection(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Read the key files (`args.api_keys`: every key) and set the connection cap's default; a bad file stops
    with one line naming its flag."""
    from assisted_backends.serve.security import read_keys

    try:
        args.api_keys = read_keys(args.api_key, args.api_key_file)
    except ValueError as error:
        parser.error(str(error))
    args.max_connections = args.max_connections or args.slots + args.max_waiting + EXTRA_CONNECTIONS


def limits_of(args: argparse.Namespace) -> Limits:
    """The `Limits` the flags set."""
    return Limits(max_body_bytes=args.max_body_mb * 1024 * 1024, max_connections=args.max_connections,
                  body_timeout_s=args.body_timeout, send_timeout_s=args.send_timeout,
                  shutdown_timeout_s=args.shutdown_timeout)  # fmt: skip
