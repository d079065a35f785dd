"""Reads the GPU check's reports and writes its tables (standard library only: it runs
on the GPU machine's Python and on any other).

    results.py counts junit FILE...      "passed failed skipped" of JUnit XML reports
                                         (ctest --output-junit, GoogleTest, pytest)
    results.py counts gbench FILE...     the same of Google Benchmark JSON: a benchmark
                                         skipped with a message counts as skipped
    results.py sanitizer-errors LOG      the errors compute-sanitizer reported
    results.py bench-table FILE...       bench_cuda's JSON reports as one Markdown table
    results.py summary TSV               the summary rows as an aligned text table
    results.py summary-md TSV MACHINE    the same as Markdown, under the machine's lines

A missing or unreadable report is an error (exit status 3), so that a step whose report
never appeared cannot pass as "0 failed".
"""

from __future__ import annotations

import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

COLUMNS = ("tier", "step", "status", "passed", "failed", "skipped", "seconds", "note")


class ReportError(Exception):
    pass


def junit_counts(paths: list[str]) -> tuple[int, int, int]:
    passed = failed = skipped = 0
    for path in paths:
        try:
            root = ET.parse(path).getroot()
        except (OSError, ET.ParseError) as e:
            raise ReportError(f"{path}: {e}") from e
        for case in root.iter("testcase"):
            children = {child.tag for child in case}
            if children & {"failure", "error"} or case.get("status") == "fail":
                failed += 1
            elif ("skipped" in children or case.get("result") == "skipped"
                  or case.get("status") in ("notrun", "disabled")):
                skipped += 1
            else:
                passed += 1
    return passed, failed, skipped


def gbench_runs(path: str) -> list[dict]:
    try:
        with open(path) as f:
            document = json.load(f)
    except (OSError, ValueError) as e:
        raise ReportError(f"{path}: {e}") from e
    return [b for b in document.get("benchmarks", []) if b.get("run_type", "iteration") == "iteration"]


def gbench_counts(paths: list[str]) -> tuple[int, int, int]:
    passed = skipped = 0
    for path in paths:
        for run in gbench_runs(path):
            if run.get("error_occurred"):
                skipped += 1
            else:
                passed += 1
    return passed, 0, skipped


def sanitizer_errors(path: str) -> int:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as e:
        raise ReportError(f"{path}: {e}") from e
    found = re.findall(r"ERROR SUMMARY: (\d+) error", text)
    if not found:
        raise ReportError(f"{path}: no 'ERROR SUMMARY' line")
    return sum(int(n) for n in found)


def number(value: object, digits: int) -> str:
    return f"{value:.{digits}f}" if isinstance(value, (int, float)) else ""


def bench_table(paths: list[str]) -> str:
    lines = ["| benchmark | time | unit | GB/s | copy ratio | plain Adam ratio | note |",
             "|---|---:|---|---:|---:|---:|---|"]
    for path in paths:
        for run in gbench_runs(path):
            name = run.get("name", "?").replace("/manual_time", "")
            name = re.sub(r"/iterations:\d+", "", name)
            if run.get("error_occurred"):
                lines.append(f"| {name} | | | | | | {run.get('error_message', 'skipped')} |")
                continue
            per_second = run.get("bytes_per_second")
            lines.append("| " + " | ".join([
                name,
                number(run.get("real_time"), 3),
                run.get("time_unit", ""),
                number(per_second / 1e9, 1) if isinstance(per_second, (int, float)) else "",
                number(run.get("copy_ratio"), 3),
                number(run.get("plain_adam_ratio"), 2),
                "",
            ]) + " |")
    return "\n".join(lines)


def read_rows(tsv: str) -> list[list[str]]:
    rows = []
    for line in Path(tsv).read_text().splitlines():
        cells = line.split("\t")
        rows.append((cells + [""] * len(COLUMNS))[: len(COLUMNS)])
    return rows


def text_table(rows: list[list[str]]) -> str:
    table = [list(COLUMNS)] + rows
    widths = [max(len(r[i]) for r in table) for i in range(len(COLUMNS) - 1)]
    out = []
    for r in table:
        cells = [r[i].ljust(widths[i]) for i in range(len(COLUMNS) - 1)] + [r[-1]]
        out.append("  ".join(cells).rstrip())
    return "\n".join(out)


def markdown_table(rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    out += ["| " + " | ".join(cell.replace("|", "/") for cell in r) + " |" for r in rows]
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    command, rest = argv[1], argv[2:]
    try:
        if command == "counts" and rest and rest[0] in ("junit", "gbench") and len(rest) > 1:
            counts = junit_counts(rest[1:]) if rest[0] == "junit" else gbench_counts(rest[1:])
            print(*counts)
        elif command == "sanitizer-errors" and len(rest) == 1:
            print(sanitizer_errors(rest[0]))
        elif command == "bench-table" and rest:
            print(bench_table(rest))
        elif command == "summary" and len(rest) == 1:
            print(text_table(read_rows(rest[0])))
        elif command == "summary-md" and len(rest) == 2:
            machine = Path(rest[1]).read_text() if Path(rest[1]).exists() else "(no machine report)\n"
            print("# GPU check\n\n```\n" + machine.rstrip() + "\n```\n\n" + markdown_table(read_rows(rest[0])))
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except ReportError as e:
        print(f"results.py: {e}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
