"""Train a demo pair and save it: `python -m assisted_backends.demo --out DIR [--budget default|smoke]`.

This is how the shipped weights under `assisted_backends/demo/weights/` were made (default budget,
saved in bf16): same torch build, same Python standard library and 2 threads give the same weights.
"""

import argparse
import time
from pathlib import Path

import torch

from assisted_backends.demo.pair import SMOKE_BUDGET, DemoBudget, _prepare

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--out", required=True, type=Path)
parser.add_argument("--budget", choices=("default", "smoke"), default="default")
parser.add_argument("--save-dtype", choices=("fp32", "bf16"), default="bf16")
args = parser.parse_args()
budget = DemoBudget() if args.budget == "default" else SMOKE_BUDGET
started = time.perf_counter()
_prepare(args.out, budget, progress=True, save_dtype=torch.bfloat16 if args.save_dtype == "bf16" else torch.float32)
print(f"trained and saved to {args.out} in {time.perf_counter() - started:.0f} s")
