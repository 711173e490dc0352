"""Documented refusals: features assisted_backends deliberately does not support under `enable(model)`.

Each entry: (test-name pattern, exception types, exception-message pattern, reason). A test of
transformers' GenerationTesterMixin that fails in routed mode with an exception matching an entry whose
test-name pattern also matches is reported as xfail with the reason; any other failure stays a failure.
Both patterns must match, so a test that fails for another cause is still reported.

Only refusals the package states itself (its `NotImplementedError` / `ValueError` naming the feature, as
listed in `transformers_integration` and `core.generation_options.REFUSED`) belong here; a crash or a
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
        r"output_(scores|logits|attentions|hidden_states)=True is not supported by assisted_backends",
        "per-step scores / logits / attentions / hidden states are not returned (sequences only)",
    ),
    (
        r"^test_",
        (NotImplementedError,),
        r"model\.generate\(inputs_embeds=\.\.\.\) under assisted_backends\.enable: inputs_embeds is not supported",
        "inputs_embeds is not supported: the loop drafts and verifies token ids",
    ),
    (
        r"^test_",
        (NotImplementedError,),
        r"model\.generate\((past_key_values|cache)=\.\.\.\) under assisted_backends\.enable: a caller-provided cache",
        "a caller-provided cache (past_key_values=) is not supported: the package keeps its own caches",
    ),
    (
        r"^test_",
        (ValueError,),
        r"num_return_sequences=\d+ is not supported",
        "num_return_sequences > 1 is not supported: call generate once per sequence",
    ),
    (
        r"^test_",
        (NotImplementedError,),
        r"model\.generate\(logits_processor=\.\.\.\) under assisted_backends\.enable: custom logits processors",
        "custom logits_processor= objects are not supported: the GenerationConfig fields they implement are",
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
