"""PyTorch's own GradScaler tests (test_cuda.py's ``test_grad_scaling_*``, test_torch.py's
``test_pickle_gradscaler``), ported to ``paddle_amp_scaler.compat.torch``. Throughout: the
CPU for CUDA, float32 models (no float16 matmul on Paddle's CPU; ``auto_cast`` does nothing
there, so ``emulate_fp16_grads`` stands in), ``clear_grad(set_to_zero=False)`` for
``zero_grad()``, ``paddle.assign`` for ``p.grad.data.fill_(inf)``, public behaviour for
the private attributes upstream reads; the scale's documented floor of 1.0 is kept."""

import copy
import functools
import math
import pickle

import numpy as np
import paddle
import pytest

from paddle_amp_scaler.compat.torch import GradScaler, TorchAssertionError
from paddle_amp_scaler.testing import emulate_fp16_grads

# Paddle warns that auto_cast does nothing on a CPU; the ported loops keep it anyway.
pytestmark = pytest.mark.filterwarnings("ignore:amp_guard can only be enabled")


class TorchRule:
    """Our pure-Python model of PyTorch's scale update, in float32; ``floor`` is the
    face's documented difference (1.0; 0.0 gives PyTorch's own values)."""

    def __init__(self, scale, growth=2.0, backoff=0.5, interval=2000, floor=1.0):
        self.scale, self.tracker = np.float32(scale), 0
        self.growth, self.backoff = np.float32(growth), np.float32(backoff)
        self.interval, self.floor = interval, np.float32(floor)

    def update(self, found_inf):
        if found_inf:
            self.scale, self.tracker = max(self.scale * self.backoff, self.floor), 0
        elif self.tracker + 1 == self.interval:
            grown = np.float32(self.scale * self.growth)
            self.scale, self.tracker = (grown if np.isfinite(grown) else self.scale), 0
        else:
            self.tracker += 1
        return float(self.scale), self.tracker


# -- helpers: upstream's scaling case, two equal models, one trained with the scaler -------

CASE = {"init_scale": 128.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 1}
S0 = {"init_scale": 3.0, "growth_factor": 4.0, "backoff_factor": 0.5, "growth_interval": 2}
S1 = {"init_scale": 6.0, "growth_factor": 7.0, "backoff_factor": 0.8, "growth_interval": 10}
SKIP_ITER = 2
mse = paddle.nn.functional.mse_loss
OPTIMIZERS = {  # SGD at upstream's lr; Adam and AdamW gentler, their steps being lr-sized
    "sgd": lambda params, **kw: paddle.optimizer.SGD(learning_rate=1.0, parameters=params, **kw),
    "adam": lambda params: paddle.optimizer.Adam(learning_rate=0.1, parameters=params),
    "adamw": lambda params: paddle.optimizer.AdamW(learning_rate=0.1, parameters=params),
}
sgd = OPTIMIZERS["sgd"]
COPIERS = {"pickle": lambda s: pickle.loads(pickle.dumps(s)), "deepcopy": copy.deepcopy}


def two_layers(seed=0):
    paddle.seed(seed)
    return paddle.nn.Sequential(paddle.nn.Linear(8, 8), paddle.nn.Linear(8, 8))


def model_pair(seed=0, make_optimizer=sgd):
    """[control, scaled, control's optimizer, scaled's optimizer], equal at the start."""
    models = [two_layers(seed), two_layers(seed)]
    return models + [make_optimizer(m.parameters()) for m in models]


def make_data(count=4, seed=0):
    rng = np.random.default_rng(seed)
    draw = [rng.standard_normal((8, 8)).astype("float32") for _ in range(2 * count)]
    return [(paddle.to_tensor(x), paddle.to_tensor(y)) for x, y in zip(draw[::2], draw[1::2])]


def fill_inf(param):
    paddle.assign(paddle.full_like(param.grad, math.inf), output=param.grad)


def zero_grad(optimizer):  # PyTorch's default: gradients to None
    optimizer.clear_grad(set_to_zero=False)


