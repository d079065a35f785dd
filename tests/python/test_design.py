"""docs/DESIGN.md and what refers to it.

Code, documents and docstrings cite the design document by section number. These
tests keep the citations and the document in step: the document has its numbered
sections in order, every citation in a tracked text file names a section that
exists, no tracked file points outside the repository, and every file path that
docs/DESIGN.md or the README mentions exists. The helpers are tested on small
strings first, so that a check that can no longer fail is noticed.

No optex build is needed: these tests read files only.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

# Computed here: these tests need nothing from conftest (nor numpy, nor an optex build).
REPO_ROOT = Path(__file__).resolve().parents[2]
DESIGN = REPO_ROOT / "docs" / "DESIGN.md"
EXPECTED_SECTIONS = list(range(1, 12))

# Paths and names that live outside the repository and must not be referred to.
# Spelled in pieces so that this file, which is scanned too, does not contain them.
OUTSIDE_REFERENCES = (
    "../" + "shared",
    "shared/" + "DESIGN.md",
    "optex" + "_jax/",
    "/" + "work/",
    "../" + ".library",
)

# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------

# Line breaks and comment markers that may sit inside a citation wrapped over
# two lines of a C++, Python or Markdown comment.
_GAP = r"(?:\s|//|#|\*|>)+"
_NUMBER = r"\d+(?:\.\d+)?"
_NUMBERS = rf"{_NUMBER}(?:(?:\s*,\s*|{_GAP}and{_GAP}|\s*&\s*){_NUMBER})*"
CITATION = re.compile(
    rf"(?P<document>[\w./-]*DESIGN\.md)`?,?{_GAP}sections?{_GAP}(?P<numbers>{_NUMBERS})"
)
# Inside the design document itself, "section N" refers to its own sections.
SELF_REFERENCE = re.compile(rf"\bsections?{_GAP}(?P<numbers>{_NUMBERS})")

SECTION_HEADING = re.compile(r"^## (\d+)\. \S", re.MULTILINE)
SUBSECTION_HEADING = re.compile(r"^### (\d+\.\d+)\.? \S", re.MULTILINE)

PATH_SUFFIXES = ("hpp", "cpp", "cu", "cuh", "py", "md", "sh", "txt", "toml", "cmake")
PATH = re.compile(
    r"(?<![\w./\-])"
    r"(?P<path>(?:\.\.?/)*[\w.\-*<>$(){}]+(?:/[\w.\-*<>$(){}]+)+\.(?:"
    + "|".join(PATH_SUFFIXES)
    + r"))(?![\w/\-]|\.\w)"
)
URL = re.compile(r"\b(?:https?://|www\.)\S+|\b[\w-]+(?:\.[\w-]+)+\.(?:com|org|io|net)/\S*")


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def numbered_sections(text: str) -> list[int]:
    """The numbers of the `## N.` headings, in document order."""
    return [int(n) for n in SECTION_HEADING.findall(text)]


def citable(text: str) -> set[str]:
    """What a citation may name: "N" for each `## N.` and "N.M" for each `### N.M`."""
    return {str(n) for n in numbered_sections(text)} | set(SUBSECTION_HEADING.findall(text))


def cited_numbers(numbers: str) -> list[str]:
    return re.findall(_NUMBER, numbers)


def bad_citations(name: str, text: str, sections: set[str]) -> list[str]:
    """`name:line: ...` for every citation of the design document that names no section of
    it, or names it by a path that is not docs/DESIGN.md."""
    bad = []
    for match in CITATION.finditer(text):
        where = f"{name}:{line_of(text, match.start())}"
        document = match.group("document")
        if not refers_to_design(name, document):
            bad.append(f"{where}: {document} is not docs/DESIGN.md")
        for number in cited_numbers(match.group("numbers")):
            if number not in sections:
                bad.append(f"{where}: {document} section {number} does not exist")
    return bad


def bad_self_references(text: str, sections: set[str]) -> list[str]:
    """`docs/DESIGN.md:line: ...` for every "section N" of the document that it lacks."""
    bad = []
    for match in SELF_REFERENCE.finditer(text):
        for number in cited_numbers(match.group("numbers")):
            if number not in sections:
                bad.append(f"docs/DESIGN.md:{line_of(text, match.start())}: section {number} "
                           "does not exist")
    return bad


def refers_to_design(name: str, document: str) -> bool:
    """A bare DESIGN.md, or a path that resolves to docs/DESIGN.md from the repository root
    or from the citing file's directory."""
    if document == "DESIGN.md":
        return True
    target = (REPO_ROOT / "docs" / "DESIGN.md").resolve()
    from_root = (REPO_ROOT / document).resolve()
    from_file = (REPO_ROOT / name).parent.joinpath(document).resolve()
    return target in (from_root, from_file)


