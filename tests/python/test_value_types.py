"""The base optimizer classes, optex.Options and optex.OptimizerState as value types."""

from __future__ import annotations

import copy
import math
import pickle
import re
from decimal import Decimal
from fractions import Fraction

import numpy as np
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
    "proxy_distances": "direct",
    "seed": 0,
    "evaluations_per_point": 1,
    "strategy": "fixed",
    "continue_from": "best_loss",
    "max_posterior_variance": math.inf,
    "trust_region": math.inf,
    "max_lengthscale_change": math.inf,
    "mode": "approximate",
    "tolerance": 0.0,
    "device": "cpu",
    "threads": 0,
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
    assert reference.proxy_distances == "direct"
    assert optex.Options.reference(parallelism=3).parallelism == 3


def test_adaptive_options() -> None:
    """Options() with the adaptive split, commits from the best loss, and the lengthscale guard."""
    adaptive = optex.Options.adaptive()
    expected = optex.Options(strategy="adaptive", continue_from="best_loss",
                             max_lengthscale_change=10.0)
    assert adaptive == expected and repr(adaptive) == repr(expected)
    assert adaptive.parallelism == 4 and adaptive.evaluations_per_point == 1
    assert optex.Options.adaptive(parallelism=6).parallelism == 6
    assert optex.Options.adaptive(np.int64(2)) == optex.Options(
        parallelism=2, strategy="adaptive", continue_from="best_loss", max_lengthscale_change=10.0)
    assert optex.Options.reference().strategy == "fixed"
    assert optex.Options.reference().continue_from == "last"


def test_safeguards_take_any_admissible_threshold() -> None:
    options = optex.Options(max_posterior_variance=5e-324, trust_region=1e300,
                            max_lengthscale_change=1)
    assert (options.max_posterior_variance, options.trust_region) == (5e-324, 1e300)
    assert options.max_lengthscale_change == 1.0 and type(options.max_lengthscale_change) is float
    options.trust_region = np.float32(0.5)
    assert options.trust_region == 0.5
    options.max_posterior_variance = math.inf  # off again
    assert options.max_posterior_variance == math.inf


def test_evaluations_per_point_divides_parallelism() -> None:
    for n, d in ((1, 1), (4, 2), (6, 3), (6, 6), (12, 4)):
        options = optex.Options(parallelism=n, evaluations_per_point=d)
        assert (options.parallelism, options.evaluations_per_point) == (n, d)
    # Attributes change one at a time: (8, 4) -> (2, 2) goes through (8, 2).
    options = optex.Options(parallelism=8, evaluations_per_point=4)
    options.evaluations_per_point = 2
    options.parallelism = 2
    assert (options.parallelism, options.evaluations_per_point) == (2, 2)


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
    for distances in ("direct", "coefficients"):
        assert optex.Options(proxy_distances=distances).proxy_distances == distances
    for scaling in ("none", "reference_mean_sqrt_norm"):
        assert optex.Options(input_scaling=scaling).input_scaling == scaling
    for warmup in ("zero_gradient", "last_gradient"):
        assert optex.Options(warmup=warmup).warmup == warmup
    for selection in ("fixed", "leave_one_out", "marginal_likelihood"):
        assert optex.Options(lengthscale_selection=selection).lengthscale_selection == selection
    for strategy in ("fixed", "adaptive"):
        assert optex.Options(strategy=strategy).strategy == strategy
    for start in ("last", "best_loss"):
        assert optex.Options(continue_from=start).continue_from == start
    for precision in ("fp32", "bf16", "bf16_gradients"):
        assert optex.Options(device="cuda", history_precision=precision).history_precision == precision


def test_positional_options_are_refused() -> None:
    with pytest.raises(TypeError):
        optex.Options(4)  # type: ignore[misc]


# ---- the base optimizer classes ------------------------------------------------------
#
# optimizers.cpp registers one class per entry of each C++ optimizer's
# python_classes(), so a new optimizer reaches the module without a Python
# edit. The tables below are written out by hand from include/optex/optimizers/:
# a class missing from them, or a default that changed on the C++ side, fails
# test_the_tables_cover_every_class or test_optimizer_defaults_mirror_cpp.

