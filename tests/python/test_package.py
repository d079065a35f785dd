"""The package as installed: version, exports, documentation, typing files."""

from __future__ import annotations

import importlib.resources
import pickle
import pydoc
import subprocess
import sys

import pytest
from conftest import REPO_ROOT, gpu_required

import optex
from optex import problems


def test_version_is_the_version_file() -> None:
    assert optex.__version__ == (REPO_ROOT / "VERSION").read_text().strip()


def test_exports() -> None:
    for name in optex.__all__:
        assert hasattr(optex, name), name
    for name in problems.__all__:
        assert hasattr(problems, name), name


@pytest.mark.gpu
def test_cuda_queries() -> None:
    assert isinstance(optex.built_with_cuda(), bool)
    count = optex.cuda_device_count()
    assert isinstance(count, int) and count >= 0
    if not optex.built_with_cuda():
        assert count == 0
    if gpu_required():  # a GPU run: this build must see the device
        assert optex.built_with_cuda() and count > 0


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
                optex.OptimizerState, optex.DeviceArray, optex.Plan, optex.PlanCandidate,
                problems.Problem, problems.Rotated, problems.WithGradientNoise):
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


# One instance of every class of the compiled module, pickled with every protocol in
# a child process: pybind11 aborts the interpreter on protocols 0 and 1 unless the
# class reduces as protocol 2 does (exported_from in python/src/bindings.hpp).
PICKLE_EVERY_CLASS = r"""
import pickle
import numpy as np
import optex
from optex import problems

opt = optex.OptEx(np.zeros(2), parallelism=2)
instances = [cls() for cls in optex.optimizer_classes()] + [
    optex.Options(), opt, optex.init_state(optex.Adam(), 2), opt.device_points(),
    problems.Domain(-1.0, 1.0), problems.Rotated(problems.Sphere(), 2),
    problems.WithGradientNoise(problems.Sphere(), 0.1),
]
instances += [getattr(problems, n)() for n in problems.__all__
              if isinstance(getattr(problems, n), type) and n not in
              ("Problem", "Domain", "Rotated", "WithGradientNoise")]
plan = optex.plan(10, 2, 4, gradient_seconds=1.0, round_timer=lambda d, n, t: 1e-3,
                  step_timer=lambda d: 1e-4)
instances += [plan, plan.candidates[0]]
points = opt.ask()
losses, grads = problems.Sphere().value_and_grad(points)
instances.append(opt.tell(grads, losses))
covered = {type(i) for i in instances} | {problems.Problem}
exported = {getattr(optex, n) for n in optex._optex.__all__ if isinstance(getattr(optex, n), type)}
exported |= {getattr(problems, n) for n in problems.__all__ if isinstance(getattr(problems, n), type)}
missing = {c.__name__ for c in exported} - {c.__name__ for c in covered}
assert not missing, f"no instance of {missing} in the list"
for value in instances:
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        try:
            clone = pickle.loads(pickle.dumps(value, protocol))
        except TypeError as e:
            assert "cannot pickle" in str(e), (value, protocol, e)
            print(type(value).__name__, protocol, "refused")
        else:
            assert type(clone) is type(value) and repr(clone) == repr(value), (value, protocol)
            print(type(value).__name__, protocol, "ok")
"""


def test_every_pickle_protocol_works_or_is_refused_without_a_crash() -> None:
    done = subprocess.run([sys.executable, "-c", PICKLE_EVERY_CLASS], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    results = dict(line.rsplit(" ", 1) for line in done.stdout.splitlines())
    for name in ("Sgd", "Adam", "AdamW", "RmsProp", "Lion", "Options", "OptEx", "Sphere",
                 "Rotated", "WithGradientNoise"):
        for protocol in (0, 1, 2, pickle.HIGHEST_PROTOCOL):
            assert results[f"{name} {protocol}"] == "ok", (name, protocol)
    for name in ("OptimizerState", "DeviceArray", "IterationInfo", "Domain", "Plan",
                 "PlanCandidate"):
        assert results[f"{name} 0"] == "refused", name


def test_no_signature_names_a_cpp_type() -> None:
    """help() shows each signature line: Python types only, no detail::accessor<...>."""
    functions = [getattr(optex, n) for n in optex._optex.__all__]
    for cls in [f for f in functions if isinstance(f, type)]:
        functions += [m for m in vars(cls).values() if callable(m)]
    for fn in functions:
        first = (fn.__doc__ or "").splitlines()[0] if fn.__doc__ else ""
        assert "::" not in first and "<" not in first.replace("->", ""), f"{fn!r}: {first}"


def test_the_module_keeps_its_static_libraries_to_itself() -> None:
    # Linked with --exclude-libs,ALL, the module exports its init function and the
    # weak template instantiations of its own sources, never a function of a static
    # archive: neither the core (liboptex.a) nor a libstdc++ that a toolchain linked
    # statically. Exported, a static libstdc++ mixes with the process's shared one,
    # and `ostream << double` crashed in OptEx.load on such a toolchain.
    import shutil

    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed")
    module = optex._optex.__file__
    listing = subprocess.run([nm, "-D", "-C", "--defined-only", module], capture_output=True,
                             text=True, timeout=60, check=True).stdout
    strong = [line.split(" ", 2)[2] for line in listing.splitlines()
              if len(line.split(" ", 2)) == 3 and line.split(" ", 2)[1] == "T"]
    assert strong == ["PyInit__optex"], strong[:10]
    for internal in ("std::locale::", "std::ios_base::", "std::codecvt<", "std::num_put<"):
        assert internal not in listing, internal
