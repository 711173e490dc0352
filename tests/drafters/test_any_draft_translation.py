"""Translation between two tokenizers through bytes: round trips, windows, boundaries, special tokens."""

import random

import pytest
from any_draft_fixtures import MEMORIZED, PROMPTS, saved_tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from assisted_backends.drafters.any_pair.token_bytes import ByteCodec, utf8_runs
from assisted_backends.drafters.any_pair.translation import DraftContext, translate_proposal

TEXTS = PROMPTS + [MEMORIZED, "a  b   c\t\td\n\n\ne", "12345 678.9 0x1F", "日本語🙂é", " x", "x "]


@pytest.fixture(scope="module")
def codecs(tmp_path_factory):
    target, draft = saved_tokenizers(tmp_path_factory.mktemp("tokenizers"))
    return {"bpe": (target, ByteCodec(target)), "unigram": (draft, ByteCodec(draft))}


@pytest.mark.parametrize("name", ["bpe", "unigram"])
def test_bytes_round_trip_for_any_text_cut_anywhere(codecs, name):
    _, codec = codecs[name]
    rng = random.Random(0)
    samples = [t.encode() for t in TEXTS]
    samples += [t.encode()[: rng.randrange(len(t.encode()) + 1)] for t in TEXTS]  # cut inside characters
    samples += [t.encode()[rng.randrange(len(t.encode()) + 1) :] for t in TEXTS]
    samples += [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 12))) for _ in range(200)]  # not UTF-8
    for data in samples:
        piece = codec.encode(data)
        assert piece.exact and codec.bytes_of(piece.ids) == data, data


@pytest.mark.parametrize("name", ["bpe", "unigram"])
def test_token_bytes_agree_with_the_tokenizers_decode(codecs, name):
    tokenizer, codec = codecs[name]
    for text in TEXTS:
        ids = tokenizer(text, add_special_tokens=False).input_ids
        spelled = codec.bytes_of(ids)
        assert spelled is not None
        assert spelled.decode().strip() == tokenizer.decode(ids).strip()  # decode may drop one leading space
    for special in tokenizer.all_special_ids:
        assert codec.is_special(special) and codec.bytes_of([special]) is None
    assert all(token_id is not None for token_id in codec.byte_ids), "every byte must be spellable"


def test_byte_fallback_pieces_spell_single_bytes(codecs):
    tokenizer, codec = codecs["unigram"]
    piece = tokenizer.convert_tokens_to_ids("<0xE6>")
    assert codec.token_bytes[piece] == b"\xe6" and codec.byte_ids[0xE6] == piece
    meta = tokenizer.convert_tokens_to_ids("▁")
    assert codec.token_bytes[meta] == b" "


def test_text_start_keeps_the_sentencepiece_word_start_space(codecs):
    tokenizer, codec = codecs["unigram"]
    natural = tokenizer("once upon", add_special_tokens=False).input_ids
    piece = codec.encode(b"once upon", at_text_start=True)
    assert piece.ids == natural and piece.virtual_space
    assert not codec.encode(b"once upon").virtual_space


@pytest.mark.parametrize("direction", [("bpe", "unigram"), ("unigram", "bpe")])
@pytest.mark.parametrize("chunk", [1, 3, 7])
def test_incremental_context_matches_a_whole_encoding(codecs, direction, chunk):
    (target_tokenizer, target), (_, draft) = codecs[direction[0]], codecs[direction[1]]
    for text in TEXTS:
        target_ids = target_tokenizer(text, add_special_tokens=False).input_ids
        context = DraftContext(target, draft)
        for start in range(0, len(target_ids), chunk):
            context.extend(target_ids[start : start + chunk])
            seen = target.bytes_of(target_ids[: start + chunk])
            spelled = draft.bytes_of(context.ids)
            assert spelled in (seen, b" " + seen), "the draft's context must spell exactly the committed text"
            assert context.ends[-1] == len(seen) if context.ids else True
        whole = draft.encode(bytes(context.text), at_text_start=True).ids
        if b"  " not in context.text and b"\t" not in context.text:
            assert context.ids == whole, text  # word-start windows reproduce the whole-text encoding


