"""Which drafter a call gets (`plan_drafting`, at planning: every refusal there) and building it (`build_drafter`, at
run time, from what planning accepted).

- `assistant_model` sharing the target's vocabulary: `ModelDrafter` (a small LM with its own cache).
- `assistant_model` with another vocabulary (`tokenizer=` and `assistant_tokenizer=` given):
  `TranslatingDrafter` (tokens translated through bytes; sampling over the vocabulary intersection),
  one per row in a batch (`any_pair.rowwise`).
- `prompt_lookup_num_tokens`: `PromptLookupDrafter` (n-gram lookup in the context, no draft model).
- `assistant_early_exit=N`: the target's first N layers and its own head (`early_exit`).
- `assistant_model` an EAGLE-3 head (`drafters.eagle`): it reads the target's hidden states.
- `suffix_cache`: `SuffixDrafter` (suffix decoding over earlier requests and the current one, no draft model).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from transformers import PreTrainedModel

from assisted_backends.drafters.any_pair.drafter import TranslatingDrafter
from assisted_backends.drafters.any_pair.rowwise import RowwiseDrafter
from assisted_backends.drafters.any_pair.token_bytes import codec_for
from assisted_backends.drafters.draft_model import DraftLimits, ModelDrafter
from assisted_backends.drafters.eagle import build as eagle
from assisted_backends.drafters.eagle.combined import LookupOrHead
from assisted_backends.drafters.eagle.head import Eagle3Head
from assisted_backends.drafters.early_exit import EarlyExitDrafter, early_exit_view
from assisted_backends.drafters.prompt_lookup import PromptLookupDrafter
from assisted_backends.drafters.suffix.cache import SuffixCache
from assisted_backends.drafters.suffix.drafter import SuffixDrafter
from assisted_backends.engine.drafter import Drafter
from assisted_backends.engine.runner import ModelRunner
from assisted_backends.model_facts import ModelFacts
from assisted_backends.options import ranges
from assisted_backends.options.errors import refusal
from assisted_backends.options.fields import SUFFIX_MAX_GAMMA
from assisted_backends.options.ranges import AssistantKind, DraftingRequest

DraftKind = Literal["none", "draft_model", "translated", "prompt_lookup", "early_exit", "eagle", "suffix"]
RunnerFactory = Callable[..., ModelRunner]  # (model, rows=None, limit=None): a runner over those batch rows


@dataclass(frozen=True)
class DraftSpec:
    """The drafter a call uses, decided before any model runs.

    `cost_ratio`: the schedule's prior for c = t_draft / t_target (draft parameters over the target's,
    counted unquantized; 0 for prompt lookup; N / L for early exit; None without a drafter);
    `prompt_pass_ratio`: the draft's pass over the prompt against the target's (body parameters: Gemma 3
    270M is 62% embeddings, so SmolLM2-135M's prompt pass costs about as much as Gemma 3's), 0 for
    drafters that read no prompt; `position_limit`: the positions a same-vocabulary draft's learned
    position table encodes (None: any, as rotary drafts); `key_limit`: the keys its bias table spans
    (MPT's ALiBi `max_seq_len`). Past either, drafting stops for the rest of the call: the draft only
    ever changes speed. `acceptance_prior`: α_1 measured before the call (an EAGLE head's held-out α_1), the
    schedule's prior in place of 1/2.
    """

    kind: DraftKind = "none"
    assistant_model: PreTrainedModel | None = None
    tokenizer: Any = None
    assistant_tokenizer: Any = None
    lookup_tokens: int | None = None
    exit_layers: int | None = None
    cost_ratio: float | None = None
    prompt_pass_ratio: float = 0.0
    position_limit: int | None = None
    key_limit: int | None = None
    combined_lookup: int | None = None  # an EAGLE head with prompt lookup first (`drafters.eagle.combined`)
    acceptance_prior: float | None = None
    suffix_cache: SuffixCache | None = None  # the suffix drafter's index of earlier requests (kind "suffix", or eagle)

    @property
    def speculates(self) -> bool:
        return self.kind != "none"

    @property
    def runs_draft_model(self) -> bool:
        """Whether `assistant_model` is a model the backend prepares and a runner steps (an EAGLE head rides on
        the target's runner instead)."""
        return self.kind in ("draft_model", "translated")


def _translation_needed(target: ModelFacts, draft: ModelFacts, tokenizer: Any, assistant_tokenizer: Any) -> bool:
    """Whether the draft's tokens must be translated: vocabularies (or heads) differ."""
    sizes = [getattr(t, "__len__", lambda: None)() for t in (tokenizer, assistant_tokenizer)]
    if draft.vocab_size != target.vocab_size or sizes[0] != sizes[1]:
        return True  # decided without get_vocab(), which builds a dict of every token (seconds for a 262k vocabulary)
    return tokenizer.get_vocab() != assistant_tokenizer.get_vocab()


def assistant_kind(assistant_model: Any) -> AssistantKind | None:
    """What `assistant_model` is, as `options.ranges.check_drafting` takes it: an EAGLE-3 head, a draft model, or
    None."""
    if assistant_model is None:
        return None
    return "eagle_head" if isinstance(assistant_model, Eagle3Head) else "draft_model"


def drafting_request(
    assistant_model: Any,
    lookup_tokens: int | None = None,
    exit_layers: int | None = None,
    suffix_cache: Any = None,
    num_assistant_tokens: int | None = None,
) -> DraftingRequest:
    """The drafting a call asked for, checked and stated (`options.ranges.check_drafting`)."""
    return ranges.check_drafting(
        {
            "assistant_model": assistant_kind(assistant_model),
            "prompt_lookup_num_tokens": lookup_tokens,
            "assistant_early_exit": exit_layers,
            "suffix_cache": suffix_cache,
            "num_assistant_tokens": num_assistant_tokens,
        }
    )


def plan_drafting(
    target: ModelFacts,
    request: DraftingRequest,
    assistant_model: PreTrainedModel | None,
    draft: ModelFacts | None,
    tokenizer: Any,
    assistant_tokenizer: Any,
    suffix_cache: SuffixCache | None = None,
    static_shapes: bool = False,
) -> DraftSpec:
    """The `DraftSpec` for `request` (`drafting_request`), every refusal raised here, before a model is prepared:
    `build_drafter` builds what this accepts. `static_shapes`: the backend's (a draft of another tokenizer cannot
    keep them)."""
    if request.drafter == "eagle":
        eagle.check_head(assistant_model, target)
        costs = eagle.draft_costs(assistant_model, target)
        if request.suffix:
            return DraftSpec("eagle", assistant_model, combined_lookup=SUFFIX_MAX_GAMMA, suffix_cache=suffix_cache,
                             **costs)  # fmt: skip
        return DraftSpec("eagle", assistant_model, combined_lookup=request.lookup_tokens, **costs)
    if request.drafter == "suffix":
        return DraftSpec("suffix", suffix_cache=suffix_cache, cost_ratio=0.0)
    if request.drafter == "prompt_lookup":
        return DraftSpec("prompt_lookup", lookup_tokens=request.lookup_tokens, cost_ratio=0.0)
    if request.drafter == "early_exit":
        ranges.check_early_exit(request.exit_layers, target.layers)
        return DraftSpec("early_exit", exit_layers=request.exit_layers, cost_ratio=request.exit_layers / target.layers)
    if request.drafter == "none":
        return DraftSpec()
    if (tokenizer is None) != (assistant_tokenizer is None) and assistant_tokenizer is not None:
        raise refusal("tokenizer_pair", name="assistant_tokenizer")
    draft.check_rollback("assistant_model")
    costs = dict(
        cost_ratio=draft.parameters / target.parameters,
        prompt_pass_ratio=draft.body_parameters / target.body_parameters,
    )
    if tokenizer is not None and assistant_tokenizer is not None:
        if _translation_needed(target, draft, tokenizer, assistant_tokenizer):
            if static_shapes:
                raise refusal("translated_static", shapes=("static_shapes", True))
            return DraftSpec(
                "translated",
                assistant_model,
                tokenizer,
                assistant_tokenizer,
                position_limit=draft.max_positions,
                **costs,
            )
    elif draft.vocab_size != target.vocab_size:
        raise refusal("draft_vocabulary", {"draft": draft.vocab_size, "target": target.vocab_size},
                      name="assistant_model")  # fmt: skip
    return DraftSpec(
        "draft_model",
        assistant_model,
        position_limit=draft.max_positions if draft.position_table else None,
        key_limit=draft.key_limit[1] if draft.key_limit else None,
        **costs,
    )


def build_drafter(
    spec: DraftSpec,
    target_runner: ModelRunner,
    prepared_draft: PreTrainedModel | None,
    make_runner: RunnerFactory,
    static_shapes: bool,
    batch_size: int,
    vocab_size: int,
    rowwise: bool = False,
) -> Drafter | None:
    """The drafter for `spec` (None: plain decoding). `prepared_draft` is the backend-prepared assistant;
    `static_shapes` asks for exactly γ tokens every round; `vocab_size` is the target's logits width;
    `rowwise`: a draft of another tokenizer drafts row by row even for one row (a queue's slots take new rows)."""
    if spec.kind == "prompt_lookup":
        return PromptLookupDrafter(vocab_size, fixed_length=static_shapes)
    if spec.kind == "suffix":
        return SuffixDrafter(vocab_size, spec.suffix_cache, fixed_length=static_shapes)
    if spec.kind == "eagle":
        drafter = eagle.build_eagle_drafter(spec.assistant_model, target_runner, static_shapes, vocab_size)
        if spec.combined_lookup is None:
            return drafter
        free = SuffixDrafter(vocab_size, spec.suffix_cache, static_shapes) if spec.suffix_cache is not None else None
        return LookupOrHead(drafter, spec.combined_lookup, vocab_size, static_shapes, free)
    if spec.kind == "early_exit":
        view = make_runner(early_exit_view(target_runner.model, spec.exit_layers), limit=target_runner.position_limit)
        return EarlyExitDrafter(view, target_runner, spec.exit_layers)
    if spec.kind == "draft_model":
        limits = DraftLimits(spec.position_limit, spec.key_limit)
        return ModelDrafter(
            make_runner(prepared_draft), limits=limits, fixed_length=static_shapes, vocab_size=vocab_size
        )
    if spec.kind != "translated":
        return None
    draft_vocab = ModelFacts.of(prepared_draft).vocab_size

    def translating(rows: list[int] | None) -> TranslatingDrafter:
        return TranslatingDrafter(
            make_runner(prepared_draft, rows),
            target=codec_for(spec.tokenizer),
            draft=codec_for(spec.assistant_tokenizer),
            target_vocab=vocab_size,
            draft_vocab=draft_vocab,
            max_positions=spec.position_limit,
        )

    if batch_size == 1 and not rowwise:
        return translating(None)
    return RowwiseDrafter([translating([b]) for b in range(batch_size)], vocab_size, fresh=lambda: translating([0]))