def settings(s):
    """What upstream's pickling and state-dict tests read, by the public getters."""
    factors = (s.get_growth_factor(), s.get_backoff_factor(), s.get_growth_interval())
    return s.get_scale(), *factors, s.state_dict()["_growth_tracker"]


def params_of(*models):
    return [p.numpy().copy() for model in models for p in model.parameters()]


def assert_close(got, want, atol=0.0):
    """Bit for bit, or as upstream's ``torch.allclose(c, s, atol=atol)``, whose default
    rtol of 1e-5 comes with it: the clipping case's few ulps, which move with the
    processor's rounding (seen with the weights nudged a float step), stay within it."""
    rtol = 1e-5 if atol else 0.0
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


def inject(i, scaler, model, scaling):
    if scaling and i == SKIP_ITER and scaler.is_enabled():
        fill_inf(model[1].weight)


def finish(i, scaler, optimizer, scaling):
    """Scaled: step and update. Control: the step, less the one the scaled run skips."""
    if scaling:
        scaler.step(optimizer)
        scaler.update()
    elif i != SKIP_ITER or not scaler.is_enabled():
        optimizer.step()


def run_scaling_case(run, unskipped, skipped, atol=0.0, make_optimizer=sgd, **options):
    """Upstream's harness, enabled and disabled: the unscaled float32 control run and the
    scaled run end equal; the scale grew ``unskipped`` times, backed off ``skipped``."""
    for enabled in (True, False):
        control, scaled, opt_control, opt_scaled = model_pair(make_optimizer=make_optimizer)
        scaler = GradScaler("cpu", enabled=enabled, **CASE)
        run(make_data(), control, opt_control, scaler, False, **options)
        scaler = run(make_data(), scaled, opt_scaled, scaler, True, **options) or scaler
        factors = CASE["growth_factor"] ** unskipped * CASE["backoff_factor"] ** skipped
        assert scaler.get_scale() == (CASE["init_scale"] * factors if enabled else 1.0)
        assert_close(params_of(scaled), params_of(control), atol)


def run_schedule(scaler, schedule, resume=None, at=None):
    """One SGD iteration per entry (True: inf in a gradient); ``resume(scaler)`` replaces
    the scaler before iteration ``at``. Returns [(scale, tracker)] and the parameters."""
    model = two_layers()
    optimizer = sgd(model.parameters())
    seen = []
    for i, (overflow, (x, y)) in enumerate(zip(schedule, make_data(len(schedule)))):
        scaler = resume(scaler) if i == at else scaler
        zero_grad(optimizer)
        scaler.scale(mse(model(x), y)).backward()
        if overflow:
            fill_inf(model[1].weight)
        finish(i, scaler, optimizer, True)
        seen.append((scaler.get_scale(), scaler.state_dict()["_growth_tracker"]))
    return seen, params_of(model)


# -- pickling -----------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
@pytest.mark.parametrize("lazy_init_scale", [True, False])
def test_pickle_gradscaler(lazy_init_scale, how):
    """Ports test_pickle_gradscaler (CPU): ``lazy_init_scale`` (our scale is never lazy;
    both variants must agree); the probe of ``_per_optimizer_states`` becomes an iteration
    with an optimizer the copy never saw. Added: ``copy.deepcopy``; the original intact."""
    original = GradScaler("cpu", **S0)
    if lazy_init_scale:
        original.scale(paddle.to_tensor([4.0]))
    clone = COPIERS[how](original)
    assert clone.is_enabled() and original.is_enabled()
    assert settings(clone) == (*S0.values(), 0)
    np.testing.assert_array_equal(clone.scale(paddle.to_tensor([4.0])).numpy(), [12.0])
    assert run_schedule(clone, [False])[0] == [TorchRule(3.0, 4.0, 0.5, 2).update(False)]
    assert settings(original) == (*S0.values(), 0)


