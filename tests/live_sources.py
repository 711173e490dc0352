"""A live queue's source for tests (`api.queue.LiveSource`): prompts that arrive and rows cancelled at set polls."""

from __future__ import annotations

import torch


class ArrivingSource:
    """Prompt i may join once the loop has polled `arrive_after[i]` times (deterministic arrivals); the rows named in
    `cancel_at` (row -> poll count) are cancelled then."""

    def __init__(self, prompts, limits, arrive_after, cancel_at=None):
        self.prompts, self.limits, self.arrive_after = prompts, limits, arrive_after
        self.cancel_at, self.polls, self.taken, self.reported = cancel_at or {}, 0, 0, set()

    def pending(self) -> int:
        self.polls += 1
        count = 0
        for i in range(self.taken, len(self.prompts)):
            if self.arrive_after[i] > self.polls:
                break
            count += 1
        return count

    def take(self):
        i, self.taken = self.taken, self.taken + 1
        return i, torch.tensor(self.prompts[i]), self.limits[i], []

    def cancelled(self) -> list[int]:
        due = [i for i, at in self.cancel_at.items() if at <= self.polls and i < self.taken and i not in self.reported]
        self.reported.update(due)
        return due
