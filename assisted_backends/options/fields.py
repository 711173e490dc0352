"""Every GenerationConfig field, classified: honoured, refused by name, or without effect on the tokens.

`tests/test_generation_config.py` checks that the three sets cover every field of the installed
transformers, so a field added by a new release is classified before it can be ignored silently.
"""

from __future__ import annotations

from typing import Literal

# Fields that change the tokens and are honoured (transformers' own processors, or the loop's lengths/EOS).
HONOURED = frozenset(
    {
        "max_length", "max_new_tokens", "min_length", "min_new_tokens", "do_sample", "temperature", "top_k",
        "top_p", "min_p", "top_h", "typical_p", "epsilon_cutoff", "eta_cutoff", "repetition_penalty",
        "encoder_repetition_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
        "renormalize_logits", "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
        "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens", "sequence_bias",
        "eos_token_id", "pad_token_id", "stop_strings",
    }
)  # fmt: skip

# Fields that change tokens and cannot be honoured: (field, when it is active, what to do instead). When: "set"
# (not None), "truthy", "above_one" (not None and > 1), "not_one" (not None and != 1), "never" (no effect here).
Active = Literal["set", "truthy", "above_one", "not_one", "never"]
REFUSED: tuple[tuple[str, Active, str], ...] = (
    ("num_beams", "above_one", "beam search is not supported: use num_beams=1"),
    ("num_beam_groups", "above_one", "group beam search is not supported: use 1"),
    ("diversity_penalty", "truthy", "group beam search is not supported: leave it unset"),
    ("length_penalty", "never", ""),  # beam search only: no effect with one beam
    ("penalty_alpha", "truthy", "contrastive search is not supported: leave it unset"),
    ("dola_layers", "set", "DoLa decoding is not supported: leave it unset"),
    ("guidance_scale", "not_one", "classifier-free guidance is not supported"),
    ("watermarking_config", "set", "watermarking is not supported: leave it unset"),
    ("num_return_sequences", "above_one", "call generate once per sequence"),
    ("max_time", "set", "a wall-clock limit makes the tokens timing-dependent: use max_new_tokens"),
    ("token_healing", "truthy", "token healing is not supported: leave it unset"),
    ("constraints", "set", "constrained beam search is not supported"),
    ("force_words_ids", "set", "constrained beam search is not supported"),
    ("use_mtp", "truthy", "multi-token prediction is not supported: pass a drafter instead"),
    ("assistant_ensemble_weight", "set", "ensemble verification is lossy: leave it unset"),
    ("speculation_type", "set", "transformers' own speculation types are not used here"),
    ("forced_decoder_ids", "truthy", "use forced_bos_token_id, or put the tokens in the prompt"),
    ("generation_kwargs", "truthy", "pass these as arguments to generate instead"),
)

# Fields that never change the tokens (cache, compile, output format, transformers' own drafting).
NO_TOKEN_EFFECT = frozenset(
    {
        "early_stopping", "use_cache", "cache_implementation", "cache_config", "max_cache_len", "output_attentions",
        "output_hidden_states", "output_scores", "output_logits", "return_dict_in_generate", "bos_token_id",
        "decoder_start_token_id", "is_assistant", "num_assistant_tokens", "num_assistant_tokens_schedule",
        "assistant_confidence_threshold", "prompt_lookup_num_tokens", "max_matching_ngram_size",
        "assistant_early_exit", "assistant_lookbehind", "target_lookbehind", "compile_config", "disable_compile",
        "continuous_batching_config", "low_memory", "prefill_chunk_size", "transformers_version",
        "return_legacy_cache",
    }
)  # fmt: skip

# Drafting fields: they choose the drafter and γ (speed only), wherever they are set.
DRAFTING = ("prompt_lookup_num_tokens", "assistant_early_exit", "num_assistant_tokens")
# Output fields of `model.generate` (`return_dict_in_generate` and what the dict holds).
OUTPUTS = ("return_dict_in_generate", "output_scores", "output_logits", "output_attentions", "output_hidden_states")
