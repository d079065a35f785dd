"""The README's Python examples run as written: every ```python block of its
"## Python quickstart" section, in order, each as a script of its own; every
```python block of its "## On a cluster" section, each as a script run by a
Python process of its own (Dask and Ray started locally, as the blocks do); and
the lines that its "## PyTorch" section shows of examples/torch_digits.py are the
example's, which reaches its target in its quick mode and prints its table."""

from __future__ import annotations

import importlib.util
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT

QUICKSTART = "## Python quickstart"
CLUSTER = "## On a cluster"
VERIFIED = "## The verified mode: the exact trajectory in fewer rounds"
PYTORCH = "## PyTorch"
TORCH_EXAMPLE = REPO_ROOT / "examples" / "torch_digits.py"


def python_blocks(path: Path, heading: str) -> list[str]:
    """The ```python blocks after the section heading, before the next section."""
    text = path.read_text(encoding="utf-8")
    start = text.find(heading + "\n")
    assert start >= 0, f"{path.name} has no '{heading}' section"
    section = text[start + len(heading):]
    next_section = re.search(r"^## ", section, flags=re.MULTILINE)
    if next_section:
        section = section[: next_section.start()]
    return re.findall(r"^```python\n(.*?)^```", section, flags=re.MULTILINE | re.DOTALL)


def test_the_quickstart_has_its_examples() -> None:
    assert len(python_blocks(REPO_ROOT / "README.md", QUICKSTART)) == 2


@pytest.mark.parametrize("index", [0, 1])
def test_quickstart_block_runs(index: int, tmp_path: Path, monkeypatch) -> None:
    code = python_blocks(REPO_ROOT / "README.md", QUICKSTART)[index]
    # A file of its own, run as __main__: worker processes (spawn) re-import it
    # by path, as they would the user's script.
    script = tmp_path / f"quickstart_{index}.py"
    script.write_text(code, encoding="utf-8")
    monkeypatch.chdir(tmp_path)  # where the example writes its checkpoint
    runpy.run_path(str(script), run_name="__main__")


def test_the_cluster_section_has_its_examples() -> None:
    blocks = python_blocks(REPO_ROOT / "README.md", CLUSTER)
    assert len(blocks) == 2
    assert "client.get_executor(" in blocks[0] and "RayExecutor(" in blocks[1]
    # Right after the quickstart.
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## .*$", text, flags=re.MULTILINE)
    assert headings.index(CLUSTER) == headings.index(QUICKSTART) + 1


@pytest.mark.parametrize("index", [0, 1])
def test_cluster_block_runs(index: int, tmp_path: Path) -> None:
    code = python_blocks(REPO_ROOT / "README.md", CLUSTER)[index]
    engine = "ray" if re.search(r"^import ray$", code, flags=re.MULTILINE) else "distributed"
    if importlib.util.find_spec(engine) is None:
        # As test_cluster_executors.py: a skip, or a failure where CI requires the engines.
        reason = f"the example needs {engine} (pip install .[test])"
        if os.environ.get("OPTEX_REQUIRE_CLUSTER") == "1":
            pytest.fail(reason + "; OPTEX_REQUIRE_CLUSTER=1 requires it", pytrace=False)
        pytest.skip(reason)
    # A script run by a process of its own, as a user runs it: Dask's worker
    # processes re-import it, and Ray's state stays out of this process.
    script = tmp_path / f"cluster_{index}.py"
    script.write_text(code, encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, check=False)
    assert done.returncode == 0, f"{script.name} failed:\n{done.stdout}\n{done.stderr}"
    # It prints res.fun, res.nit and res.stop_reason last.
    assert done.stdout.splitlines()[-1].endswith(" target_loss"), done.stdout


def code_lines(text: str) -> list[str]:
    """The code of each line, without its indentation and trailing comment; blank lines dropped."""
    lines = (line.split("  #")[0].strip() for line in text.splitlines())
    return [line for line in lines if line]


def test_the_pytorch_section_shows_lines_of_the_example() -> None:
    # The first block is a script of its own (test_torch.py runs it); the second shows the example.
    blocks = python_blocks(REPO_ROOT / "README.md", PYTORCH)
    assert len(blocks) == 2
    example = set(code_lines(TORCH_EXAMPLE.read_text(encoding="utf-8")))
    shown = code_lines(blocks[1])
    assert len(shown) >= 10
    assert [line for line in shown if line not in example] == []


def test_the_torch_example_reaches_its_quick_target(monkeypatch, capsys) -> None:
    torch = pytest.importorskip("torch", reason="the example needs PyTorch (pip install torch)")
    pytest.importorskip("sklearn", reason="the example needs scikit-learn (pip install scikit-learn)")
    monkeypatch.setattr(sys, "argv", [str(TORCH_EXAMPLE), "--quick"])
    threads = torch.get_num_threads()
    try:
        runpy.run_path(str(TORCH_EXAMPLE), run_name="__main__")
    finally:
        torch.set_num_threads(threads)  # the example sets its own
    out = capsys.readouterr().out.splitlines()
    assert "target test accuracy 90%" in out[0] and "1297 training / 500 test images" in out[0]
    assert out[1].split() == ["method", "rows", "x", "batch", "rounds", "gradient", "rows", "samples",
                              "wall-clock", "s"]
    rows = {}
    for line in out[2:]:
        match = re.fullmatch(r"(.+?)\s+(\d+) x (\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)", line)
        assert match, f"not a row of a method that reached the target: {line!r}"
        name, per_round, batch, rounds, evaluated, samples, seconds = match.groups()
        assert int(evaluated) == int(rounds) * int(per_round) and int(samples) == int(evaluated) * int(batch)
        assert 0 < int(rounds) <= 400 and float(seconds) > 0
        rows[name] = (int(per_round), int(batch))
    assert rows == {"OptEx N=4, Adam": (4, 32), "OptEx N=4, batched": (4, 32), "Adam": (1, 32),
                    "Adam, 4x batch": (1, 128)}


def test_the_verified_mode_block_runs(capsys) -> None:
    blocks = python_blocks(REPO_ROOT / "README.md", VERIFIED)
    assert len(blocks) == 1
    exec(compile(blocks[0], "README verified mode", "exec"), {"__name__": "__main__"})
    steps = int(capsys.readouterr().out.split()[0])
    assert steps > 50  # more than one step a round
