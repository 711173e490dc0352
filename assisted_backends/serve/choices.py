"""The `n` choices of one request: n jobs of the same prompt in the live queue, each with its own events and text.

A request with `n` > 1 becomes n arrivals of its prompt (rows of the batch like any other request's). With a
`seed`, choice i samples with `choice_seed(seed, i)` (choice 0 with the seed itself, so `n` = 1 is unchanged);
greedy choices are n equal answers. The choices share one `changed` event: the handler waits for whichever
changes first and reads each one's news (`Choices.wait`).

A choice whose request asked for log-probabilities (`Job.logprobs`) sends each token's entry with the text it
shows (`Choice.logprobs`): a chunk carries the entries of the tokens whose characters it completes, the last one
the rest of the completion's. Chat's shape is `{"content": [{token, logprob, bytes, top_logprobs}]}`, completions'
`{tokens, token_logprobs, top_logprobs, text_offset}` (its top dict holds the chosen token too, as OpenAI's). A
token is its text alone (`decode([id])`, special tokens included), `bytes` that text's UTF-8; a log-probability a
sampling warper made −inf is sent as `FLOOR` (JSON has no infinity).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from assisted_backends.serve.engine import Job
from assisted_backends.serve.events import JobEvents, Update
from assisted_backends.serve.text import TextTracker

SEEDS = 1 << 64  # torch takes seeds in [-2**63, 2**64): choice seeds wrap within it
FLOOR = -9999.0  # a −inf log-probability in JSON (vLLM's value)


def choice_seed(seed: int | None, index: int) -> int | None:
    """The seed of choice `index` of a request seeded with `seed` (None: unseeded)."""
    if seed is None:
        return None
    derived = seed + index
    return derived - SEEDS if derived >= SEEDS else derived


@dataclass
class Choice:
    """One choice: its `index` in the response, its engine job, the job's events, its text, and how far its
    log-probabilities were sent (`logprobs_sent` tokens, `text_offset` characters of their text)."""

    index: int
    job: Job
    events: JobEvents
    tracker: TextTracker
    logprobs_sent: int = 0
    text_offset: int = 0

    def logprobs(self, chat: bool) -> dict | None:
        """The log-probabilities of the tokens shown since the last call, in chat's or completions' shape (see the
        module docstring); None where the request asked for none."""
        if self.job.logprobs is None:
            return None
        shown = self.tracker.tokens_shown
        entries = self.job.entries[self.logprobs_sent : shown]
        self.logprobs_sent = max(self.logprobs_sent, shown)
        decode = self.tracker.tokenizer.decode
        if chat:
            return {"content": [_chat_entry(decode, token, value, top) for token, value, top in entries]}
        texts = [decode([token]) for token, _, _ in entries]
        offsets = []
        for text in texts:
            offsets.append(self.text_offset)
            self.text_offset += len(text)
        tops = [{decode([i]): _finite(v) for i, v in [*top, (token, value)]} for token, value, top in entries]
        return {"tokens": texts, "token_logprobs": [_finite(value) for _, value, _ in entries], "top_logprobs": tops,
                "text_offset": offsets}  # fmt: skip


def _finite(value: float) -> float:
    return max(value, FLOOR)


def _chat_entry(decode, token: int, value: float, top: list[tuple[int, float]]) -> dict:
    """One token of chat's `logprobs.content`: its text, log-probability, bytes and its top alternatives."""

    def one(token_id: int, logprob: float) -> dict:
        text = decode([token_id])
        return {"token": text, "logprob": _finite(logprob), "bytes": list(text.encode("utf-8"))}

    return {**one(token, value), "top_logprobs": [one(i, v) for i, v in top]}


class Choices:
    """A request's choices (in index order), sharing the event `changed`."""

    def __init__(self, changed: asyncio.Event) -> None:
        self.changed = changed
        self.items: list[Choice] = []

    @property
    def finished(self) -> bool:
        return all(choice.tracker.finished for choice in self.items)

    @property
    def jobs(self) -> list[Job]:
        return [choice.job for choice in self.items]

    @property
    def completion_tokens(self) -> int:
        return sum(choice.tracker.completion_tokens for choice in self.items)

    async def wait(self) -> list[tuple[Choice, Update]]:
        """The news of every unfinished choice that has some (waits until one has)."""
        while True:
            self.changed.clear()
            news = [(choice, update) for choice in self.items
                    if not choice.tracker.finished and (update := choice.events.poll()) is not None]  # fmt: skip
            if news:
                return news
            await self.changed.wait()
