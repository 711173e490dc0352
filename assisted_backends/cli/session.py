"""A loaded target/draft pair on a resolved backend, ready to generate many times."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import assisted_backends
from assisted_backends.api import threads as api_threads
from assisted_backends.backends import Backend, BackendOptions, resolve_backend
from assisted_backends.backends.base import unprepared
from assisted_backends.backends.cpu import affinity
from assisted_backends.cli.loading import default_drafting
from assisted_backends.cli.threads import ThreadChoice, initial_choice, probe, probe_applies
from assisted_backends.demo.pair import NOTICE, SMOKE_BUDGET, DemoBudget, ensure_demo_pair, shipped_pair
from assisted_backends.distributed import launch as distributed
from assisted_backends.drafters.eagle.build import head_precision, is_eagle_head
from assisted_backends.drafters.eagle.precision import HeadPrecision
from assisted_backends.drafters.suffix.cache import SuffixCache
from assisted_backends.loading.files import find_gguf
from assisted_backends.loading.models import load_model, load_tokenizer, saved_generation_config
from assisted_backends.options.errors import OptionError
from assisted_backends.options.fields import DRAFTER_FIELDS

SMOKE_NOTICE = (
    "note: using a SMOKE demo pair ({target} target, {draft} draft, a few training steps on a small text sample): "
    "it writes noise; it exists for tests and CI"
)
# A prompt in the style of the demo pair's training text (its continuations of bare imports were mostly `#` and
# blank lines under greedy decoding; a class body gives code-shaped lines).
DEMO_PROMPT = 'class Stack:\n    """A last-in, first-out stack."""\n\n    def __init__(self):\n'
DEMO_EXPLAINED = (
    "note: what you see: the demo target (12 M parameters, minutes of training) continues a Python class with the "
    "draft proposing tokens; expect Python-shaped fragments, not working code. The text is exactly what the target "
    "alone writes (in the default fp32); the statistics below show how much of it the draft got right"
)


@dataclass
class Session:
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

    def demo_prompt(self) -> str:
        """The generate task's prompt for the demo pair when none is given."""
        return DEMO_PROMPT

    @property
    def assisted(self) -> bool:
        return not self.args.no_assisted

    def generate(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int,
        assisted: bool,
        ignore_eos: bool = False,
        streamer=None,
        attention_mask: torch.Tensor | None = None,
    ):
        """One `assisted_backends.generate` call with the session's flags (`streamer`: see cli.prompting;
        a batch comes left-padded with its `attention_mask`)."""
        args = self.args
        drafting = self.drafting_arguments() if assisted else {}
        return assisted_backends.generate(
            self.target,
            input_ids,
            max_new_tokens=max_new_tokens,
            do_sample=args.do_sample,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            repetition_penalty=args.repetition_penalty,
            num_assistant_tokens=args.num_assistant_tokens,
            schedule=args.schedule,
            seed=args.seed,
            static_shapes=args.static_shapes,
            eos_token_id=[] if ignore_eos else None,
            pad_token_id=self.pad_id() if (ignore_eos or attention_mask is not None) else None,
            streamer=streamer,
            backend=self.backend,
            attention_mask=attention_mask,
            **drafting,
        )

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

    def transformers_generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int):
        """transformers' own `model.generate` (plain decoding) with the session's sampling flags, exactly
        `max_new_tokens` new tokens per row (EOS ignored, as the benchmark's cases are)."""
        args = self.args
        sampling = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p) if args.do_sample else {}
        with torch.inference_mode():  # the model itself, not the backend's wrapper (CUDA graphs)
            return unprepared(self.target).generate(
                input_ids.to(self.backend.device),
                attention_mask=attention_mask.to(self.backend.device),
                max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens,
                do_sample=args.do_sample,
                repetition_penalty=args.repetition_penalty,
                pad_token_id=self.tokenizer.pad_token_id,
                **{k: v for k, v in sampling.items() if v is not None},
            )


