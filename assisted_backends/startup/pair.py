"""The target (and draft) the flags name, opened through the loading room (`loading.open`) and prepared on the
resolved backend, with the thread count chosen: what `run-assisted-generation` generates with and `assisted-serve`
serves.

Order of work: the thread count (before any model runs, so every op uses the pool it keeps), the backend, the
target (its tokenizer first), a multi-rank launch's sharding, the target prepared, the draft opened and prepared,
the thread probe on the loaded target.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from assisted_backends.api import threads as api_threads
from assisted_backends.backends import Backend, BackendOptions, resolve_backend
from assisted_backends.backends.cpu import affinity
from assisted_backends.distributed import launch as distributed
from assisted_backends.drafters.eagle.build import head_precision, is_eagle_head
from assisted_backends.drafters.eagle.precision import HeadPrecision
from assisted_backends.drafters.suffix.cache import SuffixCache
from assisted_backends.loading.open import is_gguf, open_model
from assisted_backends.native.decoder_model import keep_cache_as
from assisted_backends.options.errors import OptionError
from assisted_backends.startup.choice import demo_models, draft_for
from assisted_backends.startup.threads import ThreadChoice, initial_choice, probe, probe_applies


@dataclass
class OpenedPair:
    """A loaded target/draft pair on a resolved backend, ready to generate many times."""

    args: argparse.Namespace
    backend: Backend
    target: Any
    tokenizer: Any
    draft: Any = None
    draft_tokenizer: Any = None
    notices: list[str] = field(default_factory=list)
    held_out_text: str | None = None
    threads: ThreadChoice | None = None
    wait_policy: str = ""
    suffix_cache: Any = None  # --suffix-cache (or the suffix default): one index for every call of the run

    def runtime(self) -> dict[str, str]:
        """The backend's report (device, precision, placement) plus how the thread count was chosen."""
        report = {**self.backend.describe(), **(self.threads.report() if self.threads else {})}
        busy = affinity.busy_note(threads=self.threads.threads if self.threads else None)
        if busy is not None:
            report["machine_busy"] = busy
        if self.wait_policy:
            report["omp_wait_policy"] = self.wait_policy
        return report

    def summary(self) -> str:
        """The report in one line: device, precisions, threads and why."""
        report = self.runtime()
        draft = f", draft {report['draft_precision']}" if self.draft is not None else ""
        threads = ""
        if "threads" in report:
            count, why = int(report["threads"]), f"{report['threads_from']}: {report['threads_reason']}"
            threads = f"; {count} thread{'s' if count > 1 else ''} ({why})"
        device = report.get("device", self.backend.name)
        return f"{device}: target {report.get('dtype', '?')}{draft}{threads}; -v for the full report"

    def recheck_threads(self) -> ThreadChoice | None:
        """Probe again (between benchmark cases) when the count came from a probe; a change must be confirmed
        by a second probe (one neighbour's burst should not flip it). The new choice if it changed."""
        if self.threads is None or self.threads.source != "probe":
            return None
        current, cores = self.threads, affinity.usable_cores()
        for _ in range(2):
            found = probe(current, self.target, self.backend.device, cores)
            if found.threads == current.threads:
                self.threads = found
                api_threads.adopt(found)
                return None
        self.threads = found
        api_threads.adopt(found)
        return found

    @property
    def assisted(self) -> bool:
        return not self.args.no_assisted

    def drafting_arguments(self) -> dict:
        """The drafter the flags chose, as `generate` / `generate_queue` take it."""
        drafting = dict(
            assistant_model=self.draft,
            prompt_lookup_num_tokens=self.args.prompt_lookup,
            assistant_early_exit=self.args.assistant_early_exit,
            suffix_cache=self.suffix_cache,
        )
        if self.draft is not None and self.draft_tokenizer is not None:
            drafting.update(tokenizer=self.tokenizer, assistant_tokenizer=self.draft_tokenizer)
        return drafting

    def pad_id(self) -> int:
        """What finished rows are padded with: the tokenizer's pad token, else its EOS, else 0."""
        for token in (self.tokenizer.pad_token_id, self.tokenizer.eos_token_id):
            if token is not None:
                return int(token)
        return 0


Opened = TypeVar("Opened", bound=OpenedPair)


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def set_head_precision(head, target: torch.nn.Module, precision: str | None) -> HeadPrecision:
    """Set an EAGLE-3 head to draft at `--head-precision` (None: its own setting, "auto"); what it will draft in."""
    if precision is not None:
        head.precision = precision
    return head_precision(head, target)


def open_pair(args: argparse.Namespace, kind: type[Opened] = OpenedPair) -> Opened:
    """Choose the threads and the backend, open (and prepare once) the models the flags name; `kind`: the class to
    build (the command line's `Session` adds its calls)."""
    notices: list[str] = []
    threads = initial_choice(args)  # before any model runs, so every op uses the pool it will keep
    target_name, draft_name, held_out = demo_models(args, notices) if args.model is None else (args.model, None, None)
    dtype = args.dtype or (None if is_gguf(target_name) else "fp32")  # a .gguf keeps its own quantization
    options = BackendOptions(dtype=dtype, draft_precision=args.draft_precision, bucket_size=args.bucket_size)
    backend = resolve_backend(args.device, options)
    opened = open_model(target_name, "-m/--model", dtype, report=_progress)
    if args.model is not None:
        draft_name = draft_for(args, opened, notices)
    target = opened.model
    if args.kv_cache_dtype is not None:
        keep_cache_as(target, args.kv_cache_dtype)
    launch = distributed.launch_context()
    if launch is not None:  # deepspeed / torchrun: shard the target (AutoTP); every rank keeps a full draft
        distributed.init_distributed(launch, backend.name)
        target = distributed.shard_target(target, launch)  # generate agrees seed and γ across ranks itself
    target = backend.prepare(target, "target")
    draft = draft_tokenizer = None
    if draft_name is not None:
        opened_draft = open_model(draft_name, "--assistant-model", args.draft_precision, report=_progress)
        draft, draft_tokenizer = opened_draft.model, opened_draft.tokenizer
        if is_eagle_head(draft):  # it rides on the target: the backend's draft precision does not apply
            notices.append(f"note: {set_head_precision(draft, target, args.head_precision).line()}")
        else:
            draft = backend.prepare(draft, "draft")
    if args.head_precision is not None and not is_eagle_head(draft):
        raise OptionError("{name} applies to an EAGLE-3 head (--assistant-model naming a head's directory): drop it",
                          name=("head_precision", args.head_precision))  # fmt: skip
    text = open(held_out, encoding="utf-8").read() if held_out else None
    cores = affinity.usable_cores()
    if probe_applies(threads, backend.device.type, launch is not None, cores):
        threads = probe(threads, target, backend.device, cores)
    api_threads.adopt(threads)  # the API's calls run with this choice and do not probe again
    wait_policy = getattr(args, "wait_policy", "")
    suffix_cache = SuffixCache() if args.suffix_cache else None
    return kind(
        args, backend, target, opened.tokenizer, draft, draft_tokenizer, notices, text, threads, wait_policy,
        suffix_cache,
    )  # fmt: skip
