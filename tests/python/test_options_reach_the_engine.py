"""Every entry point hands every field of optex.Options to the engine: optex.OptEx's
keywords, optex.minimize's and optex.torch.OptEx's, with the options of points
with several evaluations, the safeguards and the adaptive strategy among them.
Fields that depend on each other (parallelism and evaluations_per_point) are
validated together, so keywords can change both at once.
"""

from __future__ import annotations

import importlib
import inspect
import math
import pickle

import numpy as np
import pytest
from objectives import rosenbrock

import optex
from optex import problems

# Valid values that differ from the defaults in every field they name.
CHANGED = dict(parallelism=6, evaluations_per_point=3, strategy="adaptive",
               continue_from="last", max_posterior_variance=0.5, trust_region=2.0,
               max_lengthscale_change=4.0, proxy_distances="coefficients")
X0 = problems.Rosenbrock().standard_start(5)


def fields(options: optex.Options, names=CHANGED) -> dict:
    return {name: getattr(options, name) for name in names}


def test_the_values_differ_from_the_defaults() -> None:
    defaults = optex.Options()
    for name, value in CHANGED.items():
        assert getattr(defaults, name) != value, name


# ---- optex.OptEx ------------------------------------------------------------------


def test_optex_keywords_reach_the_engine() -> None:
    opt = optex.OptEx(X0, optex.Adam(lr=0.01), **CHANGED)
    assert fields(opt.options) == CHANGED
    assert opt.parallelism == 6 and opt.ask().shape == (6, X0.size)


def test_optex_keywords_override_options_and_are_validated_together() -> None:
    base = optex.Options(parallelism=8, evaluations_per_point=4, trust_region=3.0)
    # Set one at a time, parallelism=2 would be refused while D is still 4.
    opt = optex.OptEx(X0, options=base, parallelism=2, evaluations_per_point=2)
    assert (opt.options.parallelism, opt.options.evaluations_per_point) == (2, 2)
    assert opt.options.trust_region == 3.0  # kept from base
    assert (base.parallelism, base.evaluations_per_point) == (8, 4)  # the caller's object


def test_the_adaptive_options_reach_the_engine() -> None:
    opt = optex.OptEx(X0, options=optex.Options.adaptive(4))
    assert opt.options == optex.Options.adaptive(4)
    assert (opt.options.strategy, opt.options.continue_from) == ("adaptive", "best_loss")
    assert opt.options.max_lengthscale_change == 10.0


# ---- optex.minimize ----------------------------------------------------------------


@pytest.fixture
def built_engines(monkeypatch) -> list[optex.OptEx]:
    """The engines optex.minimize builds, in order."""
    module = importlib.import_module("optex.minimize")
    real, built = module.OptEx, []

    def recording(*args, **kwargs):
        engine = real(*args, **kwargs)
        built.append(engine)
        return engine

    monkeypatch.setattr(module, "OptEx", recording)
    return built


def test_minimize_keywords_reach_the_engine(built_engines) -> None:
    res = optex.minimize(rosenbrock, X0, optimizer=optex.Adam(lr=0.01), max_iters=2, **CHANGED)
    (engine,) = built_engines
    assert fields(engine.options) == CHANGED
    assert res.nit == 2 and res.n_gradient_evaluations == 2 * 6 + 1


def test_minimize_options_and_keywords_combine(built_engines) -> None:
    optex.minimize(rosenbrock, X0, options=optex.Options.adaptive(4), trust_region=1.5,
                   max_iters=1)
    (engine,) = built_engines
    expected = optex.Options.adaptive(4)
    expected.trust_region = 1.5
    assert engine.options == expected


def test_minimize_refuses_a_bad_option_naming_it() -> None:
    with pytest.raises(ValueError, match=r"evaluations_per_point: must divide parallelism \(4\), got 3"):
        optex.minimize(rosenbrock, X0, evaluations_per_point=3, max_iters=1)
    with pytest.raises(ValueError, match=r"max_lengthscale_change: must be >= 1"):
        optex.minimize(rosenbrock, X0, max_lengthscale_change=0.5, max_iters=1)


# ---- optex.torch.OptEx -------------------------------------------------------------


@pytest.fixture
def torch_model():
    torch = pytest.importorskip("torch", reason="optex.torch needs PyTorch (pip install torch)")
    import optex.torch  # noqa: F401

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    x = torch.randn(8, 3, generator=torch.Generator().manual_seed(1))

    def closure_for(opt):
        def closure():
            opt.zero_grad()
            loss = (model(x) ** 2).mean()
            loss.backward()
            return loss
        return closure

    return model, closure_for


def test_the_facade_takes_every_field_of_options() -> None:
    pytest.importorskip("torch", reason="optex.torch needs PyTorch (pip install torch)")
    from optex.torch import OptEx
    from optex.torch import hyperparameters

    assert set(hyperparameters.OPTION_FIELDS) == set(optex.Options().__getstate__())
    parameters = inspect.signature(OptEx.__init__).parameters
    for name in hyperparameters.OPTION_FIELDS:
        assert parameters[name].kind is inspect.Parameter.KEYWORD_ONLY, name
        assert parameters[name].default is None, name
        assert f"``{name}``" in OptEx.__doc__, name


