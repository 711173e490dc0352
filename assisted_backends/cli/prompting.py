"""The generate task's prompt and output: chat templates for instruct models, streaming to the terminal.

`--batch-size N` runs the prompts (one per line of `--prompt-file`, or `--prompt` repeated) through N batch
slots, each refilled with the next prompt as soon as its row ends (`assisted_backends.api.queue`).
`--chat` renders the prompt (and `--system`, which implies `--chat`) with the tokenizer's own chat
template and the assistant-turn opener, as instruct models are trained to see it; the rendered text
is tokenized without adding special tokens again (the template writes them). `--stream` prints each
round's committed tokens as they arrive (default: on when stdout is a terminal; `--no-stream` off).
"""

from __future__ import annotations

import argparse
import sys

import torch

from assisted_backends.startup.errors import CLIError


def wants_chat(args: argparse.Namespace) -> bool:
    return bool(args.chat or args.system is not None)


def wants_stream(args: argparse.Namespace, stdout=None) -> bool:
    """--stream / --no-stream, else whether stdout is a terminal."""
    if args.stream is not None:
        return bool(args.stream)
    stdout = sys.stdout if stdout is None else stdout
    return bool(getattr(stdout, "isatty", lambda: False)())


def chat_text(tokenizer, user: str, system: str | None) -> str:
    """The prompt rendered by the tokenizer's chat template, ending with the assistant turn's opener."""
    if not getattr(tokenizer, "chat_template", None):
        raise CLIError(
            "--chat/--system: this model's tokenizer has no chat template (not an instruct model); drop them"
        )
    messages = ([{"role": "system", "content": system}] if system is not None else []) + [
        {"role": "user", "content": user}
    ]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def encode(tokenizer, text: str, args: argparse.Namespace) -> tuple[torch.Tensor, str]:
    """(input_ids [1, P], the text to show before the completion: the prompt, or nothing in chat mode)."""
    if wants_chat(args):
        rendered = chat_text(tokenizer, text, args.system)
        return tokenizer(rendered, return_tensors="pt", add_special_tokens=False).input_ids, ""
    return tokenizer(text, return_tensors="pt").input_ids, text


def padding_tokenizer(tokenizer):
    """`tokenizer` set up for batches: left padding, and a pad token (its EOS or unknown token when it has none)."""
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        fallback = tokenizer.eos_token or tokenizer.unk_token
        if fallback is None:
            raise CLIError("--batch-size > 1: the tokenizer has no pad, EOS or unknown token to pad prompts with")
        tokenizer.pad_token = fallback
    return tokenizer


def batch_prompts(text: str, from_file: bool, batch_size: int) -> list[str]:
    """The prompts of a batched generate task: the file's non-empty lines, or the one prompt repeated."""
    if batch_size == 1:
        return [text]
    if from_file:
        lines = [line for line in text.splitlines() if line.strip()]
        if not lines:
            raise CLIError("--prompt-file has no non-empty line: with --batch-size each line is one prompt")
        return lines
    return [text] * batch_size


def encode_batch(tokenizer, texts: list[str], args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """(input_ids [B, P] left-padded, attention_mask [B, P], the text to show before each completion)."""
    tokenizer = padding_tokenizer(tokenizer)
    if wants_chat(args):
        rendered = [chat_text(tokenizer, text, args.system) for text in texts]
        encoded = tokenizer(rendered, return_tensors="pt", padding=True, add_special_tokens=False)
        return encoded.input_ids, encoded.attention_mask, [""] * len(texts)
    encoded = tokenizer(texts, return_tensors="pt", padding=True)
    return encoded.input_ids, encoded.attention_mask, list(texts)


def encode_each(tokenizer, texts: list[str], args: argparse.Namespace) -> tuple[list[torch.Tensor], list[str]]:
    """(each prompt's input_ids [P], unpadded, the text to show before each completion) for a queue."""
    encoded = [encode(tokenizer, text, args) for text in texts]
    return [ids[0] for ids, _ in encoded], [shown for _, shown in encoded]


def generate_queue(session, prompts: list[torch.Tensor], slots: int, on_finish=None):
    """The prompts through `slots` batch rows with the session's flags (as `Session.generate` passes them to
    `generate`), each slot refilled as its row ends (`on_finish(prompt index, new tokens)` as each ends): an
    `api.queue.QueueResult`."""
    from assisted_backends.api.generation import generate_queue as run_queue

    args = session.args
    drafting = session.drafting_arguments() if session.assisted else {}
    return run_queue(
        session.target, prompts, slots=slots, max_new_tokens=args.max_new_tokens, do_sample=args.do_sample,
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, repetition_penalty=args.repetition_penalty,
        num_assistant_tokens=args.num_assistant_tokens, schedule=args.schedule, seed=args.seed,
        static_shapes=args.static_shapes, pad_token_id=session.pad_id(), backend=session.backend,
        on_finish=on_finish, prefix_cache=False if args.no_prefix_cache else None, **drafting,
    )  # fmt: skip


def streamer(tokenizer):
    """Prints committed text to stdout as rounds commit it (skipping the prompt and special tokens)."""
    from transformers import TextStreamer

    return TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)


class Collector:
    """A silent streamer: keeps the committed tokens (the prompt skipped), so that a run interrupted by Ctrl-C
    can still print what it generated."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self._prompt_seen = False

    def put(self, tokens) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self.tokens.extend(int(token) for token in tokens.reshape(-1).tolist())

    def end(self) -> None:
        pass
