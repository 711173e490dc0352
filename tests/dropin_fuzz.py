"""A seeded differential fuzzer of the drop-in path: random `model.generate(...)` calls through
`assisted_backends.enable(model)` against transformers' own `generate` on an identical twin.

Every case derives from `(seed, index)` alone (`draw_case`), so a failing case is replayed with

    PYTHONPATH=. python -c "import sys; sys.path.insert(0, 'tests'); import dropin_fuzz; dropin_fuzz.replay(S, I)"

and `describe(case)` prints the call as a transformers user would write it.

What a case draws: an architecture (tiny random model, `architectures.build`), a prompt (one row, or a
left-padded batch with its mask), the length (`max_new_tokens` / `max_length` as keyword, in a
`generation_config=` object or on `model.generation_config`, or none at all), greedy / point-mass sampling
(top_k=1) / free sampling, logits-processor fields, EOS (`eos_token_id` int / list / `[]`) and pad ids,
a caller's `stopping_criteria=` (MaxLengthCriteria, EosTokenCriteria), stop strings (with a
character-level tokenizer trained here), drafting (`assistant_model` with a same-vocabulary draft, among
them drafts with fewer positions than the sequence; `prompt_lookup_num_tokens`; `assistant_early_exit`;
`num_assistant_tokens`) passed as keyword, in `generation_config=` or on `model.generation_config`, and
`return_dict_in_generate` with `output_scores` / `output_logits`.

The reference is the twin's (a deep copy taken before `enable`) transformers `generate` with the same
call minus the drafting arguments (greedy drafting never changes the tokens, and transformers' own
assisted decoding refuses batches). Verdicts:

- greedy and point-mass sampling: token-identical `sequences`; free sampling: both succeed with the same
  rows (and the same length when nothing can stop a row early);
- drafting asked for (any route): `model.generate.last_stats.drafter` must name a drafter;
- the package raising: a *documented refusal* when (type, message) matches `DOCUMENTED_REFUSALS`; an
  *undocumented refusal* (failure) when the package raised it itself; a *crash* (failure) when the
  exception comes from inside torch / transformers; both raising is consistent.
"""

from __future__ import annotations

import copy
import functools
import os
import random
import re
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import GenerationConfig, PreTrainedTokenizerFast
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, StoppingCriteriaList

import assisted_backends

PACKAGE_DIR = str(Path(assisted_backends.__file__).resolve().parent)
VOCAB = 128
ARCHS = ("llama", "gpt2", "opt", "mistral", "qwen2", "gemma2", "gpt_neox", "phi3")
EARLY_EXIT_ARCHS = ("llama", "mistral", "qwen2", "gemma2", "phi3")  # decoder layers under model.model.layers
SHORT_POSITIONS = 8  # a short-context draft: fewer positions than most prompts + new tokens
DEFAULT_SEED = 20_240_601

# (exception type, message pattern, reason): refusals the package documents as deliberate. Only the
# package's own statements of a feature it does not support belong here; never a crash, a wrong result or a
# refusal of something transformers' generate serves (those are the findings).
DOCUMENTED_REFUSALS: tuple[tuple[type, str, str], ...] = (
    (
        NotImplementedError,
        r"^output_(attentions|hidden_states)=True is not supported by assisted_backends",
        "attention weights and hidden states are not returned (README, drop-in section)",
    ),
    (
        ValueError,
        r"^generation_config\.num_beams=\d+ is not supported: beam search",
        "beam search is not supported (options.fields.REFUSED)",
    ),
    (
        NotImplementedError,
        r"mixes windowed \(sliding or chunked\) and full-attention layers, whose masks transformers \S+ cannot build",
        "hybrid-window models need transformers >= 4.55 (hf_compat.HYBRID_MASKS_FROM_CONFIG; docs/models.md)",
    ),
)


