#!/usr/bin/env python
"""Assisted generation from the command line; the same program as the `run-assisted-generation` script.

    python examples/run_assisted_generation.py                       # the embedded demo pair
    python examples/run_assisted_generation.py --task benchmark --compare --quick
    python examples/run_assisted_generation.py -m TARGET_DIR --assistant-model DRAFT_DIR --prompt "def fib(n):"

See `--help` and the README for every flag.
"""

import sys

from assisted_backends.cli import main

if __name__ == "__main__":
    sys.exit(main())
