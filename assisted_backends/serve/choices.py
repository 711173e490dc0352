"""The `n` choices of one request: n jobs of the same prompt in the live queue, each with its own events and text.

A request with `n` > 1 becomes n arrivals of its prompt (rows of the batch like any other request's). With a
`seed`, choice i samples with `choice_seed(seed, i)` (choice 0 with the seed itself, so `n` = 1 is unchanged);
greedy choices are n equal answers. The choices share one `changed` event: the handler waits for whichever
changes first and reads each one's news (`Choices.wait`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from assisted_backends.serve.engine import Job
from assisted_backends.serve.events import JobEvents, Update
from assisted_backends.serve.text import TextTracker

SEEDS = 1 << 64  # torch takes seeds in [-2**63, 2**64): choice seeds wrap within it


def choice_seed(seed: int | None, index: int) -> int | None:
    """The seed of choice `index` of a request seeded with `seed` (None: unseeded)."""
    if seed is None:
        return None
    derived = seed + index
    return derived - SEEDS if derived >= SEEDS else derived


@dataclass
class Choice:
    """One choice: its `index` in the response, its engine job, the job's events, its text."""

    index: int
    job: Job
    events: JobEvents
    tracker: TextTracker


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
