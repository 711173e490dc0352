"""Turn the lane's JUnit XML files into the results table (markdown): per model, passed / failed / errored
/ skipped without the package and with it, and the routed failures grouped by cause."""

from __future__ import annotations

import json
import re
import sys
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from pathlib import Path

# test name -> the generate feature it exercises (for the cause table)
FEATURES = (
    (r"without_input_ids", "no input_ids (generate() with only a batch size / BOS)"),
    (r"inputs_embeds", "inputs_embeds"),
    (r"continue_from_past_key_values|recurrent_layers_mask", "continuing from a caller's cache (past_key_values=)"),
    (r"static_cache|static", "static cache (cache_implementation='static')"),
    (r"quant_cache", "quantized cache"),
    (r"compil|fullgraph", "torch.compile / compile_config"),
    (r"left_padding", "left padding"),
    (r"position_ids", "position_ids / padding-free"),
    (r"logits_to_keep", "logits_to_keep"),
    (r"assisted_decoding|prompt_lookup", "assisted decoding / prompt lookup (transformers' own drafting arguments)"),
    (r"beam", "beam search"),
    (r"dict_output|all_outputs|past_key_values_format", "return_dict_in_generate outputs (scores, logits, cache)"),
    (r"sample", "sampling"),
    (r"greedy", "greedy"),
    (r"sdpa|fa2|fa3|flash", "attention implementations"),
)


def feature(test: str) -> str:
    return next((label for pattern, label in FEATURES if re.search(pattern, test)), "other")


def _normalise(message: str) -> str:
    line = next((part.strip() for part in message.splitlines() if part.strip()), "")
    line = re.sub(r"0x[0-9a-f]+", "0x…", line)
    line = re.sub(r"tensor\(\[.*", "tensor([…])", line)
    return line[:220]


def cases(xml: Path) -> list[dict]:
    if not xml.exists():
        return []
    result = []
    for case in ElementTree.parse(xml).getroot().iter("testcase"):
        name = case.get("name", "")
        properties = {p.get("name"): p.get("value") for p in case.iter("property")}
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome, message = ("failed" if child.tag == "failure" else "error"), child.get("message", "")
                break
            if child.tag == "skipped":
                kind = child.get("type", "")
                outcome = "xfailed" if kind == "pytest.xfail" else "skipped"
                message = child.get("message", "")
        result.append(dict(name=name, outcome=outcome, message=message, properties=properties))
    return result


def counts(xml: Path) -> dict:
    tally = defaultdict(int)
    for case in cases(xml):
        tally[case["outcome"]] += 1
    tally["bad"] = tally["failed"] + tally["error"]
    if not xml.exists():
        tally["bad"] += 1
    return tally


def render(runs: list[dict], tree: Path | None = None) -> str:
    by_model = defaultdict(dict)
    for run in runs:
        by_model[run["model"]][run["mode"]] = run
    lines = []
    if tree is not None and (tree / "PROVENANCE.json").exists():
        provenance = json.loads((tree / "PROVENANCE.json").read_text())
        lines.append(
            f"Test tree: transformers {provenance.get('tests_declared_version')} tests "
            f"({provenance.get('source')}), run against installed transformers "
            f"{provenance.get('installed_transformers')}."
        )
        lines.append("")
    lines.append(
        "| model | plain: passed / failed / errors / skipped | routed: passed / failed / errors / xfail (documented "
        "refusal) / skipped | routed passes that called generate | routed generate calls | time plain / routed |"
    )
    lines.append("|---|---|---|---|---|---|")
    causes = defaultdict(list)
    baseline = defaultdict(list)
    for model, modes in by_model.items():
        cells = []
        for mode in ("plain", "routed"):
            run = modes.get(mode)
            if run is None:
                cells.append("—")
                continue
            tally = counts(run["xml"])
            if mode == "plain":
                cells.append(f"{tally['passed']} / {tally['failed']} / {tally['error']} / {tally['skipped']}")
            else:
                cells.append(
                    f"{tally['passed']} / {tally['failed']} / {tally['error']} / {tally['xfailed']} / "
                    f"{tally['skipped']}"
                )
        routed = modes.get("routed")
        routed_cases = cases(routed["xml"]) if routed else []
        calls = sum(int(c["properties"].get("routed_calls", 0)) for c in routed_cases)
        exercised = sum(
            1 for c in routed_cases if c["outcome"] == "passed" and int(c["properties"].get("routed_calls", 0))
        )
        times = " / ".join(f"{modes[m]['seconds']:.0f}s" if m in modes else "—" for m in ("plain", "routed"))
        lines.append(f"| {model} | {cells[0]} | {cells[1]} | {exercised} | {calls} | {times} |")
        plain_outcomes = {c["name"]: c["outcome"] for c in cases(modes["plain"]["xml"])} if "plain" in modes else {}
        for case in cases(routed["xml"]) if routed else []:
            if case["outcome"] in ("failed", "error"):
                also = (
                    " (fails without the package too)"
                    if plain_outcomes.get(case["name"]) in ("failed", "error")
                    else ""
                )
                causes[(feature(case["name"]), _normalise(case["message"]) + also)].append((model, case["name"]))
        for case in cases(modes["plain"]["xml"]) if "plain" in modes else []:
            if case["outcome"] in ("failed", "error"):
                baseline[_normalise(case["message"])].append((model, case["name"]))
    lines += [
        "",
        "## Routed failures by cause",
        "",
        "| feature | count | exception (first line) | tests (model: test) |",
        "|---|---|---|---|",
    ]
    for (label, message), where in sorted(causes.items(), key=lambda item: (item[0][0], -len(item[1]))):
        tests = sorted({name for _, name in where})
        models = sorted({model for model, _ in where})
        shown = ", ".join(tests[:4]) + (f", … ({len(tests)} tests)" if len(tests) > 4 else "")
        lines.append(f"| {label} | {len(where)} | `{message.replace('|', '/')}` | {', '.join(models)}: {shown} |")
    if baseline:
        lines += [
            "",
            "## Failures without the package (baseline)",
            "",
            "| count | exception | tests |",
            "|---|---|---|",
        ]
        for message, where in sorted(baseline.items(), key=lambda item: -len(item[1])):
            lines.append(
                f"| {len(where)} | `{message.replace('|', '/')}` | "
                f"{', '.join(sorted({f'{m}: {t}' for m, t in where}))} |"
            )
    return "\n".join(lines) + "\n"


if (
    __name__ == "__main__"
):  # summarize.py OUT_DIR [LANE_LOG]: re-render from existing XML files (+ run_lane's log for times)
    out = Path(sys.argv[1])
    seconds = {}
    if len(sys.argv) > 2:
        for line in Path(sys.argv[2]).read_text().splitlines():
            found = re.match(r"^(\S+)\s+(plain|routed)\s+exit \d+ in\s+([\d.]+)s", line)
            if found:
                seconds[(found.group(1), found.group(2))] = float(found.group(3))
    runs = []
    for xml in sorted(out.glob("*-*.xml")):
        model, mode = xml.stem.rsplit("-", 1)
        runs.append(dict(model=model, mode=mode, xml=xml, status=None, seconds=seconds.get((model, mode), 0.0)))
    print(render(runs))
