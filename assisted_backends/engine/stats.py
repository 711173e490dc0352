"""Statistics of one generation, returned as data (the CLI prints them).

Written in one place: every field changes only through the methods below (`record_*`, `track_rows`), which the
engine calls (`engine.slots` for each row's, `engine.state` and `engine.loop` for the call's)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


class _Rates:
    """α and tokens per round from the `drafted`, `accepted` and `rounds` counts of a dataclass below."""

    drafted: int
    accepted: int
    rounds: int

    @property
    def acceptance_rate(self) -> float | None:
        """α = accepted / drafted; None when nothing was drafted."""
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_accepted_length(self) -> float | None:
        """Tokens gained per verification round, *including* the target's own token: (accepted + rounds) / rounds."""
        return (self.accepted + self.rounds) / self.rounds if self.rounds else None


@dataclass
class RowStats(_Rates):
    """One row of a batch: its new tokens, its rounds (those it took part in) and its latency. Queues: a row
    joins when a slot frees (`joined_s`); its latency in the batch is finished_s − joined_s."""

    new_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    rounds: int = 0
    finished_s: float = 0.0  # from the start of the call's prefill until the row's last token was committed
    joined_s: float = 0.0  # queues: from the start of the call until the row's prompt pass began (0: the first batch)

    def record_round(self, drafted: int, accepted: int) -> None:
        self.rounds += 1
        self.drafted += drafted
        self.accepted += accepted

    def record_commit(self, new_tokens: int) -> None:
        """The row has committed `new_tokens` tokens after its prompt so far."""
        self.new_tokens = new_tokens

    def record_finish(self, at: float) -> None:
        """The row's last token was committed `at` seconds after the call's start."""
        self.finished_s = at


@dataclass
class GenerationStats(_Rates):
    """Counts and timings of one `generate` call.

    A *round* is one target verification pass after the prefill: it scores γ draft tokens plus one
    more position. `accepted` counts verification decisions (before truncation at EOS or at
    max_new_tokens), so `acceptance_rate` α = accepted / drafted is the per-token acceptance the
    Leviathan formula uses. A round with γ = 0 (the adaptive schedule's plain decoding, or a lookup
    that found nothing) is a *plain round*: one target token, nothing drafted. `mean_accepted_length`
    averages over every round; `tokens_per_speculative_round` only over rounds that drafted.
    Batches: counts are sums over rows (a round counts once per row it served), `rows` holds each
    row's own (in the caller's order), `verify_passes` the target's passes after the prefill and
    `row_moves` / `move_s` what realigning the rows cost (`engine.realign`). Queues: `joins` rows took
    a freed slot, their prompt passes and cache insertions took `join_s` (inside decode_s; `engine.joins`).
    """

    new_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    rounds: int = 0
    plain_rounds: int = 0
    target_forwards: int = 0
    draft_forwards: int = 0
    per_position_drafted: list[int] = field(default_factory=list)
    per_position_accepted: list[int] = field(default_factory=list)
    prefill_s: float = 0.0
    decode_s: float = 0.0
    drafter: str = "none"
    schedule: str = "none"
    cache_layout: str = "dynamic"
    backend: str = "cpu"
    batch_size: int = 1
    rows: list[RowStats] = field(default_factory=list)
    row_moves: int = 0  # batches: rounds after which rows were realigned (`engine.realign`)
    move_s: float = 0.0  # wall time of those realignments (inside decode_s)
    joins: int = 0  # queues: rows that joined the batch after its first prefill (`engine.joins`)
    join_s: float = 0.0  # wall time of their prompt passes and insertions (inside decode_s)
    head_positions_skipped: int = 0  # verified positions whose logits were never computed (`engine.head_on_demand`)
    drafting_stopped: str | None = None  # why drafting stopped for the rest of the call (its limits, an error)
    drafting_stopped_at: int | None = None  # new tokens committed (all rows) when it stopped
    prefix_reused: int = 0  # prompt tokens whose keys and values came from the prefix cache (`engine.prefix_reuse`)

    @property
    def speculative_rounds(self) -> int:
        """Rounds that drafted at least one token (γ > 0)."""
        return self.rounds - self.plain_rounds

    @property
    def tokens_per_speculative_round(self) -> float | None:
        """Tokens gained per round that drafted, the target's own token included: (accepted + s) / s."""
        rounds = self.speculative_rounds
        return (self.accepted + rounds) / rounds if rounds else None

    @property
    def verify_passes(self) -> int:
        """Target forwards after the prefill: one per round of the whole batch (a queue's joining prompt passes
        not counted)."""
        return max(self.target_forwards - 1 - self.joins, 0)

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_s

    def record_round(self, drafted: int, accepted: int) -> None:
        """Count one verification round in which the first `accepted` of `drafted` tokens were kept."""
        self.rounds += 1
        if drafted == 0:
            self.plain_rounds += 1
        self.drafted += drafted
        self.accepted += accepted
        while len(self.per_position_drafted) < drafted:
            self.per_position_drafted.append(0)
            self.per_position_accepted.append(0)
        for position in range(drafted):
            self.per_position_drafted[position] += 1
            if position < accepted:
                self.per_position_accepted[position] += 1

    def track_rows(self, rows: list[RowStats]) -> None:
        """Each row's own statistics are `rows` (by the caller's index; a queue appends the rows that join)."""
        self.batch_size, self.rows = len(rows), rows

    def record_slots(self, slots: int) -> None:
        """Queues: the batch served `slots` slots."""
        self.batch_size = slots

    def record_prefix_reused(self, tokens: int) -> None:
        """`tokens` prompt tokens had their keys and values from the prefix cache (`engine.prefix_reuse`)."""
        self.prefix_reused = tokens

    def record_skipped(self, positions: int) -> None:
        """A round verified `positions` positions whose logits were never computed (`engine.head_on_demand`)."""
        self.head_positions_skipped += positions

    def record_move(self, seconds: float) -> None:
        """The rows were realigned after a round, in `seconds` (`engine.realign`)."""
        self.row_moves += 1
        self.move_s += seconds

    def record_join(self, seconds: float) -> None:
        """A queue's prompt joined the batch: its prompt pass and insertion took `seconds` (`engine.joins`)."""
        self.joins += 1
        self.join_s += seconds

    def record_stop(self, reason: str, committed: int) -> None:
        """Drafting stopped for the rest of the call, `reason`, after `committed` new tokens (all rows); the first
        stop is kept."""
        if self.drafting_stopped is None:
            self.drafting_stopped, self.drafting_stopped_at = reason, committed

    def record_totals(
        self, new_tokens: int, prefill_s: float, decode_s: float, target_forwards: int, draft_forwards: int
    ) -> None:
        """The call ended: its new tokens (all rows), the prompt pass's and the rounds' seconds, the passes of each
        model."""
        self.new_tokens, self.prefill_s, self.decode_s = new_tokens, prefill_s, decode_s
        self.target_forwards, self.draft_forwards = target_forwards, draft_forwards

    def to_dict(self) -> dict:
        data = asdict(self)
        data["acceptance_rate"] = self.acceptance_rate
        data["mean_accepted_length"] = self.mean_accepted_length
        data["speculative_rounds"] = self.speculative_rounds
        data["tokens_per_speculative_round"] = self.tokens_per_speculative_round
        data["total_s"] = self.total_s
        data["verify_passes"] = self.verify_passes
        return data
