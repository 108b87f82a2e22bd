"""stats(), last_step_skipped() and the stuck policy.

The statistics are counted on the device during the steps; they must equal what an
independent model of a run says (the reference rule for the scale, plain Python for the
counts), with one optimizer or several, across a state_dict or checkpoint resume. The
stuck policy must fire exactly where API.md says, reading the device once per check.
"""

import math
import warnings

import paddle
import pytest
from counters import HostReadCounter
from hypothesis import given, settings
from hypothesis import strategies as st

from paddle_amp_scaler import (
    AmpScaler,
    GradScaler,
    LossScaleStuckError,
    ScalerStats,
    load_checkpoint,
    save_checkpoint,
)

from reference_rule import ReferenceScaler

# Where the verdict of an iteration is known: plain SGD is skipped by zeroing its
# gradients on the device, so the scaler knows it there only; Momentum reads its flag, and
# leaves it on the host; "both" takes turns, iteration by iteration.
VERDICTS = ("device", "host", "both")


def optimizer_for(verdict, param):
    if verdict == "device":
        return paddle.optimizer.SGD(learning_rate=0.1, parameters=[param])
    return paddle.optimizer.Momentum(learning_rate=0.1, momentum=0.0, parameters=[param])


class Run:
    """A one-parameter model whose gradient each iteration sets directly: fast enough
    for the hundreds of iterations the stuck policy needs."""

    def __init__(self, scaler, optimizers=1, verdicts="device"):
        self.scaler = scaler
        self.params = [paddle.create_parameter([4], "float32") for _ in range(optimizers)]
        kinds = ("device", "host") if verdicts == "both" else (verdicts,)
        self.turns = [[optimizer_for(kind, param) for param in self.params] for kind in kinds]
        self.iterations = 0

    def iteration(self, overflow, which=0):
        """One iteration; ``overflow`` writes inf into optimizer ``which``'s gradient."""
        for index, param in enumerate(self.params):
            bad = overflow and index == which
            param.grad = paddle.full([4], math.inf if bad else 1.0)
        optimizers = self.turns[self.iterations % len(self.turns)]
        self.iterations += 1
        if isinstance(self.scaler, GradScaler):
            for optimizer in optimizers:
                self.scaler.step(optimizer)
            self.scaler.update()
        else:
            # Paddle asserts a Tensor loss; the gradients are already in place.
            self.scaler.minimize(optimizers[0], paddle.zeros([1]))
        for optimizer in optimizers:
            optimizer.clear_grad()


def expected_stats(overflows, **rule):
    """What API.md says the counts are after the run ``overflows``."""
    reference = ReferenceScaler(**rule)
    skipped = [index + 1 for index, overflow in enumerate(overflows) if overflow]
    streak = 0
    for overflow in overflows:
        reference.update(overflow)
        streak = streak + 1 if overflow else 0
    return ScalerStats(
        iterations=len(overflows),
        skipped=len(skipped),
        skip_streak=streak,
        last_skipped=skipped[-1] if skipped else None,
        growths=reference.growths,
        backoffs=reference.backoffs,
        scale=float(reference.scale),
    )


RULE = dict(scale=2.0**4, incr_every_n_steps=2, decr_every_n_nan_or_inf=2)


def scaler_for(rule, kind=GradScaler, **options):
    return kind(
        init_loss_scaling=rule["scale"],
        incr_every_n_steps=rule["incr_every_n_steps"],
        decr_every_n_nan_or_inf=rule["decr_every_n_nan_or_inf"],
        use_dynamic_loss_scaling=rule.get("dynamic", True),
        **options,
    )


@settings(max_examples=30, deadline=None)
@given(
    overflows=st.lists(st.booleans(), max_size=16),
    incr=st.integers(1, 3),
    decr=st.integers(1, 3),
    dynamic=st.booleans(),
    verdicts=st.sampled_from(VERDICTS),
)
def test_stats_follow_the_run(overflows, incr, decr, dynamic, verdicts):
    # From 2.0 the floor is reached, and back-offs held there count.
    rule = dict(scale=2.0, incr_every_n_steps=incr, decr_every_n_nan_or_inf=decr, dynamic=dynamic)
    run = Run(scaler_for(rule), verdicts=verdicts)
    for overflow in overflows:
        run.iteration(overflow)
    assert run.scaler.stats() == expected_stats(overflows, **rule)


