"""Structured output (`assisted_backends.structured`): a grammar as a prefix-dependent logits processor keeps
speculative decoding exact.

On the shipped demo pair (a trained target and draft with their byte-level BPE tokenizer): greedy plain, prompt
lookup and draft-model decoding give `model.generate`'s tokens under the same grammar, and the text parses and
matches its schema; seeded sampling gives the package's plain tokens whatever the drafter; a batch whose rows
follow two different schemas; a regular expression; the processor's mask is a function of the prefix alone
(asked out of order, after rejected tails); EOS only once the JSON is complete; a missing library names the extra.
"""

from __future__ import annotations

import json
import re
import sys

import pytest
import torch

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

from json_schemas import FLAG, PERSON  # noqa: E402

import assisted_backends  # noqa: E402
from assisted_backends import structured  # noqa: E402
from tests.demo_pair_fixtures import demo_pair  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = 'config = {"name": "os", "count": 3}\nresult = '
OTHER = "def main(argv=None):\n    options = "
NEW_TOKENS = 64
DRAFTERS = {"plain": {}, "prompt lookup": {"prompt_lookup_num_tokens": 4}, "draft model": {"assistant_model": None}}


@pytest.fixture(scope="module")
def pair():
    return demo_pair()


def _drafting(name: str, draft) -> dict:
    return {"assistant_model": draft} if name == "draft model" else DRAFTERS[name]


def _answer(tokenizer, sequence: torch.Tensor, prompt_length: int, schema: dict) -> dict:
    """The new tokens as JSON, checked against `schema`; they end with EOS (the JSON was complete)."""
    new = sequence[prompt_length:]
    assert int(new[-1]) == tokenizer.eos_token_id, "the answer did not end with EOS"
    value = json.loads(tokenizer.decode(new, skip_special_tokens=True))
    jsonschema.validate(value, schema)
    return value


def _reference(target, ids: torch.Tensor, processor, **kwargs) -> torch.Tensor:
    with torch.inference_mode():
        return target.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=1,
                               logits_processor=[processor.for_new_sequence()], **kwargs)  # fmt: skip


@pytest.mark.parametrize("drafter", list(DRAFTERS))
def test_greedy_json_schema_is_model_generate_under_every_drafter(pair, drafter):
    target, draft, tokenizer = pair
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    processor = structured.json_schema(PERSON, tokenizer)
    reference = _reference(target, ids, processor)
    _answer(tokenizer, reference[0], ids.shape[1], PERSON)
    result = assisted_backends.generate(target, ids, max_new_tokens=NEW_TOKENS, logits_processor=[processor],
                                        **_drafting(drafter, draft))  # fmt: skip
    assert torch.equal(result.sequences, reference)


def test_json_object_changes_the_answer_and_every_token_keeps_to_json(pair):
    """The mask changes the answer (the test can fail): unconstrained the target writes code; under
    `json_object` its text opens an object and every token keeps to JSON (this small model never closes it)."""
    target, draft, tokenizer = pair
    ids = tokenizer(OTHER, return_tensors="pt").input_ids
    processor = structured.json_object(tokenizer)
    plain = assisted_backends.generate(target, ids, max_new_tokens=24, assistant_model=draft).sequences
    constrained = assisted_backends.generate(
        target, ids, max_new_tokens=24, assistant_model=draft, logits_processor=[processor]
    ).sequences
    new = constrained[0, ids.shape[1] :].tolist()
    assert plain[0, ids.shape[1] :].tolist() != new
    assert tokenizer.decode(new).startswith("{")
    assert processor.grammar.matcher().try_consume_tokens(new) == len(new)
    with torch.inference_mode():
        reference = target.generate(ids, max_new_tokens=24, do_sample=False, pad_token_id=1,
                                    logits_processor=[processor.for_new_sequence()])  # fmt: skip
    assert torch.equal(constrained, reference)


@pytest.mark.parametrize("drafter", list(DRAFTERS))
def test_seeded_sampling_reproduces_its_tokens_and_keeps_to_the_schema(pair, drafter):
    """Sampled answers parse under the schema whatever the drafter, and a seed gives its tokens again (across
    drafters the package's sampling is equal in distribution, not token for token: docs/design.md rule 2)."""
    target, draft, tokenizer = pair
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    processor = structured.json_schema(PERSON, tokenizer)
    runs = [
        assisted_backends.generate(target, ids, max_new_tokens=NEW_TOKENS, do_sample=True, top_k=0, temperature=0.9,
                                   seed=seed, logits_processor=[processor], **_drafting(drafter, draft)).sequences
        for seed in (0, 0, 1)
    ]  # fmt: skip
    assert torch.equal(runs[0], runs[1])
    for tokens in runs:
        _answer(tokenizer, tokens[0], ids.shape[1], PERSON)


