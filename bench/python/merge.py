"""Merges results files of one runner whose methods were run separately into one file.

    python bench/python/rl.py --env acrobot-linear --methods vanilla target --json a.json
    python bench/python/rl.py --env acrobot-linear --methods optex_default data_parallel --json b.json
    python bench/python/merge.py a.json b.json --out bench/results/rl-acrobot-2026-11-22.json

A long run can be split by ``--methods`` across processes or machines, since
each method's runs (its lr tuning included) depend only on its own seeds; with
``--replace``, methods rerun later (``b.json``) replace theirs in an earlier
file (``a.json`` may itself be a merged file). The
inputs must be files of ``rl.py`` or ``supervised.py`` with the same runner,
preset, metric, machine and configuration; only the per-method parts of the
configuration (``methods``, ``chosen_lr``, ``tuning``,
``evaluations_per_round``) and how each input ran (``workers``; an input that
was itself merged keeps its ``merged_from`` and ``note``) may differ, and no
(task, N, method) may appear in two inputs. The output holds the records and summary rows of every input, with
the speedups recomputed over all methods (``records.add_speedups``), the
latest input date, and ``config.merged_from`` naming each input's command.
``--note`` adds a remark (e.g. how the inputs shared the machine) that
report.py prints with the file.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import records  # noqa: E402
from method_names import METHODS  # noqa: E402
from plots import Results, ResultsError, load_results  # noqa: E402

MERGEABLE_RUNNERS = ("rl", "supervised")
SAME_TOP_LEVEL = ("runner", "preset", "metric", "goal", "machine")
PER_METHOD_CONFIG = ("methods", "chosen_lr", "tuning", "evaluations_per_round")
# How each input ran, not what it measured: they may differ (rounds are unaffected; seconds
# are per input anyway), and a merged input's history is carried over.
PER_INPUT_CONFIG = ("workers", "merged_from", "note")


def settings_of(data: dict[str, Any]) -> set[tuple[str, int, str]]:
    """The (task, N, method) triples a file holds records of."""
    return {(r["task"], r["parallelism"], r["method"]) for r in data["records"]}


def check_mergeable(inputs: list[Results]) -> None:
    """ResultsError naming the file and the field unless the inputs can be merged."""
    if len(inputs) < 2:
        raise ResultsError(f"need at least two results files to merge, got {len(inputs)}")
    first = inputs[0]
    for results in inputs:
        if results.data["runner"] not in MERGEABLE_RUNNERS:
            raise ResultsError(f"{results.path}: 'runner' is {results.data['runner']!r}; only the "
                               f"files of {', '.join(MERGEABLE_RUNNERS)} can be merged")
    for other in inputs[1:]:
        for key in SAME_TOP_LEVEL:
            if other.data[key] != first.data[key]:
                raise ResultsError(f"{other.path}: '{key}' is {other.data[key]!r}, but "
                                   f"{first.path} has {first.data[key]!r}")
        mine, theirs = first.data["config"], other.data["config"]
        for key in sorted(set(mine) | set(theirs)):
            if key in PER_METHOD_CONFIG or key in PER_INPUT_CONFIG:
                continue
            if mine.get(key) != theirs.get(key):
                raise ResultsError(f"{other.path}: config '{key}' is {theirs.get(key)!r}, but "
                                   f"{first.path} has {mine.get(key)!r}")
    owner: dict[tuple[str, int, str], Path] = {}
    for results in inputs:
        for setting in sorted(settings_of(results.data)):
            if setting in owner:
                task, n, method = setting
                raise ResultsError(f"{results.path}: holds {method} on {task} with N = {n}, "
                                   f"and so does {owner[setting]}; each method may come from one file")
            owner[setting] = results.path


def merged_config(inputs: list[Results], note: str | None) -> dict[str, Any]:
    """The first input's configuration with the per-method parts of all inputs."""
    config = dict(inputs[0].data["config"])
    methods = {m for r in inputs for m in r.data["config"]["methods"]}
    config["methods"] = [m for m in METHODS if m in methods] + sorted(methods - set(METHODS))
    config["chosen_lr"] = [e for r in inputs for e in r.data["config"]["chosen_lr"]]
    config["tuning"] = [e for r in inputs for e in r.data["config"]["tuning"]]
    budgets: dict[str, dict[str, int]] = {}
    for r in inputs:
        for n, per_method in r.data["config"]["evaluations_per_round"].items():
            budgets.setdefault(n, {}).update(per_method)
    config["evaluations_per_round"] = {
        n: {m: per_method[m] for m in config["methods"] if m in per_method}
        for n, per_method in budgets.items()}
    merged_from: list[dict[str, Any]] = []
    for r in inputs:  # an input that was itself merged contributes its own inputs
        merged_from += r.data["config"].get("merged_from") or [
            {"file": r.path.name, "command": r.data["command"], "date": r.data["date"],
             "methods": r.data["config"]["methods"], "workers": r.data["config"].get("workers")}]
    config["merged_from"] = merged_from
    workers = {r.data["config"].get("workers") for r in inputs}
    if len(workers) > 1:
        config["workers"] = "per input (merged_from)"
    notes = [n for n in [*(r.data["config"].get("note") for r in inputs), note] if n]
    config.pop("note", None)
    if notes:
        config["note"] = "; ".join(dict.fromkeys(notes))
    return config