@pytest.mark.parametrize("verdicts", VERDICTS)
@pytest.mark.parametrize("dynamic", [True, False])
def test_long_runs_count_across_folds(dynamic, verdicts):
    # Iterations are counted in folds of up to 128: reads fall inside, at and across fold
    # boundaries.
    overflows = [(index * 7919) % 10 < 3 for index in range(300)]
    rule = dict(scale=2.0**6, incr_every_n_steps=3, decr_every_n_nan_or_inf=2, dynamic=dynamic)
    run = Run(scaler_for(rule), verdicts=verdicts)
    for index, overflow in enumerate(overflows):
        run.iteration(overflow)
        if index + 1 in (1, 127, 128, 129, 256, 270):
            assert run.scaler.stats() == expected_stats(overflows[: index + 1], **rule), index
    assert run.scaler.stats() == expected_stats(overflows, **rule)


@pytest.mark.parametrize("kind", [GradScaler, AmpScaler])
@pytest.mark.parametrize("verdicts", VERDICTS)
def test_two_optimizers_count_one_iteration(kind, verdicts):
    overflows = [False, True, True, False, False, True, False, False, False]
    optimizers = 2 if kind is GradScaler else 1
    run = Run(scaler_for(RULE, kind), optimizers=optimizers, verdicts=verdicts)
    for step, overflow in enumerate(overflows):
        run.iteration(overflow, which=step % optimizers)
    assert run.scaler.stats() == expected_stats(overflows, **RULE)


def test_last_step_skipped():
    run = Run(scaler_for(RULE))
    seen = [run.scaler.last_step_skipped()]
    for overflow in (True, False, True, True):
        run.iteration(overflow)
        seen.append(run.scaler.last_step_skipped())
    assert seen == [False, True, False, True, True]


def test_stats_cost_one_read_and_steps_none():
    run = Run(scaler_for(RULE))
    counter = HostReadCounter()
    with counter.counting():
        for overflow in (True, False, False):
            run.iteration(overflow)
    assert counter.reads["scaler"] == 0, counter.where
    with counter.counting():
        run.scaler.stats()
    assert counter.reads["scaler"] == 1, counter.where


def test_a_disabled_scaler_reports_nothing():
    scaler = GradScaler(enable=False)
    Run(scaler).iteration(False)
    assert scaler.stats() == ScalerStats(0, 0, 0, None, 0, 0, 1.0)
    assert scaler.last_step_skipped() is False


# -- resume -------------------------------------------------------------------------------

OVERFLOWS = [False, True, True, False, False, False, True, False, True, True, False]


@pytest.mark.parametrize("cut", [0, 2, 5, len(OVERFLOWS)])
def test_a_resumed_run_continues_its_counts(cut):
    first = Run(scaler_for(RULE))
    for overflow in OVERFLOWS[:cut]:
        first.iteration(overflow)
    resumed = Run(GradScaler())
    resumed.scaler.load_state_dict(first.scaler.state_dict())
    for overflow in OVERFLOWS[cut:]:
        resumed.iteration(overflow)
    assert resumed.scaler.stats() == expected_stats(OVERFLOWS, **RULE)


def test_a_checkpoint_resumes_the_counts(tmp_path):
    first = Run(scaler_for(RULE))
    for overflow in OVERFLOWS[:6]:
        first.iteration(overflow)
    path = tmp_path / "run.ckpt"
    model = paddle.nn.Linear(2, 2)
    save_checkpoint(path, model=model, optimizer=first.turns[0][0], scaler=first.scaler, step=6)
    resumed = Run(GradScaler())
    load_checkpoint(path, model=model, optimizer=resumed.turns[0][0], scaler=resumed.scaler)
    for overflow in OVERFLOWS[6:]:
        resumed.iteration(overflow)
    assert resumed.scaler.stats() == expected_stats(OVERFLOWS, **RULE)


def test_a_dict_without_stats_keeps_the_scalers_own():
    run = Run(scaler_for(RULE))
    for overflow in OVERFLOWS[:4]:
        run.iteration(overflow)
    before = run.scaler.stats()
    state = run.scaler.state_dict()
    del state["stats"]
    run.scaler.load_state_dict(state)
    assert run.scaler.stats() == before