def test_batch_rows_follow_their_own_schemas(pair):
    """Two prompts, two schemas, one left-padded batch: each row is its `model.generate` row and parses under its
    own schema, with a draft model and with prompt lookup."""
    target, draft, tokenizer = pair
    prompts = [tokenizer(text).input_ids for text in (PROMPT, OTHER)]
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[1] * (width - len(p)) + p for p in prompts])
    mask = (ids != 1).long()
    processor = structured.by_prompt([(prompts[0], structured.json_schema(PERSON, tokenizer)),
                                      (prompts[1], structured.json_schema(FLAG, tokenizer))])  # fmt: skip
    reference = _reference(target, ids, processor, attention_mask=mask)
    for drafter in ("draft model", "prompt lookup"):
        result = assisted_backends.generate(target, ids, attention_mask=mask, max_new_tokens=NEW_TOKENS,
                                            logits_processor=[processor], **_drafting(drafter, draft))  # fmt: skip
        for row, schema in enumerate((PERSON, FLAG)):
            tokens = result.sequences[row, width:]
            eos = (tokens == tokenizer.eos_token_id).nonzero()
            end = int(eos[0]) + 1 if eos.numel() else tokens.shape[0]
            assert torch.equal(tokens[:end], reference[row, width:][:end]), (drafter, row)
            _answer(tokenizer, torch.cat([ids[row], tokens[:end]]), width, schema)


def test_regex_answer_matches_and_equals_plain(pair):
    target, draft, tokenizer = pair
    ids = tokenizer("    version = ", return_tensors="pt").input_ids
    processor = structured.regex(r'"[0-9]{1,2}\.[0-9]{1,2}\.[0-9]{1,2}"', tokenizer)
    reference = _reference(target, ids, processor)
    text = tokenizer.decode(reference[0, ids.shape[1] :], skip_special_tokens=True)
    assert re.fullmatch(r'"[0-9]{1,2}\.[0-9]{1,2}\.[0-9]{1,2}"', text), text
    result = assisted_backends.generate(target, ids, max_new_tokens=NEW_TOKENS, assistant_model=draft,
                                        logits_processor=[processor])  # fmt: skip
    assert torch.equal(result.sequences, reference)


def test_mask_is_a_function_of_the_prefix_alone(pair):
    """Prefixes asked in a speculative order (extended by draft tokens, cut back to a rejected tail, extended
    again, one of them leaving the grammar) get the masks a new processor gives each prefix asked alone."""
    _, _, tokenizer = pair
    prompt = tokenizer(PROMPT).input_ids
    answer = tokenizer('{"name":"ab","count":12,"tags":["x"]}').input_ids
    outside = tokenizer("}}}").input_ids
    lengths = [0, 3, 5, 2, 6, 4, len(answer), 1, len(answer), 0]
    prefixes = [prompt + answer[:n] for n in lengths] + [prompt + answer[:3] + outside, prompt + answer[:4]]
    processor = structured.json_schema(PERSON, tokenizer)
    vocab = len(tokenizer)
    for prefix in prefixes:
        ids = torch.tensor([prefix])
        seen = processor(ids, torch.zeros(1, vocab))
        alone = processor.for_new_sequence()
        alone(torch.tensor([prompt]), torch.zeros(1, vocab))  # the sequence starts at its prompt
        assert torch.equal(seen, alone(ids, torch.zeros(1, vocab))), len(prefix)
    cut = processor(torch.tensor([prompt + answer[:3] + outside]), torch.zeros(1, vocab))
    assert torch.isfinite(cut).all()  # after a token the grammar forbids: nothing masked (rejected anyway)


def test_eos_only_once_the_json_is_complete(pair):
    _, _, tokenizer = pair
    prompt = tokenizer(PROMPT).input_ids
    answer = tokenizer('{"name":"ab","count":12,"tags":["x"]}').input_ids
    processor = structured.json_schema(PERSON, tokenizer)
    eos = tokenizer.eos_token_id
    for n in range(len(answer) + 1):
        scores = processor(torch.tensor([prompt + answer[:n]]), torch.zeros(1, len(tokenizer)))[0]
        assert torch.isfinite(scores[eos]) == (n == len(answer)), n
    assert torch.isfinite(scores).sum() == 1  # complete: EOS alone


def test_missing_library_names_the_extra(monkeypatch, pair):
    monkeypatch.setitem(sys.modules, "llguidance", None)
    with pytest.raises(ImportError, match=r"\.\[structured\]"):
        structured.json_object(pair[2])


def test_bad_schema_is_refused_by_name(pair):
    with pytest.raises(ValueError, match="schema"):
        structured.json_schema("{not json", pair[2])
    with pytest.raises(ValueError, match="grammars"):
        structured.by_prompt([])


def test_a_queue_gives_each_prompt_its_own_grammar_state(pair):
    """Three prompts through two slots with a draft model: each answer is `model.generate`'s for its prompt alone
    under its own schema (the third joins when a row frees its slot)."""
    target, draft, tokenizer = pair
    texts = (PROMPT, OTHER, "    settings = ")
    prompts = [tokenizer(text).input_ids for text in texts]
    schemas = (PERSON, FLAG, FLAG)
    processor = structured.by_prompt(
        [(prompt, structured.json_schema(schema, tokenizer)) for prompt, schema in zip(prompts, schemas)]
    )
    result = assisted_backends.generate_queue(target, prompts, slots=2, assistant_model=draft,
                                              max_new_tokens=NEW_TOKENS, logits_processor=[processor])  # fmt: skip
    for prompt, tokens, schema in zip(prompts, result.tokens, schemas):
        ids = torch.tensor([prompt])
        assert torch.equal(tokens, _reference(target, ids, processor)[0, len(prompt) :])
        _answer(tokenizer, torch.cat([ids[0], tokens]), len(prompt), schema)


