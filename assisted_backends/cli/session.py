"""A loaded target/draft pair on a resolved backend, ready to generate many times."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import assisted_backends
from assisted_backends import distributed
from assisted_backends.backends import Backend, BackendOptions, resolve_backend
from assisted_backends.cli.loading import TORCH_DTYPES, default_assistant, load_model, load_tokenizer
from assisted_backends.demo.pair import NOTICE, SMOKE_BUDGET, DemoBudget, ensure_demo_pair, shipped_pair


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

    @property
    def assisted(self) -> bool:
        return not self.args.no_assisted

    def generate(
        self, input_ids: torch.Tensor, max_new_tokens: int, assisted: bool, ignore_eos: bool = False, streamer=None
    ):
        """One `assisted_backends.generate` call with the session's flags (`streamer`: see cli.prompting)."""
        args = self.args
        drafting = {}
        if assisted:
            drafting = dict(
                assistant_model=self.draft,
                prompt_lookup_num_tokens=args.prompt_lookup,
                assistant_early_exit=args.assistant_early_exit,
            )
            if self.draft is not None and self.draft_tokenizer is not None:
                drafting.update(tokenizer=self.tokenizer, assistant_tokenizer=self.draft_tokenizer)
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
            streamer=streamer,
            backend=self.backend,
            **drafting,
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
        notices.append(NOTICE.format(target=_size(budget.target), draft=_size(budget.draft)))
        draft = None if (args.no_assisted or args.prompt_lookup or args.assistant_early_exit) else str(pair.draft_dir)
        return str(pair.target_dir), draft, str(pair.held_out_text)
    wants_draft_model = not (args.no_assisted or args.prompt_lookup or args.assistant_early_exit)
    draft = args.assistant_model or (default_assistant(args.model) if wants_draft_model else None)
    return args.model, draft if wants_draft_model else None, None


def _size(shape) -> str:
    return f"{shape.layers}-layer x {shape.hidden}"


def open_session(args: argparse.Namespace) -> Session:
    """Resolve the backend, load (and prepare once) the models and tokenizers."""
    notices: list[str] = []
    target_name, draft_name, held_out = _pick_models(args, notices)
    options = BackendOptions(dtype=args.dtype, draft_precision=args.draft_precision, bucket_size=args.bucket_size)
    backend = resolve_backend(args.device, options)
    load_dtype = TORCH_DTYPES.get(args.dtype)
    target = load_model(target_name, "-m/--model", load_dtype)
    launch = distributed.launch_context()
    if launch is not None:  # deepspeed / torchrun: shard the target (AutoTP); every rank keeps a full draft
        distributed.init_distributed(launch, backend.name)
        target = distributed.shard_target(target, launch)
        args.seed = distributed.common_seed(args.seed)
    target = backend.prepare(target, "target")
    tokenizer = load_tokenizer(target_name, "-m/--model")
    draft = draft_tokenizer = None
    if draft_name is not None:
        draft = backend.prepare(load_model(draft_name, "--assistant-model", None), "draft")
        draft_tokenizer = load_tokenizer(draft_name, "--assistant-model")
    text = open(held_out, encoding="utf-8").read() if held_out else None
    return Session(args, backend, target, tokenizer, draft, draft_tokenizer, notices, text)
