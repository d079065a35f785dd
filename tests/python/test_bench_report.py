"""The benchmark report and figures (bench/python/report.py, plots.py) on small
hand-made results files: a table row for every (task, method), wins, losses
and overlaps classified from the interquartile ranges, goal "max" (RL return)
handled, the expected PNG files written, and bad input named clearly.

Needs neither the optex package nor the runners; the plot tests need
matplotlib and skip without it.
"""

from __future__ import annotations

import importlib
import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH_PYTHON = Path(__file__).resolve().parents[2] / "bench" / "python"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
DATE = "2026-01-01"


@pytest.fixture(scope="module")
def bench(request):
    """The plots and report modules, imported from bench/python."""
    sys.path.insert(0, str(BENCH_PYTHON))
    try:
        plots = importlib.import_module("plots")
        report = importlib.import_module("report")
    finally:
        sys.path.remove(str(BENCH_PYTHON))
    return plots, report


# --------------------------------------------------------------------------
# Building results files
# --------------------------------------------------------------------------

def quartiles(values):
    """(median, q1, q3) -> the schema's object; None -> all null."""
    if values is None:
        return {"median": None, "q1": None, "q3": None}
    median, q1, q3 = values
    return {"median": median, "q1": q1, "q3": q3}


def entry(task, p, method, rounds, final, seeds=5, reached=None, seconds=None, **extra):
    """One summary entry; ``rounds``/``final``/``seconds`` are (median, q1, q3) or None."""
    if reached is None:
        reached = seeds if rounds is not None else 0
    out = {"task": task, "parallelism": p, "method": method, "lr": 0.1, "target": 0.01,
           "seeds": seeds, "reached": reached, "rounds_to_target": quartiles(rounds),
           "final": quartiles(final), "speedup_vs_vanilla": None,
           "speedup_vs_best_baseline": None}
    if seconds is not None:
        out["seconds_to_target"] = quartiles(seconds)
    out.update(extra)
    return out


def records_for(summary, metric, seeds=3, rounds=6, start=1.0, extra=None):
    """A short decreasing (or, for return, increasing) curve per summary entry and seed."""
    records = []
    for e in summary:
        for seed in range(seeds):
            for r in range(rounds + 1):
                value = start * 0.5 ** r * (1 + 0.1 * seed)
                if metric == "return":
                    value = 10.0 * r + seed
                record = {"task": e["task"], "parallelism": e["parallelism"],
                          "method": e["method"], "seed": seed, "round": r,
                          metric: value, "gradient_evaluations": r * e["parallelism"],
                          "seconds": 0.01 * r}
                if extra:
                    record.update(extra(r, seed))
                records.append(record)
    # One diverged round: null values must not break anything.
    records[-1][metric] = None
    return records


def document(runner, preset, metric, summary, records):
    return {"schema": "optex-bench/1", "runner": runner, "preset": preset,
            "command": f"{runner} --preset {preset}", "date": DATE, "machine": "test machine",
            "metric": metric, "goal": "min" if metric == "loss" else "max",
            "config": {"seeds": 5}, "records": records, "summary": summary}


def write(path: Path, doc) -> Path:
    """Writes `doc` as JSON, gzip-compressed when the name ends in .gz (as large results are)."""
    if path.name.endswith(".gz"):
        with gzip.open(path, "wt", encoding="utf-8") as f:
            json.dump(doc, f)
    else:
        path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def loss_summary():
    """sphere: optex_default clearly wins, optex_reference overlaps.
    rosenbrock: optex_default clearly loses, optex_reference never reaches the target."""
    return [
        entry("sphere", 4, "vanilla", (40, 38, 42), (0.005, 0.004, 0.006)),
        entry("sphere", 4, "vanilla_nlr", (30, 28, 33), (0.005, 0.004, 0.006)),
        entry("sphere", 4, "data_parallel", (40, 38, 42), (0.005, 0.004, 0.006)),
        entry("sphere", 4, "line_search", (25, 23, 27), (0.005, 0.004, 0.006)),
        entry("sphere", 4, "target", (8, 7, 9), (0.001, 0.001, 0.002)),
        entry("sphere", 4, "optex_default", (10, 9, 11), (0.002, 0.001, 0.003)),
        entry("sphere", 4, "optex_reference", (24, 22, 26), (0.005, 0.004, 0.006)),
        entry("sphere", 4, "ablation_last_point", None, (0.5, 0.4, 0.6)),
        entry("rosenbrock", 4, "vanilla", (30, 28, 32), (0.005, 0.004, 0.006)),
        entry("rosenbrock", 4, "line_search", (20, 18, 22), (0.005, 0.004, 0.006)),
        entry("rosenbrock", 4, "optex_default", (40, 36, 44), (0.008, 0.007, 0.009)),
        entry("rosenbrock", 4, "optex_reference", None, (0.2, 0.1, 0.3), reached=1),
        entry("rosenbrock", 4, "optex_default[history=8]", (40, 37, 45), (0.008, 0.007, 0.009)),
    ]


