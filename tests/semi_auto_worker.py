"""One rank of the semi-automatic parallel tests, started by test_semi_auto.py through
``python -m paddle.distributed.launch --nproc_per_node 2``.

    semi_auto_worker.py OUTPUT_DIR

A two-Linear MLP on a mesh of two ranks, ``fc1`` column-sharded and ``fc2`` row-sharded,
trained with ``dist.shard_layer`` and ``dist.shard_optimizer``, by Paddle's own scaler
(enabled on the CPU as the tests' oracle is) and by this package's, with and without
``dist.shard_scaler``. Everything each rank saw goes to OUTPUT_DIR/semi_auto.rankR.npz;
the test process compares the scalers and the ranks. Paddle 2.6 has no ``shard_scaler``:
the test skips there.
"""

import collections
import contextlib
import dataclasses
import math
import os
import pickle
import sys
import types

import numpy as np
import paddle
import paddle.distributed as dist
from counters import HostReadCounter

import paddle_amp_scaler
from paddle_amp_scaler import (
    AmpScaler,
    GradScaler,
    LossScaleOptimizer,
    load_checkpoint,
    save_checkpoint,
)
from paddle_amp_scaler.compat.mindspore import DynamicLossScaler, all_finite
from paddle_amp_scaler.compat.torch import GradScaler as TorchGradScaler

STEPS = 6
INF_STEP = 3  # the step (0-based) on which rank 0, and only it, meets an inf
SCALER_ARGS = {"init_loss_scaling": 2.0**10, "incr_every_n_steps": 2}
MESH = dist.ProcessMesh([0, 1], dim_names=["x"])
RANK = dist.get_rank()