def _exact_answers(
    model, ids: torch.Tensor, processor, eos: int, depth: int, temperature: float = 1.0
) -> dict[tuple[int, ...], float]:
    """P(answer) for every answer (new tokens through EOS, or `depth` of them) plain sampling at `temperature`
    can give under `processor`, by walking the tree of allowed tokens (branches below 1e-7 dropped)."""
    answers: dict[tuple[int, ...], float] = {}
    grammar = processor.for_new_sequence()
    grammar(ids, torch.zeros(1, model.config.vocab_size))  # the sequence starts at its prompt

    def walk(tokens: tuple[int, ...], probability: float) -> None:
        if (tokens and tokens[-1] == eos) or len(tokens) == depth:
            answers[tokens] = probability
            return
        prefix = torch.cat([ids, torch.tensor([tokens], dtype=torch.long)], dim=1)
        with torch.inference_mode():
            logits = model(prefix).logits[:, -1].float()
        probs = torch.softmax(grammar(prefix, logits) / temperature, dim=-1)[0].double()
        for token in (probs * probability > 1e-7).nonzero().flatten().tolist():
            walk((*tokens, token), probability * float(probs[token]))

    walk((), 1.0)
    return answers


class _Unchecked(structured.GrammarProcessor):
    """The same mask, without telling the engine which drafts it forbids (every draft is verified)."""

    allowed_count = None

    def for_new_sequence(self) -> _Unchecked:
        return _Unchecked(self.grammar)


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["prompt lookup", "draft model"])
def test_sampling_under_a_grammar_keeps_the_plain_distribution(pair, drafter):
    """Answers sampled with a drafter under a regex follow the exact distribution plain sampling has under it
    (chi-square, false alarms <= 1e-3), and the test tells sampling at another temperature apart. Prompt lookup's
    drafts are all verified (`_Unchecked`), so that the rejection rule meets drafts the mask forbids; the draft
    model's drafts come from its own masked scores."""
    from stats_tools import chi_square_p_value

    target, draft, tokenizer = pair
    ids = tokenizer("a = True\nb = None\nc = False\nd =", return_tensors="pt").input_ids
    processor = structured.regex(r" (True|False|None)\n", tokenizer)
    if drafter == "prompt lookup":
        processor = _Unchecked(processor.grammar)
    eos = tokenizer.eos_token_id
    exact = _exact_answers(target, ids, processor, eos, depth=6)
    other = _exact_answers(target, ids, processor, eos, depth=6, temperature=2.0)
    cells = list(exact)
    counts = torch.zeros(len(cells) + 1, dtype=torch.float64)
    accepted = drafted = 0
    for seed in range(600):
        result = assisted_backends.generate(target, ids, max_new_tokens=6, do_sample=True, top_k=0, seed=seed,
                                            num_assistant_tokens=3,
                                            logits_processor=[processor], **_drafting(drafter, draft))  # fmt: skip
        answer = tuple(result.sequences[0, ids.shape[1] :].tolist())
        counts[cells.index(answer) if answer in exact else -1] += 1
        accepted, drafted = accepted + result.stats.accepted, drafted + result.stats.drafted
    assert 0 < accepted < drafted, "drafts must be both accepted and rejected for the test to mean anything"
    expected = torch.tensor([*exact.values(), max(0.0, 1 - sum(exact.values()))], dtype=torch.float64)
    assert chi_square_p_value(counts, expected) > 1e-3
    wrong = torch.tensor([*(other.get(cell, 0.0) for cell in cells), 0.0], dtype=torch.float64)
    wrong[-1] = max(0.0, 1 - float(wrong.sum()))
    assert chi_square_p_value(counts, wrong) < 1e-3, "power check: another distribution must be told apart"


def test_drafts_the_grammar_forbids_are_not_verified(pair):
    """Prompt lookup proposes the prompt's own JSON keys, which the schema forbids: with the processor's
    `allowed_count` the round verifies no draft past the first forbidden one (`TokenSelector.allowed_drafts`):
    fewer drafts fed, the same drafts accepted, the same tokens."""
    target, _, tokenizer = pair
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    grammar = structured.json_schema(PERSON, tokenizer).grammar
    cut, uncut = (
        assisted_backends.generate(target, ids, max_new_tokens=NEW_TOKENS, logits_processor=[kind(grammar)],
                                   prompt_lookup_num_tokens=4, num_assistant_tokens=4, schedule="constant")
        for kind in (structured.GrammarProcessor, _Unchecked)
    )  # fmt: skip
    assert torch.equal(cut.sequences, uncut.sequences)
    assert cut.stats.accepted == uncut.stats.accepted and cut.stats.rounds == uncut.stats.rounds
    assert cut.stats.drafted < uncut.stats.drafted, (cut.stats.drafted, uncut.stats.drafted)