def test_pickle_gradscaler_disabled_without_the_device():
    """Ports test_pickle_gradscaler's no-CUDA case: the scaler disables itself at
    construction (PyTorch warns; so does the face) and its copy stays disabled."""
    if paddle.device.cuda.device_count() > 0:
        pytest.skip("this machine has a GPU")
    with pytest.warns(UserWarning, match="not available"):
        original = GradScaler("cuda", init_scale=3.0)
    clone = pickle.loads(pickle.dumps(original))
    assert (original.is_enabled(), clone.is_enabled()) == (False, False)
    assert (clone.get_scale(), clone.state_dict()) == (1.0, {})
    loss = paddle.to_tensor([4.0])
    assert clone.scale(loss) is loss


def test_pickling_mid_iteration_is_refused():
    """Ports upstream ``GradScaler.__getstate__``'s guard (no upstream test): pickling at
    the start of an iteration (after ``backward()`` too, as upstream) or after ``update()``,
    never after ``unscale_``/``step``; a refused attempt leaves the scaler usable."""
    refused = "may only be pickled.* at the beginning of an iteration"
    model = two_layers()
    optimizer = sgd(model.parameters())
    scaler = GradScaler("cpu", init_scale=64.0, growth_interval=3)
    x, y = make_data(1)[0]
    scaler.scale(mse(model(x), y)).backward()
    early = pickle.loads(pickle.dumps(scaler))
    scaler.unscale_(optimizer)
    for attempt in (pickle.dumps, copy.deepcopy):
        with pytest.raises(RuntimeError, match=refused):
            attempt(scaler)
    scaler.step(optimizer)
    with pytest.raises(RuntimeError, match=refused):
        pickle.dumps(scaler)
    scaler.update()
    resumed = pickle.loads(pickle.dumps(scaler))
    assert resumed.state_dict() == scaler.state_dict()
    scale, tracker = TorchRule(64.0, interval=3).update(False)
    assert settings(resumed) == (scale, 2.0, 0.5, 3, tracker)
    assert settings(early) == (64.0, 2.0, 0.5, 3, 0)


@pytest.mark.parametrize("misuse", ["pickle_after_step", "update_without_step"])
def test_misuse_that_pytorch_asserts_is_an_assertion_error(misuse):
    """Ports the exception type of upstream's bare asserts in ``__getstate__`` and in
    ``update()`` ("No inf checks were recorded prior to update."): TorchAssertionError,
    both an AssertionError and the RuntimeError the package raises for misuse."""
    scaler = GradScaler("cpu")
    model = two_layers()
    x, y = make_data(1)[0]
    scaler.scale(mse(model(x), y)).backward()
    if misuse == "pickle_after_step":
        scaler.step(sgd(model.parameters()))
    for catch in (AssertionError, RuntimeError):
        with pytest.raises(catch, match="prior to update|beginning of an iteration"):
            scaler.update() if misuse == "update_without_step" else pickle.dumps(scaler)


# -- the update rule and the state dict ----------------------------------------------------
def test_grad_scaling_update_scale():
    """Ports test_grad_scaling_update_scale (growth 2, back-off 0.25, interval 2, from 4):
    whole public iterations instead of the private ``torch._amp_update_scale``. Added: two
    more overflows, where PyTorch reaches 0.5 and 0.125 and the face holds its floor 1.0."""
    scaler = GradScaler("cpu", 4.0, growth_factor=2.0, backoff_factor=0.25, growth_interval=2)
    ours, pytorchs = TorchRule(4.0, 2.0, 0.25, 2), TorchRule(4.0, 2.0, 0.25, 2, floor=0.0)
    schedule = [False, False, True, True, True]
    observed, _ = run_schedule(scaler, schedule)
    assert observed == [ours.update(overflow) for overflow in schedule]
    floored = [(max(pytorchs.update(o)[0], 1.0), pytorchs.tracker) for o in schedule]
    assert observed == floored and pytorchs.scale < 1.0  # the floor was reached


@pytest.mark.parametrize("lazy_init_scale", [True, False])
def test_grad_scaling_state_dict(lazy_init_scale):
    """Ports test_grad_scaling_state_dict. ``_init_growth_tracker = 7`` is
    ``set_incr_count(7)``, which needs a growth interval above 7: s1's is 10, not 1.
    Added: s1 then runs on exactly as s0 does."""
    s0 = GradScaler("cpu", **S0)
    s1 = GradScaler("cpu", **S1)
    s1.set_incr_count(7)
    if lazy_init_scale:
        s1.scale(paddle.to_tensor([4.0]))
    s1.load_state_dict(s0.state_dict())
    assert settings(s1) == (*S0.values(), 0)
    schedule = [False, True, False, False]
    assert run_schedule(s1, schedule)[0] == run_schedule(s0, schedule)[0]


