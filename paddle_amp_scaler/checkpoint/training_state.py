"""The training state a checkpoint holds besides the scaler's: models, optimizers by
parameter position, and Paddle's random generator.

Optimizer state is stored by parameter position, not by Paddle's parameter names: the
names come from a process-wide counter (``linear_0.w_0``), so the same model built
again (or built after another one) gets other names, and Paddle's own
``set_state_dict`` would then silently start from fresh moments.
"""

from __future__ import annotations

import functools
import pickle
import warnings
from typing import Any

import numpy as np
import paddle

from ..core.optimizers import parameters_of

# -- models -----------------------------------------------------------------------------


def model_state(model: Any) -> dict[str, Any]:
    return {name: _to_numpy(value) for name, value in model.state_dict().items()}


def check_model_state(model: Any, saved: dict[str, Any]) -> None:
    """ValueError where ``saved`` does not fit ``model``: other keys, shapes or dtypes."""
    live = model.state_dict()
    if set(live) != set(saved):
        missing, unexpected = sorted(set(live) - set(saved)), sorted(set(saved) - set(live))
        raise ValueError(f"model keys differ (missing {missing}, unexpected {unexpected})")
    for name, value in live.items():
        _check_like(saved[name], value, f"model entry {name!r}")


# -- optimizers ---------------------------------------------------------------------------


def optimizer_state(optimizer: Any) -> dict[str, Any]:
    """The optimizer's state_dict with every parameter name replaced by its position."""
    params = parameters_of(optimizer)
    position = {param.name: index for index, param in enumerate(params)}
    # Longest first, so that 'linear_1.w_0' never claims 'linear_1.w_0_x' of another.
    names = sorted(position.items(), key=lambda item: -len(item[0]))
    accumulators, master_weights, other = {}, {}, {}
    for key, value in optimizer.state_dict().items():
        if key == "master_weights":
            master_weights = {position[name]: _to_numpy(v) for name, v in value.items()}
        elif isinstance(value, paddle.Tensor):
            owner = next(
                ((index, key[len(name) :]) for name, index in names if key.startswith(name + "_")),
                None,
            )
            if owner is None:
                other[key] = _to_numpy(value)
            else:
                accumulators[owner] = _to_numpy(value)
        else:
            other[key] = value
    return {
        "parameter_count": len(params),
        "accumulators": accumulators,
        "master_weights": master_weights,
        "other": other,
    }


def rebuild_optimizer_state(optimizer: Any, saved: dict[str, Any]) -> dict[str, Any]:
    """What ``optimizer.set_state_dict`` takes, from ``saved`` and this optimizer's own
    parameter names; ValueError where it does not fit."""
    params = parameters_of(optimizer)
    if saved["parameter_count"] != len(params):
        raise ValueError(
            f"the optimizer has {len(params)} parameters, the checkpoint's "
            f"has {saved['parameter_count']}"
        )
    state: dict[str, Any] = {
        params[index].name + suffix: paddle.to_tensor(value)
        for (index, suffix), value in saved["accumulators"].items()
    }
    if saved["master_weights"]:
        for index, value in saved["master_weights"].items():
            _check_like(
                value, params[index], f"master weight of parameter {index}", same_dtype=False
            )
        state["master_weights"] = {
            params[index].name: paddle.to_tensor(value)
            for index, value in saved["master_weights"].items()
        }
    for key, value in saved["other"].items():
        state[key] = paddle.to_tensor(value) if isinstance(value, np.ndarray) else value
    return state


def _to_numpy(value: Any) -> Any:
    return np.array(value.numpy(), copy=True) if isinstance(value, paddle.Tensor) else value


def _check_like(saved: Any, live: Any, what: str, same_dtype: bool = True) -> None:
    if not isinstance(live, paddle.Tensor):
        return
    saved_shape = list(np.shape(saved))
    if saved_shape != list(live.shape):
        raise ValueError(
            f"{what} has shape {saved_shape} in the checkpoint, {list(live.shape)} here"
        )
    if not same_dtype:
        return
    saved_dtype = str(np.asarray(saved).dtype)
    live_dtype = str(live.dtype).replace("paddle.", "")
    # NumPy has no bfloat16: Paddle hands its bits over as uint16.
    if saved_dtype != live_dtype and not (live_dtype == "bfloat16" and saved_dtype == "uint16"):
        raise ValueError(f"{what} is {saved_dtype} in the checkpoint, {live_dtype} here")


# -- the random generator ------------------------------------------------------------------


@functools.cache
def rng_state_survives_pickling() -> bool:
    """Whether Paddle's RNG state can be written to a file and read back.

    Paddle 2.6 pickles a CPU generator's seed but not its position, so a restored
    generator would start over. Checked once per process by a round trip; the
    caller's random stream is put back as it was.
    """
    untouched = paddle.get_rng_state()
    try:
        paddle.rand([1])
        position = paddle.get_rng_state()
        expected = paddle.rand([4]).numpy()
        paddle.set_rng_state(pickle.loads(pickle.dumps(position)))
        return bool(np.array_equal(paddle.rand([4]).numpy(), expected))
    finally:
        paddle.set_rng_state(untouched)


def rng_state() -> dict[str, Any] | None:
    """Paddle's RNG state to save, or None with a UserWarning where it cannot be saved."""
    if rng_state_survives_pickling():
        return {"device": paddle.get_device(), "states": paddle.get_rng_state()}
    warnings.warn(
        f"Paddle {paddle.__version__} cannot save the position of its random generator: "
        "after a resume, random layers such as dropout draw other numbers than the "
        "uninterrupted run would have (parameters, optimizer and scaler resume exactly)",
        UserWarning,
        # Points at the caller of save_checkpoint.
        stacklevel=3,
    )
    return None


def restore_rng(rng: dict[str, Any] | None, path: str) -> None:
    if rng is None:
        return
    here = paddle.get_device()
    if rng["device"].split(":")[0] != here.split(":")[0]:
        warnings.warn(
            f"checkpoint {path!r} holds the RNG state of {rng['device']}, not of "
            f"{here}: random ops (dropout) will not repeat the original run",
            RuntimeWarning,
            stacklevel=3,
        )
        return
    paddle.set_rng_state(rng["states"])
