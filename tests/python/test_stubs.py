"""python/optex/_optex.pyi against the compiled module it describes.

The stub is written by hand, so these tests make it fail loudly when the module
grows a name, an optimizer class, a hyperparameter or a default the stub does
not have (the optimizer classes are registered from the C++ optimizers' own
descriptions: a new optimizer appears in the module without any Python edit).
"""

from __future__ import annotations

import ast
import re

import numpy as np
import pytest
from conftest import REPO_ROOT

import optex
from optex import _optex

STUB_PATH = REPO_ROOT / "python" / "optex" / "_optex.pyi"
STUB = ast.parse(STUB_PATH.read_text(encoding="utf-8"), filename=str(STUB_PATH))

# The module's classes whose public attributes the stub must list (the
# optimizer classes are checked on their own, below).
OTHER_CLASSES = ("OptEx", "Options", "OptimizerState", "IterationInfo", "DeviceArray", "Plan",
                 "PlanCandidate")


def top_level_names(tree: ast.Module) -> dict[str, ast.stmt]:
    """Every name the stub defines at module level (imports excluded)."""
    names: dict[str, ast.stmt] = {}
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    names[target.id] = node
    return names


DEFINED = top_level_names(STUB)


def stub_class(name: str) -> ast.ClassDef:
    node = DEFINED.get(name)
    assert isinstance(node, ast.ClassDef), f"_optex.pyi has no class {name}"
    return node


