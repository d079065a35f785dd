"""The shared JSON schema of the benchmark runners ("optex-bench/1") and its summary statistics.

A document::

    {"schema": "optex-bench/1", "runner": "rl" | "supervised", "preset", "command",
     "date": "YYYY-MM-DD", "machine", "metric": "return" | "loss", "goal": "max" | "min",
     "config": {...runner-specific...},
     "records": [{"task", "parallelism", "method", "seed", "round", <metric>,
                  "gradient_evaluations", "seconds", ...extras}],
     "summary": [{"task", "parallelism", "method", "lr", "target", "seeds", "reached",
                  "rounds_to_target": {"median", "q1", "q3"},
                  "seconds_to_target": {...}, "final": {...},
                  "speedup_vs_vanilla", "speedup_vs_best_baseline", "note"?}]}

Records hold one row per round of every run (round 0 = the start; counts and
seconds are cumulative). In the summary, a seed that never reaches the target
counts as +infinity, so a median or quartile that lands on it is infinite, and
every non-finite number is written as null. ``speedup_vs_vanilla`` is vanilla's
median rounds to the target over the method's; ``speedup_vs_best_baseline``
divides instead the smallest finite median among vanilla_nlr, data_parallel and
line_search.
"""

from __future__ import annotations

import datetime
import gzip
import json
import math
import os
import platform
import shlex
import sys
from collections import defaultdict
from typing import Any, Callable, Iterable, Sequence

from methods import BASELINES

SCHEMA = "optex-bench/1"


def machine_description() -> str:
    """The CPU model and the number of logical cores, e.g. "AMD EPYC 7B13 (2 cores)"."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model} ({os.cpu_count()} cores)"


def command_line() -> str:
    """How this process was started, quoted for a shell."""
    return " ".join(shlex.quote(a) for a in [os.path.basename(sys.executable)] + sys.argv)


def today() -> str:
    return datetime.date.today().isoformat()


def finite_or_none(value: float | None) -> float | None:
    """The JSON spelling of a number: null unless finite."""
    return value if value is not None and math.isfinite(value) else None


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile that treats +inf as a value, not as NaN-producing."""
    position = (len(sorted_values) - 1) * q
    low, high = math.floor(position), math.ceil(position)
    a, b = sorted_values[low], sorted_values[high]
    fraction = position - low
    if fraction == 0.0 or a == b:
        return a
    if math.isinf(a) or math.isinf(b):
        return math.inf
    return a + (b - a) * fraction


def quartiles(values: Iterable[float]) -> dict[str, float | None]:
    """{"median", "q1", "q3"} of the values (+inf allowed); null where infinite or empty."""
    ordered = sorted(values)
    if not ordered:
        return {"median": None, "q1": None, "q3": None}
    return {
        name: finite_or_none(_percentile(ordered, q))
        for name, q in (("median", 0.5), ("q1", 0.25), ("q3", 0.75))
    }



def iqr_verdict(own: dict[str, float | None], other: dict[str, float | None]) -> str:
    """"win", "loss" or "no clear difference" between two ``quartiles`` of a cost (lower is
    better; None: not reached, +inf): clear only when the IQRs do not overlap."""
    a, b = ([math.inf if q[k] is None else q[k] for k in ("q1", "median", "q3")] for q in (own, other))
    if a[1] == b[1] == math.inf:
        return "no clear difference"
    if a[2] < b[0]:
        return "win"
    if b[2] < a[0]:
        return "loss"
    return "no clear difference"

def median(values: Iterable[float]) -> float:
    """The median (+inf allowed; NaN when empty)."""
    ordered = sorted(values)
    return _percentile(ordered, 0.5) if ordered else math.nan


def reaches(value: float, target: float, goal: str) -> bool:
    return value >= target if goal == "max" else value <= target


def group_runs(records: Iterable[dict[str, Any]]) -> dict[tuple, list[dict[str, Any]]]:
    """Records by run: (task, parallelism, method, seed) -> that run's records in round order."""
    runs: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        runs[(record["task"], record["parallelism"], record["method"], record["seed"])].append(record)
    for rows in runs.values():
        rows.sort(key=lambda r: r["round"])
    return runs


def first_reaching(
    run: Sequence[dict[str, Any]],
    metric: str,
    target: float,
    goal: str,
    eligible: Callable[[dict[str, Any]], bool] | None = None,
) -> dict[str, Any] | None:
    """The first record of a run whose metric reaches the target (and is eligible), or None."""
    for record in run:
        value = record.get(metric)
        if value is None or not math.isfinite(value):
            continue
        if (eligible is None or eligible(record)) and reaches(value, target, goal):
            return record
    return None


