"""Merges results files of one runner whose methods were run separately into one file.

    python bench/python/rl.py --env acrobot-linear --methods vanilla target --json a.json
    python bench/python/rl.py --env acrobot-linear --methods optex_default data_parallel --json b.json
    python bench/python/merge.py a.json b.json --out bench/results/rl-acrobot-2026-11-22.json

A long run can be split by ``--methods`` across processes or machines, since
each method's runs (its lr tuning included) depend only on its own seeds. The
inputs must be files of ``rl.py`` or ``supervised.py`` with the same runner,
preset, metric, machine and configuration; only the per-method parts of the
configuration (``methods``, ``chosen_lr``, ``tuning``,
``evaluations_per_round``) may differ, and no (task, N, method) may appear in
two inputs. The output holds the records and summary rows of every input, with
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
            if key in PER_METHOD_CONFIG:
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
    config["merged_from"] = [{"file": r.path.name, "command": r.data["command"], "date": r.data["date"],
                              "methods": r.data["config"]["methods"]} for r in inputs]
    if note:
        config["note"] = note
    return config


def merge(inputs: list[Results], note: str | None = None) -> dict[str, Any]:
    """One optex-bench/1 document holding every input (see the module docstring)."""
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
    args = parser.parse_args(argv)
    try:
        inputs = load_results(args.results)
        doc = merge(inputs, args.note)
    except ResultsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    records.write_json(args.out, doc)
    print(f"{args.out}: {len(doc['records'])} records, methods {', '.join(doc['config']['methods'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