CLASSES = optex.optimizer_classes()

# The C++ defaults, in constructor (hyperparameters) order.
OPTIMIZER_DEFAULTS = {
    "Sgd": dict(lr=1e-2, momentum=0.0, nesterov=False, weight_decay=0.0),
    "Adam": dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0),
    "AdamW": dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=1e-2),
    "RmsProp": dict(lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0, centered=False),
    "Lion": dict(lr=1e-4, beta1=0.9, beta2=0.99, weight_decay=0.0),
}
KINDS = {"Sgd": "sgd", "Adam": "adam", "AdamW": "adam", "RmsProp": "rmsprop", "Lion": "lion"}
# Valid values that differ from the defaults in every field.
OTHER_VALUES = {
    "Sgd": dict(lr=0.3, momentum=0.5, nesterov=True, weight_decay=0.1),
    "Adam": dict(lr=0.2, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.01),
    "AdamW": dict(lr=0.2, beta1=0.5, beta2=0.9, eps=1e-7, weight_decay=0.3),
    "RmsProp": dict(lr=0.05, alpha=0.9, eps=1e-6, weight_decay=0.2, momentum=0.7, centered=True),
    "Lion": dict(lr=0.03, beta1=0.95, beta2=0.98, weight_decay=0.5),
}
# The fields that must lie in [0, 1) (torch.optim's betas); every other float field is
# non-negative with no upper bound, as in torch.optim (test_bounds_are_torch_optims).
UNIT_INTERVAL = {"beta1", "beta2"}


def by_name(fn):
    return pytest.mark.parametrize("cls", CLASSES, ids=[c.__name__ for c in CLASSES])(fn)


def is_flag(cls: type, name: str) -> bool:
    return isinstance(OPTIMIZER_DEFAULTS[cls.__name__][name], bool)


def expected_repr(name: str, fields: dict) -> str:
    return name + "(" + ", ".join(f"{k}={v!r}" for k, v in fields.items()) + ")"


def test_the_tables_cover_every_class() -> None:
    assert isinstance(CLASSES, tuple)
    assert [cls.__name__ for cls in CLASSES] == list(OPTIMIZER_DEFAULTS)  # a fixed order
    assert optex.optimizer_classes() == CLASSES
    for cls in CLASSES:
        assert getattr(optex, cls.__name__) is cls
        assert cls.__name__ in optex.__all__
        assert list(OTHER_VALUES[cls.__name__]) == list(OPTIMIZER_DEFAULTS[cls.__name__])


@by_name
def test_hyperparameters_and_kind(cls) -> None:
    assert cls.hyperparameters == tuple(OPTIMIZER_DEFAULTS[cls.__name__])
    assert all(type(name) is str for name in cls.hyperparameters)
    assert cls.kind == KINDS[cls.__name__]
    for name in cls.hyperparameters:  # documented attributes
        assert isinstance(vars(cls)[name], property), name
        assert vars(cls)[name].__doc__.strip(), name


@by_name
def test_optimizer_defaults_mirror_cpp(cls) -> None:
    value = cls()
    fields = OPTIMIZER_DEFAULTS[cls.__name__]
    for name, expected in fields.items():
        actual = getattr(value, name)
        assert type(actual) is type(expected) and actual == expected, name
    assert repr(value) == expected_repr(cls.__name__, fields)
    other = cls(**OTHER_VALUES[cls.__name__])
    assert repr(other) == expected_repr(cls.__name__, OTHER_VALUES[cls.__name__])


@by_name
def test_repr_evaluates_back(cls) -> None:
    for value in (cls(), cls(**OTHER_VALUES[cls.__name__]),
                  cls(lr=0.1 + 0.2)):  # a float whose shortest repr has 17 digits
        assert eval(repr(value), {cls.__name__: cls}) == value  # noqa: S307


