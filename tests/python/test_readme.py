"""The README's Python quickstart runs as written: every ```python block of its
"## Python quickstart" section, in order, each as a script of its own."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest
from conftest import REPO_ROOT

SECTION = "## Python quickstart"


def quickstart_blocks(path: Path) -> list[str]:
    """The ```python blocks after the section heading, before the next section."""
    text = path.read_text(encoding="utf-8")
    start = text.find(SECTION)
    assert start >= 0, f"{path.name} has no '{SECTION}' section"
    section = text[start + len(SECTION):]
    next_section = re.search(r"^## ", section, flags=re.MULTILINE)
    if next_section:
        section = section[: next_section.start()]
    return re.findall(r"^```python\n(.*?)^```", section, flags=re.MULTILINE | re.DOTALL)


def test_the_quickstart_has_its_examples() -> None:
    assert len(quickstart_blocks(REPO_ROOT / "README.md")) == 2


@pytest.mark.parametrize("index", [0, 1])
def test_quickstart_block_runs(index: int, tmp_path: Path, monkeypatch) -> None:
    code = quickstart_blocks(REPO_ROOT / "README.md")[index]
    # A file of its own, run as __main__: worker processes (spawn) re-import it
    # by path, as they would the user's script.
    script = tmp_path / f"quickstart_{index}.py"
    script.write_text(code, encoding="utf-8")
    monkeypatch.chdir(tmp_path)  # where the example writes its checkpoint
    runpy.run_path(str(script), run_name="__main__")