class MLP(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc1 = paddle.nn.Linear(8, 16)
        self.fc2 = paddle.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(paddle.nn.functional.relu(self.fc1(x)))


def tensor_parallel(name, layer, mesh):
    if name == "fc1":
        layer.weight = dist.shard_tensor(layer.weight, mesh, [dist.Shard(1)])
        layer.bias = dist.shard_tensor(layer.bias, mesh, [dist.Shard(0)])
    elif name == "fc2":
        layer.weight = dist.shard_tensor(layer.weight, mesh, [dist.Shard(0)])
        layer.bias = dist.shard_tensor(layer.bias, mesh, [dist.Replicate()])


# Paddle 3.0's own scaler, under data parallelism with an inf on one rank, ends the
# process (gloo: "op.preamble.length <= op.nbytes"); 3.1 on trains.
PADDLE_TRAINS_DATA = tuple(int(part) for part in paddle.__version__.split(".")[:2]) >= (3, 1)
# How the batch is placed under each layout: whole on every rank under tensor
# parallelism, split by rows under data parallelism (replicated parameters).
BATCH_PLACEMENT = {"tensor": dist.Replicate(), "data": dist.Shard(0)}


def build(optimizer="sgd", steep_shard=False, layout="tensor"):
    paddle.seed(0)
    model = MLP()
    if steep_shard:
        # The rows of fc2 that rank 0 will hold, 2**-7 times as large: the gradients of
        # the fc1 columns it holds are that much smaller than rank 1's.
        with paddle.no_grad():
            model.fc2.weight[:8] = model.fc2.weight[:8] * 2.0**-7
    model = dist.shard_layer(model, MESH, tensor_parallel if layout == "tensor" else None)
    make = paddle.optimizer.SGD if optimizer == "sgd" else paddle.optimizer.AdamW
    learning_rate = 0.1 if optimizer == "sgd" else 0.01
    return model, dist.shard_optimizer(make(learning_rate, parameters=model.parameters()))


DATA = [
    np.random.default_rng(step).standard_normal((4, 8)).astype("float32") for step in range(STEPS)
]


def batch(step, mesh=MESH, placement=BATCH_PLACEMENT["tensor"]):
    return dist.shard_tensor(paddle.to_tensor(DATA[step]), mesh, [placement])


class InfOnRankZero:
    """An inf on rank 0 only, at INF_STEP: in the loss, or in rank 0's shard of fc1's
    gradient."""

    def __init__(self, model, where, layout="tensor"):
        self.where, self.step, self.placement = where, None, BATCH_PLACEMENT[layout]
        if where == "grad":
            model.fc1.weight.register_hook(self._hook)

    def _hook(self, grad):
        if self.step == INF_STEP and RANK == 0:
            return paddle.full_like(grad, math.inf)
        return grad

    def loss(self, model, step, mesh=MESH):
        self.step = step
        loss = model(batch(step, mesh, self.placement)).pow(2).mean()
        if self.where == "loss" and step == INF_STEP and RANK == 0:
            loss = loss * math.inf
        return loss


def paddle_scaler():
    """Paddle's own GradScaler, enabled on the CPU as tests/helpers.paddle_oracle does."""
    from paddle.amp import grad_scaler
    from paddle.amp.auto_cast import amp_global_state

    gpu = types.SimpleNamespace(
        is_gpu_place=lambda: True, is_xpu_place=lambda: False, is_custom_place=lambda: False
    )
    # Its back-off log line calls float() on a [1] tensor, which NumPy 2 refuses.
    original_float = paddle.Tensor.__float__
    paddle.Tensor.__float__ = lambda t: (
        original_float(t.reshape([])) if t.size == 1 else original_float(t)
    )
    real_tracer = grad_scaler._dygraph_tracer
    grad_scaler._dygraph_tracer = lambda: types.SimpleNamespace(_expected_place=gpu)
    amp_global_state().amp_dtype = "float16"
    try:
        scaler = paddle.amp.GradScaler(**SCALER_ARGS)
    finally:
        grad_scaler._dygraph_tracer = real_tracer
    assert scaler.is_enable()
    return scaler


def local(tensor):
    return tensor._local_value() if tensor.is_dist() else tensor


def number(tensor):
    return float(local(tensor).numpy().reshape([-1])[0])


def stats_row(scaler):
    stats = dataclasses.astuple(scaler.stats())
    return np.array([np.nan if value is None else value for value in stats], dtype="float64")


def paddle_skipped(scaler):
    found = scaler._cache_found_inf
    return bool(local(found)) if isinstance(found, paddle.Tensor) else bool(found)


def scaler_for(variant, **options):
    if variant == "paddle":
        return dist.shard_scaler(paddle_scaler())
    scaler = GradScaler(**SCALER_ARGS, **options)
    return dist.shard_scaler(scaler) if variant == "ours_shard_scaler" else scaler


def train(
    scaler, model, optimizer, inf, steps=range(STEPS), mesh=MESH, on_step=None, after_step=None
):
    """Train; per step whether it skipped and the scale after it. ``on_step(model)`` runs
    after each backward, ``after_step(scaler)`` after each update."""
    log = []
    for step in steps:
        scaler.scale(inf.loss(model, step, mesh)).backward()
        if on_step is not None:
            on_step(model)
        scaler.step(optimizer)
        scaler.update()
        optimizer.clear_grad()
        if after_step is not None:
            after_step(scaler)
        ours = isinstance(scaler, GradScaler)
        skipped = scaler.last_step_skipped() if ours else paddle_skipped(scaler)
        log.append([skipped, number(scaler._scale)])
    return np.array(log, dtype="float64")


def local_params(model):
    return np.concatenate([local(p).numpy().ravel() for p in model.parameters()])


OURS = ("ours_shard_scaler", "ours_own")
VARIANTS = ("paddle", *OURS)


def against_paddle(results):
    """Paddle's scaler and ours, with and without shard_scaler, under both layouts: SGD
    and AdamW, the inf in the loss and in one rank's gradient."""
    for layout in BATCH_PLACEMENT:
        for optimizer in ("sgd", "adamw"):
            # Under data parallelism a gradient replaced on one rank alone would make
            # that rank's collectives differ from the other's: the inf comes in the loss.
            for where in ("loss", "grad") if layout == "tensor" else ("loss",):
                for variant in VARIANTS:
                    if variant == "paddle" and layout == "data" and not PADDLE_TRAINS_DATA:
                        continue
                    model, opt = build(optimizer, layout=layout)
                    inf = InfOnRankZero(model, where, layout)
                    key = f"match_{layout}_{optimizer}_{where}_{variant}"
                    results[f"{key}_log"] = train(scaler_for(variant), model, opt, inf)
                    results[f"{key}_params"] = local_params(model)


def headroom(results):
    """The headroom policy on shards that differ by seven binades: per step, the amax of
    the whole scaled gradients (every shard gathered) and the amax the rule kept."""
    for variant in ("ours_shard_scaler", "ours_own"):
        model, opt = build(steep_shard=True)
        amaxes = AmaxLog()
        inf = InfOnRankZero(model, "none")
        scaler = scaler_for(variant, policy="headroom")
        log = train(scaler, model, opt, inf, on_step=amaxes.gather, after_step=amaxes.keep)
        results[f"headroom_{variant}_log"] = log
        results[f"headroom_{variant}_amax"] = np.array([amaxes.whole, amaxes.kept])
        results[f"headroom_{variant}_fc1_amax"] = np.array([amaxes.held, amaxes.whole_fc1])


class AmaxLog:
    """Per step: the largest magnitude of the whole gradients (every shard gathered), of
    fc1's whole gradient and of this rank's shard of it, and the amax the rule kept."""

    def __init__(self):
        self.whole, self.whole_fc1, self.held, self.kept = [], [], [], []

    def gather(self, model):
        fc1 = model.fc1.weight.grad
        self.held.append(float(np.abs(local(fc1).numpy()).max()))
        whole_fc1 = local(dist.reshard(fc1, MESH, [dist.Replicate()]))
        self.whole_fc1.append(float(np.abs(whole_fc1.numpy()).max()))
        grads = [dist.reshard(p.grad, MESH, [dist.Replicate()]) for p in model.parameters()]
        self.whole.append(max(float(np.abs(local(g).numpy()).max()) for g in grads))

    def keep(self, scaler):
        self.kept.append(number(scaler._loss_scale.memory.amax))


class CollectiveCounter:
    """Counts the collectives called from Python during a step: all-reduces, reshards and
    dist tensors made from local ones (what a reduction of ours would call)."""

    NAMES = ("all_reduce", "reshard", "all_gather")

    def __init__(self):
        self.calls = collections.Counter()

    @contextlib.contextmanager
    def counting(self):
        originals = {name: getattr(dist, name) for name in self.NAMES}
        core = paddle.base.core
        from_local = core.dtensor_from_local

        def wrap(name, original):
            def counted(*args, **kwargs):
                self.calls[name] += 1
                return original(*args, **kwargs)

            return counted

        for name, original in originals.items():
            setattr(dist, name, wrap(name, original))
        core.dtensor_from_local = wrap("dtensor_from_local", from_local)
        try:
            yield self
        finally:
            for name, original in originals.items():
                setattr(dist, name, original)
            core.dtensor_from_local = from_local


def cost(results):
    """Under shard_scaler: host reads of the scaler's own (none), and the collectives of a
    step, ours against Paddle's."""
    for variant in ("paddle", "ours_shard_scaler"):
        model, opt = build("adamw")
        scaler = scaler_for(variant)
        inf = InfOnRankZero(model, "none")
        train(scaler, model, opt, inf, steps=range(2))  # past the first iterations
        reads, collectives = HostReadCounter(), CollectiveCounter()
        for step in range(2, STEPS):
            scaler.scale(inf.loss(model, step)).backward()
            with reads.counting(), collectives.counting():
                scaler.step(opt)
                scaler.update()
            opt.clear_grad()
        results[f"cost_{variant}_reads"] = np.array(
            [reads.reads["scaler"], reads.reads["paddle"]], dtype="int64"
        )
        results[f"cost_{variant}_collectives"] = np.array(
            [collectives.calls[name] for name in (*CollectiveCounter.NAMES, "dtensor_from_local")]
        )


def surface(results, out):
    """Every part of the scaler, on dist gradients, under both policies and with and
    without shard_scaler: what each returned, for the test to compare."""
    for policy in ("interval", "headroom"):
        for variant in ("ours_shard_scaler", "ours_own"):
            model, opt = build("adamw")
            stuck = []
            scaler = scaler_for(
                variant, policy=policy, report_overflows=model, stuck_after=1, on_stuck=stuck.append
            )
            log = train(scaler, model, opt, InfOnRankZero(model, "grad"))
            key = f"surface_{policy}_{variant}"
            results[f"{key}_log"] = log
            results[f"{key}_stats"] = stats_row(scaler)
            results[f"{key}_stuck"] = np.array([s.last_skipped for s in stuck])
            results[f"{key}_report"] = np.array(
                [
                    f"{e.name} {e.num_inf} {e.num_nan} {e.iteration}"
                    for e in scaler.overflow_report()
                ]
            )
            scaler.check_consistency()
            state = scaler.state_dict()
            # Pickled as it is: a Paddle tensor in it would come back as one.
            with open(os.path.join(out, f"{key}.rank{RANK}.pickle"), "wb") as file:
                pickle.dump(state, file)
            reloaded = GradScaler(policy=policy)
            reloaded.load_state_dict(state)
            results[f"{key}_reloaded"] = stats_row(reloaded)
            results[f"{key}_whole_params"] = np.concatenate(
                [
                    local(dist.reshard(p, MESH, [dist.Replicate()])).numpy().ravel()
                    for p in model.parameters()
                ]
            )
            save_checkpoint(
                os.path.join(out, f"{key}.rank{RANK}.ckpt"),
                model=model,
                optimizer=opt,
                scaler=scaler,
                step=STEPS,
            )
            # Back into a sharded run of the same layout.
            resumed_model, resumed_opt = build("adamw")
            resumed = GradScaler(policy=policy)
            load_checkpoint(
                os.path.join(out, f"{key}.rank{RANK}.ckpt"),
                model=resumed_model,
                optimizer=resumed_opt,
                scaler=resumed,
            )
            results[f"{key}_resumed_stats"] = stats_row(resumed)
            results[f"{key}_resumed_params"] = local_params(resumed_model)
            results[f"{key}_params"] = local_params(model)
    # A state dict of a single-process run, written by the test, resumes here.
    single = GradScaler(policy="headroom")
    single.load_state_dict(paddle.load(os.path.join(out, "single.pdparams")))
    paddle.save(single.state_dict(), os.path.join(out, f"single_loaded.rank{RANK}.pdparams"))
    model, opt = build("adamw")
    results["from_single_process_log"] = train(single, model, opt, InfOnRankZero(model, "none"))
    results["from_single_process_stats"] = stats_row(single)
    # One rank disagreeing is named.
    scaler = GradScaler(**SCALER_ARGS)
    model, opt = build()
    train(scaler, model, opt, InfOnRankZero(model, "none"), steps=range(2))
    if RANK == 1:
        scaler.set_init_loss_scaling(3.0)
    try:
        scaler.check_consistency()
        results["inconsistency"] = ""
    except RuntimeError as error:
        results["inconsistency"] = str(error)


def faces(results):
    """The faces and install(), each against this package's GradScaler on the same run."""
    model, opt = build("adamw")
    torch_scaler = TorchGradScaler(init_scale=2.0**10, growth_interval=2)
    results["face_torch_log"] = train(torch_scaler, model, opt, InfOnRankZero(model, "grad"))

    model, opt = build("adamw")
    keras = LossScaleOptimizer(opt, initial_scale=2.0**10, dynamic_growth_steps=2)
    inf, log = InfOnRankZero(model, "grad"), []
    for step in range(STEPS):
        keras.minimize(lambda step=step: inf.loss(model, step))
        opt.clear_grad()
        log.append([keras.scaler.last_step_skipped(), number(keras.loss_scale)])
    results["face_keras_log"] = np.array(log, dtype="float64")

    # MindSpore's functional scaler decides nothing across ranks: the caller's verdict,
    # here every rank's, agreed as a MindSpore user would with an all-reduce of its own.
    model, _ = build()
    mindspore = DynamicLossScaler(scale_value=2.0**10, scale_factor=2, scale_window=2)
    # paddle.grad runs no hooks of leaves: the inf comes in the loss.
    inf, log, params = InfOnRankZero(model, "loss"), [], list(model.parameters())
    for step in range(STEPS):
        grads = paddle.grad(mindspore.scale(inf.loss(model, step)), params)
        finite = all_finite(mindspore.unscale(grads))
        agreed = dist.reshard(
            paddle.base.core.dtensor_from_local(
                (~local(finite)).astype("int32"), MESH, [dist.Partial(dist.ReduceType.kRedMax)]
            ),
            MESH,
            [dist.Replicate()],
        )
        found = bool(local(agreed))
        mindspore.adjust(not found)
        log.append([found, number(mindspore.scale_value)])
    results["face_mindspore_log"] = np.array(log, dtype="float64")

    # AmpScaler.minimize, and unscale_ before step (to clip true gradients), each with
    # and without shard_scaler.
    for variant in OURS:
        model, opt = build("adamw")
        scaler = AmpScaler(**SCALER_ARGS)
        if variant == "ours_shard_scaler":
            scaler = dist.shard_scaler(scaler)
        inf, log = InfOnRankZero(model, "grad"), []
        for step in range(STEPS):
            scaled = scaler.scale(inf.loss(model, step))
            scaled.backward()
            scaler.minimize(opt, scaled)
            opt.clear_grad()
            log.append([scaler.last_step_skipped(), number(scaler._scale)])
        results[f"face_minimize_{variant}_log"] = np.array(log, dtype="float64")
        model, opt = build("adamw")
        scaler = scaler_for(variant)
        inf, log = InfOnRankZero(model, "grad"), []
        for step in range(STEPS):
            scaler.scale(inf.loss(model, step)).backward()
            scaler.unscale_(opt)
            scaler.step(opt)
            scaler.update()
            opt.clear_grad()
            log.append([scaler.last_step_skipped(), number(scaler._scale)])
        results[f"face_unscale_{variant}_log"] = np.array(log, dtype="float64")

    paddle_amp_scaler.install()
    try:
        model, opt = build("adamw")
        installed = dist.shard_scaler(paddle.amp.GradScaler(**SCALER_ARGS))
        results["face_install_log"] = train(installed, model, opt, InfOnRankZero(model, "grad"))
        results["face_install_type"] = type(installed).__module__
    finally:
        paddle_amp_scaler.uninstall()


def main():
    out = sys.argv[1]
    results = {}
    against_paddle(results)
    headroom(results)
    cost(results)
    surface(results, out)
    faces(results)
    np.savez(os.path.join(out, f"semi_auto.rank{RANK}.npz"), **results)


if __name__ == "__main__":
    main()
