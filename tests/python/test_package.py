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
    [optex, optex.OptEx, optex.Options, *optex.optimizer_classes(), optex.IterationInfo,
     optex.OptimizerState, optex.init_state, optex.apply_step, optex.optimizer_classes,
     problems, problems.Problem, problems.Rosenbrock, problems.Rotated,
     problems.WithGradientNoise, problems.Domain],
    ids=lambda obj: getattr(obj, "__name__", repr(obj)),
)
def test_help_renders(obj) -> None:
    text = pydoc.render_doc(obj, renderer=pydoc.plaintext)
    assert len(text) > 200


def test_every_public_method_has_a_docstring() -> None:
    for cls in (optex.OptEx, optex.Options, *optex.optimizer_classes(), optex.IterationInfo,
                optex.OptimizerState, optex.DeviceArray, problems.Problem, problems.Rotated,
                problems.WithGradientNoise):
        assert cls.__doc__ and cls.__doc__.strip(), cls
        for name, member in vars(cls).items():
            if name.startswith("_"):
                continue
            doc = getattr(member, "__doc__", None)
            assert doc and doc.strip(), f"{cls.__name__}.{name} has no docstring"


def test_every_public_function_has_a_docstring() -> None:
    for name in optex.__all__:
        obj = getattr(optex, name)
        if callable(obj) and not isinstance(obj, type):
            assert obj.__doc__ and len(obj.__doc__.strip()) > 20, name


@pytest.mark.parametrize("cls", optex.optimizer_classes(), ids=lambda c: c.__name__)
def test_optimizer_help_shows_the_constructor_and_the_rules(cls) -> None:
    text = pydoc.render_doc(cls, renderer=pydoc.plaintext)
    defaults = cls()
    signature = ", ".join(f"{n}: {'bool' if isinstance(getattr(defaults, n), bool) else 'float'} = "
                          f"{getattr(defaults, n)!r}" for n in cls.hyperparameters)
    assert f"__init__(self, {signature}) -> None" in text
    assert "ValueError" in text and "TypeError" in text
    for name in cls.hyperparameters:
        assert vars(cls)[name].__doc__.strip() in text


def test_optex_help_explains_the_view() -> None:
    doc = optex.OptEx.ask.__doc__
    assert "read-only" in doc and "VIEW" in doc
    assert "drop_nonfinite" in optex.OptEx.tell.__doc__


def test_typing_files_are_installed() -> None:
    files = importlib.resources.files("optex")
    for name in ("py.typed", "_optex.pyi", "problems.pyi"):
        assert files.joinpath(name).is_file(), name
