"""Figures from the benchmark runners' results files (schema "optex-bench/1").

    python bench/python/plots.py RESULTS.json [RESULTS.json ...] --out DIR

For every (task, parallelism) of a results file one PNG: the metric against
rounds, one line per method (the median over seeds, with the interquartile
band), the target as a dashed line; supervised results get a second panel with
test accuracy. A results file with several parallelism values (the scaling
preset) also gets a speedup figure: speedup over vanilla against N per method,
with the sqrt(N) reference curve.

File names depend only on the results file's contents:
``<runner>-<preset>-<date>-<task>-N<parallelism>.png`` and
``<runner>-<preset>-<date>-speedup.png``. Each method has a fixed colour, so
figures are comparable across files (variants such as
``optex_default[history=8]`` are dashed, coloured by their order in the file).

This module also reads and checks results files for report.py. matplotlib is
imported only when a figure is drawn, so report.py can check files without it.
JSON files that have no "schema" key at all (the Google Benchmark output and
the other programs' JSON under bench/results) are skipped with a message, so
``bench/results/*.json`` can be passed as a whole.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from method_names import METHODS

SCHEMA = "optex-bench/1"
RUNNERS = ("optex-bench", "rl", "supervised")
GOALS = {"loss": "min", "return": "max"}

# The methods every runner knows, in the order tables and legends list them.
METHOD_ORDER = METHODS

# One colour per method for every figure (matplotlib's tab10 palette, and one of
# tab20's for optex_adaptive).
METHOD_COLOURS = {
    "vanilla": "#7f7f7f",
    "vanilla_nlr": "#8c564b",
    "data_parallel": "#e377c2",
    "line_search": "#ff7f0e",
    "target": "#2ca02c",
    "optex_reference": "#1f77b4",
    "optex_default": "#d62728",
    "optex_adaptive": "#ff9896",  # tab20's light red: optex_default's family
    "ablation_last_gradient": "#9467bd",
    "ablation_last_point": "#17becf",
}
UNKNOWN_COLOUR = "#bcbd22"
# Variants (``optex_default[history=8]``) are dashed, in colours of matplotlib's
# tab20b palette, which the base methods do not use.
VARIANT_COLOURS = (
    "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173",
    "#5254a3", "#8ca252", "#bd9e39", "#ad494a", "#a55194",
    "#6b6ecf", "#b5cf6b", "#e7ba52", "#d6616b", "#ce6dbd",
    "#9c9ede", "#cedb9c", "#e7cb94", "#e7969c", "#de9ed6",
)
# More lines than this and the legend moves to the right of the axes.
LEGEND_INSIDE_MAX = 10

TOP_LEVEL_KEYS = ("schema", "runner", "preset", "command", "date", "machine",
                  "metric", "goal", "config", "records", "summary")
RECORD_KEYS = ("task", "parallelism", "method", "seed", "round",
               "gradient_evaluations", "seconds")
SUMMARY_KEYS = ("task", "parallelism", "method", "lr", "target", "seeds", "reached",
                "rounds_to_target", "final", "speedup_vs_vanilla",
                "speedup_vs_best_baseline")
QUARTILE_KEYS = ("median", "q1", "q3")


class ResultsError(ValueError):
    """A results file that cannot be used; the message starts with its path."""


@dataclass(frozen=True)
class Results:
    """One checked results file: where it came from and its parsed JSON."""

    path: Path
    data: dict[str, Any]


# --------------------------------------------------------------------------
# Reading and checking results files
# --------------------------------------------------------------------------

def read_json(path: Path) -> Any:
    """The parsed JSON of ``path``, or ResultsError naming the file."""
    try:
        # Large results files are committed gzip-compressed (".json.gz").
        if path.name.endswith(".gz"):
            with gzip.open(path, "rt", encoding="utf-8") as f:
                text = f.read()
        else:
            text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ResultsError(f"{path}: no such file") from None
    except (gzip.BadGzipFile, EOFError) as error:  # before OSError: BadGzipFile is one
        raise ResultsError(f"{path}: not a valid gzip file ({error})") from None
    except OSError as error:
        raise ResultsError(f"{path}: cannot be read ({error.strerror})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ResultsError(f"{path}: not valid JSON (line {error.lineno}: {error.msg})") from None


def is_runner_file(data: Any) -> bool:
    """Whether this JSON claims to be a runner's results file at all.

    Only files without a "schema" key are foreign; a wrong schema string is an
    error, not a reason to skip, so a runner writing a new schema is noticed.
    """
    return isinstance(data, dict) and "schema" in data


def _require(condition: bool, path: Path, where: str, problem: str) -> None:
    """Raise ResultsError "<path>: <where> <problem>" unless ``condition``."""
    if not condition:
        raise ResultsError(f"{path}: {where} {problem}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_quartiles(value: Any, path: Path, where: str) -> None:
    """{"median", "q1", "q3"}, each a number or null."""
    _require(isinstance(value, dict), path, where, "is not an object with median, q1, q3")
    for key in QUARTILE_KEYS:
        _require(key in value, path, where, f"has no '{key}'")
        _require(value[key] is None or _is_number(value[key]), path, f"{where}.{key}",
                 f"is {value[key]!r}, not a number or null")


def validate(data: Any, path: Path) -> None:
    """Raise ResultsError (naming ``path`` and the field) unless ``data`` follows the schema."""
    _require(isinstance(data, dict), path, "the top level", "is not a JSON object")
    _require(data.get("schema") == SCHEMA, path, "'schema'",
             f"is {data.get('schema')!r}, expected {SCHEMA!r}")
    for key in TOP_LEVEL_KEYS:
        _require(key in data, path, "the top level", f"has no '{key}'")
    _require(data["runner"] in RUNNERS, path, "'runner'",
             f"is {data['runner']!r}, expected one of {', '.join(RUNNERS)}")
    _require(data["metric"] in GOALS, path, "'metric'",
             f"is {data['metric']!r}, expected 'loss' or 'return'")
    _require(data["goal"] in ("min", "max"), path, "'goal'",
             f"is {data['goal']!r}, expected 'min' or 'max'")
    _require(isinstance(data["records"], list), path, "'records'", "is not a list")
    _require(isinstance(data["summary"], list), path, "'summary'", "is not a list")
    metric = data["metric"]
    for i, record in enumerate(data["records"]):
        where = f"records[{i}]"
        _require(isinstance(record, dict), path, where, "is not an object")
        for key in RECORD_KEYS + (metric,):
            _require(key in record, path, where, f"has no '{key}'")
        _require(record[metric] is None or _is_number(record[metric]), path,
                 f"{where}.{metric}", f"is {record[metric]!r}, not a number or null")
    for i, entry in enumerate(data["summary"]):
        where = f"summary[{i}]"
        _require(isinstance(entry, dict), path, where, "is not an object")
        for key in SUMMARY_KEYS:
            _require(key in entry, path, where, f"has no '{key}'")
        _check_quartiles(entry["rounds_to_target"], path, f"{where}.rounds_to_target")
        _check_quartiles(entry["final"], path, f"{where}.final")
        if entry.get("seconds_to_target") is not None:
            _check_quartiles(entry["seconds_to_target"], path, f"{where}.seconds_to_target")


def load_results(paths: Iterable[str | Path], log=sys.stderr) -> list[Results]:
    """The runners' results files among ``paths``, checked, in the order given.

    Files without a "schema" key are skipped with a line on ``log``; anything
    else that is not a valid results file raises ResultsError.
    """
    loaded = []
    for name in paths:
        path = Path(name)
        data = read_json(path)
        if not is_runner_file(data):
            print(f"skipping {path}: not a benchmark runner results file (no 'schema' key)",
                  file=log)
            continue
        validate(data, path)
        loaded.append(Results(path, data))
    return loaded


# --------------------------------------------------------------------------
# Grouping records
# --------------------------------------------------------------------------

def method_sort_key(method: str) -> tuple:
    """Known methods in METHOD_ORDER, variants right after their base, others last.

    Variants sort naturally: ``[history=8]`` before ``[history=16]``.
    """
    base = base_method(method)
    rank = METHOD_ORDER.index(base) if base in METHOD_ORDER else len(METHOD_ORDER)
    natural = tuple((0, float(part), "") if re.fullmatch(r"\d+(\.\d+)?", part) else (1, 0.0, part)
                    for part in re.split(r"(\d+(?:\.\d+)?)", method) if part)
    return (rank, base, method != base, natural)


def base_method(method: str) -> str:
    """``optex_default[history=8]`` -> ``optex_default``."""
    return method.split("[", 1)[0]


def settings(data: dict) -> list[tuple[str, int]]:
    """The (task, parallelism) pairs of a results file, in order of first appearance."""
    seen: dict[tuple[str, int], None] = {}
    for item in list(data["summary"]) + list(data["records"]):
        seen.setdefault((item["task"], item["parallelism"]), None)
    return list(seen)


def series_by_method(data: dict, task: str, parallelism: int, field: str
                     ) -> dict[str, dict[int, list[tuple[int, float]]]]:
    """method -> seed -> [(round, value)] for one setting; null values become NaN."""
    out: dict[str, dict[int, list[tuple[int, float]]]] = {}
    for record in data["records"]:
        if record["task"] != task or record["parallelism"] != parallelism or field not in record:
            continue
        value = record[field]
        value = math.nan if value is None else float(value)
        out.setdefault(record["method"], {}).setdefault(record["seed"], []).append(
            (int(record["round"]), value))
    return out


def median_band(by_seed: dict[int, list[tuple[int, float]]]
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """rounds, median, q1, q3 over the seeds at each round.

    A run that stopped early (the RL runner stops a run at the threshold) holds
    its last value over the later rounds: summarising only the seeds still
    running would leave the late rounds to the runs that never reached the
    target, and draw a method that succeeds early as collapsing.
    """
    rounds = sorted({r for points in by_seed.values() for r, _ in points})
    table = np.full((len(by_seed), len(rounds)), np.nan)
    column = {r: j for j, r in enumerate(rounds)}
    for i, points in enumerate(by_seed.values()):
        for r, value in points:
            table[i, column[r]] = value
        last = max((r for r, _ in points), default=None)
        if last is not None:
            table[i, column[last] + 1:] = table[i, column[last]]
    keep = ~np.all(np.isnan(table), axis=0)
    table = table[:, keep]
    x = np.asarray(rounds, dtype=float)[keep]
    if table.size == 0:
        return x, x, x, x
    q1, median, q3 = np.nanpercentile(table, [25, 50, 75], axis=0)
    return x, median, q1, q3


def targets(data: dict, task: str, parallelism: int) -> list[float]:
    """The distinct targets the summary gives for one setting."""
    values = {float(e["target"]) for e in data["summary"]
              if e["task"] == task and e["parallelism"] == parallelism
              and _is_number(e.get("target"))}
    return sorted(values)


# --------------------------------------------------------------------------
# Styles and names
# --------------------------------------------------------------------------

def method_styles(methods: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Colour and line style per method.

    Base methods are solid in their fixed colour. Variants such as
    ``optex_default[history=8]`` are dashed, coloured by their position among
    the variants in ``methods``; pass all methods of a results file so every
    figure of the file agrees.
    """
    styles = {}
    variants = []
    for method in sorted(set(methods), key=method_sort_key):
        if method == base_method(method):
            styles[method] = {"color": METHOD_COLOURS.get(method, UNKNOWN_COLOUR),
                              "linestyle": "-"}
        else:
            variants.append(method)
    for k, method in enumerate(variants):
        # The palette has 20 colours; after that the dashes change too.
        dashes = (0, (4, 2)) if k < len(VARIANT_COLOURS) else (0, (1, 1))
        styles[method] = {"color": VARIANT_COLOURS[k % len(VARIANT_COLOURS)],
                          "linestyle": dashes}
    return styles


