"""OptEx.state_arrays() and OptEx.from_state_arrays(): the whole engine state as a dict.

An engine built from its own state continues bit for bit (Adam, SGD with momentum,
several evaluations per point, the adaptive strategy, ranges with step offsets);
without the history it resumes exactly as a run whose history is empty. Reading a
state back is strict: every missing, unknown, mistyped, misshapen or out-of-range
entry is a ValueError naming its key, and nothing is built.
"""

from __future__ import annotations

import copy
import math
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import optex

D = 5


def objective(points: np.ndarray, seeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A coupled, slightly noisy objective: rows' noise keyed to their seeds."""
    scale = np.arange(1, points.shape[1] + 1, dtype=np.float64)
    x = points.astype(np.float64)
    losses = np.sum(scale * x * x + 0.05 * x**4, axis=1) + 0.3 * np.sum(x[:, :-1] * x[:, 1:], axis=1)
    grads = 2 * scale * x + 0.2 * x**3
    grads[:, :-1] += 0.3 * x[:, 1:]
    grads[:, 1:] += 0.3 * x[:, :-1]
    noise = np.stack([np.random.default_rng(int(s)).normal(size=points.shape[1]) for s in seeds])
    return losses, (grads + 0.01 * noise).astype(np.float32)


def run(opt: optex.OptEx, rounds: int) -> None:
    for _ in range(rounds):
        points = opt.ask()
        losses, grads = objective(points, opt.seeds)
        opt.tell(grads, losses)


def same(a, b) -> bool:
    """Equal values, bit for bit (NaN equals NaN), arrays of the same dtype and shape."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                and a.shape == b.shape and a.tobytes() == b.tobytes())
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return np.float64(a).tobytes() == np.float64(b).tobytes()
    return type(a) is type(b) and a == b


def start(d: int = D) -> np.ndarray:
    return np.linspace(-1.2, 0.9, d).astype(np.float32)


def adaptive() -> optex.Options:
    o = optex.Options.adaptive(4)
    o.history = 8
    o.seed = 3
    return o


CONFIGS = {
    "adam": lambda: optex.OptEx(start(), optimizer=optex.Adam(lr=0.05), parallelism=4, history=8, seed=1),
    "sgd_momentum": lambda: optex.OptEx(start(6), optimizer=optex.Sgd(lr=0.02, momentum=0.9, nesterov=True),
                                        parallelism=3, history=5, seed=2),
    "two_evaluations_per_point": lambda: optex.OptEx(start(), optimizer=optex.Sgd(lr=0.05, momentum=0.5),
                                                     parallelism=4, history=6, evaluations_per_point=2),
    "adaptive": lambda: optex.OptEx(start(6), optimizer=optex.AdamW(lr=0.05), options=adaptive()),
    "ranges": lambda: optex.OptEx(start(8), optimizer=[(2, optex.Adam(lr=0.05)), (3, optex.AdamW(lr=0.02)),
                                                       (3, optex.Adam(lr=0.1))], parallelism=4, history=6),
    # torch.optim's boundary values: lr 0 (the history then holds pairs at one point), betas
    # and weight decay 0, momentum 1.
    "lr_zero": lambda: optex.OptEx(start(), optimizer=[(2, optex.Adam(lr=0.0, beta1=0.0, beta2=0.0)),
                                                       (3, optex.Adam(lr=0.0, eps=0.0))],
                                   parallelism=3, history=5, seed=4),
    "sgd_lr_zero_momentum_one": lambda: optex.OptEx(start(), optimizer=optex.Sgd(lr=0.0, momentum=1.0),
                                                    parallelism=2, history=4, seed=5),
}


@pytest.mark.parametrize("name", CONFIGS)
def test_an_engine_built_from_its_state_continues_bit_for_bit(name, tmp_path) -> None:
    opt = CONFIGS[name]()
    run(opt, 4)
    if name == "ranges":  # ranges that joined at different steps
        step = opt.state_arrays()["step"]
        opt.set_optimizer([(size, optimizer, offset) for (size, optimizer), offset
                           in zip(opt.optimizer, (0, 2, step))])
        run(opt, 1)
    state = opt.state_arrays()
    resumed = optex.OptEx.from_state_arrays(state)
    assert same(resumed.state_arrays(), state)
    assert resumed.optimizer == opt.optimizer
    # The checkpoint file is the same state.
    opt.save(tmp_path / "run.ckpt")
    assert same(optex.OptEx.load(tmp_path / "run.ckpt").state_arrays(), state)
    for _ in range(5):
        points = opt.ask()
        np.testing.assert_array_equal(resumed.ask(), points)
        np.testing.assert_array_equal(resumed.seeds, opt.seeds)
        losses, grads = objective(points, opt.seeds)
        opt.tell(grads, losses)
        resumed.tell(grads, losses)
        assert same(resumed.state_arrays(), opt.state_arrays())


def test_without_the_history_the_run_warms_up_again() -> None:
    opt = optex.OptEx(start(), optimizer=optex.Adam(lr=0.05), parallelism=3, history=6, seed=9,
                      continue_from="last")
    run(opt, 4)
    full, bare = opt.state_arrays(), opt.state_arrays(history=False)
    assert "history" not in bare
    assert same(bare, {k: v for k, v in full.items() if k != "history"})
    resumed = optex.OptEx.from_state_arrays(bare)
    state = resumed.state_arrays()
    assert same({k: v for k, v in state.items() if k != "history"}, bare)
    assert same(state["history"], {
        "size": 0, "next": 0, "points": np.zeros((0, D), np.float32), "gradients": np.zeros((0, D), np.float32),
        "squared_distances": np.zeros((6, 6)), "squared_norms": np.zeros(6),
        "gradient_inner_products": np.zeros((6, 6))})
    # The warm-up: every point at the iterate, with the seeds the original draws next.
    points = resumed.ask()
    np.testing.assert_array_equal(points, np.repeat(opt.x[None, :], 3, axis=0))
    opt.ask()
    np.testing.assert_array_equal(resumed.seeds, opt.seeds)
    # Its commit is one base-optimizer step from the iterate with the last point's
    # gradient: what an N = 1 engine from the same state does.
    losses, grads = objective(points, resumed.seeds)
    base = optex.OptEx.from_state_arrays({**bare, "options": {**bare["options"], "parallelism": 1}})
    base.ask()
    base.tell(grads[-1:], losses[-1:])
    resumed.tell(grads, losses)
    np.testing.assert_array_equal(resumed.x, base.x)
    after, expected = resumed.state_arrays(), base.state_arrays()
    assert same(after["slots"], expected["slots"]) and after["step"] == expected["step"]
    assert after["history"]["size"] == 3


def test_the_arrays_are_new_copies_of_the_documented_types() -> None:
    opt = CONFIGS["adam"]()
    run(opt, 3)
    a, b = opt.state_arrays(), opt.state_arrays()
    assert optex.Options(**a["options"]) == opt.options
    assert a["x"].dtype == np.float32 and a["x"].shape == (D,)
    assert {k: v.dtype for k, v in a["slots"].items()} == {"exp_avg": np.float32, "exp_avg_sq": np.float32}
    assert a["history"]["points"].shape == (8, D) and a["history"]["squared_norms"].dtype == np.float64
    for key in ("x",):
        assert not np.shares_memory(a[key], b[key])
    x = opt.x
    a["x"][:] = 7.0
    a["slots"]["exp_avg"][:] = 7.0
    a["history"]["points"][:] = 7.0
    np.testing.assert_array_equal(opt.x, x)
    assert same(opt.state_arrays(), b)
    # Any strides are read (a copy is made): reversed, Fortran-ordered and strided views.
    state = opt.state_arrays()
    strided = copy.deepcopy(state)
    strided["x"] = np.ascontiguousarray(state["x"][::-1])[::-1]
    strided["history"]["points"] = np.asfortranarray(state["history"]["points"])
    doubled = np.zeros((D, 2), np.float32)
    doubled[:, 0] = state["slots"]["exp_avg"]
    strided["slots"]["exp_avg"] = doubled[:, 0]
    assert not strided["slots"]["exp_avg"].flags.c_contiguous
    assert same(optex.OptEx.from_state_arrays(strided).state_arrays(), state)


# ---- strict reading: every refusal names its key --------------------------------------


def good() -> dict:
    """Two Adam ranges, d = 5, N = 3, a full ring of 4 (next slot 1)."""
    opt = optex.OptEx(start(), optimizer=[(2, optex.Adam(lr=0.05)), (3, optex.Adam(lr=0.02))], parallelism=3,
                      history=4, seed=5)
    run(opt, 3)
    state = opt.state_arrays()
    assert state["history"]["size"] == 4 and state["history"]["next"] == 1
    return state


def sgd_state() -> dict:
    opt = optex.OptEx(start(), optimizer=optex.Sgd(lr=0.05), parallelism=2, history=4)
    run(opt, 2)
    return opt.state_arrays()


def edit(path: str, value) -> callable:
    """Sets the entry at `path` ("history.points", "optimizer.1.lr") to `value(old)`."""
    def apply(state: dict) -> None:
        *parents, last = path.split(".")
        node = state
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        last = int(last) if isinstance(node, list) else last
        node[last] = value(node[last]) if callable(value) else value
    return apply


def delete(path: str) -> callable:
    def apply(state: dict) -> None:
        *parents, last = path.split(".")
        node = state
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        del node[last]
    return apply


def element(key_path: str, index, value) -> callable:
    def change(a: np.ndarray) -> np.ndarray:
        a = a.copy()
        a[index] = value
        return a
    return edit(key_path, change)


TOP = ["format", "options", "optimizer", "x", "step", "slots", "lengthscale", "rng", "iteration", "evaluations",
       "round"]
HISTORY = ["size", "next", "points", "gradients", "squared_distances", "squared_norms", "gradient_inner_products"]
ROUND = ["evaluations_per_point", "gradient_noise", "rounds_since_measured", "last_step_norm"]

HOSTILE = [
    # Missing keys, at every level.
    *[(f"missing_{k}", delete(k), rf"^{k}: missing$") for k in TOP],
    *[(f"missing_history_{k}", delete(f"history.{k}"), rf"^history\['{k}'\]: missing$") for k in HISTORY],
    *[(f"missing_round_{k}", delete(f"round.{k}"), rf"^round\['{k}'\]: missing$") for k in ROUND],
    ("missing_option", delete("options.seed"), r"^options\['seed'\]: missing$"),
    ("missing_kind", delete("optimizer.0.kind"), r"^optimizer\[0\]\['kind'\]: missing$"),
    ("missing_size", delete("optimizer.1.size"), r"^optimizer\[1\]\['size'\]: missing$"),
    ("missing_offset", delete("optimizer.1.step_offset"), r"^optimizer\[1\]\['step_offset'\]: missing$"),
    ("missing_hyperparameter", delete("optimizer.1.beta2"), r"^optimizer\[1\]\['beta2'\]: missing$"),
    ("missing_slot", delete("slots.exp_avg_sq"),
     r"^slots\['exp_avg_sq'\]: optimizer state slot 1 \(exp_avg_sq\) holds 0 values, expected 5"),
    # Unknown keys, at every level.
    ("unknown_key", edit("extra", 1), r"^state: unknown key 'extra'$"),
    ("unknown_history_key", edit("history.extra", 1), r"^history: unknown key 'extra'$"),
    ("unknown_round_key", edit("round.extra", 1), r"^round: unknown key 'extra'$"),
    ("unknown_option", edit("options.extra", 1), r"^options: unknown key 'extra'"),
    ("unknown_range_key", edit("optimizer.0.momentum", 0.9), r"^optimizer\[0\]: unknown key 'momentum'$"),
    ("unknown_slot", edit("slots.momentum_buffer", np.zeros(D, np.float32)),
     r"^slots\['momentum_buffer'\]: not a state slot of adam \(its slots: 'exp_avg', 'exp_avg_sq'\)$"),
    # Wrong types.
    ("format_str", edit("format", "1"), r"^format: expected an int, got str$"),
    ("format_other", edit("format", 2), r"^format: 2 is not a layout this build reads"),
    ("step_bool", edit("step", True), r"^step: expected an int, got bool$"),
    ("step_float", edit("step", 3.0), r"^step: expected an int, got float$"),
    ("iteration_none", edit("iteration", None), r"^iteration: expected an int, got NoneType$"),
    ("lengthscale_str", edit("lengthscale", "0.1"), r"^lengthscale: expected a float, got str$"),
    ("lengthscale_bool", edit("lengthscale", False), r"^lengthscale: expected a float, got bool$"),
    ("noise_none", edit("round.gradient_noise", None), r"^round\['gradient_noise'\]: expected a float"),
    ("option_type", edit("options.parallelism", "3"), r"^options\['parallelism'\]: parallelism: expected an int"),
    ("option_name", edit("options.kernel", "gauss"), r"^options\['kernel'\]: kernel: unknown value 'gauss'"),
    ("options_list", edit("options", []), r"^options: expected a dict"),
    ("options_invalid", edit("options.evaluations_per_point", 2), r"^options: evaluations_per_point"),
    ("optimizer_str", edit("optimizer", "adam"), r"^optimizer: expected a list of range dicts, got str$"),
    ("optimizer_empty", edit("optimizer", []), r"^optimizer: optimizer ranges: need at least one range"),
    ("range_not_dict", edit("optimizer.0", (2, optex.Adam())), r"^optimizer\[0\]: expected a dict, got tuple$"),
    ("kind_unknown", edit("optimizer.0.kind", "Adagrad"), r"^optimizer\[0\]\['kind'\]: expected the name of an "
                                                          r"optimizer class \(Sgd, Adam, AdamW, RmsProp, Lion\)"),
    ("kind_other_fields", edit("optimizer.0.kind", "Sgd"), r"^optimizer\[0\]: unknown key '(beta1|beta2|eps)'$"),
    ("hyperparameter_type", edit("optimizer.1.lr", "0.1"), r"^optimizer\[1\]: lr: expected a real number"),
    ("hyperparameter_value", edit("optimizer.1.lr", -1.0), r"^optimizer\[1\]: lr: must be finite and >= 0"),
    ("size_bool", edit("optimizer.0.size", True), r"^optimizer\[0\]\['size'\]: expected an int, got bool$"),
    ("size_zero", edit("optimizer.0.size", 0), r"^optimizer\[0\]\['size'\]: 0 is outside \[1, "),
    ("offset_negative", edit("optimizer.1.step_offset", -1), r"^optimizer\[1\]\['step_offset'\]: -1 is outside"),
    ("x_list", edit("x", lambda x: x.tolist()), r"^x: expected a numpy array of dtype float32 and shape \(n,\), "
                                                r"got list$"),
    ("x_float64", edit("x", lambda x: x.astype(np.float64)), r"^x: expected .* got dtype float64 and shape \(5,\)$"),
    ("x_big_endian", edit("x", lambda x: x.astype(">f4")), r"^x: expected a numpy array of dtype float32"),
    ("x_int", edit("x", lambda x: x.astype(np.int32)), r"^x: expected .* got dtype int32"),
    ("x_2d", edit("x", lambda x: x[None, :]), r"^x: expected .* got dtype float32 and shape \(1, 5\)$"),
    ("x_scalar", edit("x", lambda x: x[0]), r"^x: expected a numpy array"),
    ("slot_float64", edit("slots.exp_avg", lambda a: a.astype(np.float64)), r"^slots\['exp_avg'\]: expected"),
    ("slots_list", edit("slots", []), r"^slots: expected a dict"),
    ("points_1d", edit("history.points", lambda a: a.ravel()),
     r"^history\['points'\]: expected a numpy array of dtype float32 and shape \(n, 5\), got dtype float32 and "
     r"shape \(20,\)$"),
    ("points_columns", edit("history.points", lambda a: a[:, :4]), r"^history\['points'\]: expected .* \(n, 5\)"),
    ("gradients_float64", edit("history.gradients", lambda a: a.astype(np.float64)),
     r"^history\['gradients'\]: expected"),
    ("distances_float32", edit("history.squared_distances", lambda a: a.astype(np.float32)),
     r"^history\['squared_distances'\]: expected a numpy array of dtype float64 and shape \(4, 4\)"),
    ("distances_shape", edit("history.squared_distances", lambda a: a[:3, :3]),
     r"^history\['squared_distances'\]: expected .* \(4, 4\), got dtype float64 and shape \(3, 3\)$"),
    ("norms_shape", edit("history.squared_norms", lambda a: a[:, None]), r"^history\['squared_norms'\]: expected"),
    ("gram_list", edit("history.gradient_inner_products", lambda a: a.tolist()),
     r"^history\['gradient_inner_products'\]: expected"),
    # Non-finite and huge values, in every array (float32 arrays: beyond the magnitude bound).
    ("x_nan", element("x", 2, np.nan), r"^x: iterate element 2 is nan"),
    ("x_inf", element("x", 0, -np.inf), r"^x: iterate element 0 is -inf"),
    ("x_huge", element("x", 4, 1e30), r"^x: iterate element 4 is 1e\+30 \(must be finite and at most"),
    ("exp_avg_inf", element("slots.exp_avg", 1, np.inf),
     r"^slots\['exp_avg'\]: optimizer state exp_avg \(slot 0\), element 1 is inf"),
    ("exp_avg_sq_negative", element("slots.exp_avg_sq", 3, -1.0),
     r"^slots\['exp_avg_sq'\]: optimizer state exp_avg_sq \(slot 1\), element 3 is -1 \(must be finite and >= 0"),
    ("points_nan", element("history.points", (1, 2), np.nan),
     r"^history\['points'\]: history point 1, element 2 is nan"),
    ("gradients_huge", element("history.gradients", (0, 0), 1e20),
     r"^history\['gradients'\]: history gradient 0, element 0 is 1e\+20"),
    ("distances_negative", element("history.squared_distances", (1, 2), -1.0),
     r"^history\['squared_distances'\]: history squared distance \(1, 2\) is -1"),
    ("norms_nan", element("history.squared_norms", 3, np.nan), r"^history\['squared_norms'\]: history squared norm "
                                                              r"3 is nan"),
    ("gram_inf", element("history.gradient_inner_products", (2, 3), np.inf),
     r"^history\['gradient_inner_products'\]: history gradient inner product \(2, 3\) is inf"),
    *[(f"lengthscale_{v}", edit("lengthscale", v), r"^lengthscale: lengthscale is") for v in (0.0, -1.0, math.nan,
                                                                                               math.inf)],
    ("last_step_norm_negative", edit("round.last_step_norm", -1.0), r"^round\['last_step_norm'\]: last step length"),
    ("last_step_norm_inf", edit("round.last_step_norm", math.inf), r"^round\['last_step_norm'\]: last step length"),
    ("noise_negative", edit("round.gradient_noise", -1.0), r"^round: adaptive split: gradient noise"),
    ("split_not_a_divisor", edit("round.evaluations_per_point", 2), r"^round: adaptive split: evaluations per point 2 "
                                                                    r"does not divide parallelism 3$"),
    ("split_huge", edit("round.evaluations_per_point", 2**31), r"^round\['evaluations_per_point'\]: 2147483648 is "
                                                               r"outside"),
    # Counters out of range.
    ("step_negative", edit("step", -1), r"^step: optimizer state step is -1 \(must be >= 0\)$"),
    ("iteration_negative", edit("iteration", -1), r"^iteration: iteration is -1 \(must be >= 0\)$"),
    ("evaluations_negative", edit("evaluations", -3), r"^evaluations: evaluations is -3"),
    ("iteration_huge", edit("iteration", 2**63), r"^iteration: 9223372036854775808 is outside"),
    ("rng_negative", edit("rng", -1), r"^rng: -1 is outside \[0, 18446744073709551615\]$"),
    ("rng_huge", edit("rng", 2**64), r"^rng: 18446744073709551616 is outside"),
    ("rounds_negative", edit("round.rounds_since_measured", -1), r"^round: adaptive split: rounds since"),
    ("size_negative", edit("history.size", -1), r"^history\['size'\]: -1 is outside"),
    # The ring: its position, and a declared size the arrays or the capacity do not have.
    ("next_at_capacity", edit("history.next", 4), r"^history\['next'\]: history next slot 4 is inconsistent"),
    ("next_beyond", edit("history.next", 2**40), r"^history\['next'\]: history next slot"),
    ("size_beyond_capacity", edit("history.size", 5), r"^history\['size'\]: history size is 5, more than the "
                                                      r"capacity 4"),
    ("size_huge", edit("history.size", 2**40), r"^history\['size'\]: history size is 1099511627776"),
    ("points_fewer_than_size", edit("history.points", lambda a: a[:3]),
     r"^history\['points'\]: history points holds 15 values, expected 20"),
    ("slot_short", edit("slots.exp_avg", lambda a: a[:4]), r"^slots\['exp_avg'\]: .* holds 4 values, expected 5"),
    # Ranges: sizes that do not add up (a huge one included), kinds that differ, an offset
    # beyond the state's step.
    ("sizes_short", edit("optimizer.1.size", 2), r"^optimizer: optimizer ranges: the sizes add up to 4, but the "
                                                 r"dimension is 5$"),
    ("size_huge_range", edit("optimizer.1.size", 2**62), r"^optimizer: optimizer ranges: the sizes add up to"),
    ("size_beyond_any", edit("optimizer.1.size", 2**64), r"^optimizer\[1\]\['size'\]: 18446744073709551616 is "
                                                         r"outside"),
    ("mixed_kinds", edit("optimizer.1", {"size": 3, "kind": "Sgd", "step_offset": 0, "lr": 0.1, "momentum": 0.0,
                                          "nesterov": False, "weight_decay": 0.0}),
     r"^optimizer: optimizer ranges: range 1 is sgd but range 0 is adam"),
    # Finite values that no step can leave (each tell() would refuse its commit).
    ("first_moment_no_step_can_leave", element("slots.exp_avg", 2, 3e38),
     r"^slots\['exp_avg'\]: optimizer state exp_avg \(slot 0\), element 2: cannot take a step"),
    ("first_moment_far_too_large", element("slots.exp_avg", 4, -1e30),
     r"^slots\['exp_avg'\]: optimizer state exp_avg \(slot 0\), element 4: cannot take a step"),
    ("offset_beyond_step", edit("optimizer.1.step_offset", lambda _: 10**6),
     r"^optimizer\[1\]\['step_offset'\]: optimizer range 1 step_offset is 1000000, beyond the optimizer state's "
     r"step"),
]


@pytest.mark.parametrize(("name", "mutate", "message"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_every_hostile_state_is_refused_naming_its_key(name, mutate, message) -> None:
    state = good()
    mutate(state)
    given = copy.deepcopy(state)
    with pytest.raises(ValueError, match=message):
        optex.OptEx.from_state_arrays(state)
    assert same(state, given), "the refused state was changed"


def test_a_huge_state_whose_step_is_ordinary_loads_and_steps() -> None:
    state = good()
    state["slots"]["exp_avg_sq"][3] = 3e38
    opt = optex.OptEx.from_state_arrays(state)
    run(opt, 2)
    assert opt.iteration == state["iteration"] + 2


def test_slots_the_optimizer_does_not_keep_are_refused() -> None:
    state = sgd_state()
    assert state["slots"] == {}
    state["slots"]["momentum_buffer"] = np.zeros(D, np.float32)
    with pytest.raises(ValueError, match=r"^slots\['momentum_buffer'\]: optimizer state slot 0 \(momentum_buffer\) "
                                         r"holds 5 values, expected 0 \(the optimizer does not keep it\)$"):
        optex.OptEx.from_state_arrays(state)
    for not_a_state in ([], None, "state", good()["x"]):
        with pytest.raises(ValueError, match=r"^state: expected a dict"):
            optex.OptEx.from_state_arrays(not_a_state)
    with pytest.raises(ValueError, match=r"^state: unknown key 1$"):
        optex.OptEx.from_state_arrays({**good(), 1: 2})


def test_the_device_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match=r"^device: cuda:7 is not available"):
        optex.OptEx.from_state_arrays(good(), device="cuda:7")
    with pytest.raises(ValueError, match=r"^device: unknown"):
        optex.OptEx.from_state_arrays(good(), device="tpu")
    with pytest.raises(ValueError, match=r"^history_precision: bf16 storage is available on CUDA devices only"):
        optex.OptEx.from_state_arrays(good(), history_precision="bf16")
    elsewhere = good()
    elsewhere["options"]["device"] = "cuda:7"
    with pytest.raises(ValueError, match=r"^options.device: cuda:7 is not available"):
        optex.OptEx.from_state_arrays(elsewhere)
    assert optex.OptEx.from_state_arrays(elsewhere, device="cpu").options.device == "cpu"


# The float arrays, and what each must be: (key path, dtype, bad values).
BOUNDED = [math.nan, math.inf, -math.inf, 1e30, -3e38]
ARRAYS = [
    ("x", BOUNDED, r"iterate element {i} is"),
    ("slots.exp_avg", [math.nan, math.inf, -math.inf], r"optimizer state exp_avg \(slot 0\), element {i} is"),
    ("slots.exp_avg_sq", [math.nan, math.inf, -1.0, -1e-30],
     r"optimizer state exp_avg_sq \(slot 1\), element {i} is"),
    ("history.points", BOUNDED, r"history point {r}, element {c} is"),
    ("history.gradients", BOUNDED, r"history gradient {r}, element {c} is"),
    ("history.squared_distances", [math.nan, math.inf, -1.0], r"history squared distance \({r}, {c}\) is"),
    ("history.squared_norms", [math.nan, -math.inf, -1e-300], r"history squared norm {i} is"),
    ("history.gradient_inner_products", [math.nan, math.inf, -math.inf],
     r"history gradient inner product \({r}, {c}\) is"),
]


def python_key(path: str) -> str:
    first, *rest = path.split(".")
    return first + "".join(f"\\['{k}'\\]" for k in rest)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_non_finite_and_huge_values_are_refused_in_every_array(data) -> None:
    state = good()
    path, bad_values, where = data.draw(st.sampled_from(ARRAYS))
    *parents, last = path.split(".")
    node = state
    for p in parents:
        node = node[p]
    a = node[last].copy()
    flat = data.draw(st.integers(0, a.size - 1))
    index = np.unravel_index(flat, a.shape)
    a[index] = data.draw(st.sampled_from(bad_values))
    node[last] = a
    r, c = (index + (0,))[:2] if a.ndim == 2 else (0, 0)
    text = where.format(i=flat, r=r, c=c)
    with pytest.raises(ValueError, match=f"^{python_key(path)}: {text}") as refused:
        optex.OptEx.from_state_arrays(state)
    assert re.search(r"\(must be", str(refused.value))