# Calls whose tokens the package deliberately gives differently from transformers (README, drop-in section):
# a batch with stop strings and no EOS id. transformers pads a finished row only when an EOS criterion exists,
# so a row that matched a stop string goes on generating until every row has matched; the package ends each
# row at its own stop string, as `model.generate` on that prompt alone does.
def documented_difference(case: Case) -> str | None:
    """Why the package's tokens may differ from transformers' batched generate for `case` (None: they may not)."""
    if len(case.prompt) < 2:
        return None
    eos_given = any(kind == "eos" for kind, _ in case.criteria) or _eos_set(case)
    if case.stop_strings and not eos_given:
        return "a batch with stop strings and no EOS: each row ends at its own stop string"
    fields = {**case.kwargs, **(case.config_fields or {}), **case.model_config_fields}
    padded = case.mask is not None and any(0 in row for row in case.mask)
    if padded and ({"min_length", "no_repeat_ngram_size"} & set(fields)):
        return "a left-padded batch: each row's processors see its own prompt (min_length, n-grams), as alone"
    return None


def _eos_set(case: Case) -> bool:
    for fields in (case.kwargs, case.config_fields or {}, case.model_config_fields):
        if fields.get("eos_token_id") not in (None, []):
            return True
    return "eos_token_id" not in {**case.kwargs, **(case.config_fields or {}), **case.model_config_fields} and (
        base_model(case.arch).generation_config.eos_token_id is not None
    )


# ----------------------------------------------------------------------------------------------- models


@functools.cache
def base_model(arch: str):
    from architectures import build

    return build(arch, seed=0)


def _position_key(arch: str) -> str:
    return "n_positions" if arch == "gpt2" else "max_position_embeddings"


@functools.cache
def draft_model(arch: str, kind: str):
    """Same-vocabulary drafts: a noisy copy of the target, an unrelated model, or one with few positions."""
    from architectures import build
    from tiny_models import noisy_copy

    if kind == "noisy":
        return noisy_copy(base_model(arch), seed=3, scale=0.05)
    if kind == "other":
        return build(arch, seed=1)
    if kind == "short":
        return build(arch, seed=1, **{_position_key(arch): SHORT_POSITIONS})
    raise ValueError(kind)


