"""The dynamic loss-scaling rules, written once: a frozen state and pure transitions.

Two policies, each a pure function of (state, verdict[, amax]) -> state:

* ``adjust``, ``"interval"``: Paddle's rule (and PyTorch's, Keras', MindSpore's): grow
  after a fixed number of finite iterations, back off on inf/nan.
* ``adjust_headroom``, ``"headroom"``: grow as soon as the gradients' largest magnitude
  (the amax) leaves room below float16's ceiling, learning the margin it keeps from the
  overflows that still happen.

They are the specification, and this module holds nothing else: no Paddle, no device.
The scalers apply the same rules on the device with no read, in the form each unscale
path has (Paddle's kernels in ``kernels.py``, the compiled CPU module in
``fused_cpu.py``), and the tests hold every form to these functions on long random
sequences. Code that keeps its scale on the host, as MindSpore's loss-scale managers
do, calls ``adjust`` itself.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

POLICIES = ("interval", "headroom")

# float16's largest finite value: a scaled gradient above it is inf.
FLOAT16_MAX = 65504.0
FLOAT32_MAX = float(np.finfo(np.float32).max)
# The headroom policy's margin, in bits below FLOAT16_MAX that the amax is kept: where it
# starts, and the bounds it is learned within.
INITIAL_MARGIN, MIN_MARGIN, MAX_MARGIN = 2, 1, 24
# The most growth steps one measurement may take (24 doublings: from 2**16 to float32's
# top in two measurements).
MAX_GROWTH_STEPS = 24
# The first iterations are all measured, and an overflow in them backs off this many
# steps at once: an initial scale far too high is found in a few iterations, not one
# halving per skipped step.
CALIBRATION_ITERATIONS, CALIBRATION_STRIDE = 3, 8
# "Never grew", as an iteration number (an int32 on the device).
NEVER = -(2**30)


@dataclasses.dataclass(frozen=True)
class Policy:
    """How a dynamic loss scale moves: its ratios, its periods and its bounds.

    Args:
        incr_ratio: the factor of a growth.
        decr_ratio: the factor of a back-off.
        incr_every_n_steps: finite iterations in a row before a growth.
        decr_every_n_nan_or_inf: iterations with inf/nan in a row before a back-off.
        min_scale: the scale never falls below it.
        max_scale: the scale never grows above it; None: no bound but float32's range.
        backoff_divisor: back off by dividing by it rather than multiplying by
            ``decr_ratio``, as MindSpore's ``amp.DynamicLossScaler`` does
            (``scale / 3`` and ``scale * float32(1 / 3)`` differ in the last bit).
        name: the policy, one of ``POLICIES``: ``"interval"`` (``adjust``) or
            ``"headroom"`` (``adjust_headroom``).
    """

    incr_ratio: float = 2.0
    decr_ratio: float = 0.5
    incr_every_n_steps: int = 1000
    decr_every_n_nan_or_inf: int = 1
    min_scale: float = 1.0
    max_scale: float | None = None
    backoff_divisor: float | None = None
    name: str = "interval"


@dataclasses.dataclass(frozen=True)
class LossScaleState:
    """A loss scale between two iterations.

    Args:
        scale: the scale.
        incr_count: finite iterations in a row towards the next growth (under the
            headroom policy: finite iterations since the last overflow).
        decr_count: iterations with inf/nan in a row towards the next back-off.
        policy: how the scale moves.
        float32: products are rounded to float32, as on the device; False keeps Python
            floats (MindSpore's managers do).
        fired: whether the transition that made this state grew or backed off.
        margin: the headroom policy's margin, bits kept between the amax and float16's
            ceiling (the interval policy leaves this and the fields below as they are).
        margin_at: the iteration of the margin's last change (0: none yet).
        anchor: the scale after the last measured iteration (0: none yet).
        grown_at: the iteration of the last growth (``NEVER``: none yet).
        amax: the amax of the last finite measured iteration (0: none yet).
        iteration: how many iterations the state has seen.
    """

    scale: float
    incr_count: int = 0
    decr_count: int = 0
    policy: Policy = Policy()
    float32: bool = True
    fired: bool = False
    margin: int = INITIAL_MARGIN
    margin_at: int = 0
    anchor: float = 0.0
    grown_at: int = NEVER
    amax: float = 0.0
    iteration: int = 0

    def __post_init__(self) -> None:
        # The device holds the scale in float32 from the start.
        object.__setattr__(self, "scale", _rounded(self, self.scale))


def adjust(state: LossScaleState, found: bool) -> LossScaleState:
    """The state after one iteration whose gradients held inf/nan (``found``) or not::

        if found:
            incr_count = 0; decr_count += 1
            if decr_count == decr_every_n_nan_or_inf:        # back off
                scale = max(scale * decr_ratio, min_scale); decr_count = 0
        else:
            decr_count = 0; incr_count += 1
            if incr_count == incr_every_n_steps:             # grow
                if scale * incr_ratio is finite:
                    scale = min(scale * incr_ratio, max_scale)
                incr_count = 0

    ``fired`` says whether the rule grew or backed off, even where a bound held the
    scale or float32's limit refused the growth.
    """
    policy = state.policy
    if found:
        decr_count = state.decr_count + 1
        if decr_count < policy.decr_every_n_nan_or_inf:
            return dataclasses.replace(state, incr_count=0, decr_count=decr_count, fired=False)
        lowered = _backed_off(state)
        floor = _rounded(state, policy.min_scale)
        return dataclasses.replace(
            state, scale=max(lowered, floor), incr_count=0, decr_count=0, fired=True
        )
    incr_count = state.incr_count + 1
    if incr_count < policy.incr_every_n_steps:
        return dataclasses.replace(state, incr_count=incr_count, decr_count=0, fired=False)
    grown = _product(state, policy.incr_ratio)
    scale = state.scale
    if math.isfinite(grown):
        scale = grown if policy.max_scale is None else min(grown, _rounded(state, policy.max_scale))
    return dataclasses.replace(state, scale=scale, incr_count=0, decr_count=0, fired=True)


def adjust_headroom(
    state: LossScaleState, found: bool, amax: float | None = None
) -> LossScaleState:
    """The state after one iteration under the headroom policy. ``amax`` is the largest
    magnitude among the scaled gradients checked (before unscaling), None where the
    iteration was not measured (``measured`` says which are)::

        iteration += 1
        the interval rule, never growing:                 # every iteration
            if found: incr_count = 0; decr_count += 1
                      if decr_count == decr_every_n_nan_or_inf:      # back off
                          scale = max(scale * decr_ratio, min_scale); decr_count = 0
            else:     decr_count = 0; incr_count += 1
        if not measured: stop
        if backed off now and iteration <= CALIBRATION_ITERATIONS:   # calibrate the start
            scale = max(scale * decr_ratio ** (CALIBRATION_STRIDE - 1), min_scale)
        usable = not found and amax > 0
        learn = scale < anchor and iteration - grown_at <= incr_every_n_steps // 4
                # a back-off soon after a growth: that growth was too greedy
        quiet = usable and not learn and iteration - margin_at >= incr_every_n_steps
                # the margin unchanged for a while: try a bit closer to the ceiling
        margin = clip(margin + learn - quiet, MIN_MARGIN, MAX_MARGIN)
        if learn or quiet: margin_at = iteration
        if learn: grown_at = NEVER      # one bit per growth, however many overflows
        if usable:
            k = the largest k <= MAX_GROWTH_STEPS with
                amax * incr_ratio ** k <= FLOAT16_MAX / 2 ** margin
            grown = min(scale * incr_ratio ** k, max_scale)
            if grown > scale: scale = grown; grown_at = iteration          # grow
            last finite amax = amax
        anchor = scale

    An overflow long after the last growth is a spike, not a sign that the margin is
    too thin: the scale backs off, climbs back at the next measurement the headroom
    allows, and the margin's stretch goes on. ``fired`` says whether the scale grew or
    backed off. Products are float32 (``incr_ratio ** k`` a float32 cumulative product,
    as ``growth_factors`` gives), as on the device.
    """
    policy = state.policy
    never_growing = dataclasses.replace(policy, incr_every_n_steps=_INT32_MAX)
    held = adjust(dataclasses.replace(state, policy=never_growing), found)
    iteration = state.iteration + 1
    after = dataclasses.replace(held, policy=policy, iteration=iteration)
    if amax is None:
        return after
    scale, margin = after.scale, after.margin
    backed_off = after.fired
    if backed_off and iteration <= CALIBRATION_ITERATIONS:
        stride = calibration_stride(policy.decr_ratio)
        scale = max(_product_of(after, scale, stride), _rounded(after, policy.min_scale))
    usable = not found and amax > 0
    learn = scale < state.anchor and iteration - state.grown_at <= policy.incr_every_n_steps // 4
    quiet = usable and not learn and iteration - state.margin_at >= policy.incr_every_n_steps
    margin = min(max(margin + int(learn) - int(quiet), MIN_MARGIN), MAX_MARGIN)
    margin_at = iteration if learn or quiet else state.margin_at
    grew, last_amax, grown_at = False, state.amax, NEVER if learn else state.grown_at
    if usable:
        factors = growth_factors(policy.incr_ratio)
        factor = float(factors[growth_steps(amax, margin, policy.incr_ratio)])
        cap = FLOAT32_MAX if policy.max_scale is None else policy.max_scale
        grown = min(_product_of(after, scale, factor), _rounded(after, cap))
        if grown > scale:
            scale, grew, grown_at = grown, True, iteration
        last_amax = float(np.float32(amax))
    return dataclasses.replace(
        after,
        scale=scale,
        margin=margin,
        margin_at=margin_at,
        anchor=scale,
        grown_at=grown_at,
        amax=last_amax,
        fired=backed_off or grew,
    )


def advance(state: LossScaleState, found: bool, amax: float | None = None) -> LossScaleState:
    """One iteration of the state's policy: ``adjust`` or ``adjust_headroom``."""
    if state.policy.name == "headroom":
        return adjust_headroom(state, found, amax)
    return adjust(state, found)


def measured(iteration: int, every: int) -> bool:
    """Whether the headroom policy measures the amax in ``iteration`` (1-based), on a path
    that measures every ``every`` iterations: always in the first ones."""
    return iteration <= CALIBRATION_ITERATIONS or iteration % every == 0


def growth_steps(amax: float, margin: int, incr_ratio: float) -> int:
    """The largest k <= MAX_GROWTH_STEPS with ``amax * incr_ratio**k`` at most
    ``FLOAT16_MAX / 2**margin``, in float32 (0 for an amax that leaves no room)."""
    limit = margin_limits()[margin]
    with np.errstate(over="ignore"):
        products = np.float32(amax) * growth_factors(incr_ratio)[1:]
    return int(np.count_nonzero(products <= limit))


def calibration_stride(decr_ratio: float) -> float:
    """The calibration's extra back-off factor, ``decr_ratio ** (CALIBRATION_STRIDE - 1)``
    rounded to float32 (every device form uses this value)."""
    return float(np.float32(decr_ratio ** (CALIBRATION_STRIDE - 1)))


def margin_limits() -> np.ndarray:
    """float32 ``FLOAT16_MAX / 2 ** margin`` for margin = 0 .. MAX_MARGIN (every device
    form uses this table)."""
    margins = np.arange(MAX_MARGIN + 1, dtype=np.float32)
    limits: np.ndarray = np.float32(FLOAT16_MAX) * np.exp2(-margins).astype(np.float32)
    return limits


def growth_factors(incr_ratio: float) -> np.ndarray:
    """float32 ``incr_ratio ** k`` for k = 0 .. MAX_GROWTH_STEPS, as a cumulative product
    (every device form uses this table)."""
    with np.errstate(over="ignore"):
        factors: np.ndarray = np.cumprod(
            np.concatenate([[1.0], np.full(MAX_GROWTH_STEPS, incr_ratio)]).astype(np.float32),
            dtype=np.float32,
        )
    return factors


_INT32_MAX = 2**31 - 1


def _product_of(state: LossScaleState, value: float, factor: float) -> float:
    if not state.float32:
        return value * factor
    with np.errstate(over="ignore"):
        return float(np.float32(value) * np.float32(factor))


def _rounded(state: LossScaleState, value: float) -> float:
    return float(np.float32(value)) if state.float32 else value


def _product(state: LossScaleState, ratio: float) -> float:
    if not state.float32:
        return state.scale * ratio
    with np.errstate(over="ignore"):
        return float(np.float32(state.scale) * np.float32(ratio))


def _backed_off(state: LossScaleState) -> float:
    divisor = state.policy.backoff_divisor
    if divisor is None:
        return _product(state, state.policy.decr_ratio)
    if not state.float32:
        return state.scale / divisor
    return float(np.float32(state.scale) / np.float32(divisor))
