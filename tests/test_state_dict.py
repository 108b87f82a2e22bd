"""state_dict / load_state_dict: Paddle's format both ways, PyTorch's format in, and a bad
dict raises ValueError naming the key while the scaler stays exactly as it was."""

import math

import numpy as np
import paddle
import pytest

from paddle_amp_scaler import AmpScaler, GradScaler

from helpers import paddle_oracle


def observable(scaler):
    return (
        scaler.get_loss_scaling(),
        scaler.get_init_loss_scaling(),
        scaler.get_incr_ratio(),
        scaler.get_decr_ratio(),
        scaler.get_incr_every_n_steps(),
        scaler.get_decr_every_n_nan_or_inf(),
        scaler.get_incr_count(),
        scaler.get_decr_count(),
        scaler.is_use_dynamic_loss_scaling(),
    )


def busy_scaler():
    scaler = GradScaler(
        init_loss_scaling=1000.0,
        incr_ratio=3.0,
        decr_ratio=0.25,
        incr_every_n_steps=7,
        decr_every_n_nan_or_inf=3,
    )
    scaler.set_incr_count(5)
    scaler._scale.fill_(1234.5)
    return scaler


def test_format_matches_api_md():
    state = busy_scaler().state_dict()
    assert set(state) == {
        "scale",
        "incr_ratio",
        "decr_ratio",
        "incr_every_n_steps",
        "decr_every_n_nan_or_inf",
        "incr_count",
        "decr_count",
        "use_dynamic_loss_scaling",
        "min_loss_scaling",
        "max_loss_scaling",
        "stats",
        "policy",
    }
    assert isinstance(state["scale"], np.ndarray)
    assert state["scale"].dtype == np.float32 and state["scale"].shape == (1,)
    assert state["scale"][0] == np.float32(1234.5)
    assert (state["incr_ratio"], state["decr_ratio"]) == (3.0, 0.25)
    assert (state["incr_every_n_steps"], state["decr_every_n_nan_or_inf"]) == (7, 3)
    assert (state["incr_count"], state["decr_count"]) == (5, 0)
    assert state["use_dynamic_loss_scaling"] is True
    assert all(type(state[k]) is int for k in ("incr_every_n_steps", "incr_count", "decr_count"))


def test_state_dict_is_a_snapshot_not_a_view():
    scaler = busy_scaler()
    state = scaler.state_dict()
    scaler.set_init_loss_scaling(8.0)
    assert state["scale"][0] == np.float32(1234.5)


def test_round_trip_through_paddle_save(tmp_path):
    source = busy_scaler()
    paddle.save(source.state_dict(), str(tmp_path / "scaler.pdparams"))
    target = GradScaler()
    target.load_state_dict(paddle.load(str(tmp_path / "scaler.pdparams")))
    assert observable(target)[0] == observable(source)[0]
    assert observable(target)[2:] == observable(source)[2:]
    # As in Paddle, the loaded scale also becomes the initial scale.
    assert target.get_init_loss_scaling() == np.float32(1234.5)


def test_paddle_loads_ours_and_we_load_paddles(monkeypatch):
    source = busy_scaler()
    theirs = paddle_oracle(monkeypatch)
    theirs.load_state_dict(source.state_dict())
    assert float(theirs._scale.numpy()[0]) == source.get_loss_scaling()
    assert (theirs._incr_ratio, theirs._decr_ratio, theirs._incr_count) == (3.0, 0.25, 5)

    theirs._decr_count = 2
    ours = AmpScaler()
    ours.load_state_dict(theirs.state_dict())
    assert observable(ours)[2:] == (3.0, 0.25, 7, 3, 5, 2, True)
    assert ours.get_loss_scaling() == source.get_loss_scaling()


def test_loads_pytorch_grad_scaler_dict():
    torch_state = {
        "scale": 4096.0,
        "growth_factor": 2.5,
        "backoff_factor": 0.125,
        "growth_interval": 500,
        "_growth_tracker": 321,
    }
    scaler = GradScaler(decr_every_n_nan_or_inf=4, use_dynamic_loss_scaling=False)
    scaler.set_decr_count(2)
    scaler.load_state_dict(torch_state)
    assert observable(scaler) == (4096.0, 4096.0, 2.5, 0.125, 500, 1, 321, 0, True)


def test_loads_a_real_pytorch_state_dict_when_torch_is_installed():
    torch = pytest.importorskip("torch")
    torch_scaler = torch.amp.GradScaler("cpu", init_scale=512.0, growth_interval=9)
    scaler = GradScaler()
    scaler.load_state_dict(torch_scaler.state_dict())
    assert observable(scaler)[0] == 512.0 and scaler.get_incr_every_n_steps() == 9


