"""docs/RESULTS.md from the benchmark runners' committed results files.

    python bench/python/report.py bench/results/*.json --figures docs/figures --out docs/RESULTS.md

For every results file (schema "optex-bench/1"): where and how it was made, a
table per (task, parallelism) with each method's numbers as the runner
summarised them, links to the figures, and sentences computed from those
numbers: where OptEx (optex_default, optex_adaptive, optex_reference) beats the best
same-budget baseline, where there is no clear difference, where it loses.

A "clear" win or loss needs the interquartile ranges over seeds to be
disjoint; anything else is reported as "no clear difference". Rounds to
target that the summary gives as null (the target was not reached by that
quantile of the seeds) count as infinitely many rounds.

The figures are drawn into --figures by plots.py (unless --no-plots) and
linked by paths relative to the report.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from plots import (
    Results,
    ResultsError,
    base_method,
    curve_figure_name,
    has_scaling,
    load_runner_results,
    method_sort_key,
    settings,
    speedup_figure_name,
    write_figures,
)

# Baselines that use the same budget as OptEx, N gradient evaluations per round
# (DESIGN.md section 5), as the runners define them for speedup_vs_best_baseline.
# vanilla (one evaluation per round) is the sequential reference, and "target"
# an upper bound, not a baseline to beat.
BASELINES = ("vanilla_nlr", "data_parallel", "line_search")
SEQUENTIAL = "vanilla"
OPTEX_METHODS = ("optex_default", "optex_adaptive", "optex_reference")
UPPER_BOUND = "target"

WIN, TIE, LOSS = "win", "no clear difference", "loss"


# --------------------------------------------------------------------------
# Spreads over seeds and their comparison
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class Spread:
    """Median and quartiles over seeds; infinities stand for "not reached" or missing."""

    median: float
    q1: float
    q3: float


def rounds_spread(entry: dict, field: str = "rounds_to_target") -> Spread:
    """Rounds (or seconds) to target; null means not reached, i.e. infinitely many."""
    quartiles = entry.get(field) or {}
    def value(key: str) -> float:
        v = quartiles.get(key)
        return math.inf if v is None else float(v)
    return Spread(value("median"), value("q1"), value("q3"))


def final_spread(entry: dict, goal: str) -> Spread:
    """Final metric values; null (a diverged or missing run) counts as the worst value."""
    worst = math.inf if goal == "min" else -math.inf
    quartiles = entry["final"]
    def value(key: str) -> float:
        v = quartiles.get(key)
        return worst if v is None or not math.isfinite(v) else float(v)
    return Spread(value("median"), value("q1"), value("q3"))


def classify(candidate: Spread, baseline: Spread, lower_is_better: bool) -> str:
    """WIN or LOSS only when the interquartile ranges are disjoint, TIE otherwise."""
    if lower_is_better:
        if candidate.q3 < baseline.q1:
            return WIN
        if candidate.q1 > baseline.q3:
            return LOSS
        return TIE
    if candidate.q1 > baseline.q3:
        return WIN
    if candidate.q3 < baseline.q1:
        return LOSS
    return TIE


def goal_key(value: float, goal: str) -> float:
    """A value to sort ascending so that the best comes first."""
    return value if goal == "min" else -value


def best_baseline(entries: dict[str, dict], goal: str) -> str | None:
    """The same-budget baseline with the fewest median rounds to target.

    Ties (including "none reached the target") go to the better final value.
    """
    present = [m for m in BASELINES if m in entries]
    if not present:
        return None
    return min(present, key=lambda m: (rounds_spread(entries[m]).median,
                                       goal_key(final_spread(entries[m], goal).median, goal),
                                       BASELINES.index(m)))


@dataclass(frozen=True)
class Comparison:
    """One method against one reference method in one (task, parallelism) setting."""

    task: str
    parallelism: int
    method: str
    reference: str
    verdict: str
    text: str


def compare(data: dict, task: str, parallelism: int, method: str, reference: str,
            entries: dict[str, dict], reference_role: str) -> Comparison:
    """Classify ``method`` against ``reference`` and say so in one sentence.

    Rounds to target decide when either median reached the target; when
    neither did, the final metric value decides.
    """
    goal, metric = data["goal"], data["metric"]
    mine, theirs = entries[method], entries[reference]
    where = f"{task} (N = {parallelism})"
    against = f"{reference_role}, {reference}" if reference_role else reference
    if mine["seeds"] < 2 or theirs["seeds"] < 2:
        return Comparison(task, parallelism, method, reference, TIE,
                          f"{where}: {method} against {against}: one seed only, no "
                          "interquartile range, so no claim either way.")
    my_rounds, their_rounds = rounds_spread(mine), rounds_spread(theirs)
    if math.isfinite(my_rounds.median) or math.isfinite(their_rounds.median):
        verdict = classify(my_rounds, their_rounds, lower_is_better=True)
        text = _rounds_sentence(where, method, against, verdict, mine, theirs)
    else:
        verdict = classify(final_spread(mine, goal), final_spread(theirs, goal),
                           lower_is_better=(goal == "min"))
        text = _final_sentence(where, method, against, verdict, mine, theirs, metric, goal)
    return Comparison(task, parallelism, method, reference, verdict, text)


def _rounds_sentence(where: str, method: str, against: str, verdict: str,
                     mine: dict, theirs: dict) -> str:
    """The sentence for a comparison decided by rounds to target."""
    mine_r, theirs_r = rounds_spread(mine), rounds_spread(theirs)
    pair = (f"{format_spread(mine_r, rounds=True)} against "
            f"{format_spread(theirs_r, rounds=True)} rounds to target (median [IQR])"
            f"{_seconds_clause(mine, theirs)}")
    if verdict == WIN:
        how = (f"the baseline reaches the target in only {theirs['reached']}/{theirs['seeds']} seeds"
               if math.isinf(theirs_r.median)
               else rounds_gap(theirs_r.median, mine_r.median, "fewer"))
        return f"{where}: {method} wins against {against}: {how}; {pair}."
    if verdict == LOSS:
        how = (f"it reaches the target in only {mine['reached']}/{mine['seeds']} seeds"
               if math.isinf(mine_r.median)
               else rounds_gap(mine_r.median, theirs_r.median, "more"))
        return f"{where}: {method} loses to {against}: {how}; {pair}."
    return (f"{where}: no clear difference between {method} and {against}: "
            f"{pair}; the IQRs overlap.")


def rounds_gap(larger: float, smaller: float, word: str) -> str:
    """``"2.5x fewer rounds"``; a difference where the smaller is 0 (no finite ratio)."""
    if smaller > 0:
        return f"{larger / smaller:.3g}x {word} rounds"
    return f"{larger - smaller:.4g} {word} rounds"


def _seconds_clause(mine: dict, theirs: dict) -> str:
    """Wall-clock seconds to target, where the runner measured them."""
    if mine.get("seconds_to_target") is None or theirs.get("seconds_to_target") is None:
        return ""
    a = rounds_spread(mine, "seconds_to_target")
    b = rounds_spread(theirs, "seconds_to_target")
    return f"; seconds to target {format_spread(a, rounds=True)} against {format_spread(b, rounds=True)}"


def _final_sentence(where: str, method: str, against: str, verdict: str,
                    mine: dict, theirs: dict, metric: str, goal: str) -> str:
    """The sentence for a comparison decided by the final metric value."""
    a, b = final_spread(mine, goal), final_spread(theirs, goal)
    pair = (f"final {metric} {format_spread(a)} against {format_spread(b)} (median [IQR]; "
            "neither reaches the target in most seeds)")
    if verdict == TIE:
        return f"{where}: no clear difference between {method} and {against}: {pair}; the IQRs overlap."
    if verdict == WIN:
        return f"{where}: {method} wins against {against}: {final_gap(a, b, metric, goal)}; {pair}."
    return f"{where}: {method} loses to {against}: {final_gap(a, b, metric, goal)}; {pair}."


def final_gap(a: Spread, b: Spread, metric: str, goal: str) -> str:
    """How far ``a`` is from ``b``: a ratio for positive losses, else a difference."""
    if not (math.isfinite(a.median) and math.isfinite(b.median)):
        return "one of them diverged or is missing"
    better_a = goal_key(a.median, goal) < goal_key(b.median, goal)
    if goal == "min" and a.median > 0 and b.median > 0:
        factor = max(a.median, b.median) / min(a.median, b.median)
        return f"{metric} {factor:.3g}x {'lower' if better_a else 'higher'}"
    word = ("higher" if better_a else "lower") if goal == "max" else ("lower" if better_a else "higher")
    return f"{metric} {abs(a.median - b.median):.3g} {word}"


# --------------------------------------------------------------------------
# Number formatting
# --------------------------------------------------------------------------

def format_number(value: Any, digits: int = 3) -> str:
    """Significant digits, or a dash for null."""
    if value is None:
        return "—"
    if isinstance(value, float) and not math.isfinite(value):
        return "—"
    return f"{value:.{digits}g}"


def format_spread(spread: Spread, rounds: bool = False) -> str:
    """``median [q1, q3]``; infinite rounds read "not reached"."""
    def one(v: float) -> str:
        if math.isinf(v):
            return "not reached" if rounds else "—"
        return f"{v:.4g}" if rounds else f"{v:.3g}"
    if math.isinf(spread.median) and math.isinf(spread.q1) and math.isinf(spread.q3):
        return one(spread.median)
    return f"{one(spread.median)} [{one(spread.q1)}, {one(spread.q3)}]"


def format_quartiles(quartiles: dict | None, rounds: bool = False) -> str:
    """A summary's {"median", "q1", "q3"} for a table cell."""
    if quartiles is None:
        return "—"
    def one(v: Any) -> str:
        if v is None:
            return "not reached" if rounds else "—"
        return f"{v:.4g}" if rounds else f"{v:.3g}"
    if all(quartiles.get(k) is None for k in ("median", "q1", "q3")):
        return one(None)
    return f"{one(quartiles.get('median'))} [{one(quartiles.get('q1'))}, {one(quartiles.get('q3'))}]"