def _slug(text: str) -> str:
    """A file-name-safe spelling: anything but letters, digits, '.', '_' and '-' becomes '_'."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(text))


def figure_prefix(data: dict) -> str:
    """``<runner>-<preset>-<date>``: what every figure of one results file starts with."""
    return "-".join(_slug(data[key]) for key in ("runner", "preset", "date"))


def curve_figure_name(data: dict, task: str, parallelism: int) -> str:
    """The file name of one setting's metric-against-rounds figure."""
    return f"{figure_prefix(data)}-{_slug(task)}-N{parallelism}.png"


def speedup_figure_name(data: dict) -> str:
    """The file name of a scaling file's speedup-against-N figure."""
    return f"{figure_prefix(data)}-speedup.png"


def has_scaling(data: dict) -> bool:
    """Whether a file holds several parallelism values (and so gets a speedup figure)."""
    return len({p for _, p in settings(data)}) > 1


def all_methods(data: dict) -> list[str]:
    """Every method of a results file, in legend order."""
    return sorted({item["method"] for item in data["summary"] + data["records"]},
                  key=method_sort_key)


# --------------------------------------------------------------------------
# Drawing
# --------------------------------------------------------------------------

def _pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _draw_curves(ax, series: dict[str, dict[int, list[tuple[int, float]]]],
                 styles: dict[str, dict[str, Any]]) -> list[float]:
    """One median line with its IQR band per method; returns every plotted value."""
    plotted: list[float] = []
    for method in sorted(series, key=method_sort_key):
        x, median, q1, q3 = median_band(series[method])
        if x.size == 0:
            continue
        style = styles[method]
        ax.plot(x, median, label=method, **style)
        ax.fill_between(x, q1, q3, color=style["color"], alpha=0.15, linewidth=0)
        plotted.extend(v for v in np.concatenate([median, q1, q3]) if np.isfinite(v))
    return plotted