def rl_summary():
    """goal max; no method reaches the target, so final returns decide.
    cartpole: optex_default clearly higher; acrobot: clearly lower."""
    return [
        entry("cartpole-linear", 4, "vanilla", None, (100, 90, 110)),
        entry("cartpole-linear", 4, "vanilla_nlr", None, (120, 110, 130)),
        entry("cartpole-linear", 4, "line_search", None, (150, 140, 160)),
        entry("cartpole-linear", 4, "optex_default", None, (300, 280, 320)),
        entry("acrobot-linear", 4, "vanilla", None, (-300, -320, -280)),
        entry("acrobot-linear", 4, "vanilla_nlr", None, (-300, -320, -280)),
        entry("acrobot-linear", 4, "line_search", None, (-200, -210, -190)),
        entry("acrobot-linear", 4, "optex_default", None, (-400, -420, -380)),
        # Reached by everyone here, and no same-budget baseline ran: vanilla is
        # the reference, rounds decide, seconds are reported.
        entry("cartpole-mlp", 4, "vanilla", (50, 45, 55), (480, 470, 490), seconds=(5, 4, 6)),
        entry("cartpole-mlp", 4, "optex_default", (20, 18, 22), (490, 480, 500),
              seconds=(2.5, 2, 3)),
    ]


def scaling_summary():
    out = []
    for p in (2, 4, 8):
        out.append(entry("sphere", p, "vanilla", (40, 38, 42), (0.005, 0.004, 0.006),
                         speedup_vs_vanilla=1.0))
        out.append(entry("sphere", p, "optex_default", (40 / p ** 0.5, 36 / p ** 0.5, 44 / p ** 0.5),
                         (0.002, 0.001, 0.003), speedup_vs_vanilla=p ** 0.5,
                         sqrt_parallelism=p ** 0.5))
    return out


@pytest.fixture()
def files(tmp_path):
    """Four results files (loss, RL, scaling, supervised) and one foreign JSON file."""
    loss = loss_summary()
    rl = rl_summary()
    scaling = scaling_summary()
    accuracy_summary = {"final_test_accuracy": quartiles((0.9, 0.88, 0.92))}
    supervised = [entry("digits-softmax", 2, "vanilla", (30, 28, 32), (0.3, 0.28, 0.32),
                        **accuracy_summary),
                  entry("digits-softmax", 2, "optex_default", (15, 14, 16), (0.2, 0.19, 0.21),
                        **accuracy_summary)]
    accuracy = lambda r, seed: {"test_loss": 1.0 / (r + 1), "test_accuracy": 0.5 + 0.05 * r}
    paths = {
        "loss": write(tmp_path / "optex-bench-ci.json",
                      document("optex-bench", "ci", "loss", loss, records_for(loss, "loss"))),
        "rl": write(tmp_path / "rl-ci.json",
                    document("rl", "ci", "return", rl, records_for(rl, "return"))),
        "scaling": write(tmp_path / "optex-bench-scaling.json",
                         document("optex-bench", "scaling", "loss", scaling,
                                  records_for(scaling, "loss"))),
        "supervised": write(tmp_path / "supervised-ci.json.gz",
                            document("supervised", "ci", "loss", supervised,
                                     records_for(supervised, "loss", extra=accuracy))),
        "foreign": write(tmp_path / "cpu-estimator.json", {"context": {}, "benchmarks": []}),
    }
    return paths