def outside_references(name: str, text: str) -> list[str]:
    """`name:line: ...` for every reference to a path outside the repository."""
    found = []
    for forbidden in OUTSIDE_REFERENCES:
        start = text.find(forbidden)
        while start >= 0:
            found.append(f"{name}:{line_of(text, start)}: refers to '{forbidden}', outside "
                         "the repository")
            start = text.find(forbidden, start + 1)
    return found


def is_placeholder(path: str) -> bool:
    """Globs, <placeholders>, shell expansions: not a file name."""
    return any(c in path for c in "*<>$(){}")


def missing_paths(name: str, text: str, root: Path = REPO_ROOT) -> list[str]:
    """`name:line: ...` for every file path in `text` that does not exist. Paths resolve
    against the repository root, the file's own directory, and, for `optex/...`, include/."""
    text_without_urls = URL.sub(lambda m: " " * len(m.group(0)), text)
    base = (root / name).parent
    missing = []
    for match in PATH.finditer(text_without_urls):
        path = match.group("path")
        if is_placeholder(path):
            continue
        candidates = [root / path, base / path]
        if path.startswith("optex/"):
            candidates.append(root / "include" / path)
        if not any(c.is_file() for c in candidates):
            missing.append(f"{name}:{line_of(text, match.start())}: {path} does not exist")
    return missing


UNTRACKED_DIRECTORIES = (".git", ".venv", "_build", "out", "__pycache__")


