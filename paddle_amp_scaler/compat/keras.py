"""TensorFlow/Keras' ``LossScaleOptimizer``: a Paddle optimizer that scales its own loss,
with this package's ``GradScaler``: the same rule, kernels and promises.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from paddle import Tensor

from ..core import kernels, optimizers, validation
from ..core.scaler import AmpScaler, GradScaler

__all__ = ["LossScaleOptimizer"]

SCALER_STATE_KEY = "LossScaleOptimizer.scaler"
# Set on an inner optimizer once wrapped, as tf-keras marks it: a second wrapper would
# keep a second scale over the same gradients.
_WRAPPED_MARK = "_wrapped_by_loss_scale_optimizer"
# Keras' base-optimizer arguments, which its LossScaleOptimizer refuses as belonging "on the
# inner optimizer" (its test's words), each with where Paddle has it, if anywhere.
_KERAS_OPTIMIZER_ARGUMENTS = {
    "weight_decay": "in Paddle too: weight_decay=... on the inner optimizer",
    "clipnorm": "in Paddle, grad_clip=paddle.nn.ClipGradByNorm(...) on the inner optimizer",
    "global_clipnorm": "in Paddle, grad_clip=paddle.nn.ClipGradByGlobalNorm(...) on the "
    "inner optimizer",
    "clipvalue": "in Paddle, grad_clip=paddle.nn.ClipGradByValue(...) on the inner optimizer",
    "use_ema": "Paddle's optimizers keep no moving average of the weights",
    "ema_momentum": "Paddle's optimizers keep no moving average of the weights",
    "ema_overwrite_frequency": "Paddle's optimizers keep no moving average of the weights",
    "loss_scale_factor": "Paddle's optimizers have no loss scale: it is this wrapper's, "
    "initial_scale=..., with dynamic=False for a fixed one",
    "gradient_accumulation_steps": "Paddle's optimizers do not accumulate by themselves: run "
    "get_scaled_loss(loss).backward() several times, then step()",
}


class LossScaleOptimizer:
    """Wraps a Paddle optimizer so that ``minimize(loss)`` applies dynamic loss scaling.

    Only ``clear_grad``, ``get_lr``, ``set_lr``, ``set_lr_scheduler``, ``state_dict`` and
    ``set_state_dict`` are delegated; everything else is on ``inner_optimizer``.

    Args:
        inner_optimizer: the Paddle optimizer to wrap; an optimizer is wrapped once.
        dynamic: True: the scale starts at ``initial_scale``, doubles after
            ``dynamic_growth_steps`` finite steps and halves on every overflow, never
            below 1. False: ``initial_scale`` is the fixed scale.
        initial_scale: the first scale (default 2**15); required when ``dynamic=False``.
        dynamic_growth_steps: finite steps in a row before the scale doubles (default
            2000; a whole float such as 2.0 is taken); None when ``dynamic=False``.
        scaler: an ``AmpScaler`` or ``GradScaler`` to use instead of the TensorFlow
            arguments, which are then left at their defaults.
        **optimizer_arguments: none is taken. Each raises ``UnknownArgumentError``
            naming it; Keras' base-optimizer arguments (``clipnorm``, ``use_ema``, ...)
            say that Keras sets them on the inner optimizer, then where Paddle has them.
    """

    def __init__(
        self,
        inner_optimizer: Any,
        dynamic: bool = True,
        initial_scale: float | None = None,
        dynamic_growth_steps: int | None = None,
        *,
        scaler: AmpScaler | None = None,
        **optimizer_arguments: Any,
    ) -> None:
        validation.check_keywords(
            "LossScaleOptimizer",
            optimizer_arguments,
            validation.keyword_names(LossScaleOptimizer.__init__),
            lambda name: _where_it_belongs(name, inner_optimizer),
        )
        if isinstance(inner_optimizer, LossScaleOptimizer):
            raise TypeError(
                "LossScaleOptimizer cannot wrap another LossScaleOptimizer; wrap its "
                "inner_optimizer instead"
            )
        if not callable(getattr(inner_optimizer, "step", None)):
            raise TypeError(
                "inner_optimizer must be a paddle.optimizer.Optimizer, got "
                f"{type(inner_optimizer).__name__}"
            )
        optimizers.parameters_of(inner_optimizer)  # refuses an optimizer with no parameters
        if getattr(inner_optimizer, _WRAPPED_MARK, False):
            raise ValueError(
                f"inner_optimizer ({type(inner_optimizer).__name__}) is already wrapped by a "
                "LossScaleOptimizer, and a second would keep a second loss scale over the "
                "same gradients: keep the first wrapper and use it"
            )
        dynamic = validation.check_bool(dynamic, "dynamic")
        if scaler is None:
            scaler = _scaler_for(dynamic, initial_scale, dynamic_growth_steps)
        elif not isinstance(scaler, AmpScaler):
            raise TypeError(
                "scaler must be a paddle_amp_scaler AmpScaler or GradScaler, got "
                f"{type(scaler).__name__}"
            )
        elif not dynamic or initial_scale is not None or dynamic_growth_steps is not None:
            raise ValueError(
                "give either scaler= or the TensorFlow arguments (dynamic, initial_scale, "
                "dynamic_growth_steps), not both"
            )
        self._inner, self._scaler = inner_optimizer, scaler
        setattr(inner_optimizer, _WRAPPED_MARK, True)
        # For the warning of apply_gradients, as tf-keras keeps them: what was ever called.
        self._called: set[str] = set()
        self._warned_unscaled = False

    @property
    def inner_optimizer(self) -> Any:
        return self._inner

    @property
    def scaler(self) -> AmpScaler:
        return self._scaler

    @property
    def loss_scale(self) -> Tensor:
        """The current scale, a float32 0-d Tensor (a copy; no read)."""
        return self._scaler._scale.reshape([]).clone()

    @property
    def dynamic(self) -> bool:
        return self._scaler.is_use_dynamic_loss_scaling()

    @property
    def initial_scale(self) -> float:
        return self._scaler.get_init_loss_scaling()

    @property
    def dynamic_growth_steps(self) -> int | None:
        return self._scaler.get_incr_every_n_steps() if self.dynamic else None

    @property
    def dynamic_counter(self) -> int | None:
        """Finite steps since the scale last changed (reads the device); None when fixed."""
        return self._scaler.get_incr_count() if self.dynamic else None

    def minimize(
        self, loss: Tensor | Callable[[], Tensor], parameters: Any = None, no_grad_set: Any = None
    ) -> Any:
        """The whole iteration, as in TensorFlow: scale ``loss`` (a Tensor, or a callable
        returning one), run its backward, unscale, check, step or skip, update the scale
        (gradients are not cleared). Returns what the inner ``minimize`` returned;
        ``(None, None)`` when skipped without calling it.
        """
        loss = _loss_tensor(loss)
        self._scaler.scale(loss).backward()
        return self._step_and_update(
            lambda: self._inner.minimize(loss, parameters=parameters, no_grad_set=no_grad_set),
            skipped=(None, None),
        )

    def step(self) -> None:
        """After ``get_scaled_loss(loss).backward()``: unscale, check, step or skip, update."""
        self._step_and_update(self._inner.step)

    def get_scaled_loss(self, loss: Tensor | Callable[[], Tensor]) -> Any:
        """``loss`` times the scale; for a callable, a callable that returns that."""
        self._called.add("get_scaled_loss()")
        if callable(loss) and not isinstance(loss, Tensor):
            return lambda: self._scaler.scale(_loss_tensor(loss))
        return self._scaler.scale(_loss_tensor(loss))

    def get_unscaled_gradients(self, grads: Iterable[Tensor | None]) -> list[Tensor | None]:
        """A new list: each gradient divided by the scale, ``None`` kept as ``None``."""
        if isinstance(grads, Tensor) or not isinstance(grads, Iterable):
            raise TypeError(
                f"grads must be a list of Tensors (or None), got {type(grads).__name__}"
            )
        self._called.add("get_unscaled_gradients()")
        if not self._scaler.is_enable():
            return list(grads)
        scale = self._scaler._scale
        return [None if grad is None else kernels.unscaled(_tensor(grad), scale) for grad in grads]

    def apply_gradients(self, grads_and_vars: Iterable[tuple[Tensor | None, Tensor]]) -> Any:
        """Apply unscaled gradients, TensorFlow-ordered ``(grad, param)`` pairs (those with
        a None gradient left out): check them, step (the inner optimizer's
        ``apply_gradients``) or skip, update the scale. On a skipped step with plain SGD the
        given gradients are set to zero (the skip that needs no device read).
        """
        pairs = [_pair(item) for item in grads_and_vars]
        pairs = [(grad, param) for grad, param in pairs if grad is not None]
        # Warn once, as tf-keras does, for a hand-written loop that shows no sign of
        # scaling: unscaled gradients are applied loss_scale times too large, and a loss
        # that was never scaled can underflow.
        missed = sorted({"get_scaled_loss()", "get_unscaled_gradients()"} - self._called)
        if missed and self._scaler.is_enable() and not self._warned_unscaled:
            self._warned_unscaled = True
            warnings.warn(
                f"apply_gradients() was called without {' and '.join(missed)} having been "
                "called first: scale the loss with get_scaled_loss(loss) before computing "
                "gradients, and pass them through get_unscaled_gradients(grads) before "
                "apply_gradients() (minimize() and step() do both themselves)",
                stacklevel=2,
            )
        return self._step_and_update(
            lambda: self._inner.apply_gradients([(param, grad) for grad, param in pairs]),
            grads=[grad for grad, _ in pairs],
        )

    def _step_and_update(self, run_step: Callable[[], Any], **how: Any) -> Any:
        # Step or skip, then end the iteration: TensorFlow has no separate update.
        result = self._scaler.step_optimizer(self._inner, run_step, **how)
        self._scaler.end_iteration()
        return result

    def clear_grad(self, set_to_zero: bool = True) -> None:
        self._inner.clear_grad(set_to_zero)

    def get_lr(self) -> float:
        return float(self._inner.get_lr())

    def set_lr(self, value: float) -> None:
        self._inner.set_lr(value)

    def set_lr_scheduler(self, scheduler: Any) -> None:
        self._inner.set_lr_scheduler(scheduler)

    def state_dict(self) -> dict[str, Any]:
        """The inner optimizer's state dict, with the scaler's under one more key."""
        return {**self._inner.state_dict(), SCALER_STATE_KEY: self._scaler.state_dict()}

    def set_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load a ``state_dict()`` of this class (or a plain optimizer's, which leaves the
        scaler as it is). A bad scaler part raises before anything is loaded.
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"state_dict must be a dict, got {type(state_dict).__name__}")
        inner_state = dict(state_dict)
        scaler_state = inner_state.pop(SCALER_STATE_KEY, None)
        if scaler_state is not None:  # checked whole before it changes anything
            self._scaler.load_state_dict(scaler_state)
        self._inner.set_state_dict(inner_state)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_inner", "_scaler"):
            raise AttributeError(name)
        raise AttributeError(
            f"LossScaleOptimizer has no attribute {name!r}: it delegates only clear_grad, "
            "get_lr, set_lr, set_lr_scheduler, state_dict, set_state_dict; use "
            f".inner_optimizer.{name} on the {type(self._inner).__name__} it wraps"
        )

    def __repr__(self) -> str:
        """As TensorFlow shows it: the inner optimizer's class, the scale (reads the device)."""
        inner = type(self._inner).__name__
        if not self._scaler.is_enable():
            return f"LossScaleOptimizer({inner}, scaler={self._scaler!r})"
        state = f"dynamic={self.dynamic}, loss_scale={self._scaler.get_loss_scaling()!r}"
        if self.dynamic:
            state += (
                f", dynamic_growth_steps={self.dynamic_growth_steps}, "
                f"dynamic_counter={self.dynamic_counter}"
            )
        return f"LossScaleOptimizer({inner}, {state})"


