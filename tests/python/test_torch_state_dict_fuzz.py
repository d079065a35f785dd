"""optex.torch.OptEx.load_state_dict against every simple corruption of a real state_dict.

From the state_dict of an OptEx that has taken a few steps (a Linear layer; Adam, SGD
with momentum, AdamW), each case changes one thing: removes one key at any depth,
replaces one tensor (NaN, inf, 3e38, a wrong shape, a flattened or reshaped one of the
right size, another dtype, a sparse or a meta tensor) or one plain value (None, a
string, NaN, -1), adds a key of one of torch.optim's optimizers to a param group, or
breaks the structure (foreign indices, extra entries and keys). Each case must either be
refused with ValueError (not KeyError, TypeError, NotImplementedError, RuntimeError)
leaving the optimizer exactly as it was, or be one of ACCEPTED, and then the optimizer
must be able to take a step.
"""

from __future__ import annotations

import copy
import functools
import io
import math

import pytest

torch = pytest.importorskip("torch", reason="optex.torch needs PyTorch (pip install torch); not installed here")

from optex.torch import OptEx  # noqa: E402

KINDS = {"adam": {}, "sgd": {"momentum": 0.9}, "adamw": {}}

# The corruptions that still describe a state from which the run can go on.
ACCEPTED = {
    # A state saved with history=False looks like this.
    "del ['optex']['engine']['history']",
    # A huge second moment makes tiny steps.
    "huge ['state'][0]['exp_avg_sq']",
    "huge ['state'][1]['exp_avg_sq']",
    # The history's cached float64 statistics are kept as saved (3e38 is finite in
    # float64; DESIGN.md section 6: the checks do not promise that they match the
    # points, and a fit that cannot use them degrades the round, it does not fail).
    "huge ['optex']['engine']['history']['squared_distances']",
    "huge ['optex']['engine']['history']['squared_norms']",
    "huge ['optex']['engine']['history']['gradient_inner_products']",
    # NaN is how the engine writes "not measured yet".
    "nan ['optex']['engine']['round']['gradient_noise']",
    "nan ['optex']['engine']['round']['last_step_norm']",
    # States saved before the verified mode have no window: a fresh window, as here
    # (the run is in the approximate mode, whose window is always empty).
    "del ['optex']['engine']['round']['window_carried']",
    "del ['optex']['engine']['round']['window_first_slot']",
    # States saved before the option existed found their distances the direct way.
    "del ['optex']['engine']['options']['proxy_distances']",
}


def make(model: torch.nn.Module, kind: str) -> OptEx:
    return OptEx(model.parameters(), optimizer=kind, lr=0.01, parallelism=2, history=4, seed=3,
                 **KINDS[kind])


def closure_for(opt: OptEx, model: torch.nn.Module):
    x = torch.linspace(-1.0, 1.0, 18).reshape(6, 3)

    def closure():
        opt.zero_grad()
        loss = (model(x) - 0.5).pow(2).mean()
        loss.backward()
        return loss
    return closure


