"""Suffix decoding: a draft-free drafter over earlier requests and the current one (`drafter`), matching against
a memory-bounded index of suffix automata (`cache`, `automaton`)."""

from assisted_backends.drafters.suffix.cache import SuffixCache
from assisted_backends.drafters.suffix.drafter import SuffixDrafter

__all__ = ["SuffixCache", "SuffixDrafter"]