def via_state_dict(scaler):
    fresh = GradScaler()
    fresh.load_state_dict(scaler.state_dict())
    return fresh


@pytest.mark.parametrize("resume", [via_state_dict, *COPIERS.values()], ids=["sd", *COPIERS])
def test_grad_scaling_state_dict_resumes_mid_run(resume):
    """Extends test_grad_scaling_state_dict: a run resumed after three iterations in a
    fresh ``GradScaler()`` by ``load_state_dict`` (or pickled, or deep-copied) follows
    the uninterrupted run and PyTorch's rule, parameters bit for bit."""
    schedule = [False, True, False, False, False, True, False, False]
    whole = run_schedule(GradScaler("cpu", init_scale=2.0**10, growth_interval=2), schedule)
    scaler = GradScaler("cpu", init_scale=2.0**10, growth_interval=2)
    resumed = run_schedule(scaler, schedule, resume=resume, at=3)
    rule = TorchRule(2.0**10, interval=2)
    assert resumed[0] == whole[0] == [rule.update(overflow) for overflow in schedule]
    assert_close(resumed[1], whole[1])


# -- the training loops -----------------------------------------------------------------
def autocast_run(data, model, optimizer, scaler, scaling, try_pickle):
    if scaling:
        emulate_fp16_grads(model)
    for i, (x, y) in enumerate(data):
        zero_grad(optimizer)
        with paddle.amp.auto_cast(enable=scaling):
            loss = mse(model(x), y)
        (scaler.scale(loss) if scaling else loss).backward()
        inject(i, scaler, model, scaling)
        finish(i, scaler, optimizer, scaling)
        if scaling and try_pickle:
            scaler = pickle.loads(pickle.dumps(scaler))
    return scaler


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
@pytest.mark.parametrize("try_pickle", [False, True], ids=["kept", "pickled"])
def test_grad_scaling_autocast(try_pickle, optimizer):
    """Ports test_grad_scaling_autocast / _grad_scaling_autocast_test (atol 1e-3), the
    scaler pickled and reloaded after every ``update()`` or not; fp16 gradients emulated.
    Adam and AdamW as later upstream revisions add them."""
    make = OPTIMIZERS[optimizer]
    run_scaling_case(autocast_run, 3, 1, 1e-3, make_optimizer=make, try_pickle=try_pickle)


def clipping_run(data, model, optimizer, scaler, scaling, mode, max_norm=0.2):
    """mode "scaled": clip scaled gradients to max_norm * scale, inject; "unscale_": inject,
    unscale_, clip; "optimizer": its grad_clip clips in the step() after unscaling."""
    for i, (x, y) in enumerate(data):
        zero_grad(optimizer)
        loss = mse(model(x), y)
        (scaler.scale(loss) if scaling else loss).backward()
        if mode == "scaled":
            norm = max_norm * scaler.get_scale() if scaling else max_norm
            paddle.nn.utils.clip_grad_norm_(model.parameters(), norm)
        inject(i, scaler, model, scaling)
        if mode == "unscale_":
            if scaling:
                scaler.unscale_(optimizer)
            paddle.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        finish(i, scaler, optimizer, scaling)


def test_grad_scaling_clipping():
    """Ports test_grad_scaling_clipping: the still-scaled gradients are clipped to
    max_norm times the scale (Paddle's ``clip_grad_norm_``), inf injected, step.
    Upstream's atol of 1e-7 is kept: the clip coefficient's epsilon does not scale."""
    run_scaling_case(clipping_run, unskipped=3, skipped=1, atol=1e-7, mode="scaled")