def without_methods(results: Results, methods: set[str]) -> Results:
    """A copy of `results` without the records, summary rows and per-method config of `methods`."""
    data = dict(results.data)
    data["records"] = [r for r in data["records"] if r["method"] not in methods]
    data["summary"] = [r for r in data["summary"] if r["method"] not in methods]
    config = dict(data["config"])
    config["methods"] = [m for m in config["methods"] if m not in methods]
    for key in ("chosen_lr", "tuning"):
        config[key] = [e for e in config.get(key, []) if e["method"] not in methods]
    config["evaluations_per_round"] = {
        n: {m: v for m, v in per.items() if m not in methods}
        for n, per in config.get("evaluations_per_round", {}).items()}
    data["config"] = config
    return Results(results.path, data)


def replaced(inputs: list[Results]) -> list[Results]:
    """The inputs with every method a later input reruns taken out of the earlier ones."""
    out: list[Results] = []
    for k, results in enumerate(inputs):
        later = {m for r in inputs[k + 1:] for m in r.data["config"]["methods"]}
        out.append(without_methods(results, later))
    return out


def merge(inputs: list[Results], note: str | None = None, replace: bool = False) -> dict[str, Any]:
    """One optex-bench/1 document holding every input (see the module docstring); with
    `replace`, a method in a later input replaces the same method in earlier ones."""
    if replace:
        inputs = replaced(inputs)
    check_mergeable(inputs)
    first = inputs[0].data
    summary = [dict(row) for r in inputs for row in r.data["summary"]]
    records.add_speedups(summary)
    doc = records.document(first["runner"], first["preset"], first["metric"], first["goal"],
                           merged_config(inputs, note),
                           [row for r in inputs for row in r.data["records"]], summary)
    doc["machine"] = first["machine"]  # where the runs ran, not where they were merged
    doc["date"] = max(r.data["date"] for r in inputs)
    return doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="results files of one runner (.json or .json.gz)")
    parser.add_argument("--out", required=True, help="the merged file (.json, or .json.gz to compress)")
    parser.add_argument("--note", help="a remark stored as config.note and printed by report.py")
    parser.add_argument("--replace", action="store_true",
                        help="a method rerun in a later input replaces it in the earlier ones")
    args = parser.parse_args(argv)
    try:
        inputs = load_results(args.results)
        doc = merge(inputs, args.note, args.replace)
    except ResultsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    records.write_json(args.out, doc)
    print(f"{args.out}: {len(doc['records'])} records, methods {', '.join(doc['config']['methods'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