@functools.cache
def char_tokenizer() -> PreTrainedTokenizerFast:
    """A 128-entry tokenizer for the tiny models' vocabulary: 100 single characters (what encoding produces)
    and 28 two-character tokens (which models may generate), decoded by concatenation. Stop strings need it."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    singles = [chr(c) for c in range(33, 127)] + list("äöüéèà")  # 94 + 6 = 100
    doubles = ["ab", "ba", "cd", "dc", "ef", "fe", "gh", "hg", "ij", "ji", "kl", "lk", "mn", "nm", "op", "po",
               "qr", "rq", "st", "ts", "uv", "vu", "wx", "xw", "yz", "zy", "th", "he"]  # fmt: skip
    tokens = singles + doubles
    assert len(tokens) == VOCAB and len(set(tokens)) == VOCAB
    vocab = {token: index for index, token in enumerate(tokens)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="?"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="?")


# ------------------------------------------------------------------------------------------------- cases


@dataclass
class Case:
    seed: int
    index: int
    arch: str
    prompt: list[list[int]]  # [B][P], left padding included
    mask: list[list[int]] | None
    kwargs: dict = field(default_factory=dict)  # generate keywords (plain values; objects built at run time)
    config_fields: dict | None = None  # generation_config=GenerationConfig(**fields), None: not passed
    model_config_fields: dict = field(default_factory=dict)  # set on model.generation_config
    criteria: list[tuple[str, object]] = field(default_factory=list)  # ("max_length", n) / ("eos", ids)
    stop_strings: list[str] | None = None
    draft: str | None = None  # assistant_model kind: noisy / other / short
    mode: str = "greedy"  # greedy | point_mass | sample
    length_kind: str = "max_new_tokens"  # where the length comes from: max_new_tokens | max_length | none
    can_stop_early: bool = False

    @property
    def drafting(self) -> bool:
        names = ("prompt_lookup_num_tokens", "assistant_early_exit")
        sources = [self.kwargs, self.config_fields or {}, self.model_config_fields]
        return self.draft is not None or any(source.get(name) is not None for source in sources for name in names)


DRAFTING_FIELDS = ("prompt_lookup_num_tokens", "assistant_early_exit", "num_assistant_tokens")


def draw_case(seed: int, index: int) -> Case:
    """Case `index` of the run seeded `seed`: every choice from one generator seeded by (seed, index)."""
    rng = random.Random(f"{seed}:{index}")
    arch = rng.choice(ARCHS)
    batch = rng.choice([1, 1, 1, 2])
    length = rng.randint(2, 8)
    rows, mask = [], None
    pads = [0] * batch
    if batch > 1:
        pads = [rng.randint(0, min(3, length - 1)), 0]
        rng.shuffle(pads)
    pad_id = rng.choice([None, None, 0, 5]) if batch == 1 else rng.choice([0, 5])
    fill = pad_id if pad_id is not None else 0
    for row in range(batch):
        real = [rng.randrange(VOCAB) for _ in range(length - pads[row])]
        real = [token if token != pad_id else (token + 1) % VOCAB for token in real] if pad_id is not None else real
        rows.append([fill] * pads[row] + real)
    if batch > 1 or rng.random() < 0.3:
        mask = [[0] * pads[row] + [1] * (length - pads[row]) for row in range(batch)]

    case = Case(seed, index, arch, rows, mask)
    fields: dict = {}  # what the call asks for, then spread over keyword / generation_config / model config

    # length
    new = rng.randint(3, 14)
    length_kind = rng.choice(["max_new_tokens"] * 5 + ["max_length", "none"])
    case.length_kind = length_kind
    if length_kind == "max_new_tokens":
        fields["max_new_tokens"] = new
    elif length_kind == "max_length":
        fields["max_length"] = length + new

    # decoding mode
    case.mode = rng.choice(["greedy"] * 6 + ["point_mass", "sample", "sample"])
    if case.mode == "greedy":
        fields["do_sample"] = rng.choice([False, False, None])
    else:
        fields["do_sample"] = True
        fields["top_k"] = 1 if case.mode == "point_mass" else rng.choice([None, 5, 20])
        if case.mode == "sample":
            fields["temperature"] = rng.choice([None, 0.7, 1.3])
            fields["top_p"] = rng.choice([None, 0.9])

    # special tokens
    eos_kind = rng.choice(["none", "none", "int", "list", "empty"])
    eos_ids: list[int] = []
    if eos_kind == "empty" and pad_id is None and rng.random() < 0.7:
        pad_id = 5  # transformers itself needs a pad id with eos_token_id=[] (its IndexError otherwise)
    if eos_kind == "int":
        eos_ids = [rng.randrange(VOCAB)]
        fields["eos_token_id"] = eos_ids[0]
    elif eos_kind == "list":
        eos_ids = rng.sample(range(VOCAB), rng.randint(1, 3))
        fields["eos_token_id"] = list(eos_ids)
    elif eos_kind == "empty":
        fields["eos_token_id"] = []
    if pad_id is not None:
        fields["pad_token_id"] = pad_id

    # logits processors
    menu = {
        "repetition_penalty": lambda: rng.choice([1.2, 1.5, 0.8]),
        "no_repeat_ngram_size": lambda: rng.choice([1, 2, 3]),
        "min_new_tokens": lambda: rng.randint(1, 4),
        "min_length": lambda: length + rng.randint(1, 3),
        "bad_words_ids": lambda: [[rng.randrange(VOCAB)], [rng.randrange(VOCAB), rng.randrange(VOCAB)]],
        "suppress_tokens": lambda: rng.sample(range(VOCAB), 3),
        "begin_suppress_tokens": lambda: rng.sample(range(VOCAB), 2),
        "exponential_decay_length_penalty": lambda: (rng.randint(1, 4), rng.choice([1.2, 1.5])),
        "forced_eos_token_id": lambda: rng.randrange(VOCAB),
        "sequence_bias": lambda: {(rng.randrange(VOCAB),): rng.choice([-5.0, 5.0])},
        "renormalize_logits": lambda: True,
    }
    if eos_kind == "none":  # transformers' own ExponentialDecayLengthPenalty needs an EOS list
        del menu["exponential_decay_length_penalty"]
    for name in rng.sample(sorted(menu), rng.choice([0, 0, 1, 1, 2, 3])):
        fields[name] = menu[name]()

    # drafting
    drafting_kind = rng.choice(["none"] * 4 + ["assistant", "assistant", "prompt_lookup", "early_exit"])
    if drafting_kind == "early_exit" and arch not in EARLY_EXIT_ARCHS:
        drafting_kind = "prompt_lookup"
    if drafting_kind == "assistant":
        case.draft = rng.choice(["noisy", "noisy", "other", "short"])
    elif drafting_kind == "prompt_lookup":
        fields["prompt_lookup_num_tokens"] = rng.randint(1, 4)
    elif drafting_kind == "early_exit":
        fields["assistant_early_exit"] = 1
    if drafting_kind != "none" and rng.random() < 0.5:
        fields["num_assistant_tokens"] = rng.randint(1, 6)

    # where each field goes: keyword, generation_config= object, or the model's own generation_config
    config_fields: dict = {}
    use_config = rng.random() < 0.4
    places = ["kwarg", "kwarg", "model"] + (["config", "config"] if use_config else [])
    for name, value in fields.items():
        if value is not None:
            where = rng.choice(places)
            {"kwarg": case.kwargs, "config": config_fields, "model": case.model_config_fields}[where][name] = value
    if use_config:
        case.config_fields = config_fields

    # a caller's stopping criteria
    criteria_kind = rng.choice(["none"] * 5 + ["max_length", "eos", "both"])
    if criteria_kind in ("max_length", "both"):
        case.criteria.append(("max_length", length + rng.randint(1, 5)))
    if criteria_kind in ("eos", "both"):
        case.criteria.append(("eos", rng.sample(range(VOCAB), 2)))
        if fields.get("pad_token_id") is None:  # transformers pads finished rows with it (TypeError without)
            case.kwargs["pad_token_id"] = 0

    # stop strings (with the tokenizer)
    if rng.random() < 0.15:
        tokens = char_tokenizer().convert_ids_to_tokens(list(range(VOCAB)))
        case.stop_strings = [rng.choice(tokens) for _ in range(rng.randint(1, 3))]
        if rng.random() < 0.5:  # a string spanning two tokens
            case.stop_strings.append(rng.choice(tokens[:94]) + rng.choice(tokens[:94]))

    # output format
    output = rng.choice(["tensor"] * 9 + ["dict", "dict", "scores", "logits"])
    if output != "tensor":
        case.kwargs["return_dict_in_generate"] = True
    if output == "scores":
        case.kwargs["output_scores"] = True
    elif output == "logits":
        case.kwargs["output_logits"] = True

    case.can_stop_early = bool(eos_ids or case.criteria or case.stop_strings or "forced_eos_token_id" in fields)
    return case


# ---------------------------------------------------------------------------------------------- running


def _criteria(case: Case):
    if not case.criteria:
        return None
    built = []
    for kind, value in case.criteria:
        built.append(MaxLengthCriteria(max_length=value) if kind == "max_length" else EosTokenCriteria(value))
    return StoppingCriteriaList(built)


def _call_arguments(case: Case, with_drafting: bool) -> tuple[torch.Tensor, dict]:
    prompt = torch.tensor(case.prompt)
    kwargs = dict(case.kwargs)
    if case.mask is not None:
        kwargs["attention_mask"] = torch.tensor(case.mask)
    if case.config_fields is not None:
        fields = dict(case.config_fields)
        if not with_drafting:
            for name in DRAFTING_FIELDS:
                fields.pop(name, None)
        kwargs["generation_config"] = GenerationConfig(**fields)
    criteria = _criteria(case)
    if criteria is not None:
        kwargs["stopping_criteria"] = criteria
    if case.stop_strings:
        kwargs["stop_strings"] = list(case.stop_strings)
        kwargs["tokenizer"] = char_tokenizer()
    if not with_drafting:
        for name in DRAFTING_FIELDS:
            kwargs.pop(name, None)
    elif case.draft is not None:
        kwargs["assistant_model"] = draft_model(case.arch, case.draft)
    return prompt, kwargs


def models_for(case: Case):
    """(target with the package enabled, twin with transformers' own generate), identical weights and
    generation configs (the twin's without drafting fields)."""
    base = base_model(case.arch)
    target = copy.deepcopy(base)
    for name, value in case.model_config_fields.items():
        setattr(target.generation_config, name, value)
    twin = copy.deepcopy(target)
    for name in DRAFTING_FIELDS:
        if name in case.model_config_fields:
            setattr(twin.generation_config, name, getattr(GenerationConfig(), name))
    assisted_backends.enable(target)
    return target, twin


@dataclass
class Outcome:
    # pass | documented_refusal | documented_difference | both_raise | package_lenient (passes);
    # undocumented_refusal | crash | mismatch |
    # drafter_ignored (failures)
    verdict: str
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.verdict in ("undocumented_refusal", "crash", "mismatch", "drafter_ignored")


def _compare_steps(name: str, ours, theirs) -> str | None:
    """`scores` / `logits` per generated step: the same count, and the same values where the package has them
    (NaN: a row that had ended; the verify pass's fp32 matmul may differ from a one-token step in the last bits)."""
    if (ours is None) != (theirs is None):
        counts = ["none" if steps is None else len(steps) for steps in (ours, theirs)]
        return f"{name}: package {counts[0]} vs transformers {counts[1]}"
    if ours is None:
        return None
    if len(ours) != len(theirs):
        return f"{name}: {len(ours)} steps vs transformers' {len(theirs)}"
    for step, (a, b) in enumerate(zip(ours, theirs)):
        known = ~torch.isnan(a)
        if a.shape != b.shape or not torch.allclose(a[known], b.to(a.dtype)[known], atol=2e-3, rtol=1e-3):
            largest = float((a[known] - b[known]).abs().nan_to_num().max())
            return f"{name}: step {step} differs (max |difference| {largest:.2e})"
    return None


def _raised_by_package(error: BaseException) -> bool:
    """Whether the innermost frame of `error`'s traceback is this package's code."""
    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and str(Path(frames[-1].filename).resolve()).startswith(PACKAGE_DIR)


def documented_reason(error: BaseException) -> str | None:
    for kind, pattern, reason in DOCUMENTED_REFUSALS:
        if isinstance(error, kind) and re.search(pattern, str(error)):
            return reason
    return None


def _sequences(output) -> torch.Tensor:
    return output if isinstance(output, torch.Tensor) else output.sequences


def _generate(model, case: Case, with_drafting: bool):
    prompt, kwargs = _call_arguments(case, with_drafting)
    torch.manual_seed(1234)
    with torch.inference_mode():
        return model.generate(prompt, **kwargs)


def run_case(case: Case) -> Outcome:
    target, twin = models_for(case)
    try:
        expected, reference_error = _generate(twin, case, with_drafting=False), None
    except Exception as error:  # noqa: BLE001 - transformers refusing the call is a verdict too
        expected, reference_error = None, error
    try:
        got = _generate(target, case, with_drafting=True)
    except Exception as error:  # noqa: BLE001
        message = f"{type(error).__name__}: {error}".splitlines()[0][:300]
        if reference_error is not None:
            return Outcome(
                "both_raise", f"{message} | transformers: {type(reference_error).__name__}: {reference_error}"[:400]
            )
        reason = documented_reason(error)
        if reason is not None:
            return Outcome("documented_refusal", f"{message} ({reason})")
        if _raised_by_package(error):
            return Outcome("undocumented_refusal", message)
        where = traceback.extract_tb(error.__traceback__)[-1]
        return Outcome("crash", f"{message} [at {Path(where.filename).name}:{where.lineno} in {where.name}]")
    if reference_error is not None:
        return Outcome(
            "package_lenient", f"transformers raised {type(reference_error).__name__}: {reference_error}"[:300]
        )
    stats = target.generate.last_stats
    if case.drafting and (stats is None or stats.drafter == "none"):
        return Outcome(
            "drafter_ignored", f"drafting was asked for but stats.drafter={getattr(stats, 'drafter', None)!r}"
        )
    ours, theirs = _sequences(got), _sequences(expected)
    if type(got).__name__ != type(expected).__name__ and not (
        isinstance(got, torch.Tensor) and isinstance(expected, torch.Tensor)
    ):
        return Outcome("mismatch", f"return type {type(got).__name__} != transformers' {type(expected).__name__}")
    if case.mode in ("greedy", "point_mass"):
        if ours.shape != theirs.shape or not torch.equal(ours, theirs):
            difference = documented_difference(case)
            if difference is not None:
                return Outcome("documented_difference", difference)
            return Outcome("mismatch", f"sequences differ: package {ours.tolist()} vs transformers {theirs.tolist()}")
        for name in ("scores", "logits"):
            problem = _compare_steps(name, getattr(got, name, None), getattr(expected, name, None))
            if problem is not None:
                difference = documented_difference(case) if name == "scores" else None
                return Outcome("documented_difference", difference) if difference else Outcome("mismatch", problem)
        return Outcome("pass")
    if ours.shape[0] != theirs.shape[0] or (not case.can_stop_early and ours.shape != theirs.shape):
        return Outcome(
            "mismatch", f"sampled shapes differ: package {tuple(ours.shape)} vs transformers {tuple(theirs.shape)}"
        )
    return Outcome("pass")


# ------------------------------------------------------------------------------------------- describing


def describe(case: Case) -> str:
    """The case as code a transformers user would write (plus how to replay it)."""
    lines = [
        f"# dropin_fuzz case (seed={case.seed}, index={case.index}): {case.mode}",
        f"model = architectures.build({case.arch!r}, seed=0)  # tests/architectures.py",
    ]
    for name, value in case.model_config_fields.items():
        lines.append(f"model.generation_config.{name} = {value!r}")
    lines.append("twin = copy.deepcopy(model); assisted_backends.enable(model)")
    arguments = [f"torch.tensor({case.prompt})"]
    if case.mask is not None:
        arguments.append(f"attention_mask=torch.tensor({case.mask})")
    arguments += [f"{name}={value!r}" for name, value in case.kwargs.items()]
    if case.config_fields is not None:
        inner = ", ".join(f"{name}={value!r}" for name, value in case.config_fields.items())
        arguments.append(f"generation_config=GenerationConfig({inner})")
    if case.criteria:
        built = ", ".join(
            f"MaxLengthCriteria(max_length={v})" if k == "max_length" else f"EosTokenCriteria({v})"
            for k, v in case.criteria
        )
        arguments.append(f"stopping_criteria=StoppingCriteriaList([{built}])")
    if case.stop_strings:
        arguments.append(f"stop_strings={case.stop_strings!r}, tokenizer=dropin_fuzz.char_tokenizer()")
    if case.draft is not None:
        arguments.append(f"assistant_model=dropin_fuzz.draft_model({case.arch!r}, {case.draft!r})")
        if case.draft == "short":
            lines.append(f"# the draft has {_position_key(case.arch)}={SHORT_POSITIONS}")
    lines.append("torch.manual_seed(1234)")
    lines.append("model.generate(" + ", ".join(arguments) + ")")
    lines.append(
        f"# replay: PYTHONPATH=. python -c \"import sys; sys.path.insert(0, 'tests'); import dropin_fuzz; "
        f'dropin_fuzz.replay({case.seed}, {case.index})"'
    )
    return "\n".join(lines)


def replay(seed: int, index: int) -> Outcome:
    case = draw_case(seed, index)
    print(describe(case))
    outcome = run_case(case)
    print(f"-> {outcome.verdict}: {outcome.detail}")
    return outcome


def seed_from_env() -> int:
    return int(os.environ.get("ASSISTED_BACKENDS_FUZZ_SEED", DEFAULT_SEED))


def failure_class(case: Case, outcome: Outcome) -> str:
    """A short signature grouping failures of one cause (for the long run's summary)."""
    detail = re.sub(r"\d+", "N", outcome.detail)
    if outcome.verdict == "mismatch":
        tags = []
        if case.criteria:
            tags.append("stopping_criteria=" + "+".join(kind for kind, _ in case.criteria))
        if case.stop_strings:
            tags.append("stop_strings")
        if len(case.prompt) > 1:
            tags.append("batch")
        return f"mismatch [{', '.join(tags) or 'other'}]"
    if outcome.verdict == "drafter_ignored":
        routes = [
            name for name in ("prompt_lookup_num_tokens", "assistant_early_exit") if name in case.model_config_fields
        ]
        return f"drafter_ignored [model.generation_config: {', '.join(routes) or '?'}]"
    if "max_new_tokens is required" in outcome.detail:
        return f"{outcome.verdict}: {detail[:100]} [length: {case.length_kind}]"
    if "positions" in outcome.detail and case.draft == "short":
        return f"{outcome.verdict}: short-context draft refused [{detail[:100]}]"
    return f"{outcome.verdict}: {detail[:120]}"
