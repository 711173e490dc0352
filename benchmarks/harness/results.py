"""Result files: `benchmarks/results/<name>.json` holding the command, the UTC date, the machine, then the payload."""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
import sysconfig
import time
from pathlib import Path

import torch

from assisted_backends.backends.cpu import affinity, cpu_features

RESULTS = Path(__file__).resolve().parents[1] / "results"


def command_line(script: str, python: str = "python") -> str:
    """How this run was started, as `python -m benchmarks.<script> <arguments>` (for the result file)."""
    return f"{python} -m benchmarks.{script}" + "".join(f" {shlex.quote(a)}" for a in sys.argv[1:])


def machine() -> dict[str, str]:
    """The CPU (model and flags summary), versions, thread placement, the 1-minute load average, and the GPU if any."""
    import transformers

    info = {
        "cpu": cpu_features.detect().summary(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "platform": sysconfig.get_platform(),
        "load_average_1m": f"{os.getloadavg()[0]:.2f}",
    }
    info.update(affinity.placement().as_dict())
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
        info["torch_cuda"] = str(torch.version.cuda)
    return info


def write_result(name: str, command: str, payload: dict, path: Path | None = None) -> Path:
    """Write `benchmarks/results/<name>.json` (or `path`): the command, the date, the machine, then `payload`."""
    path = Path(path) if path else RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {"command": command, "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    document["machine"] = machine()
    document.update(payload)
    path.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {path}")
    return path