def test_window_bounds_the_work_per_round(codecs):
    (target_tokenizer, target), (_, draft) = codecs["bpe"], codecs["unigram"]
    target_ids = target_tokenizer(MEMORIZED * 3, add_special_tokens=False).input_ids
    context = DraftContext(target, draft, window=4)
    encoded = []
    original = draft.encode
    draft.encode = lambda data, at_text_start=False: encoded.append(len(data)) or original(data, at_text_start)
    try:
        for token_id in target_ids:
            context.extend([token_id])
    finally:
        del draft.encode
    longest_token = max(len(draft.token_bytes[i]) for i in context.ids)
    assert max(encoded) <= (4 * 4 + 4) * longest_token, "a round re-encodes a bounded window, never the prefix"
    assert draft.bytes_of(context.ids) in (bytes(context.text), b" " + bytes(context.text))


def test_special_tokens_translate_by_role(codecs):
    (target_tokenizer, target), (draft_tokenizer, draft) = codecs["bpe"], codecs["unigram"]
    hello = target_tokenizer("hello", add_special_tokens=False).input_ids
    context = DraftContext(target, draft)
    context.extend(hello + [target_tokenizer.eos_token_id] + hello)
    # target <|endoftext|> (its bos and eos) -> the draft's special of the same role
    assert {draft_tokenizer.bos_token_id, draft_tokenizer.eos_token_id} & set(context.ids)
    # each text segment starts as the draft tokenizer starts a text (its word-start space included)
    assert draft.bytes_of([i for i in context.ids if not draft.is_special(i)]) == b" hello hello"
    proposal = translate_proposal(
        draft_tokenizer("▁hi", add_special_tokens=False).input_ids + [draft_tokenizer.eos_token_id, 5],
        hello,
        draft,
        target,
    )
    assert proposal.ids[-1] == target_tokenizer.eos_token_id and proposal.final == len(proposal.ids)
    assert target.bytes_of(proposal.ids[:-1]) == draft.bytes_of(
        draft_tokenizer("▁hi", add_special_tokens=False).input_ids
    )


def test_boundary_straddling_proposal(codecs):
    (target_tokenizer, target), (_, draft) = codecs["bpe"], codecs["unigram"]
    committed = target_tokenizer("the robot who lo", add_special_tokens=False).input_ids
    new = draft.encode(b"ved to count the st").ids
    proposal = translate_proposal(new, committed, draft, target)
    assert target.bytes_of(proposal.ids) == b"ved to count the st"
    # The committed "lo" stays; the proposal continues it. " st" (the unfinished last word) is not final.
    final_bytes = target.bytes_of(proposal.ids[: proposal.final])
    assert final_bytes == b"ved to count the"
    # The count follows the target's tokens, not the draft's.
    assert proposal.ids == target.encode(b"ved to count the st").ids
    # A proposal starting a new word merges the way the target would tokenize the whole text.
    whole = target_tokenizer("the robot who loved to count", add_special_tokens=False).input_ids
    head = target_tokenizer("the robot who loved", add_special_tokens=False).input_ids
    assert whole[: len(head)] == head
    proposal = translate_proposal(draft.encode(b" to count").ids, head, draft, target)
    assert head + proposal.ids == whole


def test_round_trip_target_to_draft_and_back(codecs):
    (target_tokenizer, target), (_, draft) = codecs["bpe"], codecs["unigram"]
    for text in TEXTS:
        target_ids = target_tokenizer(text, add_special_tokens=False).input_ids
        context = DraftContext(target, draft)
        context.extend(target_ids)
        back = translate_proposal(context.ids, [], draft, target).ids
        assert target.bytes_of(back).lstrip(b" ") == text.encode().lstrip(b" ")
        if not text.startswith(" "):
            assert target.bytes_of(back) in (text.encode(), b" " + text.encode())


def test_unsupported_decoder_is_a_clear_error():
    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.decoder = decoders.WordPiece()
    with pytest.raises(NotImplementedError, match="WordPiece.*not supported"):
        ByteCodec(PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]"))


def test_utf8_runs_split_stray_bytes():
    assert utf8_runs(b"ab\xffc\xe6\x97") == [(b"ab", True), (b"\xff", False), (b"c", True), (b"\xe6\x97", False)]
