"""optex.Options under random field values: every value is either accepted, and
then an OptEx built from it runs a round, or refused with ValueError or TypeError
naming the field, and a refused assignment leaves the object as it was.

The values mix valid ones with NaN, infinities, negatives, zero, huge numbers and
wrong types. Valid parallelism and history values stay small: a valid but huge N
or T0 is a real allocation (test_allocation.py covers the sizes that cannot be had).
"""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import optex
from optex import problems

WRONG_TYPES = st.sampled_from([None, "1", b"1", [1], {"a": 1}, object()])
HUGE_INTS = st.sampled_from([-(2**63), -(2**31) - 1, 2**31, 2**40, 2**64, 2**70])
FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 5e-324, 1e-300, 1e300, math.nan, math.inf, -math.inf]),
    st.integers(-5, 5),
    st.builds(np.float32, st.floats(width=32)),
    WRONG_TYPES,
)


def small_ints(low: int, high: int) -> st.SearchStrategy:
    return st.one_of(
        st.integers(low, high),
        st.integers(-3, 0),
        HUGE_INTS,
        st.builds(np.int64, st.integers(low, high)),
        st.sampled_from([True, 2.0, 1.5, math.nan]),
        WRONG_TYPES,
    )


def names(*valid: str) -> st.SearchStrategy:
    return st.one_of(
        st.sampled_from(valid),
        st.sampled_from(["", "none ", "MATERN52", "x", "cuda:", "loo"]),
        st.integers(-1, 3),
        WRONG_TYPES,
    )


FIELDS: dict[str, st.SearchStrategy] = {
    "parallelism": small_ints(1, 4),
    "history": small_ints(1, 16),
    "kernel": names("matern12", "matern32", "matern52", "rbf"),
    "lengthscale": FLOATS,
    "noise": FLOATS,
    "input_scaling": names("none", "reference_mean_sqrt_norm"),
    "warmup": names("zero_gradient", "last_gradient"),
    "lengthscale_selection": names("fixed", "leave_one_out", "marginal_likelihood"),
    "selection_interval": small_ints(1, 2**31 - 1),
    "lengthscale_grid": st.one_of(st.lists(FLOATS, max_size=3), st.tuples(FLOATS), FLOATS,
                                  st.just("0.5,1")),
    "proxy": names("gp", "target", "last_gradient"),
    "proxy_distances": names("direct", "coefficients"),
    "seed": st.one_of(st.integers(0, 2**64 - 1), st.integers(-(2**70), -1),
                      st.integers(2**64, 2**70), st.sampled_from([True, 1.0]), WRONG_TYPES),
    "evaluations_per_point": small_ints(1, 4),
    "strategy": names("fixed", "adaptive"),
    "continue_from": names("last", "best_loss"),
    "max_posterior_variance": FLOATS,
    "trust_region": FLOATS,
    "max_lengthscale_change": st.one_of(FLOATS, st.sampled_from([1.0, 1.0 - 1e-16, 0.999, 1.5])),
    "mode": names("approximate", "verified"),
    "tolerance": st.one_of(FLOATS, st.sampled_from([0.0, 1e-6, 1e-2])),
    "device": names("cpu", "cuda", "cuda:0", "cuda:1", "cuda:-1", "gpu"),
    "threads": small_ints(0, 1024),
    "history_precision": names("fp32", "bf16", "bf16_gradients", "fp16"),
}

assert set(FIELDS) == set(optex.Options().__getstate__()), "a new Options field needs a strategy"

# Fields validated together: an assignment to one may be refused naming the other
# (parallelism=3 where evaluations_per_point is 2).
# A refused assignment names the field assigned or one it depends on: the verified
# mode refuses the fields it cannot run with, by their names.
VERIFIED_REFUSES = ("evaluations_per_point", "strategy", "proxy", "max_posterior_variance",
                    "trust_region", "history")
DEPENDENT = {"parallelism": ("evaluations_per_point", "history"),
             "evaluations_per_point": ("parallelism",), "mode": VERIFIED_REFUSES}


def names_a_field(error: Exception, fields) -> bool:
    return any(str(error).startswith(f"{name}:") for name in fields)


def one_round(options: optex.Options) -> None:
    """An OptEx from these options asks and tells once, or refuses a device this machine
    lacks: every feature is available on every device."""
    f = problems.Sphere()
    try:
        opt = optex.OptEx(f.standard_start(3), optimizer=optex.Adam(lr=0.01), options=options)
    except ValueError as e:
        # Options accept any CUDA index; the engine refuses a device this machine lacks,
        # and nothing else.
        assert options.device != "cpu", e
        assert str(e).startswith("device:"), e
        return
    if options.proxy == "target":
        opt.set_gradient_oracle(f.value_and_grad)
    losses, grads = f.value_and_grad(opt.ask())
    info = opt.tell(grads, losses)
    assert info.iteration == 1 and np.all(np.isfinite(opt.x))
    assert sum(info.point_evaluations) == options.parallelism


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(FIELDS)), st.none(), max_size=5).flatmap(
    lambda chosen: st.fixed_dictionaries({name: FIELDS[name] for name in chosen})))
def test_options_from_random_keywords_are_valid_or_refused_by_name(kwargs: dict) -> None:
    try:
        options = optex.Options(**kwargs)
    except (ValueError, TypeError) as e:
        assert names_a_field(e, kwargs), (kwargs, e)
        return
    # Accepted: validate() agreed, the object round-trips, and an engine runs on it.
    assert pickle.loads(pickle.dumps(options)) == options
    one_round(options)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(FIELDS)).flatmap(lambda name: st.tuples(st.just(name), FIELDS[name])),
       st.sampled_from([optex.Options(), optex.Options.reference(2),
                        optex.Options(parallelism=1, proxy="target", lengthscale_grid=[0.5, 2.0]),
                       optex.Options.adaptive(4),
                       optex.Options(parallelism=4, evaluations_per_point=2, trust_region=1.5,
                                     max_posterior_variance=0.5)]))
def test_a_refused_assignment_changes_nothing(assignment: tuple, start: optex.Options) -> None:
    name, value = assignment
    options = pickle.loads(pickle.dumps(start))  # a fresh copy per example
    before = repr(options)
    try:
        setattr(options, name, value)
    except (ValueError, TypeError) as e:
        assert names_a_field(e, (name, *DEPENDENT.get(name, ()))), (name, value, e)
        assert repr(options) == before
        assert options == start
        return
    one_round(options)


@pytest.mark.parametrize("name", sorted(FIELDS))
def test_deleting_a_field_is_refused(name: str) -> None:
    options = optex.Options()
    with pytest.raises(AttributeError):
        delattr(options, name)
    assert options == optex.Options()
