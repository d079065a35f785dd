"""scripts/gpu-check.sh: the pieces of the GPU check that decide what a run reports.

The check runs once per lent GPU, in minutes that cannot be had again, so what it
concludes must be right the first time: a report that is missing or truncated must not
read as "0 failed", a step that hangs must end at its time box, a kit that changed must
be refused, and an archive from a run without a GPU must never land in bench/results.
The whole sequence itself is proven by `scripts/gpu-check.sh dry-run` (scripts/test.sh),
and the real kit by ctest's gpu_check_kit; these tests need neither: no kit, no network,
no build.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from conftest import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "gpu-check.sh"
HELPERS = REPO_ROOT / "scripts" / "gpu_check"
RESULTS = HELPERS / "results.py"


def results(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(RESULTS), *args], capture_output=True, text=True, check=False)


def bash(script: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Runs a bash snippet with the helpers sourced (steps.sh expects LOGS, TIME_SCALE, DEADLINE)."""
    prelude = f"source {HELPERS}/kit_layout.sh; source {HELPERS}/steps.sh; "
    return subprocess.run(["bash", "-c", prelude + script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env}, check=False)


def gpu_check(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env}, check=False)


# ---------------------------------------------------------------------------- reports

CTEST_JUNIT = """<?xml version="1.0" encoding="UTF-8"?>
<testsuite name="Linux-c++" tests="3" failures="1" disabled="0" skipped="1">
  <testcase name="Cuda.A" classname="Cuda.A" time="0.1" status="run"><system-out>ok</system-out></testcase>
  <testcase name="Cuda.B" classname="Cuda.B" time="0.2" status="fail"><failure message="Failed"/></testcase>
  <testcase name="Cuda.C" classname="Cuda.C" time="0" status="notrun"><skipped message="Skipped"/></testcase>
</testsuite>
"""
GTEST_XML = """<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="3"><testsuite name="CudaKernels" tests="3">
  <testcase name="A" status="run" result="completed"/>
  <testcase name="B" status="run" result="skipped"><skipped message="no CUDA device"/></testcase>
  <testcase name="C" status="run" result="completed"><failure message="x"/></testcase>
</testsuite></testsuites>
"""
PYTEST_XML = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="4">
  <testcase classname="test_cuda" name="a"/>
  <testcase classname="test_cuda" name="b"><skipped type="pytest.skip" message="no CUDA device"/></testcase>
  <testcase classname="test_cuda" name="c"><error message="fixture failed"/></testcase>
  <testcase classname="test_cuda" name="d"/>
