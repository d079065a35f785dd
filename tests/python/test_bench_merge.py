"""bench/python/merge.py: results files of one runner, split by --methods, merged into one.

Checked: the RL ci preset run in two parts and merged holds the same records and
summary as the same preset run whole (all but the wall-clock seconds); the
speedups are recomputed across the inputs; every refusal names the file and
the field, and the command line exits 2 on it. No timing is asserted.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

pytest.importorskip("gymnasium", reason="the RL runner needs gymnasium (pip install .[bench])")

from bench_runners import BENCH_PYTHON, run_ci_preset  # noqa: E402

sys.path.insert(0, str(BENCH_PYTHON))

import merge  # noqa: E402
import records  # noqa: E402
from plots import Results, ResultsError, load_results  # noqa: E402

PART_A = ["vanilla", "vanilla_nlr", "optex_default"]
PART_B = ["data_parallel", "target"]


def run_rl_ci(out: Path, methods: list[str]) -> Path:
    run_ci_preset("rl.py", out, "--methods", *methods)
    return out


@pytest.fixture(scope="module")
def parts(tmp_path_factory) -> tuple[Path, Path, Path]:
    """The ci preset as two parts and whole."""
    root = tmp_path_factory.mktemp("merge")
    return (run_rl_ci(root / "a.json", PART_A), run_rl_ci(root / "b.json", PART_B),
            run_rl_ci(root / "whole.json", PART_A + PART_B))


def without_seconds(rows: list[dict]) -> list[dict]:
    return sorted(({k: v for k, v in r.items() if k not in ("seconds", "seconds_to_target")} for r in rows),
                  key=lambda r: sorted((k, str(v)) for k, v in r.items()))


def test_split_run_merges_into_the_whole_run(parts, tmp_path) -> None:
    a, b, whole = parts
    out = tmp_path / "merged.json.gz"
    assert merge.main([str(a), str(b), "--out", str(out), "--note", "two processes"]) == 0
    (merged,) = load_results([out])
    (reference,) = load_results([whole])
    assert without_seconds(merged.data["records"]) == without_seconds(reference.data["records"])
    assert without_seconds(merged.data["summary"]) == without_seconds(reference.data["summary"])
    config, expected = merged.data["config"], reference.data["config"]
    assert sorted(config["methods"]) == sorted(expected["methods"])
    assert sorted(map(str, config["chosen_lr"])) == sorted(map(str, expected["chosen_lr"]))
    assert config["evaluations_per_round"] == expected["evaluations_per_round"]
    assert [m["methods"] for m in config["merged_from"]] == [PART_A, PART_B]
    assert config["note"] == "two processes"
    assert merged.data["runner"] == "rl" and merged.data["preset"] == "ci"


def summary_row(method: str, median_rounds: float | None) -> dict:
    spread = {"median": median_rounds, "q1": median_rounds, "q3": median_rounds}
    return {"task": "t", "parallelism": 4, "method": method, "lr": 0.1, "target": 1.0, "seeds": 1,
            "reached": int(median_rounds is not None), "rounds_to_target": spread,
            "seconds_to_target": spread, "final": spread,
            "speedup_vs_vanilla": None, "speedup_vs_best_baseline": None}


def synthetic(path: str, methods: dict[str, float | None], **changes) -> Results:
    """A minimal valid rl document with one summary row and one record per method."""
    config = {"methods": list(methods), "chosen_lr": [], "tuning": [],
              "evaluations_per_round": {"4": {m: 4 for m in methods}}, "max_rounds": 60}
    doc = records.document("rl", "full", "return", "max", config,
                           [{"task": "t", "parallelism": 4, "method": m, "seed": 0, "round": 0,
                             "return": 0.0, "gradient_evaluations": 0, "seconds": 0.0} for m in methods],
                           [summary_row(m, r) for m, r in methods.items()])
    for key, value in changes.items():
        if key in doc:
            doc[key] = value
        else:
            doc["config"][key] = value
    return Results(Path(path), doc)


def test_speedups_are_recomputed_across_the_inputs() -> None:
    a = synthetic("a.json", {"vanilla": 40.0, "line_search": None})
    b = synthetic("b.json", {"optex_default": 20.0, "data_parallel": 30.0})
    assert b.data["summary"][0]["speedup_vs_vanilla"] is None  # b alone has no vanilla
    doc = merge.merge([a, b])
    by_method = {row["method"]: row for row in doc["summary"]}
    assert by_method["optex_default"]["speedup_vs_vanilla"] == pytest.approx(2.0)
    # The best baseline is data_parallel (30); line_search never reached the target.
    assert by_method["optex_default"]["speedup_vs_best_baseline"] == pytest.approx(1.5)
    assert by_method["line_search"]["speedup_vs_vanilla"] is None
    assert doc["config"]["methods"] == ["vanilla", "data_parallel", "line_search", "optex_default"]
    # The inputs are not modified.
    assert b.data["summary"][0]["speedup_vs_vanilla"] is None


@pytest.mark.parametrize("second, message", [
    (lambda: synthetic("b.json", {"vanilla": 10.0}), "b.json: holds vanilla on t with N = 4, and so does a.json"),
    (lambda: synthetic("b.json", {"target": 5.0}, preset="ci"), "b.json: 'preset' is 'ci', but a.json has 'full'"),
    (lambda: synthetic("b.json", {"target": 5.0}, machine="elsewhere"), "b.json: 'machine' is 'elsewhere'"),
    (lambda: synthetic("b.json", {"target": 5.0}, max_rounds=80),
     "b.json: config 'max_rounds' is 80, but a.json has 60"),
    (lambda: synthetic("b.json", {"target": 5.0}, runner="optex-bench"),
     "b.json: 'runner' is 'optex-bench'; only the files of rl, supervised can be merged"),
])
def test_refusals_name_the_file_and_the_field(second, message) -> None:
    a = synthetic("a.json", {"vanilla": 40.0})
    before = copy.deepcopy(a.data)
    with pytest.raises(ResultsError) as error:
        merge.merge([a, second()])
    assert message in str(error.value)
    assert a.data == before


def test_one_input_is_refused() -> None:
    with pytest.raises(ResultsError, match="need at least two results files to merge, got 1"):
        merge.merge([synthetic("a.json", {"vanilla": 40.0})])


def test_command_line_exits_2_and_writes_nothing_on_a_refusal(parts, tmp_path, capsys) -> None:
    a, _, _ = parts
    out = tmp_path / "merged.json"
    assert merge.main([str(a), str(a), "--out", str(out)]) == 2
    assert "each method may come from one file" in capsys.readouterr().err
    assert not out.exists()


def test_report_prints_the_note(parts, tmp_path) -> None:
    import report

    a, b, _ = parts
    out = tmp_path / "merged.json"
    assert merge.main([str(a), str(b), "--out", str(out), "--note", "shared the 2 cores"]) == 0
    page = tmp_path / "RESULTS.md"
    assert report.main([str(out), "--figures", str(tmp_path / "figures"), "--out", str(page)]) == 0
    assert "- Note: shared the 2 cores" in page.read_text()


def test_a_rerun_replaces_the_method_only_with_replace() -> None:
    old = synthetic("old.json", {"vanilla": 40.0, "optex_default": 30.0}, workers=2,
                    merged_from=[{"file": "x.json", "command": "c", "date": "d", "methods": []}],
                    note="two processes")
    rerun = synthetic("new.json", {"optex_default": 20.0, "optex_adaptive": 10.0}, workers=1)
    with pytest.raises(ResultsError, match="holds optex_default on t with N = 4"):
        merge.merge([old, rerun])
    doc = merge.merge([old, rerun], note="rerun", replace=True)
    by_method = {row["method"]: row for row in doc["summary"]}
    assert by_method["optex_default"]["rounds_to_target"]["median"] == 20.0
    assert len([r for r in doc["records"] if r["method"] == "optex_default"]) == 1
    assert by_method["vanilla"]["rounds_to_target"]["median"] == 40.0
    config = doc["config"]
    assert config["methods"] == ["vanilla", "optex_default", "optex_adaptive"]
    assert [m["file"] for m in config["merged_from"]] == ["x.json", "new.json"]
    assert config["workers"] == "per input (merged_from)"
    assert config["note"] == "two processes; rerun"
    # The inputs are not modified.
    assert [r["method"] for r in old.data["summary"]] == ["vanilla", "optex_default"]