def repository_files() -> list[str]:
    """The tracked files, from git; without a usable git (no checkout, a repository owned by
    another user), every file outside the git-ignored build and environment directories."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True,
                                check=True, timeout=60).stdout
        return [name for name in listed.decode("utf-8").split("\0") if name]
    except (OSError, subprocess.SubprocessError):
        pass
    names = []
    for path in REPO_ROOT.rglob("*"):
        parts = path.relative_to(REPO_ROOT).parts
        if ".git" in parts or any(p in UNTRACKED_DIRECTORIES or p.startswith("build")
                                  or p.endswith(".egg-info") for p in parts[:-1]):
            continue
        if path.is_file():
            names.append(path.relative_to(REPO_ROOT).as_posix())
    return sorted(names)


def tracked_text_files() -> list[tuple[str, str]]:
    """(path, text) of every tracked text file outside bench/results/."""
    files = []
    for name in repository_files():
        if name.startswith("bench/results/"):
            continue
        path = REPO_ROOT / name
        if not path.is_file():  # deleted in the work tree
            continue
        data = path.read_bytes()
        if b"\0" in data:
            continue
        try:
            files.append((name, data.decode("utf-8")))
        except UnicodeDecodeError:
            continue
    return files


@pytest.fixture(scope="module")
def design_text() -> str:
    assert DESIGN.is_file(), "docs/DESIGN.md is missing"
    return DESIGN.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def text_files() -> list[tuple[str, str]]:
    files = tracked_text_files()
    assert any(name == "README.md" for name, _ in files), "README.md is not tracked?"
    return files


# ---------------------------------------------------------------------------
# The helpers can fail
# ---------------------------------------------------------------------------

DOCUMENT = "DESIGN.md"  # never next to a section number in this file's own text


def test_a_citation_of_a_missing_section_is_reported() -> None:
    text = f"int x;\n// The commit ({DOCUMENT} section 99).\n"
    assert bad_citations("src/a.cpp", text, {"1", "2"}) == [
        f"src/a.cpp:2: {DOCUMENT} section 99 does not exist"
    ]


def test_existing_sections_are_accepted_in_every_spelling() -> None:
    sections = {"2", "3", "8", "3.1"}
    text = (f"see {DOCUMENT} section 2; `docs/{DOCUMENT}` section 3, {DOCUMENT} sections 2 "
            f"and 8, {DOCUMENT} sections 2, 3 and 8, {DOCUMENT} section 3.1")
    assert bad_citations("README.md", text, sections) == []
    assert len(CITATION.findall(text)) == 5


def test_a_citation_wrapped_over_comment_lines_is_read_whole() -> None:
    cpp = f"// only the gradients travel ({DOCUMENT}\n// section 12). More.\n"
    assert bad_citations("x.hpp", cpp, {"3"}) == [f"x.hpp:1: {DOCUMENT} section 12 does not exist"]
    python = f"    # the engine ({DOCUMENT}\n    # sections 2 and 13)\n"
    assert bad_citations("x.py", python, {"2"}) == [f"x.py:1: {DOCUMENT} section 13 does not exist"]


def test_every_number_of_a_list_is_checked() -> None:
    text = f"{DOCUMENT} sections 2, 42 and 8"
    assert bad_citations("f.md", text, {"2", "8"}) == [
        f"f.md:1: {DOCUMENT} section 42 does not exist"
    ]
    assert bad_citations("f.md", f"{DOCUMENT} section 3.7", {"3"}) == [
        f"f.md:1: {DOCUMENT} section 3.7 does not exist"
    ]


def test_a_citation_of_another_design_document_is_reported() -> None:
    text = f"see bench/{DOCUMENT} section 2"
    assert bad_citations("README.md", text, {"2"}) == [
        "README.md:1: bench/DESIGN.md is not docs/DESIGN.md"
    ]
    # Relative to the citing file, ../docs/ is the same document.
    assert bad_citations("bench/README.md", f"../docs/{DOCUMENT} section 2", {"2"}) == []


def test_self_references_of_the_document_are_checked() -> None:
    assert bad_self_references("as in section 2, and sections 7 and 30", {"2", "7"}) == [
        "docs/DESIGN.md:1: section 30 does not exist"
    ]


def test_an_outside_reference_is_reported() -> None:
    shared = OUTSIDE_REFERENCES[0]
    jax = OUTSIDE_REFERENCES[2]
    text = f"fine\n// from {shared}/notes.md\n// the authors' code ({jax}x.py)\n"
    found = outside_references("a.hpp", text)
    assert found == [
        f"a.hpp:2: refers to '{shared}', outside the repository",
        f"a.hpp:3: refers to '{jax}', outside the repository",
    ]
    assert outside_references("a.hpp", "// the authors' JAX code\n") == []


def test_a_missing_path_is_reported_and_placeholders_are_not() -> None:
    text = (
        "`src/engine/engine.cpp` and `optex/engine/engine.hpp` exist;\n"
        "`src/no_such_file.cpp` does not;\n"
        "`problems/*.hpp`, `include/optex/<name>_communicator.hpp`, "
        "`bench/results/cuda-$(date +%F).md` and https://example.com/a/b.py are not files\n"
    )
    assert missing_paths("README.md", text) == [
        "README.md:2: src/no_such_file.cpp does not exist"
    ]


def test_section_numbers_are_read_from_level_two_headings_only() -> None:
    text = "# t\n## 1. A\n### A covariance kernel\n## 2. B\ntext ## 3. no\n### 2.1 C\n"
    assert numbered_sections(text) == [1, 2]
    assert citable(text) == {"1", "2", "2.1"}


# ---------------------------------------------------------------------------
# The repository
# ---------------------------------------------------------------------------


def test_design_has_its_numbered_sections_in_order(design_text: str) -> None:
    assert numbered_sections(design_text) == EXPECTED_SECTIONS


def test_every_citation_names_an_existing_section(design_text: str,
                                                  text_files: list[tuple[str, str]]) -> None:
    sections = citable(design_text)
    bad = [b for name, text in text_files for b in bad_citations(name, text, sections)]
    bad += bad_self_references(design_text, sections)
    assert not bad, "citations of missing sections:\n" + "\n".join(bad)
    cited = sum(len(CITATION.findall(text)) for _, text in text_files)
    assert cited >= 15, f"only {cited} citations found: is the pattern still right?"


def test_nothing_refers_outside_the_repository(text_files: list[tuple[str, str]]) -> None:
    found = [f for name, text in text_files for f in outside_references(name, text)]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("name", ["docs/DESIGN.md", "README.md"])
def test_every_path_mentioned_exists(name: str) -> None:
    text = (REPO_ROOT / name).read_text(encoding="utf-8")
    assert PATH.search(text), f"{name} mentions no file path: is the pattern still right?"
    missing = missing_paths(name, text)
    assert not missing, "\n".join(missing)