@pytest.mark.parametrize(
    "stats",
    [
        {"iterations": 3, "skipped": 4, "skip_streak": 0, "last_skipped": 3},
        {"iterations": 3, "skipped": 1, "skip_streak": 1, "last_skipped": 2},
        {"iterations": 3, "skipped": 0, "skip_streak": 0, "last_skipped": 2},
        {"iterations": 3, "skipped": 1, "skip_streak": 0, "last_skipped": 0},
        {"iterations": -1, "skipped": 0, "skip_streak": 0, "last_skipped": 0},
        {"iterations": 2.0, "skipped": 0, "skip_streak": 0, "last_skipped": 0},
        {"iterations": 2, "skipped": 0, "skip_streak": 0},
    ],
)
def test_impossible_stats_are_refused_unchanged(stats):
    run = Run(scaler_for(RULE))
    run.iteration(True)
    before = run.scaler.stats()
    state = run.scaler.state_dict()
    state["stats"] = {"growths": 0, "backoffs": 0, **stats}
    with pytest.raises(ValueError, match=r"state_dict\['stats'\]"):
        run.scaler.load_state_dict(state)
    assert run.scaler.stats() == before


# -- the stuck policy -----------------------------------------------------------------


def expected_firings(overflows, stuck_after):
    """The iterations at which API.md says the policy fires."""
    check_every = min(stuck_after, 100)
    streak, firings = 0, []
    for iteration, overflow in enumerate(overflows, start=1):
        streak = streak + 1 if overflow else 0
        if iteration % check_every == 0 and streak >= stuck_after:
            firings.append(iteration)
    return firings


def streaks(*lengths, gap=3):
    overflows = []
    for length in lengths:
        overflows += [True] * length + [False] * gap
    return overflows


@pytest.mark.parametrize(
    ("stuck_after", "overflows"),
    [
        (1, streaks(1, 2, 0, 3)),
        (3, streaks(2, 3, 7, 4)),
        (5, streaks(4, 5, 6, 9, 13)),
        (150, streaks(149, 150, 230)),
    ],
)
def test_the_policy_fires_where_api_md_says(stuck_after, overflows):
    fired = []
    run = Run(GradScaler(stuck_after=stuck_after, on_stuck=lambda stats: fired.append(stats)))
    for overflow in overflows:
        run.iteration(overflow)
    expected = expected_firings(overflows, stuck_after)
    assert [stats.iterations for stats in fired] == expected
    assert expected, "the schedule must make the policy fire"
    assert all(stats.skip_streak >= stuck_after for stats in fired)


def test_reads_once_per_check():
    run = Run(GradScaler(stuck_after=4))
    counter = HostReadCounter()
    with counter.counting():
        for _ in range(12):
            run.iteration(False)
    assert counter.reads["scaler"] == 3, counter.where


def test_warn_once_per_streak(caplog):
    run = Run(GradScaler(stuck_after=2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for overflow in streaks(6, 5):
            run.iteration(overflow)
    stuck = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(stuck) == 2
    assert "were all skipped" in str(stuck[0].message)
    # One report per streak: the warning, not a log line besides.
    assert not [r for r in caplog.records if "were all skipped" in r.getMessage()]


@pytest.mark.parametrize("kind", [GradScaler, AmpScaler])
def test_raise_leaves_a_consistent_resumable_scaler(kind):
    run = Run(scaler_for(RULE, kind, stuck_after=2, on_stuck="raise"))
    run.iteration(True)
    with pytest.raises(LossScaleStuckError, match="last 2 iterations were all skipped"):
        run.iteration(True)
    # The iteration that raised was updated and ended: the next one runs as usual.
    assert run.scaler.stats() == expected_stats([True, True], **RULE)
    resumed = Run(scaler_for(RULE, kind))
    resumed.scaler.load_state_dict(run.scaler.state_dict())
    run.iteration(False)
    resumed.iteration(False)
    assert (
        run.scaler.stats() == resumed.scaler.stats() == expected_stats([True, True, False], **RULE)
    )


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"stuck_after": 0}, ValueError, "stuck_after"),
        ({"stuck_after": 1.5}, TypeError, "stuck_after"),
        ({"stuck_after": True}, TypeError, "stuck_after"),
        ({"on_stuck": "ignore"}, ValueError, "on_stuck"),
    ],
)
def test_bad_policy_arguments(options, error, match):
    with pytest.raises(error, match=match):
        GradScaler(**options)


# -- iterations are counted later, in folds: what may come between --


def test_a_setter_between_iterations_does_not_change_the_last_count():
    # Growth at the third finite step resets incr_count to 0; setting it to 2 before
    # the count must not make that iteration look as if the rule had not fired.
    run = Run(scaler_for(dict(scale=8.0, incr_every_n_steps=3, decr_every_n_nan_or_inf=1)))
    for _ in range(3):
        run.iteration(False)
    run.scaler.set_incr_count(2)
    run.scaler.set_decr_every_n_nan_or_inf(2)
    assert run.scaler.stats().growths == 1
    run.iteration(False)  # 2 + 1 reaches the period again
    assert run.scaler.stats().growths == 2