@functools.cache
def trained(kind: str) -> tuple[dict, bytes]:
    """(the model's weights, the optimizer's state_dict as bytes) after 3 steps."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = make(model, kind)
    closure = closure_for(opt, model)
    for _ in range(3):
        opt.step(closure)
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    return copy.deepcopy(model.state_dict()), buffer.getvalue()


def good_state(kind: str) -> dict:
    return torch.load(io.BytesIO(trained(kind)[1]), weights_only=True)


def resumed(kind: str):
    """A model and an optimizer resumed from the good state."""
    model = torch.nn.Linear(3, 2)
    model.load_state_dict(trained(kind)[0])
    opt = make(model, kind)
    opt.load_state_dict(good_state(kind))
    return model, opt


def fingerprint(opt: OptEx):
    """Everything a refused load must leave alone, bit for bit."""
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    groups = [{k: ([id(p) for p in v] if k == "params" else v) for k, v in g.items()}
              for g in opt.param_groups]
    return buffer.getvalue(), repr(groups), dict(opt.defaults), opt.iteration, opt.engine.iteration


# ------------------------------------------------------------------ the mutations

def _paths(value, path=()):
    yield path, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, path + (k,))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _paths(v, path + (i,))


def _name(path) -> str:
    return "".join(f"[{k!r}]" for k in path)


def _get(d, path):
    for k in path:
        d = d[k]
    return d


def _set(d, path, value) -> None:
    parent = _get(d, path[:-1])
    if isinstance(parent, tuple):
        items = list(parent)
        items[path[-1]] = value
        _set(d, path[:-1], tuple(items))
    else:
        parent[path[-1]] = value


def _delete(d, path) -> None:
    del _get(d, path[:-1])[path[-1]]


def _tensors(t: torch.Tensor):
    float_dtype = t.dtype if t.is_floating_point() else torch.float32
    yield "nan", torch.full(t.shape, math.nan, dtype=float_dtype)
    yield "inf", torch.full(t.shape, math.inf, dtype=float_dtype)
    yield "huge", torch.full(t.shape, 3e38, dtype=float_dtype)
    yield "longer", torch.zeros(t.numel() + 1, dtype=t.dtype)
    yield "reshaped", t.reshape(1, *t.shape).clone()  # the right number of elements
    if t.dim() > 1:
        yield "flattened", t.reshape(-1).clone()
    for dtype in (torch.float64, torch.float32, torch.int64, torch.bool):
        if dtype != t.dtype:
            yield str(dtype).replace("torch.", ""), t.to(dtype)
    yield "sparse", (t if t.dim() else t.reshape(1)).to_sparse()
    yield "meta", t.to("meta")


_PLAIN = (("None", None), ("str", "junk"), ("nan", math.nan), ("-1", -1))


def _foreign_group_keys(ours: dict):
    """(optimizer, key, value) of torch.optim's optimizers' param-group keys OptEx has not."""
    for cls in (torch.optim.Adam, torch.optim.SGD, torch.optim.AdamW, torch.optim.RMSprop):
        group = cls([torch.zeros(1, requires_grad=True)], lr=0.1).state_dict()["param_groups"][0]
        for key, value in group.items():
            if key not in ours:
                yield cls.__name__, key, value


@functools.cache
def mutations(kind: str) -> dict:
    """name -> a function that corrupts a state_dict in place."""
    good = good_state(kind)
    out = {}
    for path, value in list(_paths(good)):
        if path and isinstance(_get(good, path[:-1]), dict):
            out[f"del {_name(path)}"] = functools.partial(_delete, path=path)
        if isinstance(value, torch.Tensor):
            for what, replacement in _tensors(value):
                out[f"{what} {_name(path)}"] = functools.partial(_set, path=path, value=replacement)
        elif path and not isinstance(value, (dict, list, tuple)):
            for what, replacement in _PLAIN:
                if replacement is not value and replacement != value:
                    out[f"{what} {_name(path)}"] = functools.partial(_set, path=path, value=replacement)
    for cls, key, value in _foreign_group_keys(good["param_groups"][0]):
        out[f"add {cls}'s {key}"] = functools.partial(_set, path=("param_groups", 0, key), value=value)

    def structural(change):
        return change

    out.update({
        "state entry of no parameter": structural(lambda s: s["state"].__setitem__(2, dict(s["state"][1]))),
        "state entry -1": structural(lambda s: s["state"].__setitem__(-1, dict(s["state"][1]))),
        "state keys as str": structural(lambda s: s.__setitem__("state", {str(k): v for k, v in s["state"].items()})),
        "unknown key in a state entry": structural(lambda s: s["state"][0].__setitem__("extra", torch.zeros(1))),
        "params repeated": structural(lambda s: s["param_groups"][0].__setitem__("params", [0, 0])),
        "params shifted": structural(lambda s: s["param_groups"][0].__setitem__("params", [1, 2])),
        "params reversed": structural(lambda s: s["param_groups"][0].__setitem__("params", [1, 0])),
        "params as a tuple": structural(lambda s: s["param_groups"][0].__setitem__("params", (0, 1))),
        "params one more": structural(lambda s: s["param_groups"][0].__setitem__("params", [0, 1, 2])),
        "a second group": structural(lambda s: s["param_groups"].append(dict(s["param_groups"][0]))),
        "no group": structural(lambda s: s.__setitem__("param_groups", [])),
        "groups as a tuple": structural(lambda s: s.__setitem__("param_groups", tuple(s["param_groups"]))),
        "unknown top-level key": structural(lambda s: s.__setitem__("extra", 1)),
        "unknown optex key": structural(lambda s: s["optex"].__setitem__("extra", 1)),
        "unknown engine key": structural(lambda s: s["optex"]["engine"].__setitem__("extra", 1)),
        "slots in the engine entry": structural(
            lambda s: s["optex"]["engine"].__setitem__("slots", {"exp_avg": torch.zeros(8)})),
        "optimizer in the engine entry": structural(
            lambda s: s["optex"]["engine"].__setitem__("optimizer", [])),
        "another optimizer kind": structural(lambda s: s["optex"].__setitem__("optimizer", "lion")),
        "format as a tensor": structural(lambda s: s["optex"].__setitem__("format", torch.tensor([1, 1]))),
        "state of torch.optim.Adam before its first step": structural(
            lambda s: (s.clear(), s.update(torch.optim.Adam(
                [torch.zeros(3, 2, requires_grad=True), torch.zeros(2, requires_grad=True)]).state_dict()))),
        "step as a 1-element vector": structural(lambda s: s["state"][0].__setitem__("step", s["state"][0]["step"].reshape(1))),
    })
    return out


CASES = [(kind, name) for kind in KINDS for name in mutations(kind)]


@pytest.mark.parametrize("kind,name", CASES, ids=[f"{k}: {n}" for k, n in CASES])
def test_a_corrupted_state_is_refused_unchanged_or_can_step(kind, name) -> None:
    model, opt = resumed(kind)
    state = good_state(kind)
    mutations(kind)[name](state)
    before = fingerprint(opt)
    try:
        opt.load_state_dict(state)
    except ValueError:
        assert name not in ACCEPTED, f"{name}: refused, but it is a state the run can go on from"
        assert fingerprint(opt) == before, f"{name}: refused, but the optimizer changed"
        opt.step(closure_for(opt, model))  # and it still works
        return
    assert name in ACCEPTED, f"{name}: accepted"
    opt.step(closure_for(opt, model))
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())


def test_every_accepted_case_is_generated() -> None:
    names = {name for _, name in CASES}
    assert ACCEPTED <= names


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_good_state_loads_and_continues(kind) -> None:
    model, opt = resumed(kind)
    reference_model = torch.nn.Linear(3, 2)
    reference_model.load_state_dict(trained(kind)[0])
    reference = make(reference_model, kind)
    reference.load_state_dict(good_state(kind))
    for _ in range(2):
        opt.step(closure_for(opt, model))
        reference.step(closure_for(reference, reference_model))
    assert torch.equal(torch.cat([p.flatten() for p in model.parameters()]),
                       torch.cat([p.flatten() for p in reference_model.parameters()]))
