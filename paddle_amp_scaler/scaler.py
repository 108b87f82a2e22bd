"""AmpScaler and GradScaler: the per-iteration state machine around Paddle's AMP kernels."""

from __future__ import annotations

import logging
import warnings
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any, TypedDict

import paddle
from paddle import Tensor
from paddle.amp.auto_cast import amp_global_state
from paddle.amp.grad_scaler import OptimizerState

from . import distributed, kernels, optimizers, validation
from .overflow_report import OverflowEntry, OverflowRecorder
from .pickling import TensorsOnHost
from .state import ScalerState, parse_state_dict
from .statistics import OnStuck, RunCounters, ScalerStats, StuckPolicy

logger = logging.getLogger("paddle_amp_scaler")


class _OptimizerRecord(TypedDict):
    """What the scaler knows about one optimizer during an iteration (Paddle's keys)."""

    state: Any  # an OptimizerState
    found_inf: Any  # a bool tensor [1], or a host bool/int written by a wrapper
    grads: list[Tensor | None] | None  # in the optimizer's parameter order
    # Whether any gradient was there to check: an optimizer stepped with none (no
    # backward() since its gradients were cleared) tells the update rule nothing.
    checked: bool
    # (flag, its value) where the unscale knew its verdict on the host with no read.
    host_verdict: tuple[Tensor, bool] | None


def _fresh_optimizer_state() -> _OptimizerRecord:
    # A module-level factory, like Paddle's and PyTorch's, so that a scaler holding a
    # defaultdict of these can be pickled and deep-copied.
    return {
        "state": OptimizerState.INIT,
        "found_inf": None,
        "grads": None,
        "checked": True,  # what a replaced _unscale, which does not say, is taken to have done
        "host_verdict": None,
    }


def _read_number(tensor: Tensor) -> float:
    """The value of a one-element device tensor: a device sync, for getters and
    state_dict only."""
    return float(tensor.numpy().reshape(-1)[0])