@pytest.mark.parametrize("reads_between", [False, True])
def test_verdicts_on_the_host_and_on_the_device_in_turns_count_every_iteration(reads_between):
    # A read gives the host the counters back while the device holds them; without
    # reads, the device keeps them for the rest of the run.
    run = Run(scaler_for(RULE), verdicts="both")
    for index, overflow in enumerate(OVERFLOWS):
        run.iteration(overflow)
        if reads_between and index % 4 == 3:
            assert run.scaler.stats() == expected_stats(OVERFLOWS[: index + 1], **RULE)
    assert run.scaler.stats() == expected_stats(OVERFLOWS, **RULE)


def test_a_replaced_unscale_that_decides_on_the_host_counts_every_iteration():
    # fleet's distributed_scaler replaces _unscale; this one reads the gradient itself
    # and writes a Python bool, so no unscale kernel runs in those iterations.
    run = Run(scaler_for(RULE))
    own_unscale = run.scaler._unscale

    def host_decided(optimizer):
        run.scaler._found_inf = not bool(paddle.isfinite(run.params[0].grad).all())

    for index, overflow in enumerate(OVERFLOWS):
        run.scaler._unscale = host_decided if index % 2 else own_unscale
        run.iteration(overflow)
    assert run.scaler.stats() == expected_stats(OVERFLOWS, **RULE)


class LossRun(Run):
    """``Run``, with the iteration's losses handed to ``scale()`` first, as a training
    loop does (several: gradient accumulation)."""

    def iteration(self, overflow, which=0, losses=(1.0,)):
        for loss in losses:
            self.scaler.scale(paddle.to_tensor(loss, dtype="float32"))
        super().iteration(overflow, which)


# Per iteration: the losses scale() sees, and whether a gradient overflows. A non-finite
# loss makes the gradients overflow too, as it does in training.
LOSSES = st.lists(
    st.tuples(
        st.lists(st.sampled_from([1.0, math.inf, math.nan]), min_size=1, max_size=3),
        st.booleans(),
    ),
    min_size=1,
    max_size=40,
)


def nonfinite(losses):
    return not all(math.isfinite(loss) for loss in losses)


@settings(max_examples=25, deadline=None)
@given(iterations=LOSSES, read_every=st.integers(1, 10), verdicts=st.sampled_from(VERDICTS))
def test_nonfinite_loss_counts_each_iteration_once_whose_loss_was_inf_or_nan(
    iterations, read_every, verdicts
):
    run = LossRun(GradScaler(), verdicts=verdicts)
    for index, (losses, gradient_overflow) in enumerate(iterations, start=1):
        run.iteration(gradient_overflow or nonfinite(losses), losses=losses)
        if index % read_every == 0 or index == len(iterations):
            expected = sum(nonfinite(losses) for losses, _ in iterations[:index])
            assert run.scaler.stats().nonfinite_loss == expected, index


def test_an_uncounted_iteration_leaves_its_loss_behind():
    # An iteration with no gradient to check ends uncounted; an inf loss handed to scale()
    # in it must not be counted against the next iteration, whose loss is finite.
    param = paddle.create_parameter([4], "float32")
    optimizer = paddle.optimizer.SGD(learning_rate=1e-3, parameters=[param])
    scaler = GradScaler()
    scaler.scale(paddle.to_tensor(math.inf))
    with pytest.warns(UserWarning, match="nothing was checked"):
        scaler.step(optimizer)
    scaler.update()
    scaler.scale(paddle.to_tensor(1.0))
    param._set_grad_ivar(paddle.ones([4]))
    scaler.step(optimizer)
    scaler.update()
    stats = scaler.stats()
    assert (stats.iterations, stats.nonfinite_loss) == (1, 0)


def test_nonfinite_loss_is_none_for_a_scaler_that_never_saw_a_loss():
    run = Run(GradScaler())
    run.iteration(True)
    assert GradScaler().stats().nonfinite_loss is None
    assert run.scaler.stats().nonfinite_loss is None
    assert "nonfinite_loss" not in run.scaler.state_dict()["stats"]
    assert AmpScaler(enable=False).stats().nonfinite_loss is None


