"""A suffix automaton over token sequences, built online in amortized O(1) per token (Blumer et al. 1985).

Every distinct substring x of the indexed sequences belongs to one state (the class of strings with the same end
positions); `length[v]` is the longest string of v, `link[v]` the state of the longest suffix of v's strings in
another class. Several sequences share one automaton (the generalized construction: each sequence starts again
at the root, and a transition that already exists is reused or split), so a substring of one request is found in
any later request. Two counters ride on it:

- `count[v]`: in how many sequences v's strings occur (document frequency). After each token the new state's
  suffix-link path is walked up to the first state already counted for this sequence, so a sequence of n tokens
  costs O(n + states it touches), and `count[child] / count[v]` estimates P(next token | matched context).
- `latest[v]` (when `positions` is on, for the current request's own tokens): an end position of v's strings
  before the newest one, the most recent the bounded walk saw; the continuation is read from the tokens after it.

Storage is flat `array`s of 4-byte ints: per state its first transition inline and a list of its further ones in a
shared edge pool, a dict only for the few states with more than `WIDE` transitions (the root, frequent contexts),
so the index's bytes (`nbytes`) are about 40-60 per token indexed.
"""

from __future__ import annotations

import sys
from array import array

NONE = -1  # no transition (inline edge) / end of an edge list
DICT = -2  # `more_head` of a state whose further transitions sit in `self.wide[state]`
WIDE = 8  # a state with more transitions than this keeps them in a dict (the root, frequent contexts)
LATEST_WALK = 64  # suffix-link steps `latest` is refreshed along per token (older ends stay valid, only older)


