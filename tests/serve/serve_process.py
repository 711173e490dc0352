"""A real `assisted-serve` process on a free loopback port, for the tests to drive as clients do.

`running_server(*flags)` starts `python -m assisted_backends.serve --port 0 ...` (the demo pair unless `-m`
is given, one thread, the test chat template), reads the address it prints, waits for `/health`, and on exit
sends SIGTERM and waits for the process (killed after `STOP_S`)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

START_S = 120
STOP_S = 60
CHAT_TEMPLATE = Path(__file__).with_name("chat_template.jinja")
ADDRESS = re.compile(r"served at (http://127\.0\.0\.1:(\d+))/v1")


@dataclass
class Server:
    process: subprocess.Popen
    url: str  # http://127.0.0.1:PORT
    log: list[str] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def get(self, path: str) -> tuple[int, dict | str]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=30) as response:
                body = response.read().decode()
                status = response.status
        except urllib.error.HTTPError as error:
            body, status = error.read().decode(), error.code
        try:
            return status, json.loads(body)
        except json.JSONDecodeError:
            return status, body

    def rss_kib(self) -> int:
        """The server process's resident memory."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def _drain(process: subprocess.Popen, log: list[str], found: list[str]) -> None:
    for line in process.stderr:
        log.append(line)
        match = ADDRESS.search(line)
        if match and not found:
            found.append(match.group(1))


def start_server(*flags: str) -> Server:
    command = [sys.executable, "-m", "assisted_backends.serve", "--port", "0", "--threads", "1",
               "--chat-template", str(CHAT_TEMPLATE), *flags]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    log: list[str] = []
    found: list[str] = []
    threading.Thread(target=_drain, args=(process, log, found), daemon=True).start()
    deadline = time.monotonic() + START_S
    while not found:
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError("the server did not start:\n" + "".join(log))
        time.sleep(0.05)
    server = Server(process, found[0], log)
    while server.get("/health")[0] != 200:
        if time.monotonic() > deadline:
            server.stop()
            raise RuntimeError("the server never became healthy:\n" + "".join(log))
        time.sleep(0.05)
    return server


@contextlib.contextmanager
def running_server(*flags: str):
    server = start_server(*flags)
    try:
        yield server
    finally:
        server.stop()


def demo_prompts(count: int) -> list[str]:
    """`count` prompts of mixed lengths (about 5 to 200 tokens) cut from the demo pair's held-out text."""
    from assisted_backends.demo.pair import shipped_pair

    text = shipped_pair().held_out_text.read_text(encoding="utf-8")
    prompts, start = [], 0
    for i in range(count):
        length = 20 + (i * 97) % 600
        start = text.index("\n", start + 1000) + 1
        prompts.append(text[start : start + length])
    return prompts


class Reference:
    """What `assisted_backends.generate` makes of a prompt with the demo target alone (fp32, greedy, no draft),
    tokenized as the server tokenizes it: the text a server must answer whoever else it serves."""

    def __init__(self) -> None:
        from transformers import AutoTokenizer

        from assisted_backends.api.generation import AssistedGenerator
        from assisted_backends.demo.pair import shipped_pair

        pair = shipped_pair()
        self.tokenizer = AutoTokenizer.from_pretrained(str(pair.target_dir))
        self.generator = AssistedGenerator(str(pair.target_dir), dtype="fp32")
        self.template = CHAT_TEMPLATE.read_text(encoding="utf-8")

    def ids(self, prompt: str | None = None, messages: list[dict] | None = None) -> list[int]:
        if messages is not None:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                      chat_template=self.template)  # fmt: skip
            return self.tokenizer(text, add_special_tokens=False).input_ids
        return self.tokenizer(prompt).input_ids

    def tokens(self, ids: list[int], max_tokens: int, **options) -> list[int]:
        import torch

        result = self.generator.generate(torch.tensor([ids]), max_new_tokens=max_tokens, do_sample=False, **options)
        new = result.sequences[0, len(ids) :].tolist()
        eos = self.tokenizer.eos_token_id
        return new[: new.index(eos) + 1] if eos in new else new

    def text(self, prompt: str | None = None, max_tokens: int = 16, messages: list[dict] | None = None,
             **options) -> str:  # fmt: skip
        return self.tokenizer.decode(self.tokens(self.ids(prompt, messages), max_tokens, **options),
                                     skip_special_tokens=True)  # fmt: skip


def openai_client(server: Server):
    """The official `openai` client pointed at `server` (no retries: a failure shows as it happened)."""
    import openai

    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)
