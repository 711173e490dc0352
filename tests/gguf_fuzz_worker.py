"""The GGUF fuzzer's worker process and its driver (tests/loading/test_gguf_fuzz.py).

The worker (`python tests/gguf_fuzz_worker.py`) imports torch and the package once, then answers one JSON line per
case read from stdin: it opens the file with `assisted_backends.AssistedGenerator(path)`, and where that loads,
decodes one repetitive prompt greedily twice, plain and with prompt lookup (constant schedule, one-token matches:
drafts every round), then reads the file's tokenizer as the command line does (`loading.models.load_tokenizer`)
and decodes the tokens; it says what happened: the exception's type, whether it is a ValueError / RuntimeError,
its message, the traceback's last lines; or both token lists. Before its first answer it opens a well-formed file
(the kernels and the native decoder are built or loaded then, without a case's time limit) and prints `ready`.
It writes its answers on a duplicate of the original stdout and sends everything else (the package's lines, C++
prints, AddressSanitizer's reports) to stderr, which the driver keeps in a file.

`Worker` (the driver) sends one case at a time, reads the answer with a time limit, and when the process dies (a
signal, AddressSanitizer's exit) or the limit passes (a hang: the process is killed), reports that case as
`crashed` / `hung` with the end of the worker's stderr, then starts a fresh worker for the next case.
Repacked weights go to a cache of the worker's own (deleted after every case); the built libraries are linked from
the package's cache, so nothing is built twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROMPT = [65, 66, 67, 68, 69, 65, 66, 67, 68, 69, 65, 66, 67]  # repeats: prompt lookup finds drafts in it
NEW_TOKENS = 8
CASE_TIMEOUT_S = float(os.environ.get("ASSISTED_BACKENDS_FUZZ_CASE_TIMEOUT", "60"))
START_TIMEOUT_S = 1800.0  # the first start may build the kernels and the decoder (minutes, more under ASan)
#: case paths that make the worker die of SIGABRT (as glibc's "malloc(): invalid size" does; AddressSanitizer leaves
#: it alone, unlike SIGSEGV) or hang: tests/loading/test_gguf_fuzz.py checks the driver with them
SELF_TEST = {
    "<signal>": lambda: os.kill(os.getpid(), 6),
    "<hang>": lambda: time.sleep(3600),
}
MEMORY_LIMIT = 12 << 30  # address space of a worker outside AddressSanitizer: a mutated size cannot eat the machine


@dataclass
class Answer:
    """What one case did: `outcome` is "error", "loaded", "crashed" or "hung"."""

    outcome: str
    error_type: str = ""
    clean_type: bool = False  # a ValueError or RuntimeError (the package's model-file errors are ValueErrors)
    message: str = ""
    tail: str = ""  # the traceback's last lines, or the worker's last stderr lines after a crash or hang
    plain: list[int] = field(default_factory=list)
    assisted: list[int] = field(default_factory=list)
    drafted: int = 0


def _open_and_decode(path: str) -> dict:
    import torch

    import assisted_backends
    from assisted_backends.loading.models import load_tokenizer

    generator = assisted_backends.AssistedGenerator(path)
    ids = torch.tensor([PROMPT])
    plain = generator.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)
    assisted = generator.generate(
        ids, max_new_tokens=NEW_TOKENS, do_sample=False, prompt_lookup_num_tokens=3, schedule="constant"
    )
    tokenizer = load_tokenizer(path, "model")  # the command line's route to the file's tokenizer
    tokenizer.decode(plain.sequences[0].tolist())
    return {
        "outcome": "loaded",
        "plain": plain.sequences[0, len(PROMPT) :].tolist(),
        "assisted": assisted.sequences[0, len(PROMPT) :].tolist(),
        "drafted": int(assisted.stats.drafted),
    }


def _run_case(path: str) -> dict:
    if path in SELF_TEST:  # the driver's own test: a signal, a hang
        SELF_TEST[path]()
    try:
        return _open_and_decode(path)
    except Exception as error:  # noqa: BLE001 - what escapes is the finding
        lines = traceback.format_exception(error)
        return {
            "outcome": "error",
            "error_type": f"{type(error).__module__}.{type(error).__qualname__}",
            "clean_type": isinstance(error, (ValueError, RuntimeError)),
            "message": str(error),
            "tail": "".join(lines[-4:])[-3000:],
        }


def _serve() -> None:
    """The worker's loop (see the module docstring)."""
    import shutil

    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # prints from the package or C++ go to stderr, not into the answers
    sys.stdout = sys.stderr
    if "asan" not in os.environ.get("LD_PRELOAD", ""):
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    sys.path.insert(0, str(HERE))
    import torch

    from assisted_backends.drafters import prompt_lookup

    torch.set_num_threads(1)
    prompt_lookup.DEFAULT_MIN_NGRAM = 1  # draft from one-token matches: every round verifies drafts
    cache = Path(os.environ["ASSISTED_BACKENDS_CACHE"])
    warm = _run_case(sys.argv[1])
    print(f"gguf fuzz worker: warm-up on {sys.argv[1]}: {warm}", file=sys.stderr, flush=True)
    answers.write(json.dumps({"ready": warm}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        print(f"gguf fuzz worker: case {request['name']}", file=sys.stderr, flush=True)
        answer = _run_case(request["path"])
        for folder in ("quantized", "gguf"):
            shutil.rmtree(cache / folder, ignore_errors=True)
        answers.write(json.dumps(answer) + "\n")


def linked_cache(folder: Path) -> Path:
    """A cache directory under `folder` whose `kernels` and `decoder` link to the package's cache."""
    from assisted_backends.cache_dir import cache_root

    real = cache_root()
    cache = folder / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    for name in ("kernels", "decoder"):
        (real / name).mkdir(parents=True, exist_ok=True)
        link = cache / name
        if not link.exists():
            link.symlink_to(real / name, target_is_directory=True)
    return cache


class Worker:
    """The driver: `ask(name, path)` -> Answer; restarts the worker after a crash or a hang."""

    def __init__(self, warm_file: Path, folder: Path, timeout: float = CASE_TIMEOUT_S) -> None:
        self.warm_file, self.folder, self.timeout = warm_file, folder, timeout
        self.cache = linked_cache(folder)
        self.process: subprocess.Popen | None = None
        self.starts = 0
        self.warm: dict = {}
        self.last_returncode: int | None = None

    def _start(self) -> None:
        self.starts += 1
        self.log = self.folder / f"worker-{self.starts}.log"
        env = {**os.environ, "ASSISTED_BACKENDS_CACHE": str(self.cache), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
        env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), str(self.warm_file)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env, text=True, bufsize=1,
            )  # fmt: skip
        line = self._read(START_TIMEOUT_S)
        if line is None:
            raise RuntimeError(f"the fuzz worker did not start: {self._stderr_tail()}")
        self.warm = json.loads(line)["ready"]

    def _read(self, timeout: float) -> str | None:
        """The next answer line, or None when the worker dies or `timeout` passes (then it is killed)."""
        assert self.process is not None and self.process.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            if selector.select(timeout):
                line = self.process.stdout.readline()
                if line:
                    return line
        self.stop()
        return None

    def _stderr_tail(self, lines: int = 25) -> str:
        text = self.log.read_text(errors="replace") if self.log.is_file() else ""
        return "\n".join(text.splitlines()[-lines:])

    def ask(self, name: str, path: Path) -> Answer:
        if self.process is None:
            self._start()
        assert self.process is not None and self.process.stdin is not None
        started = time.monotonic()
        with contextlib.suppress(BrokenPipeError):  # the worker died: `_read` sees it and the case is reported
            self.process.stdin.write(json.dumps({"name": name, "path": str(path)}) + "\n")
            self.process.stdin.flush()
        line = self._read(self.timeout)
        if line is not None:
            return Answer(**json.loads(line))
        hung = time.monotonic() - started >= self.timeout
        code = self.last_returncode
        what = f"no answer in {self.timeout:.0f} s (killed)" if hung else _exit_words(code)
        return Answer("hung" if hung else "crashed", message=what, tail=self._stderr_tail())

    def stop(self) -> None:
        self.last_returncode = None
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.kill()
        self.last_returncode = self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):  # a pipe the dead worker left broken: nothing left to flush
                    stream.close()
        self.process = None


def _exit_words(code: int | None) -> str:
    if code is not None and code < 0:
        import signal

        return f"killed by signal {signal.Signals(-code).name}"
    if "asan" in os.environ.get("LD_PRELOAD", ""):
        return f"the worker exited with status {code}: AddressSanitizer's report is under ASAN_OPTIONS' log_path"
    return f"the worker exited with status {code}"


def scratch_folder() -> Path:
    return Path(tempfile.mkdtemp(prefix="gguf-fuzz-"))


if __name__ == "__main__":
    _serve()