def _pick_models(args: argparse.Namespace, notices: list[str]) -> tuple[str, str | None, str | None]:
    """(target, draft, held-out text path): the demo pair unless -m is given."""
    if args.model is None:
        if args.assistant_model is not None:
            raise ValueError("--assistant-model needs -m/--model (the demo pair brings its own draft)")
        budget = SMOKE_BUDGET if args.demo_pair == "smoke" else DemoBudget()
        pair = shipped_pair() if args.demo_pair == "shipped" else None
        if pair is None:
            pair = ensure_demo_pair(root=Path(args.demo_dir) if args.demo_dir else None, budget=budget)
        notice = SMOKE_NOTICE if args.demo_pair == "smoke" else NOTICE
        notices.append(notice.format(target=_size(budget.target), draft=_size(budget.draft)))
        drafting = args.no_assisted or args.prompt_lookup or args.assistant_early_exit or args.suffix_cache
        draft = None if drafting else str(pair.draft_dir)
        return str(pair.target_dir), draft, str(pair.held_out_text)
    # else an EAGLE head (validated) with lookup or suffix decoding first
    lookup_alone = (args.prompt_lookup or args.suffix_cache) and args.assistant_model is None
    wants_draft_model = not (args.no_assisted or lookup_alone or args.assistant_early_exit)
    if not wants_draft_model:
        return args.model, None, None
    saved = saved_generation_config(args.model, "-m/--model")
    if args.assistant_model is None and any(saved.get(field) for field in DRAFTER_FIELDS):
        notices.append("note: drafting as the model's generation_config.json asks (" + ", ".join(
            f"{field}={saved[field]}" for field in DRAFTER_FIELDS if saved.get(field)) + ")")  # fmt: skip
        return args.model, None, None
    if args.assistant_model is not None:
        return args.model, args.assistant_model, None
    chosen = getattr(args, "default_drafting", None) or default_drafting(args.model, None, None)
    if chosen.draft is None:  # no suitable draft model at hand: suffix decoding, said in one line
        notices.append(chosen.note())
        args.suffix_cache = True
        return args.model, None, None
    notices.append(f"note: no --assistant-model given; using the default draft for this family: {chosen.draft}")
    return args.model, chosen.draft, None


def load_with_progress(name: str, what: str, precision: str | None):
    """`load_model`, with one line before and one after when a `.gguf` is first converted (it can take a minute):
    repacked for the int4 / int8 kernels when it keeps its quantization, else dequantized to a model directory."""
    from assisted_backends.loading import files

    gguf = files.find_gguf(name, what)
    quantized = precision in (None, "int8", "int4")
    if gguf is None or _converted(gguf, precision, quantized):
        return load_model(name, what, precision)
    kind = f"{precision or 'its own'} quantization, repacked for the CPU kernels" if quantized else "a model directory"
    print(f"converting {gguf.name} ({gguf.stat().st_size / 1e6:.0f} MB) to {kind}, once (cached by content; "
          "load times: docs/quantized.md)...", file=sys.stderr, flush=True)  # fmt: skip
    began = time.perf_counter()
    model = load_model(name, what, precision)
    print(f"converted {gguf.name} in {time.perf_counter() - began:.1f} s", file=sys.stderr, flush=True)
    return model


def _converted(gguf, precision: str | None, quantized: bool) -> bool:
    from assisted_backends.loading import files
    from assisted_backends.quantized.model import is_cached

    if quantized:
        files.share_quantized_entry(gguf)  # a renamed copy of a repacked file finds its entry
        return is_cached(gguf, scheme=precision or "file")
    return (files.converted_dir(gguf) / "config.json").is_file()


def _size(shape) -> str:
    return f"{shape.layers}-layer x {shape.hidden}"


def set_head_precision(head, target: torch.nn.Module, precision: str | None) -> HeadPrecision:
    """Set an EAGLE-3 head to draft at `--head-precision` (None: its own setting, "auto"); what it will draft in."""
    if precision is not None:
        head.precision = precision
    return head_precision(head, target)


def open_session(args: argparse.Namespace) -> Session:
    """Resolve the backend, load (and prepare once) the models and tokenizers."""
    notices: list[str] = []
    threads = initial_choice(args)  # before any model runs, so every op uses the pool it will keep
    target_name, draft_name, held_out = _pick_models(args, notices)
    dtype = args.dtype or (None if find_gguf(target_name) else "fp32")  # a .gguf keeps its own quantization
    options = BackendOptions(dtype=dtype, draft_precision=args.draft_precision, bucket_size=args.bucket_size)
    backend = resolve_backend(args.device, options)
    # the tokenizer first: building one from a .gguf (a 262k vocabulary: +350 MiB passing) peaks before the weights
    # are resident, not on top of them (benchmarks/RESULTS.md, opening a .gguf)
    tokenizer = load_tokenizer(target_name, "-m/--model")
    target = load_with_progress(target_name, "-m/--model", dtype)
    launch = distributed.launch_context()
    if launch is not None:  # deepspeed / torchrun: shard the target (AutoTP); every rank keeps a full draft
        distributed.init_distributed(launch, backend.name)
        target = distributed.shard_target(target, launch)  # generate agrees seed and γ across ranks itself
    target = backend.prepare(target, "target")
    draft = draft_tokenizer = None
    if draft_name is not None:
        draft_tokenizer = load_tokenizer(draft_name, "--assistant-model")
        draft = load_with_progress(draft_name, "--assistant-model", args.draft_precision)
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
    api_threads.adopt(threads)  # the API's calls run with the CLI's choice and do not probe again
    wait_policy = getattr(args, "wait_policy", "")
    suffix_cache = SuffixCache() if args.suffix_cache else None
    return Session(
        args, backend, target, tokenizer, draft, draft_tokenizer, notices, text, threads, wait_policy, suffix_cache
    )
