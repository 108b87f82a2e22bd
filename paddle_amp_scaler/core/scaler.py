"""``AmpScaler`` and ``GradScaler``: the conductor of a training step around Paddle's AMP
kernels, with Paddle's API and the private names Paddle's trainers use.

A step visits each stage once and in order (``docs/architecture.md``, "One training
step"): each optimizer's ``OptimizerStep`` (``step.py``) unscales and checks its gradients
and steps or skips it; the end of the iteration moves the scale by its rule
(``loss_scale.py``) and tells every monitor (``monitoring.py``). Code outside the core
reaches a scaler through its public API and ``PADDLE_CONTRACT`` only (a test reads its
source to keep it so); a face that subclasses it may override ``SUBCLASS_HOOKS``.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import paddle
from paddle import Tensor
from paddle.amp.auto_cast import amp_global_state
from paddle.amp.grad_scaler import OptimizerState

from . import distributed, kernels, optimizers, rules, validation
from .loss_scale import LossScale
from .monitor import IterationEnd
from .monitoring import Monitors, OnStuck, ScalerStats
from .pickling import TensorsOnHost
from .reports import OverflowEntry, UnderflowEntry, UnderflowReading
from .rules import Rule, rule_from_arguments
from .state_dict import parse_state_dict, saved_state
from .step import SKIPPED, OptimizerStep, Stepping, Verdict

# Paddle's private fields, as its trainers and distributed wrappers use them (API.md, "Drop-in").
PADDLE_CONTRACT = (
    "_scale",
    "_enable",
    "_use_dynamic_loss_scaling",
    "_unscale",
    "_found_inf",
    "_temp_found_inf_value_false",
    "_optimizer_states",
    "_cache_found_inf",
)
# What a subclass (a face) may override: docs/architecture.md, "What a face may use".
SUBCLASS_HOOKS = ("_nothing_checked", "_repr_fields")


class AmpScaler(TensorsOnHost):
    """Dynamic loss scaling for Paddle dygraph, with the API of Paddle's ``AmpScaler``.

    Once per iteration the scale moves by its rule (``policy``); a step whose gradients hold inf/nan
    leaves parameters and optimizer state untouched. ``scale``, ``unscale_``, ``minimize``, ``step``
    and ``update`` never wait for the device; the getters, ``stats`` and ``state_dict`` read it.

    Args:
        enable: False makes every method a pass-through (``scale`` returns the loss).
        init_loss_scaling: the first scale.
        incr_ratio: the factor of a growth (> 1).
        decr_ratio: the factor of a back-off (between 0 and 1).
        incr_every_n_steps: finite iterations in a row before a growth.
        decr_every_n_nan_or_inf: iterations with inf/nan in a row before a back-off.
        use_dynamic_loss_scaling: False keeps the scale fixed (inf/nan steps still skip).
        policy: how the dynamic scale moves: ``"interval"`` (Paddle's rule) or
            ``"headroom"`` (fits the scale to the measured peak of the gradients, a bit
            below float16's ceiling; ``incr_every_n_steps`` holds off a level that overflowed).
        min_loss_scaling: the scale's floor (default 1.0; one below 1.0 is honoured too).
        max_loss_scaling: the scale's ceiling (default None: float32's largest value).
        place: the scale's device, a device string or a Paddle place (default: the current one).
        stuck_after: after this many skipped iterations in a row, apply ``on_stuck``, whose
            message names the cause: a loss already inf/nan before scaling, or gradients
            that overflow at every scale (default 200: one device read every 100
            iterations; None: never, and no read at all).
        on_stuck: ``"warn"`` (one ``RuntimeWarning`` per streak, from rank 0), ``"raise"``
            (``LossScaleStuckError``) or a callable taking ``ScalerStats``.
        report_overflows: count inf and nan per gradient, for ``overflow_report`` and a
            log line per skipped iteration (one read per iteration): True, or the model,
            whose names (``encoder.0.weight``) both then use, not Paddle's (``linear_0.w_0``).
        measure_every: measure the scaled gradients (no read) in iterations 1 to 3 and every
            ``measure_every``-th, for ``stats()`` and ``underflow_report``. None: every 64th under
            ``"headroom"``, which fits to it; off under ``"interval"`` (Paddle's cost per step).
        group: the ``paddle.distributed`` group whose ranks agree on verdicts (None: every rank).
        sync_found_inf: False skips that agreement, for ranks with identical gradients.
    """

    @validation.keywords_checked
    def __init__(
        self,
        enable: bool = True,
        init_loss_scaling: float = 2.0**15,
        incr_ratio: float = 2.0,
        decr_ratio: float = 0.5,
        incr_every_n_steps: int = 1000,
        decr_every_n_nan_or_inf: int = 1,
        use_dynamic_loss_scaling: bool = True,
        *,
        policy: str = "interval",
        min_loss_scaling: float = 1.0,
        max_loss_scaling: float | None = None,
        place: Any = None,
        stuck_after: int | None = 200,
        on_stuck: OnStuck = "warn",
        report_overflows: Any = False,
        measure_every: int | None = None,
        group: Any = None,
        sync_found_inf: bool = True,
    ) -> None:
        self._enable = validation.check_bool(enable, "enable")

        # The rule, and the scale it moves on the device.
        rule = rule_from_arguments(
            policy,
            incr_ratio,
            decr_ratio,
            incr_every_n_steps,
            decr_every_n_nan_or_inf,
            min_loss_scaling,
            max_loss_scaling,
            measure_every,
        )
        dynamic = validation.check_bool(use_dynamic_loss_scaling, "use_dynamic_loss_scaling")
        self._use_dynamic_loss_scaling = rules.check_fixable(rule, dynamic)
        self._loss_scale = LossScale(rule, init_loss_scaling, place)
        self._init_loss_scaling = float(init_loss_scaling)
        place = self._loss_scale.scale.place

        # Paddle's names for the verdict of the last unscale and its flag for "none found".
        self._temp_found_inf_value_false = paddle.to_tensor([False], place=place)
        self._found_inf: Any = self._temp_found_inf_value_false
        self._cache_found_inf: Any = None
        self._optimizer_states: defaultdict[int, OptimizerStep] = defaultdict(OptimizerStep)

        # What watches the run, and what every optimizer's step takes from the scaler.
        self._monitors = Monitors(self._loss_scale, report_overflows, stuck_after, on_stuck)
        sync = distributed.FoundInfSync(group, sync_found_inf)
        looking = self._monitors.looking
        self._stepping = Stepping(self._loss_scale, looking, sync, self._found_inf)

    # What a repr leaves out: each option at the value the constructor gives it by default.
    _option_defaults = validation.keyword_defaults(__init__)

    @property
    def _scale(self) -> Tensor:
        """The current scale, float32 [1] on the device (Paddle's name for it)."""
        return self._loss_scale.scale

    @_scale.setter
    def _scale(self, scale: Tensor) -> None:
        self._loss_scale.scale = scale

    @property
    def _iteration(self) -> int:
        """The number of the iteration under way, from 1."""
        return self._monitors.run.iterations + 1

    @property
    def policy(self) -> str:
        """How the dynamic scale moves: ``"interval"`` or ``"headroom"``.

        Read-only: a loaded state dict saved under the other policy changes it, with a warning.
        """
        return self._loss_scale.rule.name

    @property
    def measure_every(self) -> int | None:
        """Every how many iterations the scaled gradients are measured (after the first
        three), or None where nothing is measured. Read-only: it is set at construction.
        """
        return self._loss_scale.rule.measure_every

    # -- Paddle's steps ------------------------------------------------------------------

    def scale(self, var: Tensor) -> Tensor:
        """Return ``var * scale`` (float32, or float64 for a float64 ``var``), same shape."""
        if not isinstance(var, Tensor):
            raise TypeError(f"scale() takes a paddle.Tensor as var, got {type(var).__name__}")

        # bfloat16 has float32's exponent range: no gradient underflows, scaling only costs time.
        # Paddle's also switches off outside auto_cast (global dtype float32); this one does not.
        bfloat16 = amp_global_state().amp_dtype == "bfloat16"
        if bfloat16 and self._enable and self._use_dynamic_loss_scaling:
            warnings.warn(
                "dynamic loss scaling is not needed under auto_cast(dtype='bfloat16'); the scaler "
                "switches itself off (is_enable() and is_use_dynamic_loss_scaling() are now False)",
                UserWarning,
                stacklevel=2,
            )
            self._enable = self._use_dynamic_loss_scaling = False

        if not self._enable or not var._is_initialized():
            return var

        # Whether the loss was finite before scaling: a skip tells its cause by it.
        self._monitors.run.loss_seen(var)
        return kernels.scaled(var, self._loss_scale.scale)

    def unscale_(self, optimizer: Any) -> None:
        """Divide the optimizer's gradients by the scale in place and check them for inf/nan,
        to clip or inspect true values: at most once per optimizer per iteration, before
        ``step``.
        """
        optimizers.check_optimizer(optimizer, "unscale_")
        if not self._enable:
            optimizers.refuse_without_parameters(optimizer)
            return

        step = self._optimizer_states[id(optimizer)]
        if "_unscale" in vars(self):
            self._unscale_replaced(step, optimizer)
        else:
            step.unscale(optimizer, self._stepping, self._iteration)
        self._found_inf = cast(Verdict, step.verdict).flag

    def minimize(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """Unscale (unless done), ``optimizer.minimize(*args, **kwargs)`` unless inf/nan was
        found, then update the scale.

        Returns what that returned, or ``(None, None)`` where the scaler skipped the call
        (for an optimizer that takes no found-inf flag).
        """
        optimizers.check_optimizer(optimizer, "minimize", "minimize")
        result = self.step_optimizer(
            optimizer, lambda: optimizer.minimize(*args, **kwargs), skipped=(None, None)
        )
        self.end_iteration()
        return result

    def _unscale(self, optimizer: Any) -> None:
        """Unscale and check one optimizer's gradients, the verdict in ``_found_inf``.

        Paddle's name, reached through the instance: wrappers replace it (fleet's
        ``distributed_scaler``), and ``_unscale_replaced`` then lets the replacement decide.
        """
        if self._enable:
            step = self._optimizer_states[id(optimizer)]
            step.unscale(optimizer, self._stepping, self._iteration)
            self._found_inf = cast(Verdict, step.verdict).flag

    def _unscale_replaced(self, step: OptimizerStep, optimizer: Any) -> None:
        # A replaced _unscale (fleet's, shard_scaler's) neither counts nor measures: the
        # monitors see the gradients first, and the step adopts its verdict.
        amax = step.show_before_replaced_unscale(optimizer, self._stepping, self._iteration)
        self._unscale(optimizer)
        step.adopt(self._found_inf, amax, self._stepping)

    # -- For the faces: another framework's step, update and back-off --------------------

    def step_optimizer(
        self,
        optimizer: Any,
        run_step: Callable[[], Any],
        *,
        skipped: Any = None,
        grads: Sequence[Tensor] | None = None,
    ) -> Any:
        """Step or skip one optimizer, as every face's step does: unscale its gradients unless
        done (or check the true gradients ``grads`` a caller computed instead), then call
        ``run_step()`` so that it changes nothing if they hold inf/nan.

        Returns what ``run_step()`` returned, or ``skipped`` where it was not called.
        """
        if not self._enable:
            optimizers.refuse_without_parameters(optimizer)
            return run_step()

        step = self._optimizer_states[id(optimizer)]
        if grads is not None:
            step.check_given(grads, self._stepping, self._iteration)
        elif step.stage is not OptimizerState.INIT:
            # Past unscale_() it steps; stepped already, it is refused.
            step.refuse_step()
        elif "_unscale" in vars(self):
            self._unscale_replaced(step, optimizer)
        else:
            step.unscale(optimizer, self._stepping, self._iteration)

        if not step.checked:
            try:
                self._nothing_checked(optimizer)
            except BaseException:
                # A face that refuses the step leaves the optimizer as if never touched.
                del self._optimizer_states[id(optimizer)]
                raise

        result = step.run(optimizer, run_step, self._stepping)
        verdict = cast(Verdict, step.verdict)
        self._found_inf = verdict.flag
        self._cache_found_inf = verdict.flag if verdict.on_host is None else verdict.on_host
        return skipped if result is SKIPPED else result

    def end_iteration(
        self, *, found: Tensor | None = None, new_scale: float | Tensor | None = None
    ) -> bool:
        """End the iteration: the one path into the update, for every face.

        Joins the verdicts of the optimizers stepped since the last end, or takes ``found``
        (a bool [1] tensor) from a face that decided it; moves the scale by the rule, or to
        ``new_scale`` (PyTorch's ``update(new_scale)``: the counters are kept); then tells
        every monitor. An iteration with nothing checked ends uncounted.

        Returns False, changing nothing but the scale, if there is no iteration to end (no
        ``found``, no optimizer stepped): misuse, which each face words its own way.
        """
        if not self._enable:
            return True
        if new_scale is not None:
            self._loss_scale.set_scale(new_scale, "new_scale")

        stepped = [s for s in self._optimizer_states.values() if s.stage is OptimizerState.STEPPED]
        if found is None and not stepped:
            return False
        self._optimizer_states = defaultdict(OptimizerStep)

        verdict = Verdict(found) if found is not None else Verdict.of_steps(stepped)
        if verdict is None:
            # Nothing was observed: nothing for the rule, nothing to count, and its losses
            # are not the next iteration's.
            self._monitors.run.loss_finite = None
            return True

        loss_finite = self._monitors.run.loss_finite
        if loss_finite is not None:
            verdict = verdict._replace(loss_finite=loss_finite)

        iteration = self._iteration
        acted: bool | Tensor = False
        if new_scale is None and self._use_dynamic_loss_scaling:
            acted = self._loss_scale.update(verdict, iteration)

        self._monitors.end_iteration(IterationEnd(iteration, verdict, acted, self.stats))
        return True

    def set_backoff_divisor(self, divisor: float) -> None:
        """Back off by dividing the scale by ``divisor`` (> 1), rather than multiplying it by
        ``decr_ratio``, as MindSpore's ``DynamicLossScaler`` does: ``scale / 3`` and
        ``scale * float32(1 / 3)`` differ in the last bit.
        """
        backoff_divisor = validation.check_incr_ratio(divisor, "divisor")
        self._loss_scale.change_rule(backoff_divisor=backoff_divisor)

    def _nothing_checked(self, optimizer: Any) -> None:
        """Called when no parameter of ``optimizer`` has a gradient this iteration: warns and
        steps it, as Paddle's scalers do. A face may raise to refuse it, the optimizer then
        untouched.
        """
        warnings.warn(
            f"step(): no parameter of this {type(optimizer).__name__} has a gradient (no "
            "backward() since its gradients were cleared?), so nothing was checked; it is "
            "stepped, as Paddle's scaler steps it, but the iteration neither counts in "
            "stats() nor moves the scale. Call scaler.scale(loss).backward() first",
            UserWarning,
            stacklevel=4,
        )

    def _repr_fields(self) -> dict[str, Any]:
        """The numbers a repr shows first, by name (a face shows its framework's names)."""
        rule = self._loss_scale.rule
        return {
            "scale": self.get_loss_scaling(),
            "incr_count": self.get_incr_count(),
            "decr_count": self.get_decr_count(),
            "incr_ratio": rule.incr_ratio,
            "decr_ratio": rule.decr_ratio,
            "incr_every_n_steps": rule.incr_every_n_steps,
            "decr_every_n_nan_or_inf": rule.decr_every_n_nan_or_inf,
        }

    # -- Paddle's getters and setters ---------------------------------------------------
    # Each read is a device sync, outside a step: the scaler itself never reads.

    @property
    def _rule(self) -> Rule:
        return self._loss_scale.rule

    def is_enable(self) -> bool:
        return self._enable

    def is_use_dynamic_loss_scaling(self) -> bool:
        return self._use_dynamic_loss_scaling

    def get_loss_scaling(self) -> float:
        """The current scale (reads the device); 1.0 when disabled."""
        return kernels.read_numbers(self._loss_scale.scale)[0] if self._enable else 1.0

    def get_init_loss_scaling(self) -> float:
        return self._init_loss_scaling if self._enable else 1.0

    def set_init_loss_scaling(self, new_init_loss_scaling: float) -> None:
        """Set the initial scale, and the current scale with it (within the bounds)."""
        scale = self._loss_scale.set_scale(new_init_loss_scaling, "new_init_loss_scaling")
        self._init_loss_scaling = scale

    def get_incr_ratio(self) -> float:
        return self._rule.incr_ratio

    def set_incr_ratio(self, new_incr_ratio: float) -> None:
        """Set the factor of a growth.

        Under ``"headroom"``: the step in which the fit moves the scale, either way (it
        moves by whole powers of it).
        """
        ratio = validation.check_incr_ratio(new_incr_ratio, "new_incr_ratio")
        self._loss_scale.change_rule(incr_ratio=ratio)

    def get_decr_ratio(self) -> float:
        return self._rule.decr_ratio

    def set_decr_ratio(self, new_decr_ratio: float) -> None:
        """Set the factor of a back-off, under either policy.

        Under ``"headroom"`` an overflow in the first three iterations backs off several
        such steps at once.
        """
        ratio = validation.check_decr_ratio(new_decr_ratio, "new_decr_ratio")
        self._loss_scale.change_rule(decr_ratio=ratio)

    def get_incr_every_n_steps(self) -> int:
        return self._rule.incr_every_n_steps

    def set_incr_every_n_steps(self, new_incr_every_n_steps: int) -> None:
        """Under ``"interval"``: set the growth period; a streak already that long grows at
        the next finite step.

        Under ``"headroom"``, which grows by what it measures: how long a scale that
        overflowed is held off, a growth each that many iterations.
        """
        name = "new_incr_every_n_steps"
        period = validation.check_period(new_incr_every_n_steps, name, integral_float=True)
        self._loss_scale.change_rule(incr_every_n_steps=period)

    def get_decr_every_n_nan_or_inf(self) -> int:
        return self._rule.decr_every_n_nan_or_inf

    def set_decr_every_n_nan_or_inf(self, new_decr_every_n_nan_or_inf: int) -> None:
        """Set the back-off period, under either policy; a streak already that long backs
        off at the next inf/nan.
        """
        name = "new_decr_every_n_nan_or_inf"
        period = validation.check_period(new_decr_every_n_nan_or_inf, name, integral_float=True)
        self._loss_scale.change_rule(decr_every_n_nan_or_inf=period)

    def get_incr_count(self) -> int:
        """Finite steps since the last increase or inf/nan step; under ``"headroom"``,
        since the last inf/nan step (may read the device).
        """
        return self._loss_scale.counters()[0]

    def set_incr_count(self, new_incr_count: int) -> None:
        """Set the count of finite steps: under ``"interval"`` a growth comes when it
        reaches ``incr_every_n_steps``; under ``"headroom"`` it only counts.
        """
        limit, name = self._rule.incr_count_limit, "incr_every_n_steps"
        count = validation.check_count(new_incr_count, "new_incr_count", limit, name)
        self._loss_scale.set_counters(count, self._loss_scale.counters()[1])

    def get_decr_count(self) -> int:
        """Inf/nan steps since the last decrease or finite step (may read the device)."""
        return self._loss_scale.counters()[1]

    def set_decr_count(self, new_decr_count: int) -> None:
        """Set the count of inf/nan steps in a row, under either policy: a back-off comes
        when it reaches ``decr_every_n_nan_or_inf``.
        """
        period, name = self._rule.decr_every_n_nan_or_inf, "decr_every_n_nan_or_inf"
        count = validation.check_count(new_decr_count, "new_decr_count", period, name)
        self._loss_scale.set_counters(self._loss_scale.counters()[0], count)

    # -- What the run did, saved and loaded ----------------------------------------------

    def stats(self) -> ScalerStats:
        """``ScalerStats`` of the run: counts, scale, headroom where measured (one device read)."""
        if not self._enable:
            return ScalerStats(0, 0, 0, None, 0, 0, scale=1.0)

        return self._monitors.read(self._loss_scale)[1]

    def last_step_skipped(self) -> bool:
        """Whether the most recent iteration skipped its step (reads the device); False
        before the first. For an LR scheduler that must not advance on skipped steps.
        """
        return self.stats().skip_streak > 0

    def state_dict(self) -> dict[str, Any]:
        """The scaler's state in Paddle's format (reads the device); ``{}`` when disabled."""
        if not self._enable:
            return {}

        memory, stats, measured = self._monitors.read(self._loss_scale)
        run = self._monitors.run.state(stats)
        return saved_state(self._rule, memory, run, self._use_dynamic_loss_scaling, measured)

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load a state dict of this package's, Paddle's or PyTorch's scaler, whose scale
        becomes the initial one too, as in Paddle.

        A bad one raises ``ValueError`` naming the key, and changes nothing.
        """
        if not self._enable:
            return
        if isinstance(state_dict, Mapping) and len(state_dict) == 0:
            raise RuntimeError(
                "load_state_dict() got an empty dict, which is what a disabled scaler "
                "saves; load it into a scaler built with enable=False, or pass the "
                "state_dict of an enabled one"
            )

        # Checked whole before anything changes.
        loaded = parse_state_dict(state_dict)
        rule = loaded.rule_over(self._rule)
        self._init_loss_scaling = loaded.scale_within(rule.min_scale, rule.max_scale)

        self._loss_scale.load(rule, loaded.memory_at(rule, self._init_loss_scaling))
        self._use_dynamic_loss_scaling = loaded.use_dynamic_loss_scaling
        self._monitors.load(loaded.stats, loaded.nonfinite_streak, loaded.measured, loaded.scale)

    def overflow_report(self, model: Any = None) -> list[OverflowEntry]:
        """The gradients that held inf or nan in the most recent iteration that found any
        (empty if none has), most elements first, counted before unscaling.

        Named as in ``model.named_parameters()`` when ``model`` is given (``ValueError``
        for a model that holds none of the parameters), else by ``param.name``. Needs
        ``report_overflows``.
        """
        return self._monitors.overflow_report(model)

    def underflow_report(self, model: Any = None) -> list[UnderflowEntry]:
        """Each gradient as the last finite measured iteration found it (reads the device):
        its share of nonzero elements in float16's subnormal range and its headroom at the
        current scale, lowest first and those all subnormal (noise) last, named as by
        ``overflow_report`` (a model that holds none of the parameters is refused); empty
        before any measurement.

        Needs ``measure_every`` (or the headroom policy, which measures).
        """
        return self._monitors.underflow_report(model)

    def losing_gradients(self) -> UnderflowReading:
        """Whether the run loses gradients at float16's floor, and what to do: the recipe of
        the docs applied to the subnormal share over the last measured iterations and to
        the headroom at the current scale (reads the device). Needs ``measure_every`` (or
        the headroom policy, which measures).
        """
        return self._monitors.losing_gradients(self._loss_scale)

    def check_consistency(self) -> None:
        """Raise ``RuntimeError`` naming the ranks whose scale, counters or statistics
        differ from the first rank's. A collective debugging aid that reads the device:
        every rank of the scaler's group must call it.
        """
        if self._enable:
            distributed.check_consistency(self, self._stepping.sync.group)

    def __getstate__(self) -> dict[str, Any]:
        """Pickle or deep-copy between iterations only, as in PyTorch: a step holds live objects."""
        steps = self._optimizer_states.values()
        if any(step.stage is not OptimizerState.INIT for step in steps):
            raise RuntimeError(
                "a scaler may only be pickled (or deep-copied) at the beginning of an "
                "iteration, or at the end after scaler.update(); it was pickled after "
                "unscale_() or step(): call scaler.update() first"
            )

        return super().__getstate__()

    def __repr__(self) -> str:
        """Scale, counters, ratios and periods (reads the device), then options not at defaults."""
        if not self._enable:
            return f"{type(self).__name__}(enable=False)"

        rule = self._rule
        # The period is shown where it is not the policy's own.
        period = rule.measure_every
        options = {
            "use_dynamic_loss_scaling": self._use_dynamic_loss_scaling,
            "policy": rule.name,
            "min_loss_scaling": rule.min_scale,
            "max_loss_scaling": rule.max_scale,
            "stuck_after": self._monitors.stuck_policy.stuck_after,
            "on_stuck": self._monitors.stuck_policy.on_stuck,
            "report_overflows": self._monitors.overflows is not None,
            "measure_every": None if period == type(rule).measure_every else period,
            "group": self._stepping.sync.group,
            "sync_found_inf": self._stepping.sync.enabled,
        }

        fields = self._repr_fields()
        fields.update((k, v) for k, v in options.items() if v != self._option_defaults[k])
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in fields.items())})"


class GradScaler(AmpScaler):
    """``AmpScaler`` with ``minimize`` split: ``step(optimizer)`` for each, then ``update()`` once.

    The same arguments as ``AmpScaler``, with Paddle's ``GradScaler`` defaults:
    ``init_loss_scaling=2.0**16`` and ``incr_every_n_steps=2000``.
    """

    # Written out, as Paddle's is: help() and inspect show GradScaler's own defaults.
    @validation.keywords_checked
    def __init__(
        self,
        enable: bool = True,
        init_loss_scaling: float = 2.0**16,
        incr_ratio: float = 2.0,
        decr_ratio: float = 0.5,
        incr_every_n_steps: int = 2000,
        decr_every_n_nan_or_inf: int = 1,
        use_dynamic_loss_scaling: bool = True,
        *,
        policy: str = "interval",
        min_loss_scaling: float = 1.0,
        max_loss_scaling: float | None = None,
        place: Any = None,
        stuck_after: int | None = 200,
        on_stuck: OnStuck = "warn",
        report_overflows: Any = False,
        measure_every: int | None = None,
        group: Any = None,
        sync_found_inf: bool = True,
    ) -> None:
        arguments = locals()  # every argument, forwarded by AmpScaler's names (the same)
        super().__init__(**{name: arguments[name] for name in self._option_defaults})

    def step(self, optimizer: Any) -> None:
        """Unscale (unless done), then ``optimizer.step()`` unless inf/nan was found."""
        optimizers.check_optimizer(optimizer, "step")
        self.step_optimizer(optimizer, optimizer.step)

    def update(self) -> None:
        """Update the scale once for this iteration: backs off if any stepped optimizer
        found inf/nan. Call it after the last ``step()`` of every iteration.
        """
        if not self.end_iteration():
            raise RuntimeError(
                "update() was called with no step() since the last update(); call "
                "scaler.step(optimizer) for each optimizer first, then update() once"
            )