@pytest.mark.parametrize("mode", ["unscale_", "optimizer"])
def test_grad_scaling_clipping_separate_unscale(mode):
    """Ports test_grad_scaling_clipping_separate_unscale: inf injected, ``unscale_``, the
    true gradients clipped to 0.2, step; the runs agree bit for bit (upstream: atol 1e-7).
    Added, the Paddle way: the optimizer clips (``ClipGradByGlobalNorm(0.2)``)."""
    clip = paddle.nn.ClipGradByGlobalNorm(0.2) if mode == "optimizer" else None
    make = functools.partial(sgd, grad_clip=clip)
    run_scaling_case(clipping_run, unskipped=3, skipped=1, make_optimizer=make, mode=mode)


def penalty_run(data, model, optimizer, scaler, scaling):
    params = list(model.parameters())
    for i, (x, y) in enumerate(data):
        zero_grad(optimizer)
        loss = mse(model(x), y)
        grads = paddle.grad(scaler.scale(loss) if scaling else loss, params, create_graph=True)
        if scaling:
            inv_scale = 1.0 / scaler.get_scale()
            grads = [g * inv_scale for g in grads]
        loss = loss + paddle.add_n([(g * g).sum() for g in grads]).sqrt()
        (scaler.scale(loss) if scaling else loss).backward()
        inject(i, scaler, model, scaling)
        finish(i, scaler, optimizer, scaling)


def test_grad_scaling_penalty():
    """Ports test_grad_scaling_penalty: a gradient-norm penalty from the scaled loss's
    gradients (``paddle.grad(create_graph=True)`` for ``torch.autograd.grad``), unscaled
    by hand with 1 / get_scale(); power-of-two scales make the runs agree bit for bit."""
    run_scaling_case(penalty_run, unskipped=3, skipped=1)


def accumulation_run(data, model, optimizer, scaler, scaling, every=2):
    for i, (x, y) in enumerate(data):
        loss = mse(model(x), y) / every
        (scaler.scale(loss) if scaling else loss).backward()
        if (i + 1) % every == 0:
            finish(i, scaler, optimizer, scaling)  # never SKIP_ITER, nothing injected
            zero_grad(optimizer)


def test_grad_scaling_accumulation():
    """Ports test_grad_scaling_accumulation: two micro-batches' gradients summed before
    each step; two steps, none skipped, so the scale grew twice."""
    run_scaling_case(accumulation_run, unskipped=2, skipped=0)


def test_grad_scaling_multiple():
    """Ports test_grad_scaling_multiple: two models and optimizers, two losses reaching
    both; inf injected into model 1 only, so optimizer 0 steps and optimizer 1 skips,
    and one ``update()`` backs off once. Optimizer 0 is unscaled separately first."""
    for enabled in (True, False):
        control0, scaled0, opt_control0, opt_scaled0 = model_pair(seed=0)
        control1, scaled1, opt_control1, opt_scaled1 = model_pair(seed=1)
        scaler = GradScaler("cpu", enabled=enabled, **CASE)
        for scaling, (model0, model1, opt0, opt1) in (
            (False, (control0, control1, opt_control0, opt_control1)),
            (True, (scaled0, scaled1, opt_scaled0, opt_scaled1)),
        ):
            for i, (x, y) in enumerate(make_data()):
                zero_grad(opt0)
                zero_grad(opt1)
                out0, out1 = model0(x), model1(x)
                losses = [mse(0.3 * out0 + 0.7 * out1, y), mse(0.6 * out0 - 0.4 * out1, y)]
                losses = [scaler.scale(loss) for loss in losses] if scaling else losses
                losses[0].backward(retain_graph=True)
                losses[1].backward()
                inject(i, scaler, model1, scaling)
                if scaling:
                    scaler.unscale_(opt0)
                    scaler.step(opt0)
                else:
                    opt0.step()
                finish(i, scaler, opt1, scaling)
        factor = CASE["growth_factor"] ** 3 * CASE["backoff_factor"]
        assert scaler.get_scale() == (CASE["init_scale"] * factor if enabled else 1.0)
        assert_close(params_of(scaled0, scaled1), params_of(control0, control1))


