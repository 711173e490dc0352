"""The embedded demo pair: a small target and draft trained here, offline, from the Python standard library.

No pretrained weights can be fetched on an offline machine, so `run_assisted_generation.py` with no
model arguments trains this pair once (deterministic, a few minutes on 2 cores), caches it, and loads
it back with `from_pretrained` like any other model. It is a demo pair: it writes plausible-looking
Python fragments, not good code.
"""

from assisted_backends.demo.pair import DemoBudget, demo_pair_dirs, ensure_demo_pair

__all__ = ["DemoBudget", "demo_pair_dirs", "ensure_demo_pair"]
