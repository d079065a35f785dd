"""The shell blocks, links and paths of README.md and the user guide (docs/guide/*.md).

Shell blocks (```sh, ```bash) follow the conventions of docs/guide/README.md:

- ```sh            every line runs, here: from a temporary directory, with `./build/` the
                   build's directory (OPTEX_BUILD_DIR, else the one OPTEX_BENCH is in, else the
                   first of build/, build-*/ that has the program), mpirun allowed to run as root
                   and to oversubscribe. Each block must finish in seconds.
- ```sh slow       minutes long, or run by CI elsewhere (.ci/run runs scripts/test.sh);
- ```sh gpu        needs a GPU;
- ```sh cluster    needs several machines:
                   these are parsed (`bash -n`), the scripts they run must exist (with the
                   subcommand they name), and every --flag they pass to a built program must be
                   in that program's --help (where the program is built here).

The ```python blocks are run by test_readme.py, the ```cpp ones by the install test
(tests/install/check_install.sh).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import REPO_ROOT
from test_design import DESIGN, bad_citations, citable, missing_paths
from test_readme import Block, documents, fenced_blocks

SHELL_LANGUAGES = {"sh", "bash", "shell"}
CHECKED_ONLY = {"slow", "gpu", "cluster"}
KNOWN_MARKERS = {""} | CHECKED_ONLY
README_LIMIT = 16_000  # bytes
# Named by the README and the guide, added by another change: accepted until it lands.
MPI_ENVIRONMENT = {
    # As tests/CMakeLists.txt runs the MPI tests: root allowed (containers, CI), shared memory
    # only; and more ranks than cores (Open MPI refuses them by default).
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_btl": "self,vader",
    "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
}
BUILD_PROGRAM = re.compile(r"\./build/([\w./-]+)")


def all_blocks() -> list[Block]:
    return [b for path in documents() for b in fenced_blocks(path)]


def shell_blocks() -> list[Block]:
    return [b for b in all_blocks() if b.language in SHELL_LANGUAGES]


RUNNABLE = [b for b in shell_blocks() if b.marker == ""]
CHECKED = [b for b in shell_blocks() if b.marker in CHECKED_ONLY]


def commands(code: str) -> list[str]:
    """The command lines of a block: comments and blank lines dropped, continuations joined."""
    joined = re.sub(r"\\\n", " ", code)
    lines = (line.split(" #")[0].strip() for line in joined.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def build_candidates() -> list[Path]:
    declared = os.environ.get("OPTEX_BUILD_DIR")
    bench = os.environ.get("OPTEX_BENCH")
    dirs = []
    if declared:
        dirs.append(Path(declared))
    if bench:
        dirs.append(Path(bench).resolve().parents[1])
    dirs += [REPO_ROOT / "build"] + sorted(p for p in REPO_ROOT.glob("build-*") if p.is_dir())
    return dirs


def a_build_is_declared() -> bool:
    return bool(os.environ.get("OPTEX_BUILD_DIR") or os.environ.get("OPTEX_BENCH"))


def built(relative: str) -> Path | None:
    """The program ./build/<relative> in the first build directory that has it."""
    candidates = build_candidates()
    if a_build_is_declared():
        candidates = candidates[:1]  # the build CI made, not a stale one beside it
    for directory in candidates:
        path = directory / relative
        if path.is_file() and os.access(path, os.X_OK):
            return path
    return None


# ------------------------------------------------------------------------------ conventions


def test_every_shell_block_has_a_known_marker() -> None:
    unknown = [f"{b.name}: ```{b.language} {b.marker}" for b in shell_blocks() if b.marker not in KNOWN_MARKERS]
    assert unknown == [], f"unknown shell block markers (known: {sorted(KNOWN_MARKERS)}):\n" + "\n".join(unknown)
    assert len(RUNNABLE) >= 3 and len(CHECKED) >= 4, "the pattern that finds shell blocks is broken?"


def test_every_block_has_a_known_language() -> None:
    known = SHELL_LANGUAGES | {"python", "cpp", "cmake", "text"}
    unknown = [f"{b.name}: ```{b.language}" for b in all_blocks() if b.language not in known]
    assert unknown == [], "blocks without a known language (output is ```text):\n" + "\n".join(unknown)


def test_the_readme_stays_short() -> None:
    size = (REPO_ROOT / "README.md").stat().st_size
    assert size <= README_LIMIT, f"README.md is {size} bytes; move details to docs/guide/"


def test_the_readme_starts_with_the_set_up_commands() -> None:
    first = next(b for b in shell_blocks() if b.document == "README.md")
    assert commands(first.code) == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    assert first.marker == "slow"  # .ci/run runs scripts/test.sh


def test_options_reference_is_spelled_one_way() -> None:
    wrong = []
    for path in documents():
        text = path.read_text(encoding="utf-8")
        for match in re.finditer(r"(?:[\w.]+)?Options(?:::|\.)reference\b(?:\([^)]*\))?", text):
            if match.group(0) not in ("Options::reference()", "optex.Options.reference()"):
                line = text.count("\n", 0, match.start()) + 1
                wrong.append(f"{path.relative_to(REPO_ROOT)}:{line}: {match.group(0)}")
    assert wrong == [], "spell it Options::reference() (optex.Options.reference() in Python):\n" + "\n".join(wrong)


# ------------------------------------------------------------------------------ runnable blocks


@pytest.mark.parametrize("block", RUNNABLE, ids=[b.name for b in RUNNABLE])
def test_shell_block_runs(block: Block, tmp_path: Path) -> None:
    code = block.code
    for relative in sorted(set(BUILD_PROGRAM.findall(code))):
        program = built(relative)
        if program is None:
            reason = f"{block.name}: ./build/{relative} is not built"
            if a_build_is_declared():
                pytest.fail(reason + f" in {build_candidates()[0]}", pytrace=False)
            pytest.skip(reason + " (set OPTEX_BUILD_DIR to the build directory)")
        code = code.replace(f"./build/{relative}", str(program))
    env = dict(os.environ)
    if any(c.split()[0] == "mpirun" for c in commands(code)):
        if shutil.which("mpirun") is None:
            reason = f"{block.name} needs mpirun"
            if os.environ.get("OPTEX_REQUIRE_CLUSTER") == "1":
                pytest.fail(reason + "; OPTEX_REQUIRE_CLUSTER=1 requires it", pytrace=False)
            pytest.skip(reason)
        env.update(MPI_ENVIRONMENT)
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, f"{block.name} failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"


# ------------------------------------------------------------------------------ checked blocks


@pytest.mark.parametrize("block", CHECKED, ids=[b.name for b in CHECKED])
def test_checked_block_parses_and_names_what_exists(block: Block) -> None:
    parsed = subprocess.run(["bash", "-n"], input=block.code, capture_output=True, text=True, check=False)
    assert parsed.returncode == 0, f"{block.name}: bash -n: {parsed.stderr}"
    problems = []
    for command in commands(block.code):
        words = shlex.split(command)
        while words and re.fullmatch(r"\w+=\S*", words[0]):  # VAR=value prefixes
            words = words[1:]
        if len(words) >= 2 and words[0] == "bash" and words[1].startswith("scripts/"):
            script = REPO_ROOT / words[1]
            if not script.is_file():
                problems.append(f"{command}: {words[1]} does not exist")
                continue
            if len(words) >= 3 and not words[2].startswith("-"):
                if not re.search(rf"^\s*{re.escape(words[2])}\)", script.read_text(encoding="utf-8"), re.MULTILINE):
                    problems.append(f"{command}: {words[1]} has no subcommand {words[2]}")
        for relative in BUILD_PROGRAM.findall(command):
            program = built(relative)
            flags = {w.split("=")[0] for w in words[words.index(f"./build/{relative}") + 1:] if w.startswith("--")}
            if program is None or not flags:
                continue
            helped = subprocess.run([str(program), "--help"], capture_output=True, text=True, timeout=60,
                                    check=False)
            text = helped.stdout + helped.stderr
            problems += [f"{command}: ./build/{relative} --help has no {flag}" for flag in sorted(flags)
                         if flag not in text]
    assert problems == [], f"{block.name}:\n" + "\n".join(problems)


# ------------------------------------------------------------------------------ links and paths

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.MULTILINE | re.DOTALL)
    return {slug(h) for h in re.findall(r"^#+ (.*)$", text, flags=re.MULTILINE)}


@pytest.mark.parametrize("path", documents(), ids=[p.relative_to(REPO_ROOT).as_posix() for p in documents()])
def test_every_link_resolves(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    bad = []
    for match in LINK.finditer(text):
        target = match.group(1)
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        line = text.count("\n", 0, match.start()) + 1
        if not resolved.exists():
            bad.append(f"{path.name}:{line}: {target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            bad.append(f"{path.name}:{line}: {target}: no heading with that anchor")
    assert bad == [], "\n".join(bad)


def test_the_readme_links_every_guide_page() -> None:
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    pages = sorted(p.name for p in (REPO_ROOT / "docs" / "guide").glob("*.md") if p.name != "README.md")
    assert len(pages) >= 7
    assert [p for p in pages if f"(docs/guide/{p}" not in text] == []


@pytest.mark.parametrize("path", documents(), ids=[p.relative_to(REPO_ROOT).as_posix() for p in documents()])
def test_every_path_and_design_citation_exists(path: Path) -> None:
    name = path.relative_to(REPO_ROOT).as_posix()
    text = path.read_text(encoding="utf-8")
    problems = missing_paths(name, text)
    problems += bad_citations(name, text, citable(DESIGN.read_text(encoding="utf-8")))
    assert problems == [], "\n".join(problems)
