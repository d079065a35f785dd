"""The package as installed: version, exports, documentation, typing files."""

from __future__ import annotations

import importlib.resources
import pydoc

import pytest
from conftest import REPO_ROOT

import optex
from optex import problems


def test_version_is_the_version_file() -> None:
    assert optex.__version__ == (REPO_ROOT / "VERSION").read_text().strip()


def test_exports() -> None:
    for name in optex.__all__:
        assert hasattr(optex, name), name
    for name in problems.__all__:
        assert hasattr(problems, name), name


def test_cuda_queries() -> None:
    assert isinstance(optex.built_with_cuda(), bool)
    count = optex.cuda_device_count()
    assert isinstance(count, int) and count >= 0
    if not optex.built_with_cuda():
        assert count == 0


@pytest.mark.parametrize(
    "obj",
    [optex, optex.OptEx, optex.Options, optex.Sgd, optex.Adam, optex.AdamW, optex.IterationInfo,
     problems, problems.Problem, problems.Rosenbrock, problems.Rotated,
     problems.WithGradientNoise, problems.Domain],
)
def test_help_renders(obj) -> None:
    text = pydoc.render_doc(obj, renderer=pydoc.plaintext)
    assert len(text) > 200


def test_every_public_method_has_a_docstring() -> None:
    for cls in (optex.OptEx, optex.Options, optex.Sgd, optex.Adam, optex.AdamW,
                optex.IterationInfo, problems.Problem, problems.Rotated,
                problems.WithGradientNoise):
        assert cls.__doc__ and cls.__doc__.strip(), cls
        for name, member in vars(cls).items():
            if name.startswith("_"):
                continue
            doc = getattr(member, "__doc__", None)
            assert doc and doc.strip(), f"{cls.__name__}.{name} has no docstring"


def test_optex_help_explains_the_view() -> None:
    doc = optex.OptEx.ask.__doc__
    assert "read-only" in doc and "VIEW" in doc
    assert "drop_nonfinite" in optex.OptEx.tell.__doc__


def test_typing_files_are_installed() -> None:
    files = importlib.resources.files("optex")
    for name in ("py.typed", "_optex.pyi", "problems.pyi"):
        assert files.joinpath(name).is_file(), name