def test_facade_keywords_reach_the_engine(torch_model) -> None:
    from optex.torch import OptEx

    model, closure_for = torch_model
    opt = OptEx(model.parameters(), lr=0.01, **CHANGED)
    opt.step(closure_for(opt))
    assert fields(opt.engine.options) == CHANGED
    assert opt.parallelism == 6


def test_facade_options_and_keywords_are_validated_together(torch_model) -> None:
    from optex.torch import OptEx

    model, closure_for = torch_model
    base = optex.Options.adaptive(8)
    base.evaluations_per_point = 4
    opt = OptEx(model.parameters(), options=base, parallelism=2, evaluations_per_point=2,
                max_posterior_variance=0.25)
    opt.step(closure_for(opt))
    options = opt.engine.options
    assert (options.parallelism, options.evaluations_per_point) == (2, 2)
    assert options.max_posterior_variance == 0.25
    assert (options.strategy, options.continue_from, options.max_lengthscale_change) == (
        "adaptive", "best_loss", 10.0)
    assert (base.parallelism, base.evaluations_per_point) == (8, 4)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(evaluations_per_point=3), r"^evaluations_per_point: must divide parallelism \(4\), got 3$"),
        (dict(parallelism=2, evaluations_per_point=4),
         r"^evaluations_per_point: must divide parallelism \(2\), got 4$"),
        (dict(evaluations_per_point=2.0), "^evaluations_per_point: expected an int, got float$"),
        (dict(strategy="greedy"), "^strategy: unknown value 'greedy'"),
        (dict(continue_from=0), "^continue_from: expected a str, got int$"),
        (dict(proxy_distances="exact"), "^proxy_distances: unknown value 'exact'"),
        (dict(proxy_distances=1), "^proxy_distances: expected a str, got int$"),
        (dict(max_posterior_variance=math.nan), r"^max_posterior_variance: must be > 0"),
        (dict(trust_region=-1.0), r"^trust_region: must be > 0"),
        (dict(max_lengthscale_change=0.5), r"^max_lengthscale_change: must be >= 1"),
    ],
)
def test_facade_refuses_a_bad_option_naming_it(torch_model, kwargs, message) -> None:
    from optex.torch import OptEx

    model, _ = torch_model
    with pytest.raises(ValueError, match=message):
        OptEx(model.parameters(), **kwargs)


# ---- the proxy distances through every carrier --------------------------------------


@pytest.mark.parametrize("distances", ["direct", "coefficients"])
def test_proxy_distances_survive_options_pickle_state_arrays_and_checkpoints(tmp_path, distances) -> None:
    """Set on the engine, the value reads back from options, and a pickled Options, the
    state arrays and a checkpoint file carry it to the engine they build."""
    opt = optex.OptEx(X0, optex.Sgd(lr=1e-3, momentum=0.9), parallelism=3, proxy_distances=distances)
    assert opt.options.proxy_distances == distances
    for _ in range(2):
        losses, grads = problems.Rosenbrock().value_and_grad(opt.ask())
        opt.tell(grads, losses)
    assert pickle.loads(pickle.dumps(opt.options)).proxy_distances == distances
    assert opt.state_arrays()["options"]["proxy_distances"] == distances
    assert optex.OptEx.from_state_arrays(opt.state_arrays()).options.proxy_distances == distances
    opt.save(tmp_path / "run.ckpt")
    restored = optex.OptEx.load(tmp_path / "run.ckpt")
    assert restored.options.proxy_distances == distances
    assert restored.options == opt.options


def test_state_arrays_refuse_a_bad_proxy_distances_value() -> None:
    opt = optex.OptEx(X0, parallelism=2)
    state = opt.state_arrays()
    for bad, message in (("exact", r"^options\['proxy_distances'\]: proxy_distances: unknown value 'exact'"),
                         (0, r"^options\['proxy_distances'\]: proxy_distances: expected a str, got int")):
        state["options"]["proxy_distances"] = bad
        with pytest.raises(ValueError, match=message):
            optex.OptEx.from_state_arrays(state)


def test_state_arrays_saved_before_proxy_distances_existed_load_as_direct() -> None:
    """A state dict or pickle from before the option has no such key: the run it describes
    found its distances the direct way, and it resumes so, the same bits as its twin."""
    opt = optex.OptEx(X0, optex.Sgd(lr=1e-3, momentum=0.9), parallelism=3)
    for _ in range(3):
        losses, grads = problems.Rosenbrock().value_and_grad(opt.ask())
        opt.tell(grads, losses)
    state = opt.state_arrays()
    del state["options"]["proxy_distances"]
    old = optex.OptEx.from_state_arrays(state)
    assert old.options.proxy_distances == "direct"
    twin = optex.OptEx.from_state_arrays(opt.state_arrays())
    for engine in (old, twin):
        losses, grads = problems.Rosenbrock().value_and_grad(engine.ask())
        engine.tell(grads, losses)
    assert np.array_equal(old.x, twin.x)
    # Only fields added later may be absent.
    state = opt.state_arrays()
    del state["options"]["noise"]
    with pytest.raises(ValueError, match=r"^options\['noise'\]: missing"):
        optex.OptEx.from_state_arrays(state)