def run_report(files, tmp_path, *extra):
    out = tmp_path / "docs" / "RESULTS.md"
    names = [str(files[k]) for k in ("loss", "rl", "scaling", "supervised", "foreign")]
    done = subprocess.run([sys.executable, str(BENCH_PYTHON / "report.py"), *names,
                           "--figures", str(tmp_path / "docs" / "figures"), "--out", str(out),
                           *extra], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return out.read_text(encoding="utf-8"), done


def section(text, heading, level="###"):
    """The text after a heading line up to the next heading of that level or above."""
    match = re.search(rf"^{level} {re.escape(heading)}.*$", text, flags=re.MULTILINE)
    assert match, f"no heading '{level} {heading}'"
    rest = text[match.end():]
    following = re.search(rf"^#{{2,{len(level)}}} ", rest, flags=re.MULTILINE)
    return rest[: following.start()] if following else rest


def file_section(text, runner, preset):
    """The part of the report about one results file."""
    return section(text, f"{runner} / {preset} (", level="##")


# --------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------

def test_report_has_a_row_for_every_task_and_method(bench, files, tmp_path):
    text, _ = run_report(files, tmp_path, "--no-plots")
    for key in ("loss", "rl", "scaling", "supervised"):
        doc = bench[0].read_json(files[key])
        part = file_section(text, doc["runner"], doc["preset"])
        for e in doc["summary"]:
            rows = section(part, f"{e['task']}, N = {e['parallelism']}")
            assert f"| `{e['method']}` |" in rows, (key, e["task"], e["method"])


def test_report_header_names_the_command_and_every_file(files, tmp_path):
    text, done = run_report(files, tmp_path, "--no-plots")
    assert text.startswith("# Benchmark results\n")
    assert "Generated by `bench/python/report.py`" in text
    assert "python bench/python/report.py " in text
    for key in ("loss", "rl", "scaling", "supervised"):
        assert f"- File: `{files[key].as_posix()}`" in text
    assert "- Machine: test machine" in text
    assert "cpu-estimator.json" in done.stderr  # skipped, and said so
    assert "## rl / ci (2026-01-01)" in text


def test_unreached_and_null_values_are_shown_as_such(files, tmp_path):
    text, _ = run_report(files, tmp_path, "--no-plots")
    row = next(line for line in section(text, "sphere, N = 4").splitlines()
               if line.startswith("| `ablation_last_point` |"))
    assert "| 0/5 |" in row and "not reached" in row


def test_supervised_table_has_final_test_accuracy(files, tmp_path):
    text, _ = run_report(files, tmp_path, "--no-plots")
    rows = section(text, "digits-softmax, N = 2")
    assert "final test accuracy, median [IQR]" in rows
    assert "| 0.9 [0.88, 0.92] |" in rows


def test_runner_notes_are_stated_once(bench):
    _, report = bench
    summary = [entry(task, 4, method, (10, 9, 11), (1, 1, 1),
                     note="upper bound: N sequential steps; best baseline: line_search"
                     if method == "target" else "best baseline: line_search")
               for task in ("sphere", "ackley") for method in ("line_search", "target")]
    notes = report.notes(document("optex-bench", "ci", "loss", summary, []))
    assert notes.count("target: upper bound: N sequential steps") == 1
    assert not any("best baseline:" in n for n in notes)


def test_notes_say_where_optex_reaches_the_target_in_more_or_fewer_seeds(bench):
    _, report = bench
    summary = [entry("acrobot-linear", 4, "data_parallel", (14, 13, None), (-98, -400, -96),
                     seeds=10, reached=7),
               entry("acrobot-linear", 4, "optex_default", (16, 15, 21), (-98, -99, -96),
                     seeds=10, reached=10),
               entry("acrobot-linear", 4, "optex_reference", (None, 46, None), (-119, -421, -99),
                     seeds=10, reached=7)]
    notes = report.notes(document("rl", "full", "return", summary, []))
    assert ("acrobot-linear (N = 4): optex_default reaches the target in 10/10 seeds, the best "
            "same-budget baseline, data_parallel, in 7/10.") in notes
    # The same count is no news.
    assert not any("optex_reference reaches the target" in n for n in notes)


def test_clear_win_loss_and_overlap_are_classified(bench):
    plots, report = bench
    doc = document("optex-bench", "ci", "loss", loss_summary(), [])
    verdicts = {(c.task, c.method): (c.verdict, c.reference)
                for c in report.optex_comparisons(doc)}
    assert verdicts[("sphere", "optex_default")] == (report.WIN, "line_search")
    assert verdicts[("sphere", "optex_reference")] == (report.TIE, "line_search")
    assert verdicts[("rosenbrock", "optex_default")] == (report.LOSS, "line_search")
    assert verdicts[("rosenbrock", "optex_reference")] == (report.LOSS, "line_search")


def test_optex_adaptive_is_compared_as_an_optex_method(bench):
    plots, report = bench
    summary = loss_summary() + [
        entry("sphere", 4, "optex_adaptive", (12, 11, 13), (0.002, 0.001, 0.003)),
        entry("rosenbrock", 4, "optex_adaptive", (21, 19, 23), (0.005, 0.004, 0.006))]
    doc = document("optex-bench", "ci", "loss", summary, [])
    verdicts = {(c.task, c.method): (c.verdict, c.reference)
                for c in report.optex_comparisons(doc)}
    assert verdicts[("sphere", "optex_adaptive")] == (report.WIN, "line_search")
    assert verdicts[("rosenbrock", "optex_adaptive")] == (report.TIE, "line_search")
    # Not an ablation or a variant of optex_default.
    assert all(c.method != "optex_adaptive" for c in report.ablation_comparisons(doc))
    assert report.tally(report.optex_comparisons(doc))[1].startswith(
        "- `optex_adaptive` against the best same-budget baseline")


def test_sentences_say_what_was_classified(files, tmp_path):
    text, _ = run_report(files, tmp_path, "--no-plots")
    findings = section(file_section(text, "optex-bench", "ci"), "Findings")
    wins, rest = findings.split("**No clear difference**")
    ties, losses = rest.split("**Clear losses of OptEx**")
    assert ("sphere (N = 4): optex_default wins against the best same-budget baseline, "
            "line_search: 2.5x fewer rounds; 10 [9, 11] against 25 [23, 27]") in wins
    assert "optex_reference" not in wins
    assert "sphere (N = 4): no clear difference between optex_reference" in ties
    assert "the IQRs overlap" in ties
    assert "rosenbrock (N = 4): optex_default loses to the best same-budget baseline" in losses
    assert "2x more rounds" in losses
    assert ("rosenbrock (N = 4): optex_reference loses to the best same-budget baseline, "
            "line_search: it reaches the target in only 1/5 seeds") in losses
    assert "data_parallel has the same numbers as vanilla" in findings
    assert "## Summary" in text and "clear wins" in text


def test_touching_interquartile_ranges_are_no_clear_difference(bench):
    _, report = bench
    Spread = report.Spread
    assert report.classify(Spread(10, 9, 11), Spread(12, 11, 13), True) == report.TIE
    assert report.classify(Spread(10, 9, 10.9), Spread(12, 11, 13), True) == report.WIN
    assert report.classify(Spread(14, 13.1, 15), Spread(12, 11, 13), True) == report.LOSS


def test_a_single_seed_makes_no_claim(bench):
    _, report = bench
    summary = [entry("sphere", 4, "vanilla", (40, 40, 40), (1, 1, 1), seeds=1),
               entry("sphere", 4, "optex_default", (10, 10, 10), (1, 1, 1), seeds=1)]
    (comparison,) = report.optex_comparisons(document("optex-bench", "ci", "loss", summary, []))
    assert comparison.verdict == report.TIE
    assert "one seed only" in comparison.text


def test_goal_max_prefers_higher_return(bench):
    _, report = bench
    doc = document("rl", "ci", "return", rl_summary(), [])
    by_task = {c.task: c for c in report.optex_comparisons(doc)}
    assert by_task["cartpole-linear"].reference == "line_search"  # 150 beats vanilla_nlr's 120
    assert by_task["cartpole-linear"].verdict == report.WIN
    assert by_task["acrobot-linear"].reference == "line_search"  # -200 beats -300
    assert by_task["acrobot-linear"].verdict == report.LOSS
    assert by_task["cartpole-mlp"].reference == "vanilla"
    assert by_task["cartpole-mlp"].verdict == report.WIN
    assert "the only baseline in this setting, vanilla" in by_task["cartpole-mlp"].text
    assert ("return 150 higher; final return 300 [280, 320] against 150 [140, 160]"
            in by_task["cartpole-linear"].text)
    assert "return 200 lower; final return -400" in by_task["acrobot-linear"].text
    assert "seconds to target 2.5 [2, 3] against 5 [4, 6]" in by_task["cartpole-mlp"].text


def test_rl_table_has_the_seconds_column(files, tmp_path):
    text, _ = run_report(files, tmp_path, "--no-plots")
    assert "seconds to target, median [IQR]" in section(text, "cartpole-mlp, N = 4")
    assert "seconds to target" not in file_section(text, "optex-bench", "ci")
    assert "higher is better" in text


def test_scaling_notes_compare_with_sqrt_n(bench):
    _, report = bench
    doc = document("optex-bench", "scaling", "loss", scaling_summary(), [])
    notes = " ".join(report.notes(doc))
    assert "1.41 at N = 2 (sqrt(N) = 1.41)" in notes
    assert "2.83 at N = 8 (sqrt(N) = 2.83)" in notes


def test_report_is_deterministic(files, tmp_path):
    first, _ = run_report(files, tmp_path, "--no-plots")
    second, _ = run_report(files, tmp_path, "--no-plots")
    assert first == second


# --------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------

def run_cli(script, *args):
    return subprocess.run([sys.executable, str(BENCH_PYTHON / script), *map(str, args)],
                          capture_output=True, text=True, check=False)


@pytest.mark.parametrize("script", ["report.py", "plots.py"])
def test_missing_file_is_named(script, tmp_path):
    missing = tmp_path / "nowhere.json"
    extra = ["--figures", tmp_path] if script == "report.py" else []
    done = run_cli(script, missing, *extra, "--out", tmp_path / "out")
    assert done.returncode == 2
    assert f"{missing}: no such file" in done.stderr


def test_files_of_one_preset_and_date_may_hold_different_tasks(bench, tmp_path):
    """Separate runs of one preset on one day (one task each) coexist; the same
    setting twice would overwrite a figure and is refused, naming both files."""
    plots, _ = bench
    by_task = {}
    for e in rl_summary():
        by_task.setdefault(e["task"], []).append(e)
    paths = [write(tmp_path / f"rl-{task}.json",
                   document("rl", "full", "return", rows, records_for(rows, "return")))
             for task, rows in by_task.items()]
    plots.check_distinct_prefixes(plots.load_results(paths))
    again = write(tmp_path / "rl-again.json",
                  document("rl", "full", "return", by_task["cartpole-mlp"],
                           records_for(by_task["cartpole-mlp"], "return")))
    with pytest.raises(plots.ResultsError, match=r"rl-again.json: .*rl-cartpole-mlp.json .*would collide"):
        plots.check_distinct_prefixes(plots.load_results([*paths, again]))


def test_a_corrupt_gzip_file_is_named(bench, tmp_path):
    plots, _ = bench
    broken = tmp_path / "broken.json.gz"
    broken.write_bytes(b"not gzip at all")
    with pytest.raises(plots.ResultsError, match="broken.json.gz: not a valid gzip file"):
        plots.load_results([broken])


@pytest.mark.parametrize("script", ["report.py", "plots.py"])
def test_wrong_schema_is_named(script, tmp_path):
    doc = document("optex-bench", "ci", "loss", loss_summary(), [])
    doc["schema"] = "optex-bench/0"
    bad = write(tmp_path / "old.json", doc)
    extra = ["--figures", tmp_path] if script == "report.py" else []
    done = run_cli(script, bad, *extra, "--out", tmp_path / "out")
    assert done.returncode == 2
    assert f"{bad}: 'schema' is 'optex-bench/0', expected 'optex-bench/1'" in done.stderr


def test_malformed_files_are_named_with_the_field(bench, tmp_path):
    plots, _ = bench
    doc = document("optex-bench", "ci", "loss", loss_summary(), [])
    del doc["summary"][2]["rounds_to_target"]
    bad = write(tmp_path / "bad.json", doc)
    with pytest.raises(plots.ResultsError, match=r"bad\.json: summary\[2\] has no 'rounds_to_target'"):
        plots.load_results([bad])
    broken = tmp_path / "broken.json"
    broken.write_text("{", encoding="utf-8")
    with pytest.raises(plots.ResultsError, match=r"broken\.json: not valid JSON"):
        plots.load_results([broken])
    doc = document("rl", "ci", "return", rl_summary(), records_for(rl_summary(), "return"))
    del doc["records"][0]["return"]
    bad = write(tmp_path / "norecord.json", doc)
    with pytest.raises(plots.ResultsError, match=r"norecord\.json: records\[0\] has no 'return'"):
        plots.load_results([bad])


def test_only_foreign_files_is_an_error(files, tmp_path):
    done = run_cli("report.py", files["foreign"], "--figures", tmp_path, "--out", tmp_path / "r.md")
    assert done.returncode == 2
    assert "none of the given files" in done.stderr


# --------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------

def assert_png(path: Path):
    assert path.is_file(), f"{path.name} was not written"
    data = path.read_bytes()
    assert len(data) > len(PNG_SIGNATURE) and data.startswith(PNG_SIGNATURE), path.name


def test_plots_writes_the_expected_pngs(bench, files, tmp_path):
    pytest.importorskip("matplotlib", reason="the figures need matplotlib (pip install matplotlib)")
    plots, _ = bench
    out = tmp_path / "figures"
    names = [files[k] for k in ("loss", "rl", "scaling", "supervised", "foreign")]
    assert plots.main([*map(str, names), "--out", str(out)]) == 0
    expected = {
        f"optex-bench-ci-{DATE}-sphere-N4.png",
        f"optex-bench-ci-{DATE}-rosenbrock-N4.png",
        f"rl-ci-{DATE}-cartpole-linear-N4.png",
        f"rl-ci-{DATE}-acrobot-linear-N4.png",
        f"rl-ci-{DATE}-cartpole-mlp-N4.png",
        f"optex-bench-scaling-{DATE}-sphere-N2.png",
        f"optex-bench-scaling-{DATE}-sphere-N4.png",
        f"optex-bench-scaling-{DATE}-sphere-N8.png",
        f"optex-bench-scaling-{DATE}-speedup.png",
        f"supervised-ci-{DATE}-digits-softmax-N2.png",
    }
    assert {p.name for p in out.iterdir()} == expected
    for name in expected:
        assert_png(out / name)


def test_report_links_the_figures_it_draws(files, tmp_path):
    pytest.importorskip("matplotlib", reason="the figures need matplotlib (pip install matplotlib)")
    text, _ = run_report(files, tmp_path)
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert f"figures/optex-bench-scaling-{DATE}-speedup.png" in links
    assert len(links) == 10  # nine (task, N) figures and one speedup figure
    for target in links:
        assert_png(tmp_path / "docs" / target)


def test_a_run_that_stopped_early_holds_its_last_value(bench):
    plots, _ = bench
    # Seed 0 reached the target at round 2 and stopped; seed 1 ran all 4 rounds at 0.
    x, median, q1, q3 = plots.median_band({0: [(0, 0.0), (1, 5.0), (2, 10.0)],
                                           1: [(r, 0.0) for r in range(5)]})
    assert list(x) == [0, 1, 2, 3, 4]
    assert list(median) == [0.0, 2.5, 5.0, 5.0, 5.0]  # not 0 from round 3 on
    assert q1[4] == pytest.approx(2.5) and q3[4] == pytest.approx(7.5)


def test_method_colours_are_fixed(bench):
    plots, _ = bench
    one = plots.method_styles(["vanilla", "optex_default"])
    other = plots.method_styles(["optex_default", "line_search", "optex_default[history=8]"])
    assert one["optex_default"]["color"] == other["optex_default"]["color"]
    assert one["vanilla"]["color"] == plots.method_styles(["vanilla"])["vanilla"]["color"]
    variant = other["optex_default[history=8]"]
    assert variant["linestyle"] != "-"
    assert variant["color"] not in plots.METHOD_COLOURS.values()
    # Every method has a colour of its own.
    assert set(plots.METHOD_COLOURS) == set(plots.METHOD_ORDER)
    assert len(set(plots.METHOD_COLOURS.values())) == len(plots.METHOD_COLOURS)
    assert plots.UNKNOWN_COLOUR not in plots.METHOD_COLOURS.values()


def test_optex_adaptive_is_compared_with_the_best_baseline(bench):
    _, report = bench
    summary = loss_summary() + [
        entry("sphere", 4, "optex_adaptive", (12, 11, 13), (0.002, 0.001, 0.003)),
        entry("rosenbrock", 4, "optex_adaptive", (30, 29, 31), (0.008, 0.007, 0.009))]
    doc = document("optex-bench", "ci", "loss", summary, [])
    verdicts = {(c.task, c.method): (c.verdict, c.reference)
                for c in report.optex_comparisons(doc)}
    assert verdicts[("sphere", "optex_adaptive")] == (report.WIN, "line_search")
    assert verdicts[("rosenbrock", "optex_adaptive")] == (report.LOSS, "line_search")
    # It is a configuration of its own, not a variant of optex_default.
    assert all(c.method != "optex_adaptive" for c in report.ablation_comparisons(doc))
    tally = report.tally(report.optex_comparisons(doc))
    assert any(line.startswith("- `optex_adaptive` against the best same-budget baseline")
               and "clear wins 1" in line and "clear losses 1" in line for line in tally)


def test_optex_adaptive_has_its_own_colour_and_place(bench):
    plots, _ = bench
    styles = plots.method_styles(["optex_adaptive", "optex_default", "vanilla"])
    assert styles["optex_adaptive"]["color"] == plots.METHOD_COLOURS["optex_adaptive"]
    assert styles["optex_adaptive"]["color"] != plots.UNKNOWN_COLOUR
    assert len(set(plots.METHOD_COLOURS.values())) == len(plots.METHOD_COLOURS)
    order = sorted(["ablation_last_point", "optex_adaptive", "optex_default[history=8]",
                    "optex_default", "vanilla"], key=plots.method_sort_key)
    assert order == ["vanilla", "optex_default", "optex_default[history=8]", "optex_adaptive",
                     "ablation_last_point"]


def test_learning_rate_transfer_is_stated_under_the_config(bench, tmp_path):
    _, report = bench
    transferred = document("optex-bench", "lr_transfer", "loss", loss_summary(), [])
    transferred["config"]["lr_from_vanilla"] = True
    tuned = document("optex-bench", "ci", "loss", loss_summary(), [])
    tuned["config"]["lr_from_vanilla"] = False
    sentence = "- Learning rates: transferred from vanilla. Only vanilla was tuned"
    for doc, expected in ((transferred, True), (tuned, False)):
        path = write(tmp_path / f"{doc['preset']}.json", doc)
        results = report.Results(path, doc)
        lines = report.file_section(results, tmp_path, tmp_path / "RESULTS.md",
                                    report.findings(doc))
        assert any(line.startswith(sentence) for line in lines) == expected


def test_commentary_follows_the_summary(files, tmp_path):
    note = tmp_path / "commentary.md"
    note.write_text("## What the numbers say\n\nOptEx loses on Ackley, plainly.\n", encoding="utf-8")
    text, _ = run_report(files, tmp_path, "--no-plots", "--commentary", str(note))
    summary_at = text.index("## Summary")
    said_at = text.index("## What the numbers say")
    first_file_at = text.index("## optex-bench /")
    assert summary_at < said_at < first_file_at
    assert "OptEx loses on Ackley, plainly." in text


@pytest.mark.parametrize("option", ["--commentary", "--append"])
def test_an_unreadable_markdown_input_is_refused(files, tmp_path, option):
    out = tmp_path / "RESULTS.md"
    for bad in (tmp_path / "missing.md", tmp_path):  # absent, and a directory
        done = subprocess.run([sys.executable, str(BENCH_PYTHON / "report.py"), str(files["loss"]),
                               "--no-plots", "--figures", str(tmp_path / "f"), "--out", str(out),
                               option, str(bad)], capture_output=True, text=True,
                              check=False)
        assert done.returncode == 2
        assert option in done.stderr
        assert not out.exists()


def test_appended_sections_end_the_page_in_order(files, tmp_path):
    first, second = tmp_path / "a.md", tmp_path / "b.md"
    first.write_text("## Stragglers\n\nK of N wins on five.\n", encoding="utf-8")
    second.write_text("## Overhead\n\nDask costs 31 ms.\n", encoding="utf-8")
    text, _ = run_report(files, tmp_path, "--no-plots", "--append", str(first),
                         "--append", str(second))
    last_file_at = text.rindex("## optex-bench /")
    assert last_file_at < text.index("## Stragglers") < text.index("## Overhead")
    assert text.endswith("Dask costs 31 ms.\n")
    assert "--append" in text.split("```sh", 1)[1].split("```", 1)[0]  # in the command shown
