"""AmpScaler and GradScaler: the per-iteration state machine around Paddle's AMP kernels.

One step visits each stage once, in order, each in a module of its own: what to step
(``optimizers``: parameters and gradients), unscale and check (the scaler's unscale
path, ``unscale_paths``), agree across ranks (``distributed``), step or skip
(``skipping``), and at the iteration's end the update (``rule``, in the path's device
form) and its count (``statistics``).

Other modules reach the scaler through three doors, and no other (a test reads their
source to keep it so):

* the public API: Paddle's methods, the getters and setters, ``stats()`` and the rest;
* ``PADDLE_CONTRACT``: the private fields Paddle's own trainers and fleet read and
  write, with Paddle's meaning (API.md, "Drop-in");
* ``EXTENSION_INTERFACE``: what a face (``compat``) needs beyond the public API, each
  operation documented where it is defined and listed in ``docs/architecture.md``.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any, cast

import paddle
from paddle import Tensor
from paddle.amp.auto_cast import amp_global_state
from paddle.amp.grad_scaler import OptimizerState

from . import distributed, kernels, optimizers, rule, skipping, unscale_paths, validation
from .accessors import Accessors
from .overflow_report import OverflowEntry, recorder_for
from .pickling import TensorsOnHost
from .scale_tensors import ScaleTensors
from .statistics import RunStatistics
from .stuck import OnStuck, StuckPolicy
from .verdict import Verdict

# Paddle's private fields that its trainers and distributed wrappers use, kept with
# Paddle's meaning (API.md, "Drop-in").
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
# What a face may use beyond the public API (docs/architecture.md, "What a face may use").
EXTENSION_INTERFACE = (
    "_step_optimizer",
    "_end_iteration",
    "_scale_tensors",
    "_set_policy",
    "_nothing_checked",
    "_repr_fields",
)


class OptimizerRecord:
    """What the scaler knows of one optimizer during an iteration.

    Its ``stage`` (values of Paddle's ``OptimizerState``: INIT, UNSCALED, STEPPED) is what
    Paddle's trainers read and write as ``scaler._optimizer_states[id(opt)]["state"]``.
    """

    def __init__(self) -> None:
        self.stage = OptimizerState.INIT
        self.verdict: Verdict | None = None
        # What was unscaled and checked; None where a replaced _unscale did that.
        self.params: list[Any] | None = None
        self.grads: list[Tensor | None] | None = None
        # Whether any gradient was there to check: an optimizer stepped with none (no
        # backward() since its gradients were cleared) tells the update rule nothing.
        self.checked = True

    def __getitem__(self, key: str) -> Any:
        if key != "state":
            raise KeyError(key)
        return self.stage

    def __setitem__(self, key: str, value: Any) -> None:
        if key != "state":
            raise KeyError(key)
        self.stage = value


class AmpScaler(Accessors, TensorsOnHost):
    """Dynamic loss scaling for Paddle dygraph, with the API of Paddle's ``AmpScaler``.

    Once per iteration the scale moves by its policy: ``rule.adjust`` by default (back
    off after ``decr_every_n_nan_or_inf`` iterations with inf/nan, grow after
    ``incr_every_n_steps`` finite ones), or ``rule.adjust_headroom`` (grow as soon as the
    gradients leave room below float16's ceiling), and a step whose gradients hold
    inf/nan leaves parameters and optimizer state untouched. The scale, both counters
    and the verdict stay on the device: ``scale``, ``unscale_``, ``minimize``, ``step``
    and ``update`` never wait for it; the getters, ``stats`` and ``state_dict`` read it.

    Args:
        enable: False makes every method a pass-through (``scale`` returns the loss).
        init_loss_scaling: the first scale.
        incr_ratio: the factor of a growth (> 1).
        decr_ratio: the factor of a back-off (between 0 and 1).
        incr_every_n_steps: finite iterations in a row before a growth.
        decr_every_n_nan_or_inf: iterations with inf/nan in a row before a back-off.
        use_dynamic_loss_scaling: False keeps the scale fixed (steps with inf/nan are
            still skipped).
        policy: how the dynamic scale moves: ``"interval"`` (Paddle's rule) or
            ``"headroom"`` (measures the gradients' largest magnitude and keeps it a
            learned margin below float16's ceiling; ``incr_every_n_steps`` is then how
            long the margin stands before it tries one bit closer).
        min_loss_scaling: the scale never falls below it (default 1.0; a value below
            1.0 is honoured too).
        max_loss_scaling: the scale never grows above it (default None: float32's
            largest value).
        place: where the scale lives, a device string or a Paddle place (default
            Paddle's current device).
        stuck_after: after this many skipped iterations in a row, apply ``on_stuck``
            (default None: never; the streak is read every ``min(stuck_after, 100)``
            iterations).
        on_stuck: ``"warn"`` (one ``RuntimeWarning`` per streak, from rank 0), ``"raise"``
            (``LossScaleStuckError``) or a callable taking ``ScalerStats``.
        report_overflows: count inf and nan per gradient, for ``overflow_report`` and a
            log line per skipped iteration (one read per iteration): True, or the model,
            whose structured names (``encoder.0.weight``) the report and the log lines
            then both use, rather than Paddle's (``linear_0.w_0``).
        group: the ``paddle.distributed`` group whose ranks agree on every verdict
            (default None: every rank).
        sync_found_inf: False skips that agreement, for ranks whose gradients are
            identical anyway.
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
        stuck_after: int | None = None,
        on_stuck: OnStuck = "warn",
        report_overflows: Any = False,
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
            name=validation.check_policy(policy),
        )
        self._init_loss_scaling = self._within_bounds(init_loss_scaling, "init_loss_scaling")
        self._use_dynamic_loss_scaling = validation.check_bool(
            use_dynamic_loss_scaling, "use_dynamic_loss_scaling"
        )
        place = validation.check_place(place)
        try:
            self._tensors = ScaleTensors(self._init_loss_scaling, place)
        # Paddle's words for a device it cannot use; a bare "gpu" without CUDA fails inside
        # Paddle's own message with an AttributeError.
        except (ValueError, AttributeError) as error:
            raise ValueError(f"place {place!r} cannot be used here: {error}") from None
        place = self._tensors.scale.place
        self._temp_found_inf_value_false = paddle.to_tensor([False], place=place)
        self._found_inf: Any = self._temp_found_inf_value_false
        self._cache_found_inf: Any = None
        self._optimizer_states: defaultdict[int, OptimizerRecord] = defaultdict(OptimizerRecord)
        # Chosen once: on a CPU this loads (or, once per machine, builds) the compiled
        # helper now, so that neither the build nor its self-check lands in a step. A
        # disabled scaler does no device work, and needs no helper.
        self._path = (
            unscale_paths.path_for(place)
            if self._enable
            else unscale_paths.by_name(unscale_paths.PADDLE_PATH)
        )
        self._run = RunStatistics(self._path, place)
        self._stuck_policy = StuckPolicy(stuck_after, on_stuck)
        self._overflows = recorder_for(report_overflows, self._path)
        self._sync = distributed.FoundInfSync(group, sync_found_inf)

    # What a repr leaves out: each option at the value the constructor gives it by default.
    _option_defaults = validation.keyword_defaults(__init__)

    @property
    def _scale(self) -> Tensor:
        """The current scale, float32 [1] on the device (Paddle's name for it)."""
        return self._tensors.scale

    @_scale.setter
    def _scale(self, scale: Tensor) -> None:
        self._tensors.scale = scale

    # -- the training step ------------------------------------------------------------

    def scale(self, var: Tensor) -> Tensor:
        """Return ``var * scale`` (float32, or float64 for a float64 ``var``), same shape."""
        if not isinstance(var, Tensor):
            raise TypeError(f"scale() takes a paddle.Tensor as var, got {type(var).__name__}")
        self._switch_off_for_bfloat16()
        if not self._enable or not var._is_initialized():
            return var
        return kernels.scaled(var, self._tensors.scale)

    def unscale_(self, optimizer: Any) -> None:
        """Divide the optimizer's gradients by the scale in place and check them for inf/nan.

        Call it at most once per optimizer per iteration, before ``step``; it is what
        lets you clip or inspect true gradient values.
        """
        optimizers.check_optimizer(optimizer, "unscale_")
        if not self._enable:
            optimizers.refuse_without_parameters(optimizer)
            return
        self._unscale_and_record(optimizer, self._optimizer_states[id(optimizer)])

    def minimize(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """Unscale (unless done), ``optimizer.minimize(*args, **kwargs)`` unless inf/nan
        was found, then update the scale. Returns what ``optimizer.minimize`` returned, or
        ``(None, None)`` where the scaler skipped the call (on a CPU, or for an optimizer
        that takes no found-inf flag)."""
        optimizers.check_optimizer(optimizer, "minimize", "minimize")
        result = self._step_optimizer(
            optimizer, lambda: optimizer.minimize(*args, **kwargs), skipped=(None, None)
        )
        self._end_iteration()
        return result

    def _unscale(self, optimizer: Any) -> None:
        """Unscale and check one optimizer's gradients; the verdict goes to ``_found_inf``.

        Paddle's name; reached through the instance, so that a wrapper that replaces it
        (fleet's ``distributed_scaler`` does) takes effect.
        """
        if not self._enable:
            return
        record = self._optimizer_states[id(optimizer)]
        _refuse_unscale_in(record.stage)
        params = optimizers.parameters_of(optimizer)
        grads = optimizers.grads_of(params)
        scale, all_finite = self._tensors.scale, self._temp_found_inf_value_false
        measure = self._measures_now()
        if self._overflows is None:
            verdict = self._path.unscale_and_check_(grads, scale, all_finite, measure=measure)
        else:
            verdict = self._overflows.unscale_and_count_(
                params, grads, scale, all_finite, measure=measure
            )
        self._record_verdict(record, verdict, params, grads)

    # -- the extension interface (EXTENSION_INTERFACE) -----------------------------------

    def _step_optimizer(
        self,
        optimizer: Any,
        run_step: Callable[[], Any],
        *,
        skipped: Any = None,
        given_grads: Sequence[Tensor] | None = None,
    ) -> Any:
        """Step or skip one optimizer: unscale its gradients unless done (or, with
        ``given_grads``, check those true gradients instead), then ``run_step()`` so that
        it changes nothing if they hold inf/nan. Returns what ``run_step`` returned, or
        ``skipped`` when the scaler skipped it without calling it.

        Every face's step goes through here: ``step``, ``minimize``, the dialects.
        """
        if not self._enable:
            optimizers.refuse_without_parameters(optimizer)
            return run_step()
        record = self._optimizer_states[id(optimizer)]
        if record.stage is OptimizerState.STEPPED:
            raise RuntimeError(
                "step() has already been called for this optimizer since the last "
                "update(); call scaler.update() once per iteration, after the last step()"
            )
        if given_grads is not None:
            self._check_given_gradients(record, given_grads)
        elif record.stage is OptimizerState.INIT:
            self._unscale_and_record(optimizer, record)
        if not record.checked:
            try:
                self._nothing_checked(optimizer)
            except BaseException:
                # A face that refuses the step leaves the optimizer as if never touched.
                del self._optimizer_states[id(optimizer)]
                raise
        verdict = cast(Verdict, record.verdict)  # every unscale leaves one
        skip = skipping.choose(self._path, optimizer, verdict, record.params, record.grads)
        result = skip.step(run_step, verdict)
        record.stage = OptimizerState.STEPPED
        self._found_inf = verdict.flag
        self._cache_found_inf = verdict.flag if verdict.on_host is None else verdict.on_host
        return skipped if result is skipping.SKIPPED else result

    def _end_iteration(self, *, update_scale: bool = True, found: Tensor | None = None) -> bool:
        """End the iteration: the one path into the update. Join the verdicts of every
        optimizer stepped since the last end (any inf/nan counts), or take ``found`` (a
        bool [1] tensor) from a face that decided it itself; move the scale by the rule
        unless ``update_scale`` is False; count the iteration; report overflows; then
        apply the stuck policy. An iteration in which nothing was checked ends uncounted.

        Returns False, and changes nothing, when there is no iteration to end: no
        ``found`` and no optimizer stepped (``update()`` then is misuse, which each face
        words in its own framework's terms).
        """
        if not self._enable:
            return True
        stepped = [
            record
            for record in self._optimizer_states.values()
            if record.stage is OptimizerState.STEPPED
        ]
        if found is None and not stepped:
            return False
        self._optimizer_states = defaultdict(OptimizerRecord)
        amax = None
        if found is None:
            if not any(record.checked for record in stepped):
                return True  # nothing was observed: nothing for the rule, nothing to count
            verdicts = [cast(Verdict, record.verdict) for record in stepped if record.checked]
            found = kernels.any_of([verdict.flag for verdict in verdicts])
            amax = kernels.largest_of([verdict.amax for verdict in verdicts])
        fired = None
        if update_scale and self._use_dynamic_loss_scaling:
            fired = self._path.adjust_(
                found, self._tensors, self._policy, amax=amax, iteration=self._run.iterations + 1
            )
        self._run.record(found, fired)
        if self._overflows is not None:
            self._overflows.end_iteration(self._run.iterations, found)
        # Last, so that a LossScaleStuckError leaves a consistent, resumable scaler.
        self._stuck_policy.after_iteration(self._run, self.stats)
        return True

    def _scale_tensors(self) -> ScaleTensors:
        """The scale and its counters as the live device tensors, to show or write in
        place with no read (a face that shows the scale as a tensor, or sets it)."""
        return self._tensors

    def _nothing_checked(self, optimizer: Any) -> None:
        """Called when none of ``optimizer``'s parameters has a gradient this iteration;
        a face overrides it to refuse the step (raise: the optimizer is then left as if
        never touched). Paddle's scalers step it all the same, and so does this one; the
        iteration is counted and moves the scale only if another optimizer checked
        gradients in it."""
        warnings.warn(
            f"step(): no parameter of this {type(optimizer).__name__} has a gradient (no "
            "backward() since its gradients were cleared?), so nothing was checked; it is "
            "stepped, as Paddle's scaler steps it, but the iteration neither counts in "
            "stats() nor moves the scale. Call scaler.scale(loss).backward() first",
            UserWarning,
            stacklevel=4,
        )

    # _set_policy (a change of the rule's settings) and _repr_fields (the numbers a repr
    # shows, under the face's names) are in Accessors, beside the getters and setters.

    # -- the stages -------------------------------------------------------------------

    def _unscale_and_record(self, optimizer: Any, record: OptimizerRecord) -> None:
        _refuse_unscale_in(record.stage)
        self._unscale(optimizer)
        verdict = record.verdict
        if verdict is None or verdict.flag is not self._found_inf:
            # A replaced _unscale decided, and said so in _found_inf only (a flag, or a
            # Python bool or int).
            found = self._found_inf
            if isinstance(found, Tensor):
                record.verdict = Verdict(found)
            else:
                flag = paddle.to_tensor([bool(found)], place=self._tensors.scale.place)
                record.verdict = Verdict(flag, bool(found))
            record.stage = OptimizerState.UNSCALED

    def _check_given_gradients(self, record: OptimizerRecord, grads: Sequence[Tensor]) -> None:
        # Multiplying by exactly 1 leaves every value as it is: the unscale only checks.
        _refuse_unscale_in(record.stage)
        scale = self._tensors.scale
        verdict = self._path.unscale_and_check_(
            grads,
            paddle.ones_like(scale),
            self._temp_found_inf_value_false,
            measure=self._measures_now(),
        )
        if verdict.amax is not None:
            # True gradients: their amax as the scaled ones would have had it.
            verdict = dataclasses.replace(verdict, amax=verdict.amax * scale)
        self._record_verdict(record, verdict, None, list(grads))

    def _measures_now(self) -> bool:
        """Whether this iteration's unscales measure the amax: the headroom policy's, on
        its path's schedule (every iteration on a CPU, a few on a GPU)."""
        return (
            self._policy.name == "headroom"
            and self._use_dynamic_loss_scaling
            and rule.measured(self._run.iterations + 1, self._path.measure_every)
        )

    def _record_verdict(
        self,
        record: OptimizerRecord,
        verdict: Verdict,
        params: list[Any] | None,
        grads: list[Tensor | None],
    ) -> None:
        # Agreed over the ranks before any rank decides: all then skip, update and count
        # alike.
        agreed = self._sync.agree(verdict)
        self._found_inf = agreed.flag
        record.verdict = agreed
        record.params = params
        record.grads = grads
        record.checked = any(grad is not None for grad in grads)
        record.stage = OptimizerState.UNSCALED

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
        if any(r.stage is not OptimizerState.INIT for r in self._optimizer_states.values()):
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


@validation.with_defaults(init_loss_scaling=2.0**16, incr_every_n_steps=2000)
class GradScaler(AmpScaler):
    """``AmpScaler`` with the split form of ``minimize``: ``step(optimizer)`` then ``update()``.

    The same arguments as ``AmpScaler``, with Paddle's ``GradScaler`` defaults:
    ``init_loss_scaling=2.0**16`` and ``incr_every_n_steps=2000``. Typical use::

        scaler = GradScaler()
        with auto_cast():
            loss = model(x).mean()
        scaler.scale(loss).backward()
        scaler.step(optimizer)      # skipped when inf/nan was found
        scaler.update()             # once per iteration, however many optimizers
        optimizer.clear_grad()
    """

    def step(self, optimizer: Any) -> None:
        """Unscale (unless done), then ``optimizer.step()`` unless inf/nan was found."""
        optimizers.check_optimizer(optimizer, "step")
        self._step_optimizer(optimizer, optimizer.step)

    def update(self) -> None:
        """Update the scale once for this iteration: backs off if any stepped optimizer
        found inf/nan. Call it after the last ``step()`` of every iteration."""
        if not self._end_iteration():
            raise RuntimeError(
                "update() was called with no step() since the last update(); call "
                "scaler.step(optimizer) for each optimizer first, then update() once"
            )


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