# -- unscale_ and step --------------------------------------------------------------------
def params_with_grads(specs, bad_index, bad_value):
    """Parameters (dtype, shape) with gradient 4.0, but ``bad_value`` at [2, 2] of one."""
    params = []
    for index, (dtype, shape) in enumerate(specs):
        param = paddle.create_parameter(list(shape), dtype)
        grad = np.full(shape, 4.0, dtype=dtype)
        if index == bad_index:
            grad[2, 2] = bad_value
        (param * paddle.to_tensor(grad)).sum().backward()
        params.append(param)
    return params


SQUARE, NARROW = ("float32", (10, 10)), ("float32", (10, 5))
STORM = [SQUARE, NARROW, ("float64", (10, 10)), ("float64", (10, 5))]
UNSCALE_CASES = [  # (parameters, index of the bad gradient or None, bad value)
    *[([a, b], None, 0) for a, b in ((SQUARE, SQUARE), (SQUARE, NARROW), (NARROW, NARROW))],
    *[([SQUARE, b], 1, v) for b in (SQUARE, NARROW) for v in (math.inf, math.nan)],
    ([SQUARE, NARROW], 0, -math.inf),
    ([NARROW, NARROW], 0, math.inf),
    *[(STORM, index, math.inf) for index in (None, 0, 1, 2, 3)],
]


def test_grad_scaling_unscale():
    """Ports test_grad_scaling_unscale: grads of 4.0 at scale 4 become exactly 1.0; inf or
    nan anywhere is found (step skipped, scale backed off), also in the "perfect storm".
    Public ``unscale_`` for the private kernels; shapes for strided
    views; float64 for float16 (no float16 unscale kernel on Paddle's CPU)."""
    for specs, bad_index, bad_value in UNSCALE_CASES:
        params = params_with_grads(specs, bad_index, bad_value)
        before = [p.numpy().copy() for p in params]
        scaler = GradScaler("cpu", init_scale=4.0)
        optimizer = sgd(params)
        scaler.unscale_(optimizer)
        found = bad_index is not None
        if not found:
            assert_close([p.grad.numpy() for p in params], [np.ones(p.shape) for p in params])
        finish(0, scaler, optimizer, True)
        case = (specs, bad_index, bad_value)
        assert scaler.last_step_skipped() == found, case
        assert scaler.get_scale() == TorchRule(4.0).update(found)[0], case
        moved = [not np.array_equal(p.numpy(), old) for p, old in zip(params, before)]
        assert moved == [not found] * len(params), case


def test_step_without_inf_checks_raises_no_inf_checks_error():
    """Ports upstream ``GradScaler.step``'s assertion "No inf checks were recorded for
    this optimizer.": raised for gradients never made or None, not for zeroed ones nor
    unused parameters beside used ones. Beyond PyTorch (whose record stays stuck): a
    ``backward()`` after the error lets ``step()`` through."""
    model = two_layers()
    optimizer = sgd(model.parameters())
    scaler, rule = GradScaler("cpu", init_scale=8.0), TorchRule(8.0)
    x, y = make_data(1)[0]
    with pytest.raises(TorchAssertionError, match="No inf checks were recorded for this optimizer"):
        scaler.step(optimizer)
    assert {AssertionError, RuntimeError} <= set(TorchAssertionError.__mro__)
    scaler.scale(mse(model(x), y)).backward()
    finish(0, scaler, optimizer, True)
    zero_grad(optimizer)
    with pytest.raises(AssertionError, match="No inf checks were recorded"):
        scaler.step(optimizer)
    scaler.scale(mse(model(x), y)).backward()
    optimizer.clear_grad()  # zeros, not None: the checks are recorded
    finish(0, scaler, optimizer, True)
    both = sgd(list(model.parameters()) + list(paddle.nn.Linear(8, 8).parameters()))
    zero_grad(both)
    scaler.scale(mse(model(x), y)).backward()
    before = params_of(model)
    finish(0, scaler, both, True)
    assert not np.array_equal(params_of(model)[0], before[0])
    expected = [rule.update(False) for _ in range(3)][-1]
    assert (scaler.get_scale(), scaler.state_dict()["_growth_tracker"]) == expected
