"""Every ```python block of README.md and of the user guide (docs/guide/*.md) runs as
written: each as a script of its own, in a temporary directory, run by a Python
process of its own (as a user runs it: Dask's and multiprocessing's worker processes
re-import it by path, and Ray's state stays out of this process).

The fence's info string says what a block needs (docs/guide/README.md states the
conventions for writers):

- ```python            runs. A block that imports torch (or optex.torch) skips where
                       PyTorch is missing, and fails instead with OPTEX_REQUIRE_TORCH=1
                       (conftest.py); one that imports Dask, Ray or mpi4py skips where the
                       engine is missing, and fails instead with OPTEX_REQUIRE_CLUSTER=1.
- ```python gpu        runs only where optex sees a CUDA device (a skip otherwise, a failure
                       with OPTEX_REQUIRE_GPU=1); marked `gpu` for `pytest -m gpu`.
- ```python fragment   lines shown from a file of the repository, not a program: each of its
                       code lines must be a line of the file it names (FRAGMENT_SOURCES). There
                       are at most MAX_FRAGMENTS of them.

The PyTorch example's script (examples/torch_digits.py) is run here too, in its quick mode.
"""

from __future__ import annotations

import importlib.util
import os
import re
import runpy
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO_ROOT, skip_or_fail_without_gpu

TORCH_EXAMPLE = REPO_ROOT / "examples" / "torch_digits.py"
KNOWN_MARKERS = {"", "gpu", "fragment"}
MAX_FRAGMENTS = 2
# The file whose lines each fragment shows, by the document and the fragment's first line.
FRAGMENT_SOURCES = {("docs/guide/pytorch.md", "def sequential_closure(model, loss_fn, batches):"): TORCH_EXAMPLE}
FENCE = re.compile(r"^```([A-Za-z0-9_+-]*)([^\n]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
CLUSTER_ENGINES = {"distributed": "Dask", "ray": "Ray", "mpi4py": "mpi4py"}


def documents() -> list[Path]:
    return [REPO_ROOT / "README.md"] + sorted((REPO_ROOT / "docs" / "guide").glob("*.md"))


@dataclass(frozen=True)
class Block:
    document: str  # relative to the repository root
    line: int  # of the opening fence
    language: str
    marker: str
    code: str

    @property
    def name(self) -> str:
        return f"{self.document}:{self.line}"


def fenced_blocks(path: Path) -> list[Block]:
    text = path.read_text(encoding="utf-8")
    rel = path.relative_to(REPO_ROOT).as_posix()
    return [Block(rel, text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2).strip(), m.group(3))
            for m in FENCE.finditer(text)]


def python_blocks() -> list[Block]:
    return [b for path in documents() for b in fenced_blocks(path) if b.language == "python"]


def imports(code: str, module: str) -> bool:
    return bool(re.search(rf"^\s*(import|from)\s+{re.escape(module)}(\s|\.|$)", code, flags=re.MULTILINE))


RUNNABLE = [b for b in python_blocks() if b.marker != "fragment"]
FRAGMENTS = [b for b in python_blocks() if b.marker == "fragment"]


def test_the_documents_have_their_python_blocks() -> None:
    blocks = python_blocks()
    assert [b.name for b in blocks if b.marker not in KNOWN_MARKERS] == [], \
        f"unknown ```python markers (known: {sorted(KNOWN_MARKERS)})"
    assert len(RUNNABLE) >= 8, "the pattern that finds ```python blocks is broken?"
    assert len(FRAGMENTS) <= MAX_FRAGMENTS, \
        f"{len(FRAGMENTS)} fragments: make each block a whole program instead"
    readme = [b.code for b in RUNNABLE if b.document == "README.md"]
    # The README's shortest paths: numpy ask/tell, PyTorch, a cluster.
    assert any("opt.ask()" in c for c in readme) and any("optex.torch.OptEx(" in c for c in readme)
    assert any("client.get_executor(" in c for c in readme)


@pytest.mark.parametrize("block", RUNNABLE, ids=[b.name for b in RUNNABLE])
def test_python_block_runs(block: Block, tmp_path: Path, request) -> None:
    if block.marker == "gpu":
        request.applymarker(pytest.mark.gpu)
        import optex

        if optex.cuda_device_count() == 0:
            skip_or_fail_without_gpu(f"{block.name} needs a CUDA device")
    if imports(block.code, "torch") or imports(block.code, "optex.torch"):
        # "PyTorch" in the reason: conftest.py turns the skip into a failure with OPTEX_REQUIRE_TORCH=1.
        pytest.importorskip("torch", reason=f"{block.name} needs PyTorch (pip install torch)")
    for module, engine in CLUSTER_ENGINES.items():
        if imports(block.code, module) and importlib.util.find_spec(module) is None:
            # As test_cluster_executors.py: a skip, or a failure where CI requires the engines.
            reason = f"{block.name} needs {engine} (pip install .[test])"
            if os.environ.get("OPTEX_REQUIRE_CLUSTER") == "1":
                pytest.fail(reason + "; OPTEX_REQUIRE_CLUSTER=1 requires it", pytrace=False)
            pytest.skip(reason)
    script = tmp_path / f"{Path(block.document).stem}_{block.line}.py"
    script.write_text(block.code, encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, check=False)
    assert done.returncode == 0, f"{block.name} failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"


def code_lines(text: str) -> list[str]:
    """The code of each line, without its indentation and trailing comment; blank lines dropped."""
    lines = (line.split("  #")[0].strip() for line in text.splitlines())
    return [line for line in lines if line]


@pytest.mark.parametrize("block", FRAGMENTS, ids=[b.name for b in FRAGMENTS])
def test_a_fragment_shows_lines_of_its_file(block: Block) -> None:
    first = code_lines(block.code)[0]
    source = FRAGMENT_SOURCES.get((block.document, first))
    assert source is not None, f"{block.name}: a fragment of which file? (FRAGMENT_SOURCES)"
    shown = code_lines(block.code)
    assert len(shown) >= 5
    assert [line for line in shown if line not in set(code_lines(source.read_text(encoding="utf-8")))] == []


def test_the_quickstart_prints_its_result() -> None:
    quickstart = next(b for b in RUNNABLE if b.document == "README.md" and "opt.ask()" in b.code)
    assert "print(" in quickstart.code and "opt.save(" in quickstart.code


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