@by_name
def test_positional_keyword_and_attribute_forms_agree(cls) -> None:
    values = OTHER_VALUES[cls.__name__]
    names = list(values)
    by_keyword = cls(**values)
    assert cls(*values.values()) == by_keyword
    half = len(names) // 2
    assert cls(*[values[n] for n in names[:half]], **{n: values[n] for n in names[half:]}) == by_keyword
    by_attribute = cls()
    # Set in an order the cross-field rules accept (nesterov needs momentum first).
    for name in names:
        setattr(by_attribute, name, values[name])
    assert by_attribute == by_keyword
    for name in names:
        assert getattr(by_keyword, name) == values[name]


@by_name
def test_constructor_type_errors(cls) -> None:
    name = cls.__name__
    count = len(cls.hyperparameters)
    first = cls.hyperparameters[0]
    with pytest.raises(TypeError, match=rf"{name}\(\) takes at most {count} positional arguments, "
                                        rf"got {count + 1}"):
        cls(*OTHER_VALUES[name].values(), 0.5)
    with pytest.raises(TypeError, match=rf"{name}\(\) got an unexpected keyword argument 'nope'"):
        cls(nope=1.0)
    with pytest.raises(TypeError, match=rf"{name}\(\) got an unexpected keyword argument 'learning_rate'"):
        cls(learning_rate=0.1)
    with pytest.raises(TypeError, match=rf"{name}\(\) got multiple values for argument '{first}'"):
        cls(0.1, **{first: 0.1})
    for field in cls.hyperparameters:
        wrong = [None, "0.5", [0.5], complex(0.5, 0.0)]
        if is_flag(cls, field):
            wrong += [1, 0, 1.0, "True"]
            expected = "a bool"
        else:
            wrong += [True, False, Decimal("0.5")]
            expected = "a real number"
        for bad in wrong:
            with pytest.raises(TypeError, match=rf"^{field}: expected {expected}, got "
                                                rf"{type(bad).__name__}$"):
                cls(**{field: bad})


@by_name
def test_numpy_bools_are_bools(cls) -> None:
    for field in cls.hyperparameters:
        if not is_flag(cls, field):
            continue
        for flag in (np.bool_(True), np.bool_(False)):
            kwargs = {field: flag}
            if field == "nesterov":
                kwargs["momentum"] = 0.5  # Nesterov needs momentum
            value = cls(**kwargs)
            assert getattr(value, field) is bool(flag)


@by_name
def test_real_numbers_of_any_type_are_floats(cls) -> None:
    for field in cls.hyperparameters:
        if is_flag(cls, field):
            continue
        good = OTHER_VALUES[cls.__name__][field]
        for number in (np.float64(good), np.float32(good), Fraction(good)):
            value = cls(**{field: number})
            assert type(getattr(value, field)) is float
            assert getattr(value, field) == float(number)
    value = cls(lr=1)  # an int
    assert value.lr == 1.0 and type(value.lr) is float
    assert cls(lr=np.int64(1)).lr == 1.0


def bad_values(cls, field: str) -> list:
    """(value, ValueError message) pairs that field refuses on its own."""
    if is_flag(cls, field):
        return []
    out = [(math.nan, "nan"), (math.inf, "inf"), (-math.inf, "-inf"), (-1.0, "-1"),
           (-1e-300, "-1e-300")]
    if field in UNIT_INTERVAL:
        out += [(1.0, "1"), (2.5, "2.5")]
    return out


