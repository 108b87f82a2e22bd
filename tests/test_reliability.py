"""Random state dicts, overflow storms and long soaks: nothing lost, nothing leaked."""

import gc
import math
import numbers
import os
import warnings

import numpy as np
import paddle
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paddle_amp_scaler import GradScaler
from paddle_amp_scaler.core import monitoring

from helpers import GradInjector, batches, make_model, params_of, train_step

FLOAT32_MAX = float(np.finfo(np.float32).max)
VALID = {
    "scale": np.array([512.0], dtype=np.float32),
    "incr_ratio": 2.0,
    "decr_ratio": 0.5,
    "incr_every_n_steps": 10,
    "decr_every_n_nan_or_inf": 3,
    "incr_count": 4,
    "decr_count": 1,
    "use_dynamic_loss_scaling": True,
}


# Keys beyond Paddle's that this package reads and checks (test_bounds.py and
# test_statistics.py test them); any other key is ignored.
CHECKED_EXTRAS = {"min_loss_scaling", "max_loss_scaling", "stats"}


# -- an independent statement of what a valid state dict is --------------------------------


def _is_number(v):
    return isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_))


def _is_int(v):
    return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))


def _scale_value(v):
    if isinstance(v, np.ndarray):
        return v.reshape(()).item() if v.size == 1 and v.dtype.kind in "fiu" else None
    return v if _is_number(v) else None


def expected_valid(state):
    if any(key not in state for key in VALID):
        return False
    scale = _scale_value(state["scale"])
    incr, decr = state["incr_every_n_steps"], state["decr_every_n_nan_or_inf"]
    return (
        scale is not None
        and 0 < scale <= FLOAT32_MAX
        and _is_number(state["incr_ratio"])
        and 1 < state["incr_ratio"] < math.inf
        and _is_number(state["decr_ratio"])
        and 0 < state["decr_ratio"] < 1
        and _is_int(incr)
        and 1 <= incr < 2**31
        and _is_int(decr)
        and 1 <= decr < 2**31
        and _is_int(state["incr_count"])
        and 0 <= state["incr_count"] < incr
        and _is_int(state["decr_count"])
        and 0 <= state["decr_count"] < decr
        and isinstance(state["use_dynamic_loss_scaling"], (bool, np.bool_))
    )


garbage = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 12),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(0.0, 2.0),
    st.text(max_size=3),
    st.lists(st.floats(0, 10), max_size=2),
    st.builds(np.array, st.lists(st.floats(-1e40, 1e40), min_size=0, max_size=2)),
    st.builds(np.float32, st.floats(-1e3, 1e3, width=32)),
    st.builds(np.int64, st.integers(-2, 12)),
)


def random_state_dicts():
    return st.builds(
        lambda replaced, dropped, unknown: {
            **{k: v for k, v in {**VALID, **replaced}.items() if k not in dropped},
            **unknown,
        },
        st.dictionaries(st.sampled_from(sorted(VALID)), garbage, max_size=3),
        st.sets(st.sampled_from(sorted(VALID)), max_size=1),
        st.dictionaries(
            st.text(min_size=1, max_size=5).filter(
                lambda k: k not in VALID and k not in CHECKED_EXTRAS
            ),
            garbage,
            max_size=2,
        ),
    )


def load_random_state_dict(state):
    scaler = GradScaler(init_loss_scaling=8.0, incr_every_n_steps=5)
    scaler.set_incr_count(2)
    before = scaler.state_dict()
    if expected_valid(state):
        # A Paddle-format dict carries no bounds: the scaler's own (floor 1.0) apply, and
        # a scale below it is clamped, with a warning (API.md).
        loaded_scale = _scale_value(state["scale"])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            scaler.load_state_dict(state)
        clamped = [w for w in caught if "clamped" in str(w.message)]
        assert len(clamped) == (loaded_scale < 1.0)
        after = scaler.state_dict()
        assert after["scale"][0] == np.float32(max(loaded_scale, 1.0))
        for key in VALID:
            if key != "scale":
                assert after[key] == state[key], key
    else:
        # Every refusal names the key: "state_dict['incr_ratio'] must be ..." or
        # "state_dict is missing the key ...".
        with pytest.raises(ValueError, match=r"^state_dict(\[| is missing)"):
            scaler.load_state_dict(state)
        after = scaler.state_dict()
        for key in before:
            np.testing.assert_array_equal(after[key], before[key], err_msg=key)


