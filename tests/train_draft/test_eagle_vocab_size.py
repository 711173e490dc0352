"""`train-draft --draft-vocab auto`: V_d sized by measurement, from the coverage curve of the target's answer
tokens, and the command line's parsing and errors."""

from __future__ import annotations

import pytest
import torch

from assisted_backends.train_draft.cli import main, parser, settings_from
from assisted_backends.train_draft.trainer import TrainSettings, vocabulary_size
from assisted_backends.train_draft.vocab import DEFAULT_COVERAGE, coverage_curve, size_for_coverage


def _counts() -> torch.Tensor:
    """5000 tokens: 100 chosen 100 times each, 2900 once each, 2000 never (12900 choices)."""
    counts = torch.zeros(5000, dtype=torch.long)
    counts[torch.randperm(5000, generator=torch.Generator().manual_seed(0))[:3000]] = 1
    counts[counts.nonzero()[:100, 0]] = 100
    return counts


def test_the_smallest_vocabulary_reaching_the_goal_on_known_counts():
    counts = _counts()
    # 0.95 × 12900 = 12255 choices: the 100 frequent tokens (10000) and 2255 of the single ones -> 2355 tokens,
    # rounded up to whole steps of 256
    choice = size_for_coverage(counts, 0.95)
    assert choice.size == 2560
    assert choice.reaches == pytest.approx((10000 + 2460) / 12900)
    assert [size for size, _ in choice.curve] == [1024, 2048, 4096, 5000]
    assert choice.curve[0][1] == pytest.approx((10000 + 924) / 12900)
    assert choice.curve[-2][1] == choice.curve[-1][1] == pytest.approx(1.0)
    assert size_for_coverage(counts, 0.5).size == 1024  # never below 1024
    assert size_for_coverage(counts, 1.0).size == 3072  # every chosen token: 3000 -> whole steps
    assert "V_d = 2560" in choice.lines()[-1] and "2k 0.926" in choice.lines()[0]


def test_the_curve_doubles_up_to_the_vocabulary():
    counts = torch.ones(40000, dtype=torch.long)
    assert [size for size, _ in coverage_curve(counts)] == [1024, 2048, 4096, 8192, 16384, 32768, 40000]
    assert coverage_curve(counts)[2][1] == pytest.approx(4096 / 40000)


def test_training_settings_take_auto_or_an_integer():
    counts, said = _counts(), []
    auto = TrainSettings(target="t", text=(), output="o", draft_vocab="auto", vocab_coverage=0.95)
    assert vocabulary_size(auto, counts, said.append) == 2560 and len(said) == 2
    fixed = TrainSettings(target="t", text=(), output="o", draft_vocab=8192)
    assert vocabulary_size(fixed, counts, said.append) == 3000  # the tokens the target chose (at least 1024)


def test_command_line_parses_auto_and_the_goal():
    base = ["target", "--text", "a", "-o", "out"]
    settings = settings_from(parser().parse_args([*base, "--draft-vocab", "auto", "--vocab-coverage", "0.9"]))
    assert settings.draft_vocab == "auto" and settings.vocab_coverage == 0.9
    settings = settings_from(parser().parse_args([*base, "--draft-vocab", "auto"]))
    assert settings.vocab_coverage == DEFAULT_COVERAGE
    assert settings_from(parser().parse_args([*base, "--draft-vocab", "4096"])).draft_vocab == 4096


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--draft-vocab", "lots"], "argument --draft-vocab: expected a positive integer (V_d) or auto, got 'lots'"),
        (["--draft-vocab", "0"], "argument --draft-vocab: expected a positive integer"),
        (["--draft-vocab", "auto", "--vocab-coverage", "1.5"], "argument --vocab-coverage: expected a share in (0, 1]"),
        (["--draft-vocab", "auto", "--vocab-coverage", "most"], "argument --vocab-coverage"),
        (["--vocab-coverage", "0.9"], "--vocab-coverage applies to --draft-vocab auto"),
    ],
)
def test_bad_values_name_the_option(flags, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_:
        main(["target", "--text", "a", "-o", str(tmp_path), *flags])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