@pytest.mark.parametrize(
    "scale",
    [
        2048.0,
        2048,
        np.float32(2048.0),
        np.array(2048.0),
        np.array([2048.0], dtype=np.float32),
        np.array([2048.0]),
        paddle.to_tensor([2048.0]),
        paddle.to_tensor(2048.0),
    ],
    ids=["float", "int", "np-scalar", "0d", "f32[1]", "f64[1]", "tensor[1]", "tensor0d"],
)
def test_scale_forms(scale):
    state = busy_scaler().state_dict()
    state["scale"] = scale
    scaler = GradScaler()
    scaler.load_state_dict(state)
    assert scaler.get_loss_scaling() == 2048.0


def test_unknown_keys_are_ignored():
    state = dict(busy_scaler().state_dict(), optimizer_hint="x", step=12)
    scaler = GradScaler()
    scaler.load_state_dict(state)
    assert observable(scaler)[2:] == observable(busy_scaler())[2:]


BAD_VALUES = [
    ("scale", math.nan),
    ("scale", math.inf),
    ("scale", 0.0),
    ("scale", -2.0),
    ("scale", 1e39),
    ("scale", "1024"),
    ("scale", np.array([1.0, 2.0])),
    ("scale", None),
    ("scale", np.array(["a"])),
    ("scale", True),
    ("incr_ratio", 1.0),
    ("incr_ratio", 0.5),
    ("incr_ratio", math.inf),
    ("incr_ratio", "2"),
    ("decr_ratio", 1.0),
    ("decr_ratio", 0.0),
    ("decr_ratio", -0.5),
    ("decr_ratio", math.nan),
    ("incr_every_n_steps", 0),
    ("incr_every_n_steps", 2.5),
    ("incr_every_n_steps", True),
    ("incr_every_n_steps", 2**31),
    ("decr_every_n_nan_or_inf", -1),
    ("decr_every_n_nan_or_inf", "1"),
    ("incr_count", -1),
    ("incr_count", 7),
    ("incr_count", 1.0),
    ("decr_count", 3),
    ("decr_count", None),
    ("use_dynamic_loss_scaling", 1),
    ("use_dynamic_loss_scaling", "yes"),
]


@pytest.mark.parametrize("key,value", BAD_VALUES, ids=[f"{k}={v!r}" for k, v in BAD_VALUES])
def test_bad_value_raises_naming_the_key_and_changes_nothing(key, value):
    scaler = busy_scaler()
    before = observable(scaler)
    state = dict(scaler.state_dict(), **{key: value})
    with pytest.raises(ValueError, match=repr(key).replace("[", r"\[")):
        scaler.load_state_dict(state)
    assert observable(scaler) == before


@pytest.mark.parametrize(
    "key",
    [
        "scale",
        "incr_ratio",
        "decr_ratio",
        "incr_every_n_steps",
        "decr_every_n_nan_or_inf",
        "incr_count",
        "decr_count",
        "use_dynamic_loss_scaling",
    ],
)
def test_missing_key_raises_naming_it_and_changes_nothing(key):
    scaler = busy_scaler()
    before = observable(scaler)
    state = scaler.state_dict()
    del state[key]
    with pytest.raises(ValueError, match=key):
        scaler.load_state_dict(state)
    assert observable(scaler) == before


def test_bad_pytorch_dict_names_the_pytorch_key():
    scaler = busy_scaler()
    before = observable(scaler)
    with pytest.raises(ValueError, match="growth_interval"):
        scaler.load_state_dict(
            {
                "scale": 8.0,
                "growth_factor": 2.0,
                "backoff_factor": 0.5,
                "growth_interval": 0,
                "_growth_tracker": 0,
            }
        )
    with pytest.raises(ValueError, match="_growth_tracker"):
        scaler.load_state_dict(
            {"scale": 8.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 10}
        )
    assert observable(scaler) == before


def test_not_a_dict_is_a_type_error():
    with pytest.raises(TypeError, match="state_dict must be a dict"):
        GradScaler().load_state_dict([("scale", 1.0)])


def test_empty_dict_into_enabled_scaler_is_a_runtime_error():
    scaler = busy_scaler()
    before = observable(scaler)
    with pytest.raises(RuntimeError, match="empty dict.*disabled"):
        scaler.load_state_dict({})
    assert observable(scaler) == before


def test_disabled_scaler_saves_empty_and_ignores_loads():
    scaler = GradScaler(enable=False)
    assert scaler.state_dict() == {}
    scaler.load_state_dict(busy_scaler().state_dict())
    scaler.load_state_dict({})
    assert scaler.get_loss_scaling() == 1.0 and scaler.get_incr_count() == 0
