"""The names of the optimizer state slots are torch.optim's state keys.

Each optimizer class names the state slots it may keep (``state_slot_names``,
aligned with ``OptimizerState.slots``) and, per value, those it keeps
(``state_slots``). Against torch.optim: after a few steps of the same
optimizer on the same gradients, torch's state holds exactly those keys (besides
``step``) and each named slot holds the buffer torch keeps under that name, to
rounding. Lion, which torch does not ship, is checked against its formula.
"""

from __future__ import annotations

import numpy as np
import pytest

import optex

torch = pytest.importorskip("torch", reason="the names are torch.optim's, and need PyTorch to compare")

D = 7
STEPS = 4


def gradients() -> list[np.ndarray]:
    """A few fixed float32 gradients of mixed signs."""
    rng = np.random.default_rng(17)
    return [rng.normal(size=D).astype(np.float32) for _ in range(STEPS)]


# optex value, the torch.optim optimizer class and its keywords.
CASES = [
    ("adam", optex.Adam(lr=0.01), torch.optim.Adam, {"lr": 0.01}),
    ("adam_l2", optex.Adam(lr=0.01, weight_decay=0.1), torch.optim.Adam, {"lr": 0.01, "weight_decay": 0.1}),
    ("adamw", optex.AdamW(lr=0.01), torch.optim.AdamW, {"lr": 0.01}),
    ("sgd", optex.Sgd(lr=0.1), torch.optim.SGD, {"lr": 0.1}),
    ("sgd_momentum", optex.Sgd(lr=0.1, momentum=0.9), torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
    ("sgd_nesterov", optex.Sgd(lr=0.1, momentum=0.9, nesterov=True), torch.optim.SGD,
     {"lr": 0.1, "momentum": 0.9, "nesterov": True}),
    ("rmsprop", optex.RmsProp(lr=0.01), torch.optim.RMSprop, {"lr": 0.01}),
    ("rmsprop_momentum", optex.RmsProp(lr=0.01, momentum=0.5), torch.optim.RMSprop,
     {"lr": 0.01, "momentum": 0.5}),
    ("rmsprop_centered", optex.RmsProp(lr=0.01, centered=True), torch.optim.RMSprop,
     {"lr": 0.01, "centered": True}),
    ("rmsprop_centered_momentum", optex.RmsProp(lr=0.01, momentum=0.5, centered=True), torch.optim.RMSprop,
     {"lr": 0.01, "momentum": 0.5, "centered": True}),
]


def torch_state(cls: type, kwargs: dict) -> dict[str, np.ndarray]:
    """torch.optim's per-parameter state after STEPS steps on gradients(), without ``step``."""
    x0 = np.linspace(-1, 1, D, dtype=np.float32)
    p = torch.nn.Parameter(torch.from_numpy(x0.copy()))
    opt = cls([p], foreach=False, **kwargs)
    for g in gradients():
        p.grad = torch.from_numpy(g.copy())
        opt.step()
    state = opt.state[p]
    return {k: v.detach().numpy() for k, v in state.items() if k != "step"}


def optex_state(optimizer) -> optex.OptimizerState:
    x = np.linspace(-1, 1, D, dtype=np.float32)
    state = optex.init_state(optimizer, D)
    for g in gradients():
        optex.apply_step(optimizer, x, state, g)
    return state


@pytest.mark.parametrize(("name", "optimizer", "cls", "kwargs"), CASES, ids=[c[0] for c in CASES])
def test_slot_names_are_torchs_state_keys(name, optimizer, cls, kwargs) -> None:
    reference = torch_state(cls, kwargs)
    kept = {n for n in optimizer.state_slots if n is not None}
    assert kept == set(reference), name
    state = optex_state(optimizer)
    for slot, (value, slot_name) in enumerate(zip(state.slots, optimizer.state_slots)):
        # A slot is kept exactly where it is named.
        assert (value is None) == (slot_name is None), (name, slot)
        if slot_name is not None:
            # The buffer torch keeps under that name, to rounding (torch contracts some
            # multiply-adds, DESIGN.md section 9).
            np.testing.assert_allclose(value, reference[slot_name], rtol=1e-5, atol=1e-7,
                                       err_msg=f"{name}: {slot_name}")


def test_each_class_names_the_slots_it_may_keep() -> None:
    assert optex.Sgd.state_slot_names == ("momentum_buffer", None, None)
    assert optex.Adam.state_slot_names == ("exp_avg", "exp_avg_sq", None)
    assert optex.AdamW.state_slot_names == ("exp_avg", "exp_avg_sq", None)
    assert optex.RmsProp.state_slot_names == ("square_avg", "momentum_buffer", "grad_avg")
    assert optex.Lion.state_slot_names == ("exp_avg", None, None)
    for cls in optex.optimizer_classes():
        # Aligned with OptimizerState.slots, and what a value keeps is among them.
        assert len(cls.state_slot_names) == len(optex.init_state(cls(), 1).slots)
        assert all(kept in (None, named) for kept, named in zip(cls().state_slots, cls.state_slot_names))
        # The class attribute is the class's: an instance reads the same tuple.
        assert cls().state_slot_names == cls.state_slot_names
    # A value keeps what its settings need; setting them changes what it keeps.
    sgd = optex.Sgd()
    assert sgd.state_slots == (None, None, None)
    sgd.momentum = 0.5
    assert sgd.state_slots == ("momentum_buffer", None, None)
    assert optex.RmsProp(centered=True).state_slots == ("square_avg", None, "grad_avg")


def test_lions_slot_is_its_momentum() -> None:
    # Lion (not in torch.optim): exp_avg = beta2 * exp_avg + (1 - beta2) * g, from zero.
    lion = optex.Lion(lr=1e-3, beta1=0.9, beta2=0.99)
    assert lion.state_slots == ("exp_avg", None, None)
    g = gradients()[0]
    state = optex.init_state(lion, D)
    optex.apply_step(lion, np.zeros(D, dtype=np.float32), state, g)
    expected = np.float32(0.0) * np.float32(0.99) + np.float32(1.0 - 0.99) * g
    np.testing.assert_array_equal(state.slots[0], expected)
