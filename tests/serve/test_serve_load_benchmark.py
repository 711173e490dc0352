"""The pure parts of the server benchmark's load (`benchmarks.serve_load`) and code set (`benchmarks.serve_prompts`):
the Poisson schedule, goodput, the figures of a run, the speculation counters of both servers' `/metrics`, the
planted bugs. No server, no model."""

from __future__ import annotations

import statistics

import pytest

from benchmarks.serve_load import Slo, figures, meets, parse_prometheus, poisson_arrivals, request_times, speculation
from benchmarks.serve_prompts import code_request, plant_bug

OURS = """# HELP assisted_requests_total HTTP requests answered
# TYPE assisted_requests_total counter
assisted_requests_total{endpoint="/v1/chat/completions",status="200"} 7.0
assisted_draft_tokens_total 120.0
assisted_draft_tokens_created 1.7e+09
assisted_accepted_draft_tokens_total 45.0
assisted_acceptance_rate 0.375
"""
LLAMA = """# HELP llamacpp:spec_decode_num_draft_tokens_total Speculative: Total draft tokens generated
# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total 200
llamacpp:spec_decode_num_accepted_tokens_total 50
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 30
llamacpp:tokens_predicted_total 900
"""


class WordTokenizer:
    """Tokens: the words of a text (for answers whose server sent no usage)."""

    def __call__(self, text: str, add_special_tokens: bool = False):
        return type("Encoded", (), {"input_ids": text.split()})()


def test_poisson_arrivals_are_seeded_and_of_the_rate():
    times = poisson_arrivals(4.0, 4001, seed=3)
    assert times[0] == 0.0 and all(b > a for a, b in zip(times, times[1:]))
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert statistics.mean(gaps) == pytest.approx(0.25, rel=0.06)
    assert statistics.stdev(gaps) == pytest.approx(0.25, rel=0.1), "exponential gaps: deviation = mean"
    assert poisson_arrivals(4.0, 50, seed=3) == times[:50]
    assert poisson_arrivals(4.0, 50, seed=4) != times[:50]


def test_goodput_counts_requests_within_both_limits():
    slo = Slo(ttft_s=2.0, tpot_s=0.1)
    assert meets(1.0, 0.05, slo) and meets(2.0, 0.1, slo) and meets(1.0, None, slo)
    assert not meets(2.5, 0.05, slo) and not meets(1.0, 0.2, slo) and not meets(None, None, slo)
    answer = {"text": "a b c d e", "arrivals": [0.5, 0.6, 0.7], "usage": None, "total_s": 0.9, "error": None}
    assert request_times(answer, 5) == (0.5, pytest.approx(0.1))
    assert request_times({**answer, "arrivals": []}, 0) == (None, None)
    results = [
        answer,  # TTFT 0.5, TPOT 0.1: meets
        {**answer, "arrivals": [2.5, 2.6], "total_s": 2.9},  # TTFT too long
        {**answer, "arrivals": [0.1], "total_s": 1.3, "usage": {"completion_tokens": 3}},  # TPOT 0.6: too long
        {**answer, "text": "a", "arrivals": [0.2], "total_s": 0.2},  # one token: TTFT alone decides
        {"text": "", "arrivals": [], "usage": None, "total_s": 0.1, "error": "HTTP 503: b'busy'"},
    ]
    run = figures(results, wall=4.0, tokenizer=WordTokenizer(), slo=slo)
    assert run["requests"] == 5 and run["errors"] == 1 and run["first_errors"] == ["HTTP 503: b'busy'"]
    assert run["requests_per_s"] == 1.0 and run["goodput_per_s"] == 0.5
    assert run["output_tokens"] == 5 + 5 + 3 + 1 and run["output_tokens_per_s"] == 3.5
    assert run["ttft_s"]["n"] == 4 and run["time_per_output_token_s"]["n"] == 3


def test_speculation_counters_of_both_servers_since_a_reading():
    ours, llama = parse_prometheus(OURS), parse_prometheus(LLAMA)
    assert ours['assisted_requests_total{endpoint="/v1/chat/completions",status="200"}'] == 7.0
    assert speculation(None, ours) == {"drafted": 120, "accepted": 45, "acceptance": 0.375}
    before = parse_prometheus(LLAMA.replace(" 200\n", " 100\n").replace(" 50\n", " 40\n"))
    assert speculation(before, llama) == {"drafted": 100, "accepted": 10, "acceptance": 0.1}
    assert speculation(llama, llama) == {"drafted": 0, "accepted": 0, "acceptance": None}
    assert speculation(None, parse_prometheus("llamacpp:tokens_predicted_total 9\n")) is None
    assert speculation(None, None) is None


def test_code_prompts_plant_one_bug_or_ask_a_completion():
    problem = {
        "prompt": "\ndef small(a, b):\n    '''The smaller.'''\n",
        "canonical_solution": "    return a if a <= b else b\n",
    }
    assert plant_bug(problem["canonical_solution"]) == "    return a if a < b else b\n"
    assert plant_bug("    return x\n") is None
    fix = code_request(problem, "fix")
    assert fix.startswith("This Python function has a bug.") and "a < b" in fix and "```python\ndef small" in fix
    assert "a <= b" in code_request(problem, "explain")
    asked = code_request({**problem, "canonical_solution": "    return x\n"}, "fix")
    assert asked.startswith("Complete this Python function.") and "return" not in asked