def class_members(cls: ast.ClassDef) -> dict[str, ast.stmt]:
    members: dict[str, ast.stmt] = {}
    for node in cls.body:
        if isinstance(node, ast.FunctionDef):
            members[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            members[node.target.id] = node
    return members


def union_names(node: ast.expr) -> set[str]:
    """The names of `A | B | C`."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return union_names(node.left) | union_names(node.right)
    assert isinstance(node, ast.Name), ast.dump(node)
    return {node.id}


def signature_parameters(doc: str, name: str) -> list[str]:
    """The parameter names of the signature line pybind11 writes first in a docstring."""
    first = doc.splitlines()[0]
    assert first.startswith(name + "("), first
    depth, current, parts = 0, "", []
    for char in first[len(name) + 1 :]:
        if char in "([{":
            depth += 1
        elif char in ")]}":
            if depth == 0:
                break
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    # "*" and "/" mark keyword-only and positional-only parameters; they name none.
    return [p.split(":")[0].split("=")[0].strip() for p in parts if p.strip() not in ("", "*", "/")]


def parameter_names(fn: ast.FunctionDef) -> list[str]:
    args = fn.args
    return [a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]]


# ---- names ------------------------------------------------------------------------


def test_every_public_name_of_the_module_is_in_the_stub() -> None:
    missing = [name for name in _optex.__all__ if name not in DEFINED]
    assert not missing, f"_optex.pyi does not define {missing}"
    assert "__version__" in DEFINED


def test_the_stub_all_is_the_module_all() -> None:
    node = DEFINED.get("__all__")
    assert isinstance(node, ast.Assign), "_optex.pyi has no __all__"
    assert sorted(ast.literal_eval(node.value)) == sorted(_optex.__all__)


def test_every_public_name_of_the_stub_exists() -> None:
    stale = [name for name in DEFINED if not name.startswith("_") and not hasattr(_optex, name)]
    assert not stale, f"_optex.pyi defines {stale}, which the module does not have"


@pytest.mark.parametrize("name", OTHER_CLASSES)
def test_class_attributes_match(name: str) -> None:
    cls = getattr(_optex, name)
    runtime = {n for n in vars(cls) if not n.startswith("_")}
    stub = {n for n in class_members(stub_class(name)) if not n.startswith("_")}
    assert runtime == stub, f"only in the module: {runtime - stub}, only in the stub: {stub - runtime}"


@pytest.mark.parametrize(
    "name", sorted(n for n in _optex.__all__ if callable(getattr(_optex, n)) and
                   not isinstance(getattr(_optex, n), type)))
def test_function_parameters_match(name: str) -> None:
    fn = DEFINED.get(name)
    assert isinstance(fn, ast.FunctionDef), f"_optex.pyi has no function {name}"
    assert parameter_names(fn) == signature_parameters(getattr(_optex, name).__doc__, name)


# ---- the optimizer classes ----------------------------------------------------------


def test_the_optimizer_union_names_every_class() -> None:
    node = DEFINED.get("_Optimizer")
    assert isinstance(node, ast.Assign), "_optex.pyi has no _Optimizer"
    assert union_names(node.value) == {cls.__name__ for cls in optex.optimizer_classes()}


@pytest.mark.parametrize("cls", optex.optimizer_classes(), ids=lambda c: c.__name__)
def test_optimizer_class_matches_the_stub(cls: type) -> None:
    node = stub_class(cls.__name__)
    assert any(isinstance(d, ast.Name) and d.id == "final" for d in node.decorator_list)
    members = class_members(node)
    defaults = cls()

    init = members.get("__init__")
    assert isinstance(init, ast.FunctionDef)
    args = init.args
    assert not args.posonlyargs and not args.kwonlyargs and args.vararg is None and args.kwarg is None
    assert [a.arg for a in args.args] == ["self", *cls.hyperparameters]
    assert len(args.defaults) == len(cls.hyperparameters), "every hyperparameter has a default"
    for arg, default in zip(args.args[1:], args.defaults):
        value = getattr(defaults, arg.arg)
        expected_type = "bool" if isinstance(value, bool) else "float"
        assert ast.unparse(arg.annotation) == expected_type, arg.arg
        stub_default = ast.literal_eval(default)
        assert type(stub_default) is type(value) and stub_default == value, (
            f"{cls.__name__}.__init__: {arg.arg} defaults to {value!r}, the stub says {stub_default!r}")

    # The attributes, with the types of the constructor's arguments.
    for name in cls.hyperparameters:
        field = members.get(name)
        assert isinstance(field, ast.AnnAssign), f"{cls.__name__}.{name} is not in the stub"
        expected_type = "bool" if isinstance(getattr(defaults, name), bool) else "float"
        assert ast.unparse(field.annotation) == expected_type, name
    # The class attributes, with the kind as a literal.
    assert ast.unparse(members["hyperparameters"].annotation) == "ClassVar[tuple[str, ...]]"
    kind = members["kind"].annotation
    match = re.fullmatch(r"ClassVar\[Literal\[(.+)\]\]", ast.unparse(kind))
    assert match and ast.literal_eval(match.group(1)) == cls.kind
    # The state slots' names, slot by slot, as literals.
    names = members["state_slot_names"].annotation
    match = re.fullmatch(r"ClassVar\[tuple\[(.+)\]\]", ast.unparse(names))
    assert match, ast.unparse(names)
    assert tuple(slot_literals(e) for e in names.slice.slice.elts) == tuple(
        {n} for n in cls.state_slot_names)
    kept = members["state_slots"]
    assert isinstance(kept, ast.FunctionDef) and kept.decorator_list[0].id == "property"
    assert ast.unparse(kept.returns.value) == "tuple"
    allowed = [slot_literals(e) for e in kept.returns.slice.elts]
    assert len(allowed) == len(cls.state_slot_names)
    for slot, (names_here, name) in enumerate(zip(allowed, cls.state_slot_names)):
        assert names_here <= {name, None}, (cls.__name__, slot)
        assert defaults.state_slots[slot] in names_here, (cls.__name__, slot)
    # A value type that is not hashable, and nothing the module does not have.
    assert ast.unparse(members["__hash__"].annotation) == "ClassVar[None]"
    public = {n for n in members if not n.startswith("_")}
    assert public == {*cls.hyperparameters, "hyperparameters", "kind", "state_slot_names", "state_slots"}


def slot_literals(node: ast.expr) -> set[str | None]:
    """The values `Literal["a"] | None` allows: {"a", None}."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return slot_literals(node.left) | slot_literals(node.right)
    if isinstance(node, ast.Constant) and node.value is None:
        return {None}
    assert isinstance(node, ast.Subscript) and ast.unparse(node.value) == "Literal", ast.dump(node)
    return {ast.literal_eval(node.slice)}


# ---- the state arrays' documented keys ------------------------------------------------


def typed_dict_keys(name: str) -> dict[str, str]:
    """The keys of a TypedDict of the stub, with their annotations."""
    node = stub_class(name)
    return {m.target.id: ast.unparse(m.annotation) for m in node.body if isinstance(m, ast.AnnAssign)}


def test_the_state_arrays_keys_are_those_the_stub_documents() -> None:
    opt = optex.OptEx([0.5, -1.0, 2.0], optimizer=optex.Adam(lr=0.1), parallelism=2, history=3)
    for _ in range(2):
        points = opt.ask()
        opt.tell(2 * points, (points**2).sum(axis=1))
    state = opt.state_arrays()
    documented = typed_dict_keys("_StateArrays")
    assert set(state) == set(documented)
    assert documented["history"] == "NotRequired[_StateHistory]"
    assert "history" not in opt.state_arrays(history=False)
    assert set(state["history"]) == set(typed_dict_keys("_StateHistory"))
    assert set(state["round"]) == set(typed_dict_keys("_StateRound"))
    # The Python types the annotations name.
    types = {"int": int, "float": float, "NDArray[np.float32]": np.ndarray, "NDArray[np.float64]": np.ndarray}
    for values, annotations in ((state, documented), (state["history"], typed_dict_keys("_StateHistory")),
                                (state["round"], typed_dict_keys("_StateRound"))):
        for key, annotation in annotations.items():
            if annotation in types:
                assert type(values[key]) is types[annotation], key
                if annotation.startswith("NDArray"):
                    assert values[key].dtype == np.dtype(annotation[len("NDArray[np."):-1]), key


def test_the_stub_parses_as_the_installed_copy() -> None:
    """The build copies the stub next to the module: the copy is the source's."""
    import importlib.resources

    installed = importlib.resources.files("optex").joinpath("_optex.pyi").read_text(encoding="utf-8")
    assert ast.dump(ast.parse(installed)) == ast.dump(STUB), (
        "the installed _optex.pyi differs from python/optex/_optex.pyi: rebuild or reinstall")