_RANDOM_DICTS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])
test_random_state_dicts = settings(max_examples=200, **_RANDOM_DICTS)(
    given(random_state_dicts())(load_random_state_dict)
)
test_random_state_dicts_long = pytest.mark.long(
    settings(max_examples=5000, **_RANDOM_DICTS)(
        given(random_state_dicts())(load_random_state_dict)
    )
)


def test_the_validity_statement_accepts_the_valid_dict():
    # Otherwise the property test above would only ever test rejections.
    assert expected_valid(VALID)
    assert not expected_valid({**VALID, "incr_count": 10})


# -- overflow storm and soak ---------------------------------------------------------------


def resident_bytes():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def live_tensors():
    gc.collect()
    return sum(1 for obj in gc.get_objects() if isinstance(obj, paddle.Tensor))


def overflow_storm(steps):
    model = make_model(hidden=8, depth=1)
    optimizer = paddle.optimizer.AdamW(learning_rate=0.01, parameters=model.parameters())
    injector = GradInjector(model[0].weight)
    scaler = GradScaler(init_loss_scaling=2.0**16)
    batch = batches(steps=1)[0]
    train_step(scaler, model, optimizer, batch)
    before = params_of(model)
    for _ in range(50):
        train_step(scaler, model, optimizer, batch, injector=injector, inject=math.nan)
    memory, tensors = resident_bytes(), live_tensors()
    for step in range(steps):
        train_step(
            scaler,
            model,
            optimizer,
            batch,
            injector=injector,
            inject=math.inf if step % 2 else math.nan,
        )
    assert scaler.get_loss_scaling() == 1.0
    assert scaler.get_incr_count() == 0 and scaler.get_decr_count() == 0
    for old, new in zip(before, params_of(model)):
        np.testing.assert_array_equal(new, old)
    assert live_tensors() <= tensors + 5
    assert resident_bytes() - memory < 16 * 2**20


def test_overflow_storm():
    overflow_storm(2000)


@pytest.mark.long
def test_overflow_storm_long():
    overflow_storm(30000)


def soak(iterations, kept=0):
    """``kept``: how many tensors the scaler may hold beyond its own at any moment (the
    flags of up to 128 iterations whose statistics wait for a fold)."""
    model = paddle.nn.Linear(2, 1)
    optimizer = paddle.optimizer.SGD(learning_rate=1e-6, parameters=model.parameters())
    scaler = GradScaler(init_loss_scaling=2.0**8, incr_every_n_steps=50)
    x = paddle.ones([1, 2])
    for _ in range(200):
        train_step(scaler, model, optimizer, (x, paddle.zeros([1, 1])))
    memory, tensors = resident_bytes(), live_tensors()
    attributes = dict(vars(scaler))
    for _ in range(iterations):
        scaler.scale(model(x).sum()).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.clear_grad()
    assert vars(scaler).keys() == attributes.keys()
    assert len(scaler._optimizer_states) == 0
    assert live_tensors() <= tensors + kept + 5
    assert resident_bytes() - memory < 16 * 2**20
    # It stayed a working scaler: growth every 50 finite steps, up to float32's limit.
    assert scaler.get_loss_scaling() > 2.0**8


def test_soak():
    soak(3000, kept=monitoring._FOLD_EVERY)


@pytest.mark.long
def test_soak_100k_updates():
    soak(100_000, kept=monitoring._FOLD_EVERY)
