"""pickle, copy.deepcopy and torch.save of an optex.torch.OptEx round-trip exactly, or
raise a TypeError that names state_dict(); never a silently broken optimizer."""

from __future__ import annotations

import copy
import io
import pickle

import pytest

torch = pytest.importorskip("torch", reason="optex.torch needs PyTorch (pip install torch); not installed here")

from optex.torch import OptEx  # noqa: E402
from torch_models import TwoHeads, bits, closure_for, flat, loss_of, make_data  # noqa: E402


def trained(steps: int = 3, **kwargs):
    data = make_data()
    model = TwoHeads()
    model.use_b = True
    opt = OptEx([{"params": [*model.body.parameters(), *model.a.parameters()]},
                 {"params": list(model.b.parameters()), "lr": 0.05, "weight_decay": 0.0}],
                optimizer="adamw", lr=0.02, parallelism=3, history=6, seed=9, **kwargs)
    for _ in range(steps):
        opt.step(closure_for(opt, model, data))
    return model, opt, data


def continue_run(model, opt, data, steps: int = 3) -> bytes:
    for _ in range(steps):
        opt.step(closure_for(opt, model, data))
    return bits(flat(model.parameters()))


def copies():
    """Each way of copying a (model, optimizer) pair together."""
    def deepcopy(pair):
        return copy.deepcopy(pair)

    def pickled(pair):
        return pickle.loads(pickle.dumps(pair))

    def torch_saved(pair):
        buffer = io.BytesIO()
        torch.save({"model": pair[0], "opt": pair[1]}, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False)
        return loaded["model"], loaded["opt"]

    return [deepcopy, pickled, torch_saved]


@pytest.mark.parametrize("copier", copies(), ids=lambda f: f.__name__)
def test_a_copy_continues_bit_for_bit(copier) -> None:
    model, opt, data = trained()
    model2, opt2 = copier((model, opt))
    assert isinstance(opt2, OptEx)
    # The copy's parameters are the copied model's, not the original's.
    assert {id(p) for p in opt2.param_groups[0]["params"]} <= {id(p) for p in model2.parameters()}
    assert [g["lr"] for g in opt2.param_groups] == [0.02, 0.05]
    assert opt2.engine.iteration == opt.engine.iteration
    expected = continue_run(model, opt, data)
    assert continue_run(model2, opt2, data) == expected


def test_an_optimizer_copied_alone_owns_copies_of_the_parameters() -> None:
    model, opt, data = trained()
    opt2 = copy.deepcopy(opt)
    params = [p for g in opt2.param_groups for p in g["params"]]
    assert not {id(p) for p in params} & {id(p) for p in model.parameters()}
    assert bits(flat(params)) == bits(flat(p for g in opt.param_groups for p in g["params"]))


def test_a_copy_before_the_first_step_works() -> None:
    model = TwoHeads()
    opt = OptEx(model.parameters(), lr=0.02, parallelism=2, seed=1)
    model2, opt2 = copy.deepcopy((model, opt))
    data = make_data()
    assert continue_run(model2, opt2, data) == continue_run(model, opt, data)


def test_a_pending_round_refuses_with_a_type_error_naming_state_dict() -> None:
    model, opt, data = trained(steps=1)

    def failing():
        opt.zero_grad()
        loss_of(model, data).backward()
        raise RuntimeError("the simulator crashed")

    with pytest.raises(RuntimeError, match="the simulator crashed"):
        opt.step(failing)
    for attempt in (lambda: copy.deepcopy(opt), lambda: pickle.dumps(opt),
                    lambda: torch.save(opt, io.BytesIO())):
        with pytest.raises(TypeError, match=r"round is pending.*state_dict\(\)"):
            attempt()
    opt.step(closure_for(opt, model, data))  # finishing the round makes it copyable again
    assert isinstance(copy.deepcopy(opt), OptEx)


def test_the_buffers_option_travels_with_the_copy() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 2))
    opt = OptEx(model.parameters(), lr=0.01, parallelism=2, buffers=model, seed=0)
    data = make_data()
    opt.step(closure_for(opt, model, data))
    model2, opt2 = copy.deepcopy((model, opt))
    assert continue_run(model2, opt2, data, 2) == continue_run(model, opt, data, 2)
    assert bits(model2[1].running_mean) == bits(model[1].running_mean)