@by_name
def test_out_of_range_values_name_the_parameter_and_value(cls) -> None:
    for field in cls.hyperparameters:
        for value, text in bad_values(cls, field):
            with pytest.raises(ValueError, match=rf"^{field}: must be .*, got {re.escape(text)}$"):
                cls(**{field: value})
    # 0, the largest float32 and the smallest positive double are in range wherever there
    # is no other upper bound; anything above float32's range is not, since the steps run
    # in float32.
    for field in cls.hyperparameters:
        if is_flag(cls, field) or field in UNIT_INTERVAL:
            continue
        with pytest.raises(ValueError, match=rf"^{field}: must be at most 3.40282e\+38, the "
                           r"largest float32 \(the steps run in float32\), got 1.79769e\+308$"):
            cls(**{field: 1.7976931348623157e308})
        for extreme in (0.0, 3.4028234663852886e38, 5e-324):
            assert getattr(cls(**{field: extreme}), field) == extreme, (field, extreme)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: optex.Sgd(nesterov=True), "^momentum: must be > 0 when nesterov is set, got 0$"),
        (lambda: optex.Sgd(lr=0.0, nesterov=True), "^momentum: must be > 0 when nesterov is set, got 0$"),
        (lambda: optex.RmsProp(alpha=-1.0), r"^alpha: must be finite and >= 0, got -1$"),
        (lambda: optex.RmsProp(momentum=-1.0), r"^momentum: must be finite and >= 0, got -1$"),
        (lambda: optex.RmsProp(eps=-1e-8), "^eps: must be finite and >= 0, got -1e-08$"),
        (lambda: optex.RmsProp(weight_decay=-0.5), "^weight_decay: must be finite and >= 0, got -0.5$"),
    ],
)
def test_cross_field_and_specific_rules(make, message) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_no_bound_ties_weight_decay_to_lr() -> None:
    # torch.optim.AdamW takes lr * weight_decay >= 1 (the decay then flips or zeroes x), as
    # every coupled decay does; Lion follows AdamW.
    assert optex.Adam(lr=1.0, weight_decay=5.0).weight_decay == 5.0
    assert optex.Sgd(lr=1.0, weight_decay=5.0).weight_decay == 5.0
    assert optex.RmsProp(lr=1.0, weight_decay=5.0).weight_decay == 5.0
    assert optex.AdamW(lr=1.0, weight_decay=2.0).weight_decay == 2.0
    assert optex.Lion(lr=0.5, weight_decay=3.0).weight_decay == 3.0
    assert optex.RmsProp(momentum=0.0, centered=True).centered is True


# ----------------------------------------------------------- torch.optim's own bounds

# Each optex class against the torch.optim class whose bounds it takes, and the torch.optim
# keyword arguments that set one of its hyperparameters. Lion is not in torch.optim: it takes
# AdamW's bounds (lr and weight_decay >= 0, betas in [0, 1)).
TORCH_TWIN = {"Sgd": "SGD", "Adam": "Adam", "AdamW": "AdamW", "RmsProp": "RMSprop", "Lion": "AdamW"}


def torch_kwargs(cls, field: str, value) -> dict:
    if field == "beta1":
        return {"betas": (value, 0.99)}
    if field == "beta2":
        return {"betas": (0.9, value)}
    if field == "nesterov":  # torch.optim.SGD: nesterov needs momentum > 0 (and dampening 0)
        return {"nesterov": True, "momentum": value}
    return {field: value}


# Values on and around every bound torch.optim has, and the values it has no bound for.
BOUNDARY_VALUES = (0.0, -0.0, 5e-324, -5e-324, -1e-300, 0.5, 0.999999, 1.0, 1.5, 1e30,
                   3.4028234663852886e38, 1e39, math.inf, -math.inf, math.nan, -1.0)
FLOAT32_MAX = 3.4028234663852886e38


def _boundary_cases():
    for cls in CLASSES:
        for field in cls.hyperparameters:
            if is_flag(cls, field) and field != "nesterov":  # a bool: no bound
                continue
            for value in BOUNDARY_VALUES:
                yield pytest.param(cls, field, value, id=f"{cls.__name__}-{field}-{value!r}")