def _where_it_belongs(name: str, inner_optimizer: Any) -> str | None:
    """Keras' advice for an argument of the optimizers, none for any other name."""
    if name in _KERAS_OPTIMIZER_ARGUMENTS:
        return f"in Keras it is set on the inner optimizer; {_KERAS_OPTIMIZER_ARGUMENTS[name]}"
    inner = type(inner_optimizer)
    try:
        optimizer_arguments = validation.keyword_names(inner.__init__)
    except (TypeError, ValueError):  # a signature inspect cannot read
        return None
    if name in optimizer_arguments:
        return f"set it on the inner optimizer instead: {inner.__name__}(..., {name}=...)"
    return None


def _scaler_for(
    dynamic: bool, initial_scale: float | None, dynamic_growth_steps: int | None
) -> GradScaler:
    if not dynamic and initial_scale is None:
        raise ValueError("initial_scale is required when dynamic=False: it is the fixed scale")
    if not dynamic and dynamic_growth_steps is not None:
        raise ValueError(
            f"dynamic_growth_steps must be None when dynamic=False, got {dynamic_growth_steps!r}"
        )
    # GradScaler's defaults are TensorFlow's rule: double after 2000 finite steps, halve on
    # every overflow. tf-keras takes int(dynamic_growth_steps): its checkpoint test passes 2.0.
    scale = 2.0**15 if initial_scale is None else initial_scale
    steps = 2000 if dynamic_growth_steps is None else dynamic_growth_steps
    return GradScaler(
        init_loss_scaling=validation.check_scale(scale, "initial_scale"),
        incr_every_n_steps=validation.check_period(
            steps, "dynamic_growth_steps", integral_float=True
        ),
        use_dynamic_loss_scaling=dynamic,
    )


def _loss_tensor(loss: Any) -> Tensor:
    """``loss``, or what it returns if it is a callable."""
    if callable(loss) and not isinstance(loss, Tensor):
        loss = loss()
    if not isinstance(loss, Tensor):
        raise TypeError(
            f"loss must be a Tensor or a callable returning one, got {type(loss).__name__}"
        )
    return loss


def _tensor(grad: Any) -> Tensor:
    if not isinstance(grad, Tensor):
        raise TypeError(f"each gradient must be a Tensor or None, got {type(grad).__name__}")
    return grad


def _pair(item: Any) -> tuple[Tensor | None, Tensor]:
    if not (isinstance(item, (tuple, list)) and len(item) == 2):
        raise TypeError(f"grads_and_vars must hold (grad, param) pairs, got {item!r}")
    grad, param = item
    if not isinstance(param, Tensor):
        raise TypeError(f"the second item of each pair must be a parameter, got {param!r}")
    return (None if grad is None else _tensor(grad)), param
