"""Every GenerationConfig field, classified: honoured, refused by name, or without effect on the tokens; and
every refusal of the package, each with its reason, in one place (config fields, `generate` arguments and
forward inputs, outputs, and what a queue of prompts cannot serve per prompt).

`tests/options/test_generation_config.py` checks that the three sets cover every field of the installed
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
# Arguments of `generate` / `model.generate` (neither GenerationConfig fields nor forward inputs) that cannot be
# served, and why.
REFUSED_ARGUMENTS = {
    "negative_prompt_ids": "negative prompts (classifier-free guidance) are not supported",
    "negative_prompt_attention_mask": "negative prompts (classifier-free guidance) are not supported",
    "custom_generate": "custom_generate is not supported: use transformers' own generate (after "
    "assisted_backends.disable(model) where the model is enabled)",
    "synced_gpus": "synced_gpus (ZeRO-3/FSDP) is not supported: see the DeepSpeed tensor-parallel launch instead",
    "assistant_tokenizer_kwargs": "not supported: pass assistant_tokenizer=",
}
# Forward inputs a call cannot pass through, and why.
REFUSED_INPUTS = {
    "inputs_embeds": "pass input_ids: drafts and rollback work on token ids",
    "past_key_values": "a caller-provided cache is not supported: the package keeps its own",
    "cache": "a caller-provided cache is not supported: the package keeps its own",
    "cache_position": "the package computes cache positions itself",
    "labels": "labels are for training, not generation",
}
# Output fields whose tensors this package does not return, wherever they are set (argument or config).
REFUSED_OUTPUTS = {
    "output_attentions": "attention weights are not returned (the verify pass computes several positions at once)",
    "output_hidden_states": "hidden states are not returned (the verify pass computes several positions at once)",
}
# What a queue of prompts (`generate_queue`) cannot serve per prompt, and the fix.
QUEUE_REFUSED = {
    "input_ids": "a queue's prompts are its `prompts`: pass unpadded prompts",
    "attention_mask": "a queue pads its prompts itself: pass unpadded prompts",
    "token_type_ids": "per-column inputs belong to one batch: pass unpadded prompts",
    "position_ids": "per-column inputs belong to one batch: pass unpadded prompts",
    "streamer": "a streamer follows one batch: stream finished prompts with on_finish=",
    "output_scores": "scores are not served by a queue: call generate() per batch for scores",
    "output_logits": "logits are not served by a queue: call generate() per batch for logits",
    "prefix_allowed_tokens_fn": "its batch_id would not name the prompt: call generate() per batch",
    "max_length": "max_length counts the prompt, and a queue's prompts have different lengths: pass max_new_tokens",
}
# `suffix_cache=` (the package's own drafting option, not a GenerationConfig field): the values it takes, and the
# drafting options it cannot be combined with, and why (an EAGLE-3 head takes it: a suffix match first, the head
# where there is none).
SUFFIX_CACHE_VALUES = (
    "pass True (the cache this process keeps for the target), a SuffixCache (shared by every call given it), or "
    "None/False (off)"
)
SUFFIX_CACHE_REFUSED = {
    "prompt_lookup_num_tokens": "the suffix drafter already copies from the prompt and output: drop one of them",
    "assistant_early_exit": "one drafter per call: drop one of them",
    "assistant_model": "a draft model and the suffix drafter do not combine (an EAGLE-3 head does): drop one",
}