@pytest.mark.parametrize(("cls", "field", "value"), list(_boundary_cases()))
def test_bounds_are_torch_optims(cls, field, value) -> None:
    """Every value torch.optim accepts for a hyperparameter is accepted, at construction, by
    the setter, by an engine and by OptEx.set_optimizer, except the non-finite ones and those
    beyond float32 (the steps run in float32), which torch.optim takes too; every value
    torch.optim refuses is refused naming the hyperparameter, and a refused setter changes
    nothing. The truth is torch.optim's own constructor."""
    torch = pytest.importorskip("torch")
    twin = getattr(torch.optim, TORCH_TWIN[cls.__name__])
    try:
        twin([torch.zeros(1, requires_grad=True)], **torch_kwargs(cls, field, value))
        torch_accepts = True
    except ValueError:
        torch_accepts = False
    expected = torch_accepts and math.isfinite(value) and abs(value) <= FLOAT32_MAX
    # nesterov's bound is on momentum: torch.optim.SGD refuses nesterov=True without one.
    name = "momentum" if field == "nesterov" else field
    # (momentum first: the setters check nesterov against the momentum already there)
    kwargs = {"momentum": value, "nesterov": True} if field == "nesterov" else {field: value}
    setter = cls()
    kept = copy.copy(setter)
    if not expected:
        with pytest.raises(ValueError, match=f"^{name}: must be "):
            cls(**kwargs)
        if field != "nesterov":
            with pytest.raises(ValueError, match=f"^{name}: must be "):
                setattr(setter, field, value)
            assert setter == kept and repr(setter) == repr(kept)
        return
    made = cls(**kwargs)
    assert getattr(made, name) == value
    for key, v in kwargs.items():
        setattr(setter, key, v)
    assert setter == made
    x0 = np.linspace(-1.0, 1.0, 3)
    if field == "lr":  # a schedule's value: set on a running engine
        engine = optex.OptEx(x0, optimizer=cls(), parallelism=2)
        engine.set_optimizer(made)
    else:  # the value at construction, then a schedule down to lr 0 with it
        engine = optex.OptEx(x0, optimizer=made, parallelism=2)
        made.lr = 0.0
        engine.set_optimizer(made)
    assert engine.optimizer == made


@pytest.mark.parametrize(
    ("value", "field", "bad", "message"),
    [
        (optex.Sgd(momentum=0.5, nesterov=True), "momentum", 0.0, "momentum: must be > 0 when nesterov"),
        (optex.Sgd(lr=0.0, momentum=0.5, nesterov=True), "momentum", 0.0,
         "momentum: must be > 0 when nesterov"),
    ],
)
def test_a_setter_refused_by_another_field_keeps_the_old_value(value, field, bad, message) -> None:
    kept = copy.copy(value)
    with pytest.raises(ValueError, match=message):
        setattr(value, field, bad)
    assert value == kept and repr(value) == repr(kept)


@by_name
def test_optimizer_pickle_and_copy(cls) -> None:
    for value in (cls(), cls(**OTHER_VALUES[cls.__name__])):
        clones = [pickle.loads(pickle.dumps(value, protocol))
                  for protocol in range(pickle.HIGHEST_PROTOCOL + 1)]  # 0 and 1 too
        clones += [copy.copy(value), copy.deepcopy(value), copy.deepcopy([value])[0]]
        for clone in clones:
            assert type(clone) is cls
            assert clone == value and repr(clone) == repr(value)
            assert clone is not value
        clone = copy.copy(value)
        clone.lr = value.lr / 2  # independent copies
        assert clone != value


@by_name
def test_hostile_pickle_states_are_refused(cls) -> None:
    def restore(state):
        value = cls.__new__(cls)
        value.__setstate__(state)
        return value

    good = tuple(OTHER_VALUES[cls.__name__].values())
    assert restore(good) == cls(*good)
    count = len(good)
    with pytest.raises(ValueError, match=rf"pickle: the state of a {cls.__name__} has {count - 1} "
                                         rf"values, expected {count}"):
        restore(good[:-1])
    with pytest.raises(ValueError, match=f"has {count + 1} values"):
        restore((*good, 0.5))
    with pytest.raises(ValueError, match="lr: must be finite and >= 0, got nan"):
        restore((math.nan, *good[1:]))
    with pytest.raises(TypeError, match="lr: expected a real number, got str"):
        restore(("0.1", *good[1:]))
    with pytest.raises(TypeError):
        restore([*good])  # the state is a tuple


@by_name
def test_optimizer_equality(cls) -> None:
    values = OTHER_VALUES[cls.__name__]
    value = cls(**values)
    assert value == cls(**values)
    assert not (value != cls(**values))
    for field in cls.hyperparameters:  # one field changed is another value
        if field == "momentum" and values.get("nesterov"):
            continue  # nesterov needs momentum: that change is refused
        other = cls(**values)
        setattr(other, field, OPTIMIZER_DEFAULTS[cls.__name__][field])
        assert other != value, field
    for other_cls in CLASSES:
        if other_cls is not cls:
            assert value != other_cls() and cls() != other_cls()
    assert value != None  # noqa: E711
    assert value != "Sgd()" and value != values and value != tuple(values.values())
    assert cls.__hash__ is None
    with pytest.raises(TypeError, match="unhashable"):
        hash(value)


