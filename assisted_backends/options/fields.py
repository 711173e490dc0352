"""Every GenerationConfig field, classified: honoured, refused by name, or without effect on the tokens; and
every refusal a call's planning raises, each with its reason and fix, in one place: config fields, `generate`
arguments and forward inputs, outputs, what a queue of prompts cannot serve per prompt (the tables below),
and every other refusal of planning by key (`REFUSALS`, raised through `options.errors.refusal`), the range
checks' of `options.ranges` among them (`RANGE_CHECKS`: torch-free, so the CLI runs them on its flags before
torch loads).
The drafting options' names and the γ defaults are stated here too, once, for the API, the queue and the CLI.

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

# GenerationConfig fields that choose a drafter without a draft model (a saved generation config may set them).
DRAFTER_FIELDS = ("prompt_lookup_num_tokens", "assistant_early_exit")
# Drafting fields: they choose the drafter and γ (speed only), wherever they are set.
DRAFTING = (*DRAFTER_FIELDS, "num_assistant_tokens")
# The options that each ask for a way of drafting (at most one per call; an EAGLE-3 head takes a draft-free source
# first: `options.ranges.check_drafting`).
DRAFTING_OPTIONS = ("assistant_model", *DRAFTER_FIELDS, "suffix_cache")
# γ when none is given: the constant schedule's, the adaptive schedule's largest (its cap), and the adaptive cap of
# the suffix drafter (its long matches propose long spans).
DEFAULT_NUM_ASSISTANT_TOKENS = 4
MAX_ADAPTIVE_GAMMA = 8
SUFFIX_MAX_GAMMA = 12
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
# A queue's `logprobs=`: at most this many top tokens with each token's log-probability (OpenAI's bound).
MAX_TOP_LOGPROBS = 20
# What a queue of prompts (`generate_queue`) cannot serve per prompt, and the fix.
QUEUE_REFUSED = {
    "input_ids": "a queue's prompts are its `prompts`: pass unpadded prompts",
    "attention_mask": "a queue pads its prompts itself: pass unpadded prompts",
    "token_type_ids": "per-column inputs belong to one batch: pass unpadded prompts",
    "position_ids": "per-column inputs belong to one batch: pass unpadded prompts",
    "streamer": "a streamer follows one batch: stream finished prompts with on_finish=",
    "output_scores": "scores [B, V] per position belong to one batch: pass logprobs=k for each token's "
    "log-probability and top k",
    "output_logits": "logits [B, V] per position belong to one batch: pass logprobs=k for each token's "
    "log-probability and top k (or call generate() per batch for raw logits)",
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

# Every other refusal of a call's planning, by key: (kind, template). The template names each option with a
# `{placeholder}` (`OptionError`: each front end spells it, `generate`'s keyword or the CLI's flag) and fills the
# other `{slots}` with values; one line, naming the argument and the fix. Kind: "value" (a `ValueError`),
# "unsupported" (a `NotImplementedError` too), "type" (a `TypeError` too).
RefusalKind = Literal["value", "unsupported", "type"]
REFUSALS: dict[str, tuple[RefusalKind, str]] = {
    # ranges and combinations (`options.ranges`: torch-free, the CLI checks its flags with them too)
    "integer_type": ("type", "{name} must be an int, got {found}; pass {option}=int(...)"),
    "integer_minimum": ("value", "{name} must be >= {minimum}, got {value}"),
    "temperature": ("value", "{name} must be > 0 when sampling, got {value}; use greedy decoding for temperature 0"),
    "top_k": ("value", "{name} must be >= 0 (0 keeps every token), got {value}"),
    "top_p": ("value", "{name} must be in (0, 1], got {value}"),
    "repetition_penalty": ("value", "{name} must be > 0 (1.0 = none), got {value}"),
    "drafting_with_suffix": ("value", "choose one way of drafting, got {d0} and {d1}: {reason}"),
    "drafting_several": ("value", "choose one way of drafting, got {listed}"),
    "lookup_count": ("value", "{name} must be an integer >= 1 (tokens proposed per round), got {value}"),
    "not_one_of": ("value", "{name} is not one of {choices}"),
    "static_dynamic": ("value", "{shapes} needs the static cache layout; drop {layout}"),
    "adaptive_static": ("value", "{schedule} varies γ, which static shapes forbid; use {constant}"),
    "early_exit_range": ("value", "{name} must be between 1 and {last} (the target has {layers} layers), got "
                         "{value}"),
    "positions": ("value", "prompt ({prompt} tokens) + {name} ({new}) = {total} exceeds the target's {limit} "
                  "positions; shorten the prompt or lower {name}"),
    # a call's arguments (`options.resolve`)
    "unknown_argument": ("type", "generate() got an unexpected keyword argument '{name}' (not a GenerationConfig "
                         "field nor an input of the model's forward)"),
    "refused_argument": ("unsupported", "generate({name}=...) is not supported: {reason}"),
    "forward_argument": ("unsupported", "generate({name}=...) is a forward argument of {model} that this package "
                         "does not pass through (it passes {passed}); leave it out"),
    "refused_field": ("value", "generation_config.{name}={value} is not supported: {reason}"),
    "refused_output": ("unsupported", "{name}=True is not supported by assisted_backends: {reason}; leave it unset "
                       "(or call transformers' own generate: assisted_backends.disable(model) where the model is "
                       "enabled)"),
    "column_input": ("value", "{name} must be a tensor of the prompt's shape {shape}, got {found}"),
    "prefix_function_batch": ("unsupported", "{name} with a batch is not supported (rows are processed one at a "
                              "time, so its batch_id would be wrong): generate one prompt at a time"),
    # the prompt (`options.prompt`)
    "prompt_missing": ("value", "{name} is missing and the model's generation config has no bos_token_id to start "
                       "from; pass a prompt"),
    "prompt_dtype": ("type", "{name} must hold integer token ids (torch.long), got {dtype}"),
    "prompt_vocabulary": ("value", "{name} holds token id {token} (at flat position {position}), outside the "
                          "target's vocabulary [0, {vocabulary}); encode the prompt with the target model's own "
                          "tokenizer"),
    "prompt_type": ("type", "{name} must be a torch.LongTensor of shape [batch, length], got {found}"),
    "prompt_shape": ("value", "{name} must have shape [batch, length], got {shape}"),
    "prompt_empty": ("value", "{name} is empty: the prompt needs at least one token (add a BOS token for an empty "
                     "text)"),
    "prompt_no_rows": ("value", "{name} holds no rows (batch size 0): pass at least one prompt"),
    "mask_type": ("type", "{name} must be a torch.Tensor of 0s and 1s, got {found}"),
    "mask_shape": ("value", "{name} has shape {shape} but input_ids {ids_shape}; they must match"),
    "mask_empty_row": ("value", "{name} masks every token of row {row}: each prompt needs at least one real token"),
    # special tokens, stopping criteria and processors (`options.processors`, `options.criteria`)
    "eos_no_pad": ("value", "{eos} leaves no token to pad finished rows with; pass {pad} too"),
    "criterion_type": ("type", "{name} must hold callables (input_ids, scores) -> bool, got {found}"),
    "criterion_time": ("value", "{name} holds a MaxTimeCriteria: a wall-clock limit makes the tokens "
                       "timing-dependent; use max_new_tokens"),
    "stop_strings_tokenizer": ("value", "{strings} needs the target's tokenizer: pass {tokenizer} (as model.generate "
                               "does)"),
    "not_generation_model": ("unsupported", "{name}: {model} has no {method}: it is not a generation model"),
    # lengths (`options.resolve`, `api.plan`)
    "max_length_no_room": ("value", "{name}={max_length} leaves no room after the {prompt}-token prompt (padding "
                           "included); raise max_length or set max_new_tokens"),
    "prompt_fills_positions": ("value", "the {prompt}-token prompt fills the target's {limit} positions: no room "
                               "for new tokens; shorten the prompt"),
    "key_limit": ("value", "the target would attend over {keys} cached positions (prompt with padding + {name}, the "
                  "whole preallocated cache under the static layout) but its config's {field} is {limit}; shorten "
                  "the prompt or lower {name}"),
    # streaming (`options.ranges.check_streaming`: `generate` and the CLI)
    "streaming_batch": ("value", "{name} streams one sequence, but {rows} gives {count} rows; drop {name} or "
                        "generate one prompt at a time"),
    # the draft (`drafters.factory.plan_drafting`)
    "tokenizer_pair": ("value", "pass both tokenizer= (the target's) and {name}= (the draft's), or neither"),
    "draft_vocabulary": ("value", "{name} has a vocabulary of {draft} tokens and the target {target}: pass "
                         "tokenizer= (the target's) and assistant_tokenizer= (the draft's) so tokens can be "
                         "translated, or use a draft from the target's family"),
    "translated_static": ("unsupported", "{shapes} with a draft of another tokenizer is not supported: its "
                          "re-tokenized proposals and contexts vary in length; drop {shapes} or use a draft "
                          "sharing the target's tokenizer"),
    # the models (`api.generation`)
    "meta_weights": ("value", "{name}: its weights are on the meta device (shapes without values); load it with "
                     "real weights (from_pretrained without device_map='meta' or init_empty_weights, or "
                     "load_state_dict(..., assign=True)) before generating"),
    # a queue of prompts (`api.queue`, `api.plan`)
    "queue_refused": ("value", "{name} is not served by a queue of prompts: {reason}"),
    "queue_on_finish": ("value", "{name} must be callable as on_finish(index, tokens)"),
    "queue_empty": ("value", "{name} is empty: nothing to generate"),
    "queue_tensor": ("value", "{name} as a tensor must be [N, P] (one prompt per row), got {shape}"),
    "queue_mapping": ("value", "{name}[{index}] is a mapping without 'input_ids'"),
    "queue_ids": ("value", "{name}[{index}] must be token ids (a list of ints or a 1-D integer tensor)"),
    "queue_empty_prompt": ("value", "{name}[{index}] is empty: every prompt needs at least one token"),
    "live_static": ("value", "{name} is not served by a live queue (its batch grows and shrinks); drop it"),
    "live_nothing": ("value", "{name} has nothing pending: call when a prompt has arrived"),
    "queue_logprobs": ("value", "{name} must be an int from 0 to {most} (the top tokens kept with each token's "
                       "log-probability) or None (off), got {value}"),
}  # fmt: skip
# The checks of `options.ranges` (plain Python, no torch): the range and combination rules of the options, their
# refusals in `REFUSALS`. Planning runs them on a call's values, the CLI on its flags.
RANGE_CHECKS = (
    "check_integer", "check_sampling", "check_drafting", "check_shapes", "check_early_exit", "check_positions",
    "check_streaming", "check_queue_arguments", "check_target_length",
)  # fmt: skip