class SuffixAutomaton:
    """Generalized suffix automaton with document counts (and optionally latest end positions)."""

    def __init__(self, positions: bool = False) -> None:
        self.length = array("i", [0])
        self.link = array("i", [-1])
        self.count = array("i", [0])
        self.stamp = array("i", [-1])  # the last sequence that counted this state
        self.edge_token = array("i", [NONE])  # each state's first transition, inline
        self.edge_target = array("i", [0])
        self.more_head = array("i", [NONE])  # its further transitions: an edge list, or DICT
        self.more_token = array("i")  # the edge lists' pool: token, target, next edge
        self.more_target = array("i")
        self.more_next = array("i")
        self.wide: dict[int, dict[int, int]] = {}
        self.positions = positions
        self.latest = array("i", [-1]) if positions else None
        self.tokens = array("i") if positions else None  # the one sequence's tokens (positions mode)
        self.sequences = 0
        self.indexed = 0  # tokens indexed
        self.work = 0  # loop steps of the construction and the counting walks (what "linear" is measured by)
        self._last = 0
        self._pending = -1  # positions mode: the state of the newest token, whose `latest` is set one token late

    # transitions ------------------------------------------------------------------------------------------------
    def step(self, state: int, token: int) -> int:
        """δ(state, token), or -1."""
        if self.edge_token[state] == token:
            return self.edge_target[state]
        edge = self.more_head[state]
        if edge == DICT:
            return self.wide[state].get(token, -1)
        while edge >= 0:
            if self.more_token[edge] == token:
                return self.more_target[edge]
            edge = self.more_next[edge]
        return -1

    def children(self, state: int) -> list[tuple[int, int]]:
        """[(token, next state)] of every transition out of `state`."""
        if self.edge_token[state] == NONE:
            return []
        found = [(self.edge_token[state], self.edge_target[state])]
        edge = self.more_head[state]
        if edge == DICT:
            return found + list(self.wide[state].items())
        while edge >= 0:
            found.append((self.more_token[edge], self.more_target[edge]))
            edge = self.more_next[edge]
        return found

    def _set(self, state: int, token: int, target: int) -> None:
        first = self.edge_token[state]
        if first == NONE or first == token:
            self.edge_token[state], self.edge_target[state] = token, target
            return
        edge = self.more_head[state]
        if edge == DICT:
            self.wide[state][token] = target
            return
        degree = 1
        while edge >= 0:
            if self.more_token[edge] == token:
                self.more_target[edge] = target
                return
            degree += 1
            edge = self.more_next[edge]
        if degree >= WIDE:  # the list's edges stay in the pool, unused (a state widens once)
            wide = dict(self.children(state)[1:])
            wide[token] = target
            self.wide[state] = wide
            self.more_head[state] = DICT
            return
        self.more_token.append(token)
        self.more_target.append(target)
        self.more_next.append(self.more_head[state])
        self.more_head[state] = len(self.more_token) - 1

    def _new_state(self, length: int, link: int, count: int, stamp: int, latest: int) -> int:
        self.length.append(length)
        self.link.append(link)
        self.count.append(count)
        self.stamp.append(stamp)
        self.edge_token.append(NONE)
        self.edge_target.append(0)
        self.more_head.append(NONE)
        if self.latest is not None:
            self.latest.append(latest)
        return len(self.length) - 1

    def _clone(self, source: int, length: int) -> int:
        clone = self._new_state(
            length,
            self.link[source],
            self.count[source],
            self.stamp[source],
            self.latest[source] if self.latest is not None else -1,
        )
        for token, target in self.children(source):
            self._set(clone, token, target)
        return clone

    # building ---------------------------------------------------------------------------------------------------
    def start_sequence(self) -> None:
        """The next tokens begin a new sequence (a new request): matching restarts at the root."""
        self.sequences += 1
        self._last = 0
        self._pending = -1

    def extend(self, token: int) -> None:
        """Append `token` to the current sequence (amortized O(1) transitions; counting walks new states only)."""
        last, sequence = self._last, self.sequences
        existing = self.step(last, token)
        if existing >= 0:  # the generalized case: last·token already occurs
            if self.length[existing] == self.length[last] + 1:
                state = existing
            else:
                state = self._clone(existing, self.length[last] + 1)
                self.link[existing] = state
                p = last
                while p >= 0 and self.step(p, token) == existing:
                    self._set(p, token, state)
                    p = self.link[p]
                    self.work += 1
        else:
            state = self._new_state(self.length[last] + 1, 0, 0, -1, -1)
            p = last
            while p >= 0 and self.step(p, token) < 0:
                self._set(p, token, state)
                p = self.link[p]
                self.work += 1
            if p >= 0:
                q = self.step(p, token)
                if self.length[p] + 1 == self.length[q]:
                    self.link[state] = q
                else:
                    clone = self._clone(q, self.length[p] + 1)
                    while p >= 0 and self.step(p, token) == q:
                        self._set(p, token, clone)
                        p = self.link[p]
                        self.work += 1
                    self.link[q] = clone
                    self.link[state] = clone
        self._last = state
        self.indexed += 1
        v = state
        while v > 0 and self.stamp[v] != sequence:  # document counts: each state once per sequence
            self.stamp[v] = sequence
            self.count[v] += 1
            v = self.link[v]
            self.work += 1
        if self.tokens is not None:
            self._note_position(state, token)

    def _note_position(self, state: int, token: int) -> None:
        """Positions mode: the previous token's end position becomes `latest` along its suffix-link path (one token
        late, so `latest` of a match of the current end names an earlier occurrence, never the end itself)."""
        end = len(self.tokens) - 1  # the previous token's position
        v, steps = self._pending, 0
        while v > 0 and steps < LATEST_WALK:
            self.latest[v] = end
            v = self.link[v]
            steps += 1
        self.tokens.append(token)
        self._pending = state

    def add(self, tokens: list[int]) -> None:
        """Index `tokens` as one new sequence."""
        self.start_sequence()
        for token in tokens:
            self.extend(token)

    # querying ---------------------------------------------------------------------------------------------------
    def match(self, context: list[int]) -> tuple[int, int]:
        """(state, m): the longest suffix of `context` that occurs in the index, m tokens long, and its state."""
        state, matched = 0, 0
        for token in context:
            nxt = self.step(state, token)
            while nxt < 0 and state > 0:
                state = self.link[state]
                matched = self.length[state]
                nxt = self.step(state, token)
            if nxt >= 0:
                state, matched = nxt, matched + 1
            else:
                state, matched = 0, 0
        return state, matched

    def current_match(self) -> tuple[int, int]:
        """Positions mode: (state, m) of the longest suffix of the sequence so far that also ends earlier in it."""
        state = self.link[self._last] if self._last > 0 else 0
        return state, self.length[state] if state > 0 else 0

    def best_continuation(self, state: int, limit: int, min_probability: float) -> tuple[list[int], list[float]]:
        """From `state`, follow the most frequent next token while the running product of count(child) / count(v)
        stays >= `min_probability`, up to `limit` tokens: (tokens, that product after each)."""
        tokens: list[int] = []
        probabilities: list[float] = []
        probability = 1.0
        while len(tokens) < limit and state >= 0:
            children = self.children(state)
            if not children:
                break
            token, child = max(children, key=lambda edge: (self.count[edge[1]], -edge[0]))
            total = max(self.count[state], 1) if state > 0 else max(sum(self.count[c] for _, c in children), 1)
            probability *= min(1.0, self.count[child] / total)
            if probability < min_probability:
                break
            tokens.append(token)
            probabilities.append(probability)
            state = child
        return tokens, probabilities

    def branches(
        self, state: int, chain: list[int], width: int, limit: int, min_probability: float
    ) -> list[tuple[list[int], list[float]]]:
        """Token trees: walking `chain` from `state`, at each depth d the other next tokens among the `width` most
        frequent whose estimated probability P(chain[:d]) · count(child) / count(v) stays >= `min_probability`, each
        followed by its own best continuation (`best_continuation`), at most `limit` tokens a path:
        [(chain[:d] + [token] + continuation, the estimated probability of each new token's prefix)], the likeliest
        first."""
        found: list[tuple[list[int], list[float]]] = []
        reach = 1.0
        for depth in range(min(len(chain), limit)):
            children = self.children(state) if state >= 0 else []
            if not children:
                break
            total = max(self.count[state], 1) if state > 0 else max(sum(self.count[c] for _, c in children), 1)
            ranked = sorted(children, key=lambda edge: (-self.count[edge[1]], edge[0]))[:width]
            following = -1
            for token, child in ranked:
                share = reach * min(1.0, self.count[child] / total)
                if token == chain[depth]:
                    following = child
                    continue
                if share >= min_probability:
                    tail, chances = self.best_continuation(child, limit - depth - 1, min_probability / share)
                    found.append((chain[:depth] + [token] + tail, [share] + [share * c for c in chances]))
            if following < 0:
                following = self.step(state, chain[depth])
                if following < 0:
                    break
            reach *= min(1.0, self.count[following] / total)
            state = following
        return sorted(found, key=lambda item: -item[1][0])

    def nbytes(self) -> int:
        """Bytes held: the arrays' buffers and the branching dicts (their keys and values counted as ints)."""
        arrays = [self.length, self.link, self.count, self.stamp, self.edge_token, self.edge_target, self.more_head]
        arrays += [self.more_token, self.more_target, self.more_next]
        arrays += [a for a in (self.latest, self.tokens) if a is not None]
        total = sum(a.buffer_info()[1] * a.itemsize for a in arrays)
        int_size = sys.getsizeof(1 << 20)
        for branch in self.wide.values():
            total += sys.getsizeof(branch) + 2 * int_size * len(branch)
        return total