def stuck_message(iterations, **options):
    run = LossRun(GradScaler(stuck_after=5, on_stuck="raise", **options))
    with pytest.raises(LossScaleStuckError) as stuck:
        for losses, overflow in iterations:
            run.iteration(overflow, losses=losses)
    return str(stuck.value)


def test_the_stuck_message_names_a_loss_that_was_already_inf_or_nan():
    message = stuck_message([((math.inf,), True)] * 10)
    assert "the loss was already inf or nan before scaling" in message
    assert "No loss scale fixes that" in message and "float32 or bfloat16" in message
    assert "gradients at every scale" not in message


def test_the_stuck_message_names_the_gradients_where_the_loss_was_finite():
    message = stuck_message([((1.0,), True)] * 10)
    assert "inf/nan gradients at every scale down to" in message
    assert "with a finite loss" in message and "already inf or nan" not in message
    # One skip of the streak with a finite loss: the loss did not cause them all.
    mixed = [((1.0,), True)] + [((math.nan,), True)] * 9
    assert "inf/nan gradients at every scale down to" in stuck_message(mixed)


@pytest.mark.parametrize("loss", [math.inf, 1.0])
def test_the_stuck_message_names_the_model_the_scaler_knows(loss):
    # Given report_overflows=model, the scaler knows which model to run locate_overflow
    # on, whichever the cause; without it, it names none.
    model = paddle.nn.Sequential(paddle.nn.Linear(2, 2))
    message = stuck_message([((loss,), True)] * 10, report_overflows=model)
    named = "locate_overflow(model) as found:` (model: the Sequential this scaler was given"
    assert (named if loss == math.inf else "locate_overflow(model) (model: the Sequential") in (
        message
    )
    assert "report_overflows" not in stuck_message([((loss,), True)] * 10)


def test_a_resumed_run_blames_the_loss_as_the_uninterrupted_one_does(tmp_path):
    # Half the streak before the resume: the streak of non-finite losses travels with it.
    first = LossRun(GradScaler(stuck_after=5, on_stuck="raise"))
    for _ in range(3):
        first.iteration(True, losses=(math.inf,))
    saved = first.scaler.state_dict()
    assert (saved["stats"]["nonfinite_loss"], saved["stats"]["nonfinite_streak"]) == (3, 3)
    resumed = LossRun(GradScaler(stuck_after=5, on_stuck="raise"))
    resumed.scaler.load_state_dict(saved)
    with pytest.raises(LossScaleStuckError, match="already inf or nan"):
        for _ in range(7):
            resumed.iteration(True, losses=(math.inf,))


def test_a_saved_loss_count_comes_with_its_streak_and_fits_the_run():
    run = LossRun(GradScaler())
    run.iteration(True, losses=(math.inf,))
    saved = run.scaler.state_dict()
    for stats in (
        {key: value for key, value in saved["stats"].items() if key != "nonfinite_streak"},
        {**saved["stats"], "nonfinite_loss": 2},
        {**saved["stats"], "nonfinite_streak": 2},
    ):
        target = GradScaler()
        with pytest.raises(ValueError, match="stats"):
            target.load_state_dict({**saved, "stats": stats})
        assert target.stats().iterations == 0
    # A dict saved before losses were counted loads, and counts from there.
    older = {key: value for key, value in saved["stats"].items() if "nonfinite" not in key}
    target = GradScaler()
    target.load_state_dict({**saved, "stats": older})
    assert target.stats().nonfinite_loss is None


def test_a_default_scaler_reads_once_per_hundred_iterations_and_none_without_the_policy():
    for stuck_after, reads in ((200, 3), (None, 0)):
        options = {} if stuck_after == 200 else {"stuck_after": None}
        run = LossRun(GradScaler(**options))
        counter = HostReadCounter()
        with counter.counting():
            for _ in range(300):
                run.iteration(False)
        assert counter.reads["scaler"] == reads, counter.where


@pytest.mark.parametrize(
    ("loss", "named"),
    [
        (math.inf, "the loss was already inf or nan before scaling"),
        (1.0, "inf/nan gradients at every scale down to 1, with a finite loss"),
    ],
)
def test_a_default_scaler_warns_once_naming_the_cause(loss, named):
    run = LossRun(GradScaler())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(300):
            run.iteration(True, losses=(loss,))
    stuck = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(stuck) == 1, [str(w.message) for w in stuck]
    assert named in str(stuck[0].message) and "(stuck_after=200)" in str(stuck[0].message)
    assert run.scaler.stats().nonfinite_loss == (300 if loss != 1.0 else 0)