def _legend(ax) -> None:
    """A small legend, to the right of the axes when it would hide the lines."""
    if len(ax.get_legend_handles_labels()[1]) > LEGEND_INSIDE_MAX:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        ax.legend(fontsize=7, loc="best")


def plot_curves(data: dict, task: str, parallelism: int, out_dir: Path) -> Path:
    """The metric (and test accuracy, where recorded) against rounds for one setting."""
    plt = _pyplot()
    metric = data["metric"]
    styles = method_styles(all_methods(data))
    accuracy = series_by_method(data, task, parallelism, "test_accuracy")
    with_accuracy = any(not math.isnan(v) for seeds in accuracy.values()
                        for points in seeds.values() for _, v in points)
    panels = 2 if with_accuracy else 1
    legend_room = 3.0 if len(all_methods(data)) + 1 > LEGEND_INSIDE_MAX else 0.0
    width = panels * (6.0 + legend_room) + 0.8
    fig, axes = plt.subplots(1, panels, figsize=(width, 4.4), squeeze=False)
    ax = axes[0][0]
    values = _draw_curves(ax, series_by_method(data, task, parallelism, metric), styles)
    for k, target in enumerate(targets(data, task, parallelism)):
        ax.axhline(target, color="black", linestyle="--", linewidth=1.0,
                   label="target value" if k == 0 else None)
        values.append(target)
    # Losses span orders of magnitude; a log axis only works if all are positive.
    if metric == "loss" and values and min(values) > 0:
        ax.set_yscale("log")
    ax.set_xlabel("round")
    ax.set_ylabel(f"{metric} (median, IQR band)")
    ax.set_title(f"{task}, N = {parallelism}")
    _legend(ax)
    ax.grid(True, alpha=0.3)
    if with_accuracy:
        acc_ax = axes[0][1]
        _draw_curves(acc_ax, accuracy, styles)
        acc_ax.set_xlabel("round")
        acc_ax.set_ylabel("test accuracy (median, IQR band)")
        acc_ax.set_title(f"{task}, N = {parallelism}: test accuracy")
        _legend(acc_ax)
        acc_ax.grid(True, alpha=0.3)
    fig.suptitle(f"{data['runner']} / {data['preset']} ({data['date']})", fontsize=9)
    fig.tight_layout()
    path = out_dir / curve_figure_name(data, task, parallelism)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_speedup(data: dict, out_dir: Path) -> Path:
    """Speedup over vanilla against N, one panel per task, with sqrt(N) for reference."""
    plt = _pyplot()
    tasks = list(dict.fromkeys(task for task, _ in settings(data)))
    styles = method_styles(all_methods(data))
    columns = min(3, len(tasks))
    rows = math.ceil(len(tasks) / columns)
    parallelisms = sorted({p for _, p in settings(data)})
    grid = np.geomspace(parallelisms[0], parallelisms[-1], 50)
    panel_width = 5.2 + (3.0 if len(all_methods(data)) + 1 > LEGEND_INSIDE_MAX else 0.0)
    fig, axes = plt.subplots(rows, columns, figsize=(panel_width * columns, 4.2 * rows),
                             squeeze=False)
    for index, task in enumerate(tasks):
        ax = axes[index // columns][index % columns]
        entries = [e for e in data["summary"] if e["task"] == task]
        for method in sorted({e["method"] for e in entries}, key=method_sort_key):
            points = sorted((e["parallelism"], e["speedup_vs_vanilla"]) for e in entries
                            if e["method"] == method and _is_number(e["speedup_vs_vanilla"]))
            if points:
                n, s = zip(*points)
                ax.plot(n, s, marker="o", label=method, **styles[method])
        ax.plot(grid, np.sqrt(grid), color="black", linestyle=":", label="sqrt(N)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(parallelisms, [str(p) for p in parallelisms])
        ax.minorticks_off()
        ax.set_xlabel("parallelism N")
        ax.set_ylabel("speedup in rounds vs vanilla")
        ax.set_title(task)
        _legend(ax)
        ax.grid(True, alpha=0.3)
    for index in range(len(tasks), rows * columns):
        axes[index // columns][index % columns].set_visible(False)
    fig.suptitle(f"{data['runner']} / {data['preset']} ({data['date']})", fontsize=9)
    fig.tight_layout()
    path = out_dir / speedup_figure_name(data)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_figures(results: Results, out_dir: Path) -> list[Path]:
    """Every figure of one results file, written into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [plot_curves(results.data, task, p, out_dir) for task, p in settings(results.data)]
    if has_scaling(results.data):
        paths.append(plot_speedup(results.data, out_dir))
    return paths


def figure_names(data: dict) -> list[str]:
    """The file names of every figure one results file gets."""
    names = [curve_figure_name(data, task, p) for task, p in settings(data)]
    if has_scaling(data):
        names.append(speedup_figure_name(data))
    return names


def check_distinct_prefixes(loaded: list[Results]) -> None:
    """Refuses two files that would overwrite each other's figures: the same runner,
    preset and date with a common (task, N) setting, or both with a speedup figure."""
    seen: dict[str, Path] = {}
    for results in loaded:
        for name in figure_names(results.data):
            if name in seen:
                raise ResultsError(f"{results.path}: same runner, preset, date and setting as "
                                   f"{seen[name]} (figure '{name}' would collide)")
            seen[name] = results.path


def load_runner_results(paths: Iterable[str | Path]) -> list[Results]:
    """The runner results among ``paths``: at least one, with no two figures colliding
    (ResultsError otherwise). What both command lines start from."""
    loaded = load_results(paths)
    if not loaded:
        raise ResultsError("none of the given files is a benchmark runner results file")
    check_distinct_prefixes(loaded)
    return loaded


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="results JSON files (schema optex-bench/1)")
    parser.add_argument("--out", required=True, type=Path, help="directory for the PNG files")
    args = parser.parse_args(argv)
    try:
        loaded = load_runner_results(args.results)
    except ResultsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for results in loaded:
        for path in write_figures(results, args.out):
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