# --------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------

def summary_by_setting(data: dict) -> dict[tuple[str, int], dict[str, dict]]:
    """(task, parallelism) -> method -> summary entry."""
    out: dict[tuple[str, int], dict[str, dict]] = {}
    for entry in data["summary"]:
        out.setdefault((entry["task"], entry["parallelism"]), {})[entry["method"]] = entry
    return out


def methods_in_setting(data: dict, task: str, parallelism: int) -> list[str]:
    """Every method with a summary entry or records in one setting, in table order."""
    methods = {item["method"] for item in data["summary"] + data["records"]
               if item["task"] == task and item["parallelism"] == parallelism}
    return sorted(methods, key=method_sort_key)


def extra_final_fields(data: dict) -> list[str]:
    """Further "final_<name>" quartiles the runner summarised (e.g. final_test_accuracy)."""
    return sorted({key for e in data["summary"] for key, value in e.items()
                   if key.startswith("final_") and isinstance(value, dict)})


def table(data: dict, task: str, parallelism: int) -> list[str]:
    """The Markdown table of one setting: one row per method."""
    entries = summary_by_setting(data).get((task, parallelism), {})
    with_seconds = any(e.get("seconds_to_target") is not None for e in data["summary"])
    metric = data["metric"]
    header = ["method", "lr", "reached/seeds", "rounds to target, median [IQR]"]
    if with_seconds:
        header.append("seconds to target, median [IQR]")
    extras = extra_final_fields(data)
    header += [f"final {metric}, median [IQR]"]
    header += [f"final {name.removeprefix('final_').replace('_', ' ')}, median [IQR]"
               for name in extras]
    header += ["speedup vs vanilla", "speedup vs best same-budget baseline"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for method in methods_in_setting(data, task, parallelism):
        entry = entries.get(method)
        if entry is None:
            cells = [f"`{method}`", "—", "—", "(records only, not summarised)"]
            cells += ["—"] * (len(header) - len(cells))
        else:
            cells = [f"`{method}`", format_number(entry["lr"]),
                     f"{entry['reached']}/{entry['seeds']}",
                     format_quartiles(entry["rounds_to_target"], rounds=True)]
            if with_seconds:
                cells.append(format_quartiles(entry.get("seconds_to_target")))
            cells.append(format_quartiles(entry["final"]))
            cells += [format_quartiles(entry.get(name)) for name in extras]
            cells += [format_number(entry["speedup_vs_vanilla"]),
                      format_number(entry["speedup_vs_best_baseline"])]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


# --------------------------------------------------------------------------
# Findings: sentences computed from the summary
# --------------------------------------------------------------------------

@dataclass
class Findings:
    """The sentences of one results file, by kind."""

    comparisons: list[Comparison]
    ablations: list[Comparison]
    notes: list[str]


def optex_comparisons(data: dict) -> list[Comparison]:
    """optex_default, optex_reference and optex_adaptive against the best same-budget baseline,
    per setting.

    A setting without any same-budget baseline (the ablation preset) compares
    with vanilla instead, and the sentence says so.
    """
    out = []
    for (task, p), entries in summary_by_setting(data).items():
        baseline = best_baseline(entries, data["goal"])
        role = "the best same-budget baseline"
        if baseline is None and SEQUENTIAL in entries:
            baseline, role = SEQUENTIAL, "the only baseline in this setting"
        if baseline is None:
            continue
        for method in OPTEX_METHODS:
            if method in entries:
                out.append(compare(data, task, p, method, baseline, entries, role))
    return out


def ablation_comparisons(data: dict) -> list[Comparison]:
    """Every ablation or variant (``name[...]``) against optex_default, per setting."""
    out = []
    for (task, p), entries in summary_by_setting(data).items():
        if "optex_default" not in entries:
            continue
        for method in sorted(entries, key=method_sort_key):
            is_variant = method != base_method(method)
            if method.startswith("ablation_") or is_variant:
                out.append(compare(data, task, p, method, "optex_default", entries, ""))
    return out


def same_numbers(a: dict, b: dict) -> bool:
    """Whether two summary entries report the same outcome."""
    return all(a.get(k) == b.get(k) for k in ("rounds_to_target", "final", "reached"))


def notes(data: dict) -> list[str]:
    """Observations that are not a win or a loss, computed from the summary."""
    out = []
    for (task, p), entries in summary_by_setting(data).items():
        where = f"{task} (N = {p})"
        if "data_parallel" in entries and "vanilla" in entries and same_numbers(
                entries["data_parallel"], entries["vanilla"]):
            out.append(f"{where}: data_parallel has the same numbers as vanilla, as expected "
                       "where the gradient is deterministic (N x batch is the same batch).")
        unreached = [f"{m} ({e['reached']}/{e['seeds']})"
                     for m, e in sorted(entries.items(), key=lambda kv: method_sort_key(kv[0]))
                     if 2 * e["reached"] < e["seeds"]]
        if unreached:
            out.append(f"{where}: fewer than half the seeds reach the target with "
                       + ", ".join(unreached) + ".")
        out.extend(reliability_notes(where, entries, data["goal"]))
        if UPPER_BOUND in entries:
            bound = format_spread(rounds_spread(entries[UPPER_BOUND]), rounds=True)
            optex = [f"{m} {format_spread(rounds_spread(entries[m]), rounds=True)}"
                     for m in OPTEX_METHODS if m in entries]
            if optex:
                out.append(f"{where}: the upper bound {UPPER_BOUND} (N sequential true-gradient "
                           f"steps per round) needs {bound} rounds; " + ", ".join(optex) + ".")
    out.extend(runner_notes(data))
    if has_scaling(data):
        out.extend(scaling_notes(data))
    return out


def reliability_notes(where: str, entries: dict[str, dict], goal: str) -> list[str]:
    """How many seeds reach the target with each OptEx method and with the best same-budget
    baseline, where the counts differ: the median and IQR hide a method that reaches it less
    often but fast when it does."""
    baseline = best_baseline(entries, goal)
    if baseline is None:
        return []
    theirs = entries[baseline]
    out = []
    for method in OPTEX_METHODS:
        mine = entries.get(method)
        if mine is None or mine["reached"] == theirs["reached"] or mine["seeds"] != theirs["seeds"]:
            continue
        out.append(f"{where}: {method} reaches the target in {mine['reached']}/{mine['seeds']} seeds, "
                   f"the best same-budget baseline, {baseline}, in {theirs['reached']}/{theirs['seeds']}.")
    return out


def runner_notes(data: dict) -> list[str]:
    """The runners' own "note" fields, each stated once per method.

    Notes are split at "; " and grouped, because runners repeat the same remark
    for every setting. "best baseline: ..." parts are dropped: the findings name
    the best baseline already.
    """
    where_by_note: dict[tuple[str, str], list[str]] = {}
    settings_of: dict[str, list[str]] = {}
    for entry in data["summary"]:
        where = f"{entry['task']} N = {entry['parallelism']}"
        settings_of.setdefault(entry["method"], []).append(where)
        for part in str(entry.get("note") or "").split("; "):
            part = part.strip()
            if part and not part.startswith("best baseline:"):
                where_by_note.setdefault((entry["method"], part), []).append(where)
    out = []
    for (method, note), places in sorted(where_by_note.items(),
                                         key=lambda kv: method_sort_key(kv[0][0])):
        scope = "" if places == settings_of[method] else f" ({', '.join(places)})"
        out.append(f"{method}{scope}: {note}")
    return out


def scaling_notes(data: dict) -> list[str]:
    """OptEx's speedup over vanilla per N, next to sqrt(N)."""
    out = []
    for task in dict.fromkeys(t for t, _ in settings(data)):
        for method in OPTEX_METHODS:
            points = sorted((e["parallelism"], e["speedup_vs_vanilla"]) for e in data["summary"]
                            if e["task"] == task and e["method"] == method)
            if not points:
                continue
            parts = [f"{format_number(s)} at N = {n} (sqrt(N) = {math.sqrt(n):.3g})"
                     for n, s in points]
            out.append(f"{task}: {method}'s speedup in rounds over vanilla: " + "; ".join(parts) + ".")
    return out


def findings(data: dict) -> Findings:
    """Every sentence about one results file."""
    return Findings(optex_comparisons(data), ablation_comparisons(data), notes(data))


# --------------------------------------------------------------------------
# The document
# --------------------------------------------------------------------------

def link(target: Path, report: Path) -> str:
    """``target`` relative to the report's directory, with forward slashes."""
    return Path(os.path.relpath(target, report.parent)).as_posix()


def tally(all_comparisons: list[Comparison]) -> list[str]:
    """One line per OptEx method: clear wins, no clear difference, clear losses."""
    lines = []
    for method in OPTEX_METHODS:
        mine = [c for c in all_comparisons if c.method == method]
        if not mine:
            continue
        count = {v: sum(c.verdict == v for c in mine) for v in (WIN, TIE, LOSS)}
        lines.append(f"- `{method}` against the best same-budget baseline (vanilla where no "
                     f"same-budget baseline ran), over {len(mine)} "
                     f"(task, N) settings: clear wins {count[WIN]}, no clear difference "
                     f"{count[TIE]}, clear losses {count[LOSS]}.")
    return lines


def file_section(results: Results, figures: Path, report: Path, found: Findings) -> list[str]:
    """Provenance, tables, figures and findings of one results file."""
    data = results.data
    better = "lower" if data["goal"] == "min" else "higher"
    lines = [f"## {data['runner']} / {data['preset']} ({data['date']})", "",
             f"- File: `{results.path.as_posix()}`",
             f"- Machine: {data['machine']}",
             f"- Command: `{data['command']}`",
             f"- Metric: {data['metric']} ({better} is better)",
             f"- Config: `{json.dumps(data['config'], sort_keys=True)}`"]
    if data["config"].get("note"):
        lines.append(f"- Note: {data['config']['note']}")
    if data["config"].get("lr_from_vanilla"):
        # Every other comparison in the file reads differently: no method was tuned for itself.
        lines.append("- Learning rates: transferred from vanilla. Only vanilla was tuned; every "
                     "other method ran at vanilla's learning rate (N x it for vanilla_nlr), "
                     "untuned.")
    lines.append("")
    for task, p in settings(data):
        lines += [f"### {task}, N = {p}", ""] + table(data, task, p) + [""]
        figure = figures / curve_figure_name(data, task, p)
        if figure.is_file():
            lines += [f"![{task}, N = {p}]({link(figure, report)})", ""]
    speedup = figures / speedup_figure_name(data)
    if has_scaling(data) and speedup.is_file():
        lines += ["### Speedup against N", "", f"![speedup against N]({link(speedup, report)})", ""]
    lines += ["### Findings", ""]
    groups = [("Clear wins of OptEx", WIN), ("No clear difference", TIE),
              ("Clear losses of OptEx", LOSS)]
    for title, verdict in groups:
        sentences = [c.text for c in found.comparisons if c.verdict == verdict]
        lines += [f"**{title}** ({len(sentences)})", ""]
        lines += [f"- {s}" for s in sentences] or ["- none"]
        lines.append("")
    if found.ablations:
        lines += ["**Ablations and variants against optex_default**", ""]
        lines += [f"- {c.text}" for c in found.ablations] + [""]
    if found.notes:
        lines += ["**Notes**", ""] + [f"- {n}" for n in found.notes] + [""]
    if not found.comparisons:
        lines += ["(No OptEx method and same-budget baseline in the same setting: nothing to compare.)", ""]
    return lines


def render(loaded: list[Results], figures: Path, report: Path, command: str,
           commentary: str = "", appendices: Sequence[str] = ()) -> str:
    """The whole of RESULTS.md; `commentary` (Markdown, written by people) follows the summary,
    `appendices` (Markdown sections of runners with their own schema) end the page."""
    per_file = [findings(r.data) for r in loaded]
    lines = ["# Benchmark results", "",
             "Generated by `bench/python/report.py` from the committed results files; "
             "do not edit by hand. Regenerate with:", "",
             "```sh", command, "```", "",
             "## How to read this", "",
             "Every number comes from a runner's summary (medians and quartiles over seeds). "
             "Rounds to target count sequential rounds; each round costs N gradient evaluations "
             "for OptEx and for the same-budget baselines (" + ", ".join(BASELINES) + "); "
             f"`{SEQUENTIAL}` takes one sequential step per round and is the reference of "
             f"\"speedup vs vanilla\"; `{UPPER_BOUND}` is an upper bound, not a baseline. "
             "\"not reached\" means that "
             "quantile of the seeds did not reach the target. A win or loss is called clear only "
             "when the interquartile ranges do not overlap; otherwise it reads \"no clear "
             "difference\". The best same-budget baseline is the one with the fewest median "
             "rounds to target (the better final value where none reaches it).", "",
             "## Summary", ""]
    lines += tally([c for f in per_file for c in f.comparisons]) or ["- No OptEx comparisons."]
    lines.append("")
    if commentary.strip():
        lines += [commentary.strip(), ""]
    for results, found in zip(loaded, per_file):
        lines += file_section(results, figures, report, found)
    for appendix in appendices:
        lines += [appendix.strip(), ""]
    return "\n".join(lines).rstrip() + "\n"


def draw(loaded: list[Results], figures: Path) -> None:
    """Redraw every figure; without matplotlib, say so and link what exists."""
    if importlib.util.find_spec("matplotlib") is None:
        print("warning: matplotlib is not importable: figures not redrawn, the report "
              f"links those already in {figures}", file=sys.stderr)
        return
    for results in loaded:
        write_figures(results, figures)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="results JSON files (schema optex-bench/1)")
    parser.add_argument("--figures", required=True, type=Path,
                        help="directory of the figures (drawn there unless --no-plots)")
    parser.add_argument("--out", required=True, type=Path, help="the Markdown file to write")
    parser.add_argument("--no-plots", action="store_true",
                        help="do not redraw the figures; link those already in --figures")
    parser.add_argument("--commentary", type=Path,
                        help="a Markdown file inserted after the summary: what the numbers mean")
    parser.add_argument("--append", type=Path, action="append", default=[],
                        help="a Markdown section appended at the end (a runner with a schema "
                             "of its own, e.g. the stragglers benchmark); repeatable")
    args = parser.parse_args(argv)
    try:
        loaded = load_runner_results(args.results)
    except ResultsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not args.no_plots:
        draw(loaded, args.figures)
    command = shlex.join(["python", "bench/python/report.py", *argv])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    try:
        commentary = args.commentary.read_text(encoding="utf-8") if args.commentary else ""
    except (OSError, UnicodeDecodeError) as error:
        print(f"error: --commentary {args.commentary}: {error}", file=sys.stderr)
        return 2
    appendices = []
    for path in args.append:
        try:
            appendices.append(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as error:
            print(f"error: --append {path}: {error}", file=sys.stderr)
            return 2
    args.out.write_text(render(loaded, args.figures, args.out, command, commentary, appendices),
                        encoding="utf-8")
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