class AmpScaler(TensorsOnHost):
    """Dynamic loss scaling for Paddle dygraph, with the API of Paddle's ``AmpScaler``.

    Once per iteration, with ``found`` = any inf/nan among the unscaled gradients::

        if found:
            incr_count = 0; decr_count += 1
            if decr_count == decr_every_n_nan_or_inf:
                scale = max(scale * decr_ratio, 1.0); decr_count = 0
        else:
            decr_count = 0; incr_count += 1
            if incr_count == incr_every_n_steps:
                scale *= incr_ratio  # unless that overflows float32
                incr_count = 0

    and a step with ``found`` set leaves parameters and optimizer state untouched.

    The scale, both counters and the found-inf flag are tensors on the device, updated
    there by Paddle's ``check_finite_and_unscale`` and ``update_loss_scaling`` kernels:
    ``scale``, ``unscale_``, ``minimize``, ``step`` and ``update`` never wait for the
    device. The getters, ``stats`` and ``state_dict`` read it back, a device sync.

    Keyword-only options, after Paddle's arguments: ``min_loss_scaling`` (default 1.0;
    values below 1.0 are honoured too) and ``max_loss_scaling`` (default None: float32's
    largest value) bound the scale on the device, with no read; ``place`` (where the scale and
    counters live: a device string such as ``"gpu:1"`` or a Paddle place; default
    Paddle's current device), ``stuck_after`` and ``on_stuck`` (when ``stuck_after``
    consecutive iterations or more were skipped: ``"warn"`` once per streak, ``"raise"``
    :class:`LossScaleStuckError`, or call a function with :meth:`stats`; the streak is
    read once every ``min(stuck_after, 100)`` iterations, the only read in a step),
    ``report_overflows`` (count inf and nan per gradient, for :meth:`overflow_report`
    and a log line per skipped iteration: one device read per iteration), ``group`` and
    ``sync_found_inf`` (when ``paddle.distributed`` runs more than one rank, each
    unscale's found-inf flag is reduced over ``group``, default every rank, on the
    device, so that all ranks skip alike; ``sync_found_inf=False`` turns that off).
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
        min_loss_scaling: float = 1.0,
        max_loss_scaling: float | None = None,
        place: Any = None,
        stuck_after: int | None = None,
        on_stuck: OnStuck = "warn",
        report_overflows: bool = False,
        group: Any = None,
        sync_found_inf: bool = True,
    ) -> None:
        self._enable = validation.check_bool(enable, "enable")
        self._bounds = validation.check_bounds(min_loss_scaling, max_loss_scaling)
        self._init_loss_scaling = validation.check_within(
            validation.check_scale(init_loss_scaling, "init_loss_scaling"),
            "init_loss_scaling",
            self._bounds,
        )
        self._incr_ratio = validation.check_incr_ratio(incr_ratio)
        self._decr_ratio = validation.check_decr_ratio(decr_ratio)
        # Paddle's scaler takes the periods unchecked, so code may give 1000.0.
        self._incr_every_n_steps = validation.check_period(
            incr_every_n_steps, "incr_every_n_steps", integral_float=True
        )
        self._decr_every_n_nan_or_inf = validation.check_period(
            decr_every_n_nan_or_inf, "decr_every_n_nan_or_inf", integral_float=True
        )
        self._use_dynamic_loss_scaling = validation.check_bool(
            use_dynamic_loss_scaling, "use_dynamic_loss_scaling"
        )

        place = validation.check_place(place)
        try:
            self._scale = paddle.to_tensor([self._init_loss_scaling], dtype="float32", place=place)
        # Paddle's words for a device it cannot use; a bare "gpu" without CUDA fails inside
        # Paddle's own message with an AttributeError.
        except (ValueError, AttributeError) as error:
            raise ValueError(f"place {place!r} cannot be used here: {error}") from None
        self._incr_count = paddle.to_tensor([0], dtype="int32", place=place)
        self._decr_count = paddle.to_tensor([0], dtype="int32", place=place)
        self._temp_found_inf_value_false = paddle.to_tensor([False], place=place)
        self._found_inf: Any = self._temp_found_inf_value_false
        self._cache_found_inf: Any = None
        self._optimizer_states: defaultdict[int, _OptimizerRecord] = defaultdict(
            _fresh_optimizer_state
        )
        # Stands in for update_loss_scaling's gradient list, which may not be empty.
        self._update_scratch = paddle.to_tensor([0.0], dtype="float32", place=place)
        self._run = RunCounters(self._scale.place)
        self._stuck_policy = StuckPolicy(stuck_after, on_stuck)
        self._overflows = (
            OverflowRecorder()
            if validation.check_bool(report_overflows, "report_overflows")
            else None
        )
        self._sync = distributed.FoundInfSync(group, sync_found_inf)
        if self._enable:
            # Loads (or, once per machine, builds) the CPU kernel now, so that neither the
            # build nor its self-check lands inside a training step.
            kernels.default_unscale_path(self._scale.place)

    # -- the training step ------------------------------------------------------------

    def scale(self, var: Tensor) -> Tensor:
        """Return ``var * scale`` (float32, or float64 for a float64 ``var``), same shape."""
        if not isinstance(var, Tensor):
            raise TypeError(f"scale() takes a paddle.Tensor as var, got {type(var).__name__}")
        self._switch_off_for_bfloat16()
        if not self._enable or not var._is_initialized():
            return var
        return kernels.scaled(var, self._scale)

    def unscale_(self, optimizer: Any) -> None:
        """Divide the optimizer's gradients by the scale in place and check them for inf/nan.

        Call it at most once per optimizer per iteration, before ``step``; it is what
        lets you clip or inspect true gradient values.
        """
        if not self._enable:
            optimizers.refuse_without_parameters(optimizer)
            return
        state = self._optimizer_states[id(optimizer)]
        _refuse_unscale_in(state["state"])
        self._unscale_and_record(optimizer, state)

    def minimize(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """Unscale (unless done), ``optimizer.minimize(*args, **kwargs)`` unless inf/nan
        was found, then update the scale. Returns what ``optimizer.minimize`` returned, or
        ``(None, None)`` where the scaler skipped the call (on a CPU, or for an optimizer
        that takes no found-inf flag)."""
        return self._step_and_update(
            optimizer, lambda: optimizer.minimize(*args, **kwargs), skipped=(None, None)
        )

    # -- hooks that Paddle's distributed wrappers replace or read --------------------

    def _unscale(self, optimizer: Any) -> None:
        """Unscale and check one optimizer's gradients; the verdict goes to ``_found_inf``.

        ``unscale_``, ``step`` and ``minimize`` call this through the instance, so a
        wrapper that replaces it (fleet's ``distributed_scaler`` does) takes effect.
        """
        if not self._enable:
            return
        state = self._optimizer_states[id(optimizer)]
        _refuse_unscale_in(state["state"])
        params = optimizers.parameters_of(optimizer)
        grads = state["grads"] = kernels.grads_of(params)
        state["checked"] = any(grad is not None for grad in grads)
        if self._overflows is None:
            verdict = kernels.unscale_and_decide_(
                grads, self._scale, self._temp_found_inf_value_false
            )
        else:
            verdict = self._overflows.unscale_and_count_(
                params, grads, self._scale, self._temp_found_inf_value_false
            )
        self._take_verdict(state, *verdict)
        state["state"] = OptimizerState.UNSCALED

    # -- internals ----------------------------------------------------------------

    def _switch_off_for_bfloat16(self) -> None:
        # bfloat16 has float32's exponent range: gradients do not underflow, and scaling
        # only costs time. Paddle's scaler also switches off when no auto_cast was
        # entered at all (the global dtype then reads float32); this one does not.
        if (
            self._enable
            and self._use_dynamic_loss_scaling
            and amp_global_state().amp_dtype == "bfloat16"
        ):
            warnings.warn(
                "dynamic loss scaling is not needed under auto_cast(dtype='bfloat16'); "
                "the scaler switches itself off (is_enable() and "
                "is_use_dynamic_loss_scaling() are now False)",
                UserWarning,
                stacklevel=3,
            )
            self._enable = False
            self._use_dynamic_loss_scaling = False

    def _unscale_and_record(self, optimizer: Any, state: _OptimizerRecord) -> None:
        self._unscale(optimizer)
        # A replaced _unscale may neither mark the state nor keep per-optimizer verdicts.
        state["found_inf"] = self._found_inf
        state["state"] = OptimizerState.UNSCALED

    def _step(self, optimizer: Any, run_step: Callable[[], Any], skipped: Any = None) -> Any:
        """Unscale ``optimizer``'s gradients unless done, then ``run_step()`` so that it
        changes nothing if they hold inf/nan. Returns what ``run_step`` returned, or
        ``skipped`` when the scaler skipped it without calling it.

        The one step of every public face: ``step``, ``minimize``, the dialects.
        """
        if not self._enable:
            optimizers.refuse_without_parameters(optimizer)
            return run_step()
        state = self._optimizer_states[id(optimizer)]
        self._prepare_step(optimizer, state)
        if not state["checked"]:
            self._nothing_checked(optimizer)
        result = self._step_or_skip(optimizer, state, run_step)
        state["state"] = OptimizerState.STEPPED
        return skipped if result is _SKIPPED_ON_HOST else result

    def _step_and_update(
        self, optimizer: Any, run_step: Callable[[], Any], skipped: Any = None
    ) -> Any:
        """``_step``, then the scale update that ends the iteration."""
        result = self._step(optimizer, run_step, skipped)
        if self._enable:
            self._finish_iteration()
        return result

    def _check_given_gradients(self, optimizer: Any, grads: list[Tensor]) -> None:
        """Check gradients that hold true values (already unscaled) for ``optimizer``'s
        next step, in place of unscaling its parameters' gradients."""
        state = self._optimizer_states[id(optimizer)]
        _refuse_unscale_in(state["state"])
        state["grads"] = list(grads)
        state["checked"] = bool(state["grads"])
        # Multiplying by exactly 1 leaves every value as it is: the kernel only checks.
        self._take_verdict(
            state,
            *kernels.unscale_and_decide_(
                grads, paddle.ones_like(self._scale), self._temp_found_inf_value_false
            ),
        )
        state["found_inf"] = self._found_inf
        state["state"] = OptimizerState.UNSCALED

    def _nothing_checked(self, optimizer: Any) -> None:
        """None of ``optimizer``'s parameters has a gradient this iteration. Paddle's
        scalers step it all the same, and so does this one; the iteration is counted
        and moves the scale only if another optimizer checked gradients in it."""
        warnings.warn(
            f"step(): no parameter of this {type(optimizer).__name__} has a gradient (no "
            "backward() since its gradients were cleared?), so nothing was checked; it is "
            "stepped, as Paddle's scaler steps it, but the iteration neither counts in "
            "stats() nor moves the scale. Call scaler.scale(loss).backward() first",
            UserWarning,
            stacklevel=4,
        )

    def _take_verdict(
        self, state: _OptimizerRecord, found_inf: Tensor, found_on_host: bool | None
    ) -> None:
        """Make an unscale's flag the verdict (``_found_inf``), reduced over the ranks;
        keep its host value, if it had one, for the step to decide on."""
        # Before any rank decides: every rank then skips, updates and counts alike.
        self._found_inf = self._sync.reduce(found_inf)
        # A flag reduced over ranks is a new one, known on the device only.
        if found_on_host is not None and self._found_inf is found_inf:
            state["host_verdict"] = (found_inf, found_on_host)

    def _prepare_step(self, optimizer: Any, state: _OptimizerRecord) -> None:
        if state["state"] is OptimizerState.STEPPED:
            raise RuntimeError(
                "step() has already been called for this optimizer since the last "
                "update(); call scaler.update() once per iteration, after the last step()"
            )
        if state["state"] is OptimizerState.INIT:
            self._unscale_and_record(optimizer, state)

    def _step_or_skip(
        self, optimizer: Any, state: _OptimizerRecord, run_step: Callable[[], Any]
    ) -> Any:
        """Run ``run_step`` so that it changes nothing when this optimizer found inf/nan."""
        found_inf = state["found_inf"]
        self._found_inf = found_inf
        if not isinstance(found_inf, Tensor):
            # A wrapper's _unscale already brought the verdict to the host.
            self._cache_found_inf = bool(found_inf)
            return _SKIPPED_ON_HOST if found_inf else run_step()
        host_verdict = state["host_verdict"]
        if host_verdict is not None and host_verdict[0] is found_inf:
            # On a CPU the verdict came back with the unscale, with no read and nothing
            # to wait for: skipping on the host spares the optimizer reading the flag
            # through Tensor.__bool__. On a GPU the flag stays on the device.
            self._cache_found_inf = host_verdict[1]
            return _SKIPPED_ON_HOST if host_verdict[1] else run_step()

        if optimizers.zero_grads_make_no_update(optimizer):
            # A replaced _unscale (fleet's) leaves no gradient list behind.
            grads = state["grads"] or kernels.grads_of(optimizers.parameters_of(optimizer))
            kernels.zero_if_found_(
                grads, found_inf, self._scale, self._incr_count, self._decr_count
            )
            # A flag left over from another scaler would make Paddle read it.
            optimizer._set_auxiliary_var("found_inf", None)
            self._cache_found_inf = found_inf
            return run_step()
        taker = optimizers.flag_taker(optimizer)
        if taker is not None:
            taker._set_auxiliary_var("found_inf", found_inf)
            result = run_step()
            self._cache_found_inf = taker._get_auxiliary_var("found_inf")
            # Left set, the flag would also skip a later optimizer.step() made without
            # the scaler.
            taker._set_auxiliary_var("found_inf", None)
            return result
        # An optimizer that cannot be told to skip: the one host read API.md allows.
        _note_host_decision(type(optimizer))
        self._cache_found_inf = bool(found_inf)
        return _SKIPPED_ON_HOST if self._cache_found_inf else run_step()

    def _finish_iteration(self, update_scale: bool = True) -> None:
        """End the iteration: update the scale from every optimizer stepped since the last
        update (any inf/nan counts), count it, reset, then apply the stuck policy."""
        stepped = [
            state
            for state in self._optimizer_states.values()
            if state["state"] is OptimizerState.STEPPED
        ]
        if not any(state["checked"] for state in stepped):
            # Nothing was observed: no evidence for the rule, no iteration to count.
            self._start_new_iteration()
            return
        verdicts = [self._as_flag(state["found_inf"]) for state in stepped]
        found_inf = kernels.any_of(verdicts)
        dynamic = update_scale and self._use_dynamic_loss_scaling
        if dynamic:
            self._update_scale(found_inf)
        self._run.record_(found_inf, (self._incr_count, self._decr_count) if dynamic else None)
        self._start_new_iteration()
        if self._overflows is not None:
            self._overflows.end_iteration(self._run.iterations, found_inf)
        # Last, so that a LossScaleStuckError leaves a consistent, resumable scaler.
        self._stuck_policy.after_iteration(self._run, self.stats)

    def _any_stepped(self) -> bool:
        """Whether an optimizer was stepped since the last update."""
        return any(
            state["state"] is OptimizerState.STEPPED for state in self._optimizer_states.values()
        )

    def _start_new_iteration(self) -> None:
        self._optimizer_states = defaultdict(_fresh_optimizer_state)

    def _update_scale(self, found_inf: Tensor) -> None:
        """One step of the dynamic update rule, on the device, from a bool [1] verdict,
        kept within the bounds (no operation for the default ones).

        The counters move to the slots ``RunCounters`` hands out, which keeps the ones
        it has yet to count as they are.
        """
        lower, upper = self._bounds
        before = self._scale.clone() if lower < 1.0 else None
        self._incr_count, self._decr_count = kernels.update_scale_(
            found_inf,
            self._scale,
            self._incr_count,
            self._decr_count,
            self._run.next_slots(),
            self._update_scratch,
            incr_every_n_steps=self._incr_every_n_steps,
            decr_every_n_nan_or_inf=self._decr_every_n_nan_or_inf,
            incr_ratio=self._incr_ratio,
            decr_ratio=self._decr_ratio,
        )
        if before is not None:
            kernels.backoff_below_one_(
                self._scale, before, found_inf, self._decr_count, self._decr_ratio, lower
            )
        if lower > 1.0 or upper is not None:
            kernels.clip_(self._scale, lower, upper)

    def _as_flag(self, found_inf: Any) -> Tensor:
        if isinstance(found_inf, Tensor):
            return found_inf
        return paddle.to_tensor([bool(found_inf)], place=self._scale.place)

    # -- pickling ---------------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        """Pickle (or deep-copy) between iterations only, as PyTorch's scaler does: mid-way,
        the per-optimizer records point at gradients and optimizers of this process."""
        if any(
            state["state"] is not OptimizerState.INIT for state in self._optimizer_states.values()
        ):
            raise RuntimeError(
                "a scaler may only be pickled (or deep-copied) at the beginning of an "
                "iteration, or at the end after scaler.update(); it was pickled after "
                "unscale_() or step(): call scaler.update() first"
            )
        self._run.fold()
        return super().__getstate__()

    # -- getters and setters ------------------------------------------------------

    def is_enable(self) -> bool:
        return self._enable

    def is_use_dynamic_loss_scaling(self) -> bool:
        return self._use_dynamic_loss_scaling

    def stats(self) -> ScalerStats:
        """The run so far: iterations, skipped ones, the current skip streak, the last
        skipped iteration, growths, back-offs and the scale (one read of the device)."""
        if not self._enable:
            return ScalerStats.nothing_yet()
        return self._run.read(self._scale)

    def overflow_report(self, model: Any = None) -> list[OverflowEntry]:
        """The gradients that held inf or nan in the most recent iteration that found any
        (empty if none has), most elements first, counted before unscaling; named as in
        ``model.named_parameters()`` when ``model`` is given, else by ``param.name``."""
        if self._overflows is None:
            raise RuntimeError(
                "overflow_report() needs the per-gradient counts: build the scaler with "
                "report_overflows=True (one device read per iteration)"
            )
        return self._overflows.report(model)

    def check_consistency(self) -> None:
        """Raise ``RuntimeError`` naming the ranks whose scale, counters or statistics
        differ from the first rank's; nothing to compare in a single process.

        A debugging aid, not for every step: it reads the device and gathers from every
        rank of the scaler's group (each of them must call it too).
        """
        if not self._enable:
            return
        stats = self.stats()
        values = {
            "scale": stats.scale,
            "incr_count": self.get_incr_count(),
            "decr_count": self.get_decr_count(),
            "iterations": stats.iterations,
            "skipped": stats.skipped,
            "skip_streak": stats.skip_streak,
            "last_skipped": -1 if stats.last_skipped is None else stats.last_skipped,
            "growths": stats.growths,
            "backoffs": stats.backoffs,
        }
        distributed.check_consistency(self._sync.group, values)

    def last_step_skipped(self) -> bool:
        """Whether the most recent iteration skipped its step (reads the device); False
        before the first. For an LR scheduler that must not advance on skipped steps."""
        return self.stats().skip_streak > 0

    def get_loss_scaling(self) -> float:
        """The current scale (reads the device); 1.0 when disabled."""
        return _read_number(self._scale) if self._enable else 1.0

    def get_init_loss_scaling(self) -> float:
        return self._init_loss_scaling if self._enable else 1.0

    def set_init_loss_scaling(self, new_init_loss_scaling: float) -> None:
        """Set the initial scale, and the current scale with it (within the bounds)."""
        value = validation.check_within(
            validation.check_scale(new_init_loss_scaling, "new_init_loss_scaling"),
            "new_init_loss_scaling",
            self._bounds,
        )
        self._init_loss_scaling = value
        self._scale.fill_(value)

    def get_incr_ratio(self) -> float:
        return self._incr_ratio

    def set_incr_ratio(self, new_incr_ratio: float) -> None:
        self._incr_ratio = validation.check_incr_ratio(new_incr_ratio, "new_incr_ratio")

    def get_decr_ratio(self) -> float:
        return self._decr_ratio

    def set_decr_ratio(self, new_decr_ratio: float) -> None:
        self._decr_ratio = validation.check_decr_ratio(new_decr_ratio, "new_decr_ratio")

    def get_incr_every_n_steps(self) -> int:
        return self._incr_every_n_steps

    def set_incr_every_n_steps(self, new_incr_every_n_steps: int) -> None:
        """Set the growth period; a streak already that long grows at the next finite step."""
        period = validation.check_period(
            new_incr_every_n_steps, "new_incr_every_n_steps", integral_float=True
        )
        self._incr_every_n_steps = period
        self._run.fold()
        _clamp_below_(self._incr_count, period)

    def get_decr_every_n_nan_or_inf(self) -> int:
        return self._decr_every_n_nan_or_inf

    def set_decr_every_n_nan_or_inf(self, new_decr_every_n_nan_or_inf: int) -> None:
        """Set the back-off period; a streak already that long backs off at the next inf/nan."""
        period = validation.check_period(
            new_decr_every_n_nan_or_inf, "new_decr_every_n_nan_or_inf", integral_float=True
        )
        self._decr_every_n_nan_or_inf = period
        self._run.fold()
        _clamp_below_(self._decr_count, period)

    def get_incr_count(self) -> int:
        """Finite steps since the last increase or inf/nan step (reads the device)."""
        return int(_read_number(self._incr_count))

    def set_incr_count(self, new_incr_count: int) -> None:
        count = validation.check_count(
            new_incr_count, "new_incr_count", self._incr_every_n_steps, "incr_every_n_steps"
        )
        self._run.fold()
        self._incr_count.fill_(count)

    def get_decr_count(self) -> int:
        """Inf/nan steps since the last decrease or finite step (reads the device)."""
        return int(_read_number(self._decr_count))

    def set_decr_count(self, new_decr_count: int) -> None:
        count = validation.check_count(
            new_decr_count,
            "new_decr_count",
            self._decr_every_n_nan_or_inf,
            "decr_every_n_nan_or_inf",
        )
        self._run.fold()
        self._decr_count.fill_(count)

    # -- state_dict -----------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The scaler's state in Paddle's format (reads the device); ``{}`` when disabled."""
        if not self._enable:
            return {}
        stats = self.stats()
        return ScalerState(
            bounds=self._bounds,
            scale=stats.scale,
            incr_ratio=self._incr_ratio,
            decr_ratio=self._decr_ratio,
            incr_every_n_steps=self._incr_every_n_steps,
            decr_every_n_nan_or_inf=self._decr_every_n_nan_or_inf,
            incr_count=self.get_incr_count(),
            decr_count=self.get_decr_count(),
            use_dynamic_loss_scaling=self._use_dynamic_loss_scaling,
            stats=stats,
        ).to_paddle_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load a state dict of this package, of Paddle's scalers or of PyTorch's GradScaler.

        A bad dict raises ``ValueError`` naming the key and leaves the scaler unchanged.
        Like Paddle's, loading also makes the loaded scale the initial scale.
        """
        if not self._enable:
            return
        if isinstance(state_dict, Mapping) and len(state_dict) == 0:
            raise RuntimeError(
                "load_state_dict() got an empty dict, which is what a disabled scaler "
                "saves; load it into a scaler built with enable=False, or pass the "
                "state_dict of an enabled one"
            )
        loaded = parse_state_dict(state_dict)
        self._run.fold()  # counts kept by this scaler stay, unless the dict brings its own
        self._bounds = loaded.bounds or self._bounds
        scale = _within(loaded.scale, self._bounds)
        self._init_loss_scaling = scale
        self._scale.fill_(scale)
        self._incr_ratio = loaded.incr_ratio
        self._decr_ratio = loaded.decr_ratio
        self._incr_every_n_steps = loaded.incr_every_n_steps
        self._decr_every_n_nan_or_inf = loaded.decr_every_n_nan_or_inf
        self._incr_count.fill_(loaded.incr_count)
        self._decr_count.fill_(loaded.decr_count)
        self._use_dynamic_loss_scaling = loaded.use_dynamic_loss_scaling
        if loaded.stats is not None:
            self._run.load(loaded.stats)


class GradScaler(AmpScaler):
    """``AmpScaler`` with the split form of ``minimize``: ``step(optimizer)`` then ``update()``.

    Typical use::

        scaler = GradScaler()
        with auto_cast():
            loss = model(x).mean()
        scaler.scale(loss).backward()
        scaler.step(optimizer)      # skipped when inf/nan was found
        scaler.update()             # once per iteration, however many optimizers
        optimizer.clear_grad()
    """

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
        min_loss_scaling: float = 1.0,
        max_loss_scaling: float | None = None,
        place: Any = None,
        stuck_after: int | None = None,
        on_stuck: OnStuck = "warn",
        report_overflows: bool = False,
        group: Any = None,
        sync_found_inf: bool = True,
    ) -> None:
        super().__init__(
            enable,
            init_loss_scaling,
            incr_ratio,
            decr_ratio,
            incr_every_n_steps,
            decr_every_n_nan_or_inf,
            use_dynamic_loss_scaling,
            min_loss_scaling=min_loss_scaling,
            max_loss_scaling=max_loss_scaling,
            place=place,
            stuck_after=stuck_after,
            on_stuck=on_stuck,
            report_overflows=report_overflows,
            group=group,
            sync_found_inf=sync_found_inf,
        )

    def step(self, optimizer: Any) -> None:
        """Unscale (unless done), then ``optimizer.step()`` unless inf/nan was found."""
        self._step(optimizer, optimizer.step)

    def update(self) -> None:
        """Update the scale once for this iteration: backs off if any stepped optimizer
        found inf/nan. Call it after the last ``step()`` of every iteration."""
        if not self._enable:
            return
        if not self._any_stepped():
            raise RuntimeError(
                "update() was called with no step() since the last update(); call "
                "scaler.step(optimizer) for each optimizer first, then update() once"
            )
        self._finish_iteration()


# What _step_or_skip returns when it skipped without calling the optimizer.
_SKIPPED_ON_HOST = object()


def _refuse_unscale_in(stage: OptimizerState) -> None:
    if stage is OptimizerState.UNSCALED:
        raise RuntimeError(
            "unscale_() has already been called on this optimizer since the last "
            "update(); call it at most once per optimizer per iteration"
        )
    if stage is OptimizerState.STEPPED:
        raise RuntimeError(
            "unscale_() was called after step() for this optimizer; call unscale_() "
            "before step(), or call update() to start the next iteration"
        )


_host_decided_types: set[type] = set()


def _note_host_decision(optimizer_type: type) -> None:
    # Once per optimizer class: the cost is per step, the news is not.
    if optimizer_type in _host_decided_types:
        return
    _host_decided_types.add(optimizer_type)
    logger.info(
        "%s takes no found-inf flag (no _set_auxiliary_var, nor an inner Paddle "
        "optimizer that has one): the scaler reads the flag on the host before "
        "each step, a device sync on GPU",
        optimizer_type.__qualname__,
    )


def _within(scale: float, bounds: tuple[float, float | None]) -> float:
    """A loaded scale, clamped into the bounds, with a warning if that changed it."""
    lower, upper = bounds
    clamped = max(scale, lower) if upper is None else min(max(scale, lower), upper)
    if clamped != scale:
        warnings.warn(
            f"the loaded scale {scale!r} lies outside min_loss_scaling={lower!r} and "
            f"max_loss_scaling={upper!r}; it is clamped to {clamped!r}",
            UserWarning,
            stacklevel=3,
        )
    return clamped


def _clamp_below_(counter: Tensor, period: int) -> None:
    # On the device, so that shortening a period needs no read of the counter.
    paddle.assign(paddle.minimum(counter, paddle.full_like(counter, period - 1)), output=counter)