def summarize(
    records: Sequence[dict[str, Any]],
    metric: str,
    goal: str,
    targets: dict[str, float],
    lrs: dict[tuple[str, int, str], float],
    eligible: Callable[[dict[str, Any]], bool] | None = None,
    extra_finals: Sequence[str] = (),
    notes: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """One summary row per (task, parallelism, method), in the order the records first name them.

    ``targets[task]``: the value to reach; ``lrs[(task, parallelism, method)]``: the
    learning rate the method ran with; ``eligible(record)``: whether a record may count
    as reaching (RL: a full moving-average window); ``extra_finals``: record fields whose
    final values are summarized too (as "final_<name>"); ``notes[method]``: a remark.
    """
    runs = group_runs(records)
    groups: dict[tuple[str, int, str], list[list[dict[str, Any]]]] = defaultdict(list)
    for (task, parallelism, method, _seed), run in runs.items():
        groups[(task, parallelism, method)].append(run)

    rows: list[dict[str, Any]] = []
    for (task, parallelism, method), method_runs in groups.items():
        target = targets[task]
        rounds, seconds, finals = [], [], []
        for run in method_runs:
            hit = first_reaching(run, metric, target, goal, eligible)
            rounds.append(math.inf if hit is None else hit["round"])
            seconds.append(math.inf if hit is None else hit["seconds"])
            finals.append(run[-1][metric])
        row: dict[str, Any] = {
            "task": task,
            "parallelism": parallelism,
            "method": method,
            "lr": lrs.get((task, parallelism, method)),
            "target": target,
            "seeds": len(method_runs),
            "reached": sum(math.isfinite(r) for r in rounds),
            "rounds_to_target": quartiles(rounds),
            "seconds_to_target": quartiles(seconds),
            "final": quartiles(f for f in finals if f is not None),
        }
        for name in extra_finals:
            values = [run[-1][name] for run in method_runs if run[-1].get(name) is not None]
            row["final_" + name] = quartiles(values)
        if notes and method in notes:
            row["note"] = notes[method]
        rows.append(row)
    add_speedups(rows)
    return rows


def add_speedups(rows: Sequence[dict[str, Any]]) -> None:
    """Sets each summary row's ``speedup_vs_vanilla`` and ``speedup_vs_best_baseline`` from the
    median rounds to the target of the rows of the same (task, parallelism); a null median
    (the target not reached by half the seeds) counts as infinitely many rounds."""
    median_rounds: dict[tuple[str, int, str], float] = {}
    for row in rows:
        value = row["rounds_to_target"]["median"]
        median_rounds[(row["task"], row["parallelism"], row["method"])] = math.inf if value is None else value
    for row in rows:
        key = (row["task"], row["parallelism"])
        own = median_rounds[key + (row["method"],)]
        vanilla = median_rounds.get(key + ("vanilla",), math.inf)
        baselines = [median_rounds[key + (b,)] for b in BASELINES if key + (b,) in median_rounds]
        best_baseline = min((b for b in baselines if math.isfinite(b)), default=math.inf)
        row["speedup_vs_vanilla"] = _ratio(vanilla, own)
        row["speedup_vs_best_baseline"] = _ratio(best_baseline, own)


def _ratio(reference_rounds: float, rounds: float) -> float | None:
    if not (math.isfinite(reference_rounds) and math.isfinite(rounds)) or rounds <= 0:
        return None
    return reference_rounds / rounds


def document(
    runner: str,
    preset: str,
    metric: str,
    goal: str,
    config: dict[str, Any],
    records: list[dict[str, Any]],
    summary: list[dict[str, Any]],
) -> dict[str, Any]:
    """A whole optex-bench/1 document for this process's command line, today, this machine."""
    return {
        "schema": SCHEMA,
        "runner": runner,
        "preset": preset,
        "command": command_line(),
        "date": today(),
        "machine": machine_description(),
        "metric": metric,
        "goal": goal,
        "config": config,
        "records": records,
        "summary": summary,
    }


def json_safe(value: Any) -> Any:
    """A copy with every non-finite float replaced by None (JSON null), tuples as lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def write_json(path: str, doc: dict[str, Any], rows_key: str = "records") -> None:
    """Writes a document (strict JSON: no NaN or Infinity).

    Everything but the rows (``doc[rows_key]``) is indented; the rows, by far the bulk, come last,
    one compact object per line, which keeps files small and diffs readable.
    """
    safe = json_safe(doc)
    rows = safe.pop(rows_key, [])
    head = json.dumps(safe, indent=1, allow_nan=False)
    body = ",\n".join(json.dumps(r, separators=(",", ":"), allow_nan=False) for r in rows)
    text = head[: head.rindex("}")].rstrip() + f',\n "{rows_key}": [\n' + body + "\n ]\n}\n"
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    # A path ending in ".gz" is written gzip-compressed (plots.py and report.py read both).
    if str(path).endswith(".gz"):
        with gzip.open(path, "wt", encoding="utf-8") as out:
            out.write(text)
    else:
        with open(path, "w") as out:
            out.write(text)
