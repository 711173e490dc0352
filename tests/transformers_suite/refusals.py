"""Documented refusals: features assisted_backends deliberately does not support under `enable(model)`.

Each entry: (test-name pattern, exception types, exception-message pattern, reason). A test of
transformers' GenerationTesterMixin that fails in routed mode with an exception matching an entry whose
test-name pattern also matches is reported as xfail with the reason; any other failure stays a failure.
Both patterns must match, so a test that fails for another cause is still reported.

Only refusals the package states itself (its `NotImplementedError` / `ValueError` naming the feature, as
listed in docs/dropin.md), and tests that inspect transformers' own cache or compile path, belong here; a crash or a
wrong result never does. The package owners decide what moves out of this list.
"""

from __future__ import annotations

import re

REFUSALS: tuple[tuple[str, tuple[type, ...], str, str], ...] = (
    (
        r"^test_(beam_search|beam_sample|model_parallel_beam_search)",
        (ValueError,),
        r"num_beams=\d+ is not supported: beam search is not supported",
        "beam search (num_beams > 1) is not supported: speculative decoding verifies one sequence per row",
    ),
    (
        r"^test_.*(contrastive|penalty_alpha)",
        (ValueError,),
        r"penalty_alpha=.* is not supported: contrastive search",
        "contrastive search is not supported",
    ),
    (
        r"^test_.*dola",
        (ValueError,),
        r"dola_layers=.* is not supported",
        "DoLa decoding is not supported",
    ),
    (
        r"^test_.*(constrain|force_words)",
        (ValueError,),
        r"(constraints|force_words_ids)=.* is not supported: constrained beam search",
        "constrained beam search is not supported",
    ),
    (
        r"^test_.*group_beam",
        (ValueError,),
        r"(num_beam_groups|diversity_penalty)=.* is not supported",
        "group (diverse) beam search is not supported",
    ),
    (
        r"^test_",
        (NotImplementedError,),
        r"output_(attentions|hidden_states)=True is not supported by assisted_backends",
        "attention weights and hidden states are not returned: a verify pass computes several positions at once",
    ),
    (
        r"^test_",
        (NotImplementedError,),
        r"generate\(inputs_embeds=\.\.\.\) is not supported",
        "inputs_embeds is not supported: the loop drafts and verifies token ids",
    ),
    (
        r"^test_generate_from_inputs_embeds_1_beam_search",
        (ValueError,),
        r"num_beams=\d+ is not supported: beam search",
        "beam search (num_beams > 1) is not supported",
    ),
    (
        r"^test_",
        (NotImplementedError,),
        r"generate\((past_key_values|cache)=\.\.\.\) is not supported: a caller-provided cache",
        "a caller-provided cache (past_key_values=) is not supported: the package keeps its own caches",
    ),
    (
        r"^test_generate_continue_from_past_key_values",
        (ValueError,),
        r"The cache is not standard",
        "the package keeps its own caches and returns none (no past_key_values to continue from)",
    ),
    (
        r"^test_(generate_with_static_cache|static_cache_no_recompile_with_smaller_length)",
        (AssertionError,),
        r"False is not true",
        "these tests inspect the StaticCache transformers builds and returns; the package keeps its own "
        "(static with static_shapes=True) and returns none",
    ),
    (
        r"^test_generate_compile_model_forward_fullgraph",
        (AssertionError,),
        r"False is not true",
        "this test inspects transformers' compiled forward; the package does not run transformers' compile path",
    ),
    (
        r"^test_",
        (ValueError,),
        r"num_return_sequences=\d+ is not supported",
        "num_return_sequences > 1 is not supported: call generate once per sequence",
    ),
)


def documented(test_name: str, exception_type: type, message: str) -> str | None:
    """The reason when (`test_name`, exception) is a documented refusal, else None."""
    for name_pattern, types, message_pattern, reason in REFUSALS:
        if (
            re.search(name_pattern, test_name)
            and issubclass(exception_type, types)
            and re.search(message_pattern, message)
        ):
            return reason
    return None
