"""optex.Sgd, Adam, AdamW and Options as value types."""

from __future__ import annotations

import copy
import pickle

import pytest

import optex

OPTION_FIELDS = {
    "parallelism": 4,
    "history": 32,
    "kernel": "matern52",
    "lengthscale": 0.1,
    "noise": 1e-3,
    "input_scaling": "none",
    "warmup": "last_gradient",
    "lengthscale_selection": "leave_one_out",
    "selection_interval": 1,
    "lengthscale_grid": (),
    "proxy": "gp",
    "seed": 0,
    "device": "cpu",
    "history_precision": "fp32",
}


def test_option_defaults_mirror_cpp() -> None:
    options = optex.Options()
    for name, value in OPTION_FIELDS.items():
        assert getattr(options, name) == value, name
    assert repr(options) == "Options(" + ", ".join(
        f"{k}={v!r}" for k, v in OPTION_FIELDS.items()) + ")"


def test_reference_options() -> None:
    reference = optex.Options.reference()
    assert reference.parallelism == 5
    assert reference.history == 50
    assert reference.input_scaling == "reference_mean_sqrt_norm"
    assert reference.warmup == "zero_gradient"
    assert reference.lengthscale_selection == "fixed"
    assert optex.Options.reference(parallelism=3).parallelism == 3


def test_options_attributes_and_equality() -> None:
    options = optex.Options(kernel="rbf", lengthscale_grid=[0.5, 1.0, 2.0], seed=2**64 - 1)
    assert options.kernel == "rbf"
    assert options.lengthscale_grid == (0.5, 1.0, 2.0)
    assert options.seed == 2**64 - 1
    other = optex.Options(kernel="rbf", lengthscale_grid=(0.5, 1.0, 2.0), seed=2**64 - 1)
    assert options == other
    other.noise = 0.5
    assert options != other
    assert options != "not options"
    options.device = "cuda"  # validate() does not ask the machine: the engine does
    assert options.device == "cuda:0"
    options.device = "cuda:3"
    assert options.device == "cuda:3"


def test_options_dependent_fields_in_one_constructor() -> None:
    options = optex.Options(history_precision="bf16", device="cuda:1")
    assert (options.device, options.history_precision) == ("cuda:1", "bf16")
    with pytest.raises(ValueError, match="CUDA devices only"):
        options.device = "cpu"


def test_every_enumeration_value_is_accepted() -> None:
    for kernel in ("matern12", "matern32", "matern52", "rbf"):
        assert optex.Options(kernel=kernel).kernel == kernel
    for proxy in ("gp", "target", "last_gradient"):
        assert optex.Options(proxy=proxy).proxy == proxy
    for scaling in ("none", "reference_mean_sqrt_norm"):
        assert optex.Options(input_scaling=scaling).input_scaling == scaling
    for warmup in ("zero_gradient", "last_gradient"):
        assert optex.Options(warmup=warmup).warmup == warmup
    for selection in ("fixed", "leave_one_out", "marginal_likelihood"):
        assert optex.Options(lengthscale_selection=selection).lengthscale_selection == selection
    for precision in ("fp32", "bf16", "bf16_gradients"):
        assert optex.Options(device="cuda", history_precision=precision).history_precision == precision


def test_positional_options_are_refused() -> None:
    with pytest.raises(TypeError):
        optex.Options(4)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("value", "fields"),
    [
        (optex.Sgd(), dict(lr=1e-2, momentum=0.0, nesterov=False, weight_decay=0.0)),
        (optex.Adam(), dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0)),
        (optex.AdamW(), dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=1e-2)),
    ],
)
def test_optimizer_defaults_mirror_cpp(value, fields) -> None:
    for name, expected in fields.items():
        assert getattr(value, name) == expected, name
    assert repr(value) == type(value).__name__ + "(" + ", ".join(
        f"{k}={v!r}" for k, v in fields.items()) + ")"


def test_optimizers_are_values() -> None:
    sgd = optex.Sgd(0.1, momentum=0.9, nesterov=True)
    assert sgd == optex.Sgd(lr=0.1, momentum=0.9, nesterov=True)
    sgd.lr = 0.2
    assert sgd.lr == 0.2
    assert sgd != optex.Sgd(lr=0.1, momentum=0.9, nesterov=True)
    assert optex.Adam(lr=0.1) != optex.AdamW(lr=0.1, weight_decay=0.0)  # different kinds
    assert optex.Adam() != optex.Sgd()
    with pytest.raises(TypeError):
        hash(optex.Adam())  # mutable: not hashable


@pytest.mark.parametrize(
    "value",
    [
        optex.Sgd(lr=0.3, momentum=0.5, nesterov=True, weight_decay=0.1),
        optex.Adam(lr=0.2, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.01),
        optex.AdamW(lr=0.2, weight_decay=0.3),
        optex.Options(parallelism=7, kernel="matern32", lengthscale_grid=(1.0, 3.0), seed=9,
                      device="cuda:2", history_precision="bf16_gradients"),
    ],
)
def test_pickle_and_copy(value) -> None:
    for clone in (pickle.loads(pickle.dumps(value)), copy.copy(value), copy.deepcopy(value)):
        assert type(clone) is type(value)
        assert clone == value
        assert clone is not value


def test_classes_live_in_optex() -> None:
    for cls in (optex.Sgd, optex.Adam, optex.AdamW, optex.Options, optex.OptEx,
                optex.IterationInfo):
        assert cls.__module__ == "optex"
    assert repr(optex.Sgd) == "<class 'optex.Sgd'>"
