"""The command line's session: the pair the flags name, opened and prepared (`startup.pair`), with the calls
`run-assisted-generation`'s tasks make of it (`generate` with the session's flags, transformers' own `generate` for
the benchmark's comparison)."""

from __future__ import annotations

import argparse

import torch

import assisted_backends
from assisted_backends.backends.base import unprepared
from assisted_backends.startup.pair import OpenedPair, open_pair

# A prompt in the style of the demo pair's training text (its continuations of bare imports were mostly `#` and
# blank lines under greedy decoding; a class body gives code-shaped lines).
DEMO_PROMPT = 'class Stack:\n    """A last-in, first-out stack."""\n\n    def __init__(self):\n'
DEMO_EXPLAINED = (
    "note: what you see: the demo target (12 M parameters, minutes of training) continues a Python class with the "
    "draft proposing tokens; expect Python-shaped fragments, not working code. The text is exactly what the target "
    "alone writes (in the default fp32); the statistics below show how much of it the draft got right"
)


class Session(OpenedPair):
    """The opened pair and the command line's calls of it."""

    def demo_prompt(self) -> str:
        """The generate task's prompt for the demo pair when none is given."""
        return DEMO_PROMPT

    def generate(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int,
        assisted: bool,
        ignore_eos: bool = False,
        streamer=None,
        attention_mask: torch.Tensor | None = None,
        prefix_cache: bool | None = None,
    ):
        """One `assisted_backends.generate` call with the session's flags (`streamer`: see cli.prompting;
        a batch comes left-padded with its `attention_mask`; `prefix_cache`: as `generate` takes it)."""
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
            prefix_cache=False if args.no_prefix_cache else prefix_cache,
            **drafting,
        )

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


def open_session(args: argparse.Namespace) -> Session:
    """Resolve the backend, open (and prepare once) the models and tokenizers the flags name."""
    return open_pair(args, Session)