</testsuite></testsuites>
"""


def test_junit_counts_read_ctest_googletest_and_pytest_reports(tmp_path: Path) -> None:
    files = {"ctest.xml": CTEST_JUNIT, "gtest.xml": GTEST_XML, "pytest.xml": PYTEST_XML}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert results("counts", "junit", str(tmp_path / "ctest.xml")).stdout.split() == ["1", "1", "1"]
    assert results("counts", "junit", str(tmp_path / "gtest.xml")).stdout.split() == ["1", "1", "1"]
    assert results("counts", "junit", str(tmp_path / "pytest.xml")).stdout.split() == ["2", "1", "1"]
    both = results("counts", "junit", *(str(tmp_path / name) for name in files))
    assert both.stdout.split() == ["4", "3", "3"]


@pytest.mark.parametrize("content", [None, "", CTEST_JUNIT[: len(CTEST_JUNIT) // 2], "not xml at all"],
                         ids=["missing", "empty", "truncated", "garbage"])
def test_a_report_that_cannot_be_read_is_an_error_naming_it(tmp_path: Path, content: str | None) -> None:
    report = tmp_path / "ctest.xml"
    if content is not None:
        report.write_text(content)
    done = results("counts", "junit", str(report))
    assert done.returncode == 3 and done.stdout == ""
    assert str(report) in done.stderr


def test_an_unreadable_report_counts_as_a_failure_in_a_step(tmp_path: Path) -> None:
    # steps.sh's counts(): a step whose report never appeared cannot pass.
    done = bash(f"counts junit {tmp_path}/absent.xml", LOGS=str(tmp_path))
    assert done.stdout.split() == ["0", "1", "0"]
    assert "absent.xml" in (tmp_path / "results-errors.txt").read_text()


def gbench_document(benchmarks: list[dict]) -> str:
    return json.dumps({"context": {"date": "2026-11-26"}, "benchmarks": benchmarks})


BENCH_RUNS = [
    {"name": "BM_DeviceCopy/d:10000000/iterations:50/manual_time", "run_type": "iteration",
     "real_time": 26.5, "time_unit": "us", "bytes_per_second": 3.0e12, "copy_ratio": 1.0},
    {"name": "BM_ProxyStep/d:100000000/T0:64/precision:0/optimizer:1/iterations:5/manual_time",
     "run_type": "iteration", "error_occurred": True, "error_message": "no CUDA device"},
    {"name": "BM_DeviceCopy/d:10000000_mean", "run_type": "aggregate", "real_time": 26.5},
]


def test_gbench_counts_and_table(tmp_path: Path) -> None:
    report = tmp_path / "bench.json"
    report.write_text(gbench_document(BENCH_RUNS))
    assert results("counts", "gbench", str(report)).stdout.split() == ["1", "0", "1"]
    table = results("bench-table", str(report)).stdout
    assert "| BM_DeviceCopy/d:10000000 | 26.500 | us | 3000.0 | 1.000 |" in table
    assert "| BM_ProxyStep/d:100000000/T0:64/precision:0/optimizer:1 | | | | | | no CUDA device |" in table
    assert "_mean" not in table  # aggregates are not rows of their own


def test_a_benchmark_report_cut_short_is_an_error(tmp_path: Path) -> None:
    # Google Benchmark closes its JSON only at the end: a run killed by its time box
    # leaves a prefix, which must not read as a pass with the benchmarks it lacks.
    report = tmp_path / "bench.json"
    report.write_text(gbench_document(BENCH_RUNS)[:-30])
    done = results("counts", "gbench", str(report))
    assert done.returncode == 3 and "bench.json" in done.stderr


@pytest.mark.parametrize(("log", "errors"), [
    ("========= COMPUTE-SANITIZER\n[ PASSED ]\n========= ERROR SUMMARY: 0 errors\n", "0"),
    ("========= Invalid __global__ read of size 4 bytes\n========= ERROR SUMMARY: 3 errors\n", "3"),
])
def test_sanitizer_errors_are_read_from_the_summary_line(tmp_path: Path, log: str, errors: str) -> None:
    (tmp_path / "log").write_text(log)
    assert results("sanitizer-errors", str(tmp_path / "log")).stdout.strip() == errors


def test_a_sanitizer_log_without_its_summary_is_an_error(tmp_path: Path) -> None:
    # A run killed mid-way never printed "ERROR SUMMARY": that is not "0 errors".
    (tmp_path / "log").write_text("========= COMPUTE-SANITIZER\n[ RUN      ] CudaKernels.A\n")
    done = results("sanitizer-errors", str(tmp_path / "log"))
    assert done.returncode == 3 and "ERROR SUMMARY" in done.stderr


def test_the_summary_tables(tmp_path: Path) -> None:
    tsv = tmp_path / "summary.tsv"
    tsv.write_text("0\tmachine and tools\tpassed\t-\t-\t-\t2\tNVIDIA H100\n"
                   "1\tctest -L gpu\tfailed\t70\t2\t0\t61\tctest-gpu.log | see it\n")
    text = results("summary", str(tsv)).stdout.splitlines()
    assert text[0].split() == ["tier", "step", "status", "passed", "failed", "skipped", "seconds", "note"]
    assert text[2].split()[:6] == ["1", "ctest", "-L", "gpu", "failed", "70"]
    (tmp_path / "machine.txt").write_text("gpu: NVIDIA H100 80GB HBM3\n")
    markdown = results("summary-md", str(tsv), str(tmp_path / "machine.txt")).stdout
    assert "gpu: NVIDIA H100 80GB HBM3" in markdown
    assert "| 1 | ctest -L gpu | failed | 70 | 2 | 0 | 61 | ctest-gpu.log / see it |" in markdown


# ---------------------------------------------------------------------------- steps


@pytest.mark.parametrize(("args", "status"), [
    ("0", "passed"), ("2", "failed"), ("124", "timed out"), ("137", "timed out"),
    ("0 5 0 1", "passed"), ("0 5 1 0", "failed"), ("1 5 0 0", "failed"),
    ("0 0 0 4", "skipped"), ("0 0 0 0", "failed"), ("124 3 0 0", "timed out"),
])
def test_a_steps_status_comes_from_its_exit_status_and_counts(args: str, status: str) -> None:
    assert bash(f"status_of {args}").stdout.strip() == status


def test_a_step_that_hangs_ends_at_its_time_box(tmp_path: Path) -> None:
    log = tmp_path / "step.log"
    start = time.monotonic()
    done = bash(f"boxed 1 {log} bash -c 'sleep 60 & wait'; echo rc=$?")
    assert done.stdout.strip() == "rc=124"
    assert time.monotonic() - start < 20  # TERM after 1 s (KILL 10 s later at worst)
    assert "sleep 60" in log.read_text()


def test_a_step_without_time_left_does_not_start(tmp_path: Path) -> None:
    log = tmp_path / "step.log"
    done = bash(f"boxed 0 {log} touch {tmp_path}/ran; echo rc=$?")
    assert done.stdout.strip() == "rc=124" and not (tmp_path / "ran").exists()
    assert "no time left" in log.read_text()


def test_a_time_box_keeps_the_later_tiers_floor() -> None:
    now = int(time.time())
    # 100 s left before the deadline, 30 of them reserved: at most 70, and the cap if smaller.
    script = f"TIME_SCALE=1; DEADLINE=$(({now} + 100)); step_box 500 30; step_box 20 30; step_box 500 200"
    boxes = [int(b) for b in bash(script).stdout.split()]
    assert 65 <= boxes[0] <= 70 and boxes[1] == 20 and boxes[2] == 0
    scaled = bash(f"TIME_SCALE=8; DEADLINE=$(({now} + 10000)); step_box 60 0").stdout.strip()
    assert scaled == "480"  # a dry run on fewer cores scales the boxes


# ---------------------------------------------------------------------------- commands


def test_an_unknown_command_or_argument_is_refused() -> None:
    done = gpu_check("build")
    assert done.returncode == 2 and "expected one of prepare, check, run, dry-run, collect" in done.stderr
    assert gpu_check("--help").returncode == 0
    bad = gpu_check("run", "--bogus")
    assert bad.returncode == 2 and "unknown argument '--bogus'" in bad.stderr
    assert "--out needs a folder" in gpu_check("run", "--out").stderr


def test_run_without_a_kit_says_how_to_make_one(tmp_path: Path) -> None:
    done = gpu_check("run", "--out", str(tmp_path / "out"), OPTEX_GPU_CHECK_KIT=str(tmp_path / "kit"))
    assert done.returncode == 2
    assert "scripts/gpu-check.sh prepare" in done.stderr and ".gpu-kit" in done.stderr
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_check_skips_without_a_kit_unless_one_is_required(tmp_path: Path) -> None:
    kit = str(tmp_path / "kit")
    skipped = gpu_check("check", OPTEX_GPU_CHECK_KIT=kit, OPTEX_REQUIRE_GPU_KIT="0")
    assert skipped.returncode == 77 and "skipped" in skipped.stdout
    required = gpu_check("check", OPTEX_GPU_CHECK_KIT=kit, OPTEX_REQUIRE_GPU_KIT="1")
    assert required.returncode == 1 and "OPTEX_REQUIRE_GPU_KIT is set" in required.stderr


def scratch_kit(root: Path) -> Path:
    """A kit with a MANIFEST that matches its one file, and none of the pieces."""
    root.mkdir()
    (root / "eigen3").mkdir()
    (root / "eigen3" / "file").write_text("x\n")
    checksum = subprocess.run(["sha256sum", "eigen3/file"], cwd=root, capture_output=True, text=True,
                              check=True).stdout
    (root / "MANIFEST").write_text("# recipe test\n" + checksum)
    return root


def test_check_refuses_a_kit_that_changed_or_lacks_a_piece(tmp_path: Path) -> None:
    kit = scratch_kit(tmp_path / "kit")
    lacking = gpu_check("check", OPTEX_GPU_CHECK_KIT=str(kit))
    assert lacking.returncode == 1 and "the kit lacks" in lacking.stderr and "Eigen3Config.cmake" in lacking.stderr
    (kit / "eigen3" / "file").write_text("y\n")
    changed = gpu_check("check", OPTEX_GPU_CHECK_KIT=str(kit))
    assert changed.returncode == 1 and "differs from its MANIFEST" in changed.stderr
    (kit / "eigen3" / "file").unlink()
    removed = gpu_check("check", OPTEX_GPU_CHECK_KIT=str(kit))
    assert removed.returncode == 1 and "differs from its MANIFEST" in removed.stderr


def test_a_package_without_a_provider_on_the_gpu_machine_is_named(tmp_path: Path) -> None:
    cmake = tmp_path / "CMakeLists.txt"
    cmake.write_text("find_package(Eigen3 3.3 REQUIRED NO_MODULE)\nfind_package( Boost REQUIRED)\n"
                     "find_dependency(Threads)\nfind_dependency(fmt)\n")
    assert bash(f"unknown_packages {cmake}").stdout.split() == ["Boost", "fmt"]
    # The project's own CMake files have a provider for everything they look for.
    files = subprocess.run(["git", "ls-files", "*CMakeLists.txt", "*.cmake", "*.cmake.in"], cwd=REPO_ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    if files:
        assert bash("cd " + str(REPO_ROOT) + " && unknown_packages " + " ".join(files)).stdout == ""


def archive(path: Path, files: dict[str, str], link: tuple[str, str] | None = None) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if link is not None:
            info = tarfile.TarInfo(link[0])
            info.type = tarfile.SYMTYPE
            info.linkname = link[1]
            tar.addfile(info)
    return path


def test_collect_unpacks_a_gpu_runs_archive_into_its_results_folder(tmp_path: Path) -> None:
    good = archive(tmp_path / "gpu-check-nvidia-h100-80gb-hbm3-2026-11-26.tar.gz",
                   {"logs/summary.tsv": "0\tmachine\tpassed\n", "logs/bench_cuda-proxy.json": "{}"})
    done = gpu_check("collect", str(good), str(tmp_path / "results"))
    assert done.returncode == 0, done.stderr
    folder = tmp_path / "results" / "gpu-nvidia-h100-80gb-hbm3-2026-11-26"
    assert sorted(p.name for p in folder.iterdir()) == ["bench_cuda-proxy.json", "summary.tsv"]


@pytest.mark.parametrize("case", ["dry-run", "no-gpu", "bad-name", "not-a-tar", "no-summary", "symlink",
                                  "outside-logs"])
def test_collect_refuses_what_no_gpu_measured_and_what_is_not_an_archive(tmp_path: Path, case: str) -> None:
    summary = {"logs/summary.tsv": "0\tmachine\tpassed\n"}
    name = "gpu-check-nvidia-h200-2026-11-26.tar.gz"
    if case == "dry-run":
        path = archive(tmp_path / "gpu-check-dry-run-2026-11-26.tar.gz", summary)
    elif case == "no-gpu":
        path = archive(tmp_path / "gpu-check-no-gpu-2026-11-26.tar.gz", summary)
    elif case == "bad-name":
        path = archive(tmp_path / "results.tar.gz", summary)
    elif case == "not-a-tar":
        path = tmp_path / name
        path.write_bytes(b"\x1f\x8b not really gzip")
    elif case == "no-summary":
        path = archive(tmp_path / name, {"logs/run.log": "x"})
    elif case == "symlink":
        path = archive(tmp_path / name, summary, link=("logs/passwd", "/etc/passwd"))
    else:
        path = archive(tmp_path / name, {**summary, "elsewhere/file": "x"})
    done = gpu_check("collect", str(path), str(tmp_path / "results"))
    assert done.returncode == 2, done.stdout
    assert done.stderr.startswith("collect: ")
    assert not (tmp_path / "results").exists()  # refused before anything was written


def test_nccl_and_cuda_libraries_are_found_in_the_pythons_wheels(tmp_path: Path) -> None:
    # A GPU machine's NCCL may come only with PyTorch's wheels (nvidia-nccl-cu13):
    # nvidia/nccl/{include,lib} under one of its Python's site-packages.
    site = tmp_path / "site"
    (site / "nvidia" / "nccl" / "include").mkdir(parents=True)
    (site / "nvidia" / "nccl" / "lib").mkdir()
    (site / "nvidia" / "nccl" / "include" / "nccl.h").write_text("#define NCCL_MAJOR 2\n")
    (site / "nvidia" / "nccl" / "lib" / "libnccl.so.2").write_text("")
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\necho {site}\n")  # what python_site_dirs asks it
    python.chmod(0o755)
    script = (f"source {HELPERS}/discover.sh; PY={python}; wheel_file nccl.h; wheel_file 'libnccl.so*'; "
              "wheel_file libcublas.so; echo end")
    lines = bash(script).stdout.splitlines()
    assert lines == [str(site / "nvidia/nccl/include/nccl.h"), str(site / "nvidia/nccl/lib/libnccl.so.2"), "end"]