def test_adam_and_adamw_are_one_kind_but_different_classes() -> None:
    # The same fields, only the hidden decoupled flag differs: never equal.
    assert optex.Adam(weight_decay=1e-2) != optex.AdamW()
    assert optex.AdamW(weight_decay=0.0) != optex.Adam()
    assert optex.Adam.kind == optex.AdamW.kind == "adam"
    assert optex.Adam.hyperparameters == optex.AdamW.hyperparameters


# ---- optex.OptimizerState ------------------------------------------------------------


def test_optimizer_state_is_a_copyable_value() -> None:
    opt = optex.Adam(lr=0.1)
    state = optex.init_state(opt, 3)
    assert state.step == 0
    x = np.ones(3, np.float32)
    optex.apply_step(opt, x, state, np.array([1.0, -2.0, 3.0]))
    for clone in (copy.copy(state), copy.deepcopy(state), copy.deepcopy([state])[0]):
        assert type(clone) is optex.OptimizerState
        assert clone == state and clone is not state
        assert clone.step == 1
        optex.apply_step(opt, x.copy(), clone, np.ones(3))  # independent of the original
        assert clone.step == 2 and state.step == 1
        assert clone != state
    assert state == state
    assert state != optex.init_state(opt, 3)
    assert state != "state" and state != None  # noqa: E711
    assert optex.OptimizerState.__hash__ is None
    assert repr(state) == "OptimizerState(step=1, slots 2)"


def test_optimizer_state_is_read_only() -> None:
    state = optex.init_state(optex.Sgd(momentum=0.9), 2)
    with pytest.raises(AttributeError):
        state.step = 3
    with pytest.raises(AttributeError):
        state.slots = (None, None, None)
    slots = state.slots
    assert isinstance(slots, tuple)
    slots[0][:] = 7.0  # a copy: the state keeps its zeros
    assert np.array_equal(state.slots[0], np.zeros(2, np.float32))
    assert state.slots[0] is not state.slots[0]
    with pytest.raises(TypeError, match="No constructor defined"):
        optex.OptimizerState()


# ---- every class ---------------------------------------------------------------------


def test_options_pickle_and_copy() -> None:
    value = optex.Options(parallelism=6, kernel="matern32", lengthscale_grid=(1.0, 3.0), seed=9,
                          evaluations_per_point=3, strategy="adaptive", continue_from="best_loss",
                          max_posterior_variance=0.25, trust_region=2.0, max_lengthscale_change=4.0,
                          device="cuda:2", history_precision="bf16_gradients")
    clones = [pickle.loads(pickle.dumps(value, protocol))
              for protocol in range(pickle.HIGHEST_PROTOCOL + 1)]
    for clone in (*clones, copy.copy(value), copy.deepcopy(value)):
        assert type(clone) is type(value)
        assert clone == value and repr(clone) == repr(value)
        assert clone is not value
        assert (clone.evaluations_per_point, clone.strategy, clone.continue_from) == (
            3, "adaptive", "best_loss")
        assert (clone.max_posterior_variance, clone.trust_region,
                clone.max_lengthscale_change) == (0.25, 2.0, 4.0)


def test_options_differ_in_each_new_field() -> None:
    changes = dict(evaluations_per_point=2, strategy="adaptive", continue_from="last",
                   max_posterior_variance=1.0, trust_region=1.0, max_lengthscale_change=2.0)
    for name, value in changes.items():
        assert optex.Options(**{name: value}) != optex.Options(), name


def test_classes_live_in_optex() -> None:
    for cls in (*CLASSES, optex.Options, optex.OptEx, optex.IterationInfo, optex.OptimizerState,
                optex.DeviceArray):
        assert cls.__module__ == "optex", cls
        assert repr(cls) == f"<class 'optex.{cls.__name__}'>"
