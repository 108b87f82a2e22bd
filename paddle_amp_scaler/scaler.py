"""AmpScaler and GradScaler: the per-iteration state machine around Paddle's AMP kernels.

One step visits each stage once, in order, each in a module of its own: what to step
(``optimizers``: parameters and gradients), unscale and check (``kernels``), agree
across ranks (``distributed``), step or skip (``skipping``), and at the iteration's end
the update (``rule``) and its count (``statistics``).
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from collections.abc import Callable
from typing import Any, TypedDict, cast

import paddle
from paddle import Tensor
from paddle.amp.auto_cast import amp_global_state
from paddle.amp.grad_scaler import OptimizerState

from . import distributed, kernels, optimizers, rule, skipping, validation
from .kernels import Verdict
from .overflow_report import OverflowEntry, OverflowRecorder
from .pickling import TensorsOnHost
from .state import StateAccess
from .statistics import OnStuck, RunStatistics, StuckPolicy


class _OptimizerRecord(TypedDict):
    """What the scaler knows of one optimizer during an iteration (``state``: Paddle's)."""

    state: Any  # an OptimizerState
    verdict: Verdict | None
    # What was unscaled and checked; None where a replaced _unscale did that.
    params: list[Any] | None
    grads: list[Tensor | None] | None
    # Whether any gradient was there to check: an optimizer stepped with none (no
    # backward() since its gradients were cleared) tells the update rule nothing.
    checked: bool


def _fresh_record() -> _OptimizerRecord:
    # Module level, like Paddle's and PyTorch's factory, so that the defaultdict pickles.
    return {
        "state": OptimizerState.INIT,
        "verdict": None,
        "params": None,
        "grads": None,
        "checked": True,
    }


class AmpScaler(StateAccess, TensorsOnHost):
    """Dynamic loss scaling for Paddle dygraph, with the API of Paddle's ``AmpScaler``.

    Once per iteration the scale moves by ``rule.adjust`` (back off after
    ``decr_every_n_nan_or_inf`` iterations with inf/nan, grow after
    ``incr_every_n_steps`` finite ones), and a step whose gradients hold inf/nan leaves
    parameters and optimizer state untouched. The scale, both counters and the verdict
    stay on the device: ``scale``, ``unscale_``, ``minimize``, ``step`` and ``update``
    never wait for it; the getters, ``stats`` and ``state_dict`` read it back.

    Keyword-only options, after Paddle's arguments: ``min_loss_scaling`` (default 1.0,
    values below it honoured too) and ``max_loss_scaling`` (default None: float32's
    largest) bound the scale on the device; ``place`` (a device string or a Paddle place;
    default Paddle's current device); ``stuck_after`` and ``on_stuck`` (``"warn"``,
    ``"raise"`` or a callable, once ``stuck_after`` iterations in a row were skipped; read
    every ``min(stuck_after, 100)`` iterations); ``report_overflows`` (inf and nan counted
    per gradient, for ``overflow_report``; one read per iteration); ``group`` and
    ``sync_found_inf`` (over several ranks, each verdict is reduced over ``group``, default
    every rank, so that all skip alike).
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
        lower, upper = validation.check_bounds(min_loss_scaling, max_loss_scaling)
        # Paddle's scaler takes the periods unchecked, so code may give 1000.0.
        self._policy = rule.Policy(
            incr_ratio=validation.check_incr_ratio(incr_ratio),
            decr_ratio=validation.check_decr_ratio(decr_ratio),
            incr_every_n_steps=validation.check_period(
                incr_every_n_steps, "incr_every_n_steps", integral_float=True
            ),
            decr_every_n_nan_or_inf=validation.check_period(
                decr_every_n_nan_or_inf, "decr_every_n_nan_or_inf", integral_float=True
            ),
            min_scale=lower,
            max_scale=upper,
        )
        self._init_loss_scaling = self._within_bounds(init_loss_scaling, "init_loss_scaling")
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
        self._optimizer_states: defaultdict[int, _OptimizerRecord] = defaultdict(_fresh_record)
        self._run = RunStatistics(self._scale.place)
        self._stuck_policy = StuckPolicy(stuck_after, on_stuck)
        reports = validation.check_bool(report_overflows, "report_overflows")
        self._overflows = OverflowRecorder() if reports else None
        self._sync = distributed.FoundInfSync(group, sync_found_inf)
        if self._enable:
            # Loads (or, once per machine, builds) the CPU kernel now, so that neither the
            # build nor its self-check lands inside a training step.
            kernels.default_unscale_path(self._scale.place)

    # What a repr leaves out: each option at the value the constructor gives it by default.
    _option_defaults = validation.keyword_defaults(__init__)

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
        self._unscale_and_record(optimizer, self._optimizer_states[id(optimizer)])

    def minimize(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """Unscale (unless done), ``optimizer.minimize(*args, **kwargs)`` unless inf/nan
        was found, then update the scale. Returns what ``optimizer.minimize`` returned, or
        ``(None, None)`` where the scaler skipped the call (on a CPU, or for an optimizer
        that takes no found-inf flag)."""
        return self._step_and_update(
            optimizer, lambda: optimizer.minimize(*args, **kwargs), skipped=(None, None)
        )

    def _unscale(self, optimizer: Any) -> None:
        """Unscale and check one optimizer's gradients; the verdict goes to ``_found_inf``.

        Reached through the instance, so that a wrapper that replaces it (fleet's
        ``distributed_scaler`` does) takes effect.
        """
        if not self._enable:
            return
        record = self._optimizer_states[id(optimizer)]
        _refuse_unscale_in(record["state"])
        params = optimizers.parameters_of(optimizer)
        grads = optimizers.grads_of(params)
        if self._overflows is None:
            verdict = kernels.unscale_and_check_(
                grads, self._scale, self._temp_found_inf_value_false
            )
        else:
            verdict = self._overflows.unscale_and_count_(
                params, grads, self._scale, self._temp_found_inf_value_false
            )
        self._record_verdict(record, verdict, params, grads)

    def _step(self, optimizer: Any, run_step: Callable[[], Any], skipped: Any = None) -> Any:
        """Unscale ``optimizer``'s gradients unless done, then ``run_step()`` so that it
        changes nothing if they hold inf/nan. Returns what ``run_step`` returned, or
        ``skipped`` when the scaler skipped it without calling it.

        The one step of every public face: ``step``, ``minimize``, the dialects.
        """
        if not self._enable:
            optimizers.refuse_without_parameters(optimizer)
            return run_step()
        record = self._optimizer_states[id(optimizer)]
        if record["state"] is OptimizerState.STEPPED:
            raise RuntimeError(
                "step() has already been called for this optimizer since the last "
                "update(); call scaler.update() once per iteration, after the last step()"
            )
        if record["state"] is OptimizerState.INIT:
            self._unscale_and_record(optimizer, record)
        if not record["checked"]:
            self._nothing_checked(optimizer)
        verdict = cast(Verdict, record["verdict"])  # every unscale leaves one
        skip = skipping.choose(optimizer, verdict, record["params"], record["grads"])
        result = skip.step(run_step, verdict)
        record["state"] = OptimizerState.STEPPED
        self._found_inf = verdict.flag
        self._cache_found_inf = verdict.flag if verdict.on_host is None else verdict.on_host
        return skipped if result is skipping.SKIPPED else result

    def _step_and_update(
        self, optimizer: Any, run_step: Callable[[], Any], skipped: Any = None
    ) -> Any:
        """``_step``, then the update that ends the iteration."""
        result = self._step(optimizer, run_step, skipped)
        if self._enable:
            self._finish_iteration()
        return result

    def _unscale_and_record(self, optimizer: Any, record: _OptimizerRecord) -> None:
        _refuse_unscale_in(record["state"])
        self._unscale(optimizer)
        verdict = record["verdict"]
        if verdict is None or verdict.flag is not self._found_inf:
            # A replaced _unscale decided, and said so in _found_inf only (a flag, or a
            # Python bool or int).
            found = self._found_inf
            if isinstance(found, Tensor):
                record["verdict"] = Verdict(found)
            else:
                flag = paddle.to_tensor([bool(found)], place=self._scale.place)
                record["verdict"] = Verdict(flag, bool(found))
            record["state"] = OptimizerState.UNSCALED

    def _check_given_gradients(self, optimizer: Any, grads: list[Tensor]) -> None:
        """Check gradients that hold true values (already unscaled) for ``optimizer``'s
        next step, in place of unscaling its parameters' gradients."""
        record = self._optimizer_states[id(optimizer)]
        _refuse_unscale_in(record["state"])
        # Multiplying by exactly 1 leaves every value as it is: the kernel only checks.
        ones = paddle.ones_like(self._scale)
        verdict = kernels.unscale_and_check_(grads, ones, self._temp_found_inf_value_false)
        self._record_verdict(record, verdict, None, list(grads))

    def _record_verdict(
        self,
        record: _OptimizerRecord,
        verdict: Verdict,
        params: list[Any] | None,
        grads: list[Tensor | None],
    ) -> None:
        # Agreed over the ranks before any rank decides: all then skip, update and count
        # alike.
        agreed = self._sync.agree(verdict)
        self._found_inf = agreed.flag
        record["verdict"] = agreed
        record["params"] = params
        record["grads"] = grads
        record["checked"] = any(grad is not None for grad in grads)
        record["state"] = OptimizerState.UNSCALED

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

    def _finish_iteration(self, update_scale: bool = True) -> None:
        """End the iteration: update the scale from every optimizer stepped since the last
        update (any inf/nan counts), count it, then apply the stuck policy."""
        stepped = [
            r for r in self._optimizer_states.values() if r["state"] is OptimizerState.STEPPED
        ]
        self._optimizer_states = defaultdict(_fresh_record)
        if not any(record["checked"] for record in stepped):
            return  # nothing was observed: nothing for the rule, no iteration to count
        found = kernels.any_of([cast(Verdict, record["verdict"]).flag for record in stepped])
        dynamic = update_scale and self._use_dynamic_loss_scaling
        if dynamic:
            rule.adjust_on_device_(
                found, self._scale, self._incr_count, self._decr_count, self._policy
            )
        self._run.record(found, (self._incr_count, self._decr_count) if dynamic else None)
        if self._overflows is not None:
            self._overflows.end_iteration(self._run.iterations, found)
        # Last, so that a LossScaleStuckError leaves a consistent, resumable scaler.
        self._stuck_policy.after_iteration(self._run, self.stats)

    def _any_stepped(self) -> bool:
        return any(r["state"] is OptimizerState.STEPPED for r in self._optimizer_states.values())

    def _switch_off_for_bfloat16(self) -> None:
        # bfloat16 has float32's exponent range: gradients do not underflow, and scaling
        # only costs time. Paddle's scaler also switches off when no auto_cast was
        # entered at all (the global dtype then reads float32); this one does not.
        if not (self._enable and self._use_dynamic_loss_scaling):
            return
        if amp_global_state().amp_dtype != "bfloat16":
            return
        warnings.warn(
            "dynamic loss scaling is not needed under auto_cast(dtype='bfloat16'); the "
            "scaler switches itself off (is_enable() and is_use_dynamic_loss_scaling() are "
            "now False)",
            UserWarning,
            stacklevel=3,
        )
        self._enable = self._use_dynamic_loss_scaling = False

    def __getstate__(self) -> dict[str, Any]:
        """Pickle (or deep-copy) between iterations only, as PyTorch's scaler does: mid-way,
        the per-optimizer records point at gradients and optimizers of this process."""
        if any(r["state"] is not OptimizerState.INIT for r in self._optimizer_states.values()):
            raise RuntimeError(
                "a scaler may only be pickled (or deep-copied) at the beginning of an "
                "iteration, or at the end after scaler.update(); it was pickled after "
                "unscale_() or step(): call scaler.update() first"
            )
        self._run.count_pending()
        return super().__getstate__()

    # -- diagnostics ------------------------------------------------------------------

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
        differ from the first rank's. A collective debugging aid that reads the device:
        every rank of the scaler's group must call it."""
        if self._enable:
            distributed.check_consistency(self, self._sync.group)


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
