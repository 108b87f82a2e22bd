#!/usr/bin/env python
"""Loss-scale policies on fp16-emulated training runs: what each loses to underflow, how
often it skips, where the loss ends and what its step costs.

Each workload trains one model per policy, all from the same weights on the same batches,
in lockstep: every iteration runs each policy's forward, backward and step in a fresh
random order, so that a shared machine's noise hits all alike. Every matmul computes as
float16 would on a GPU under O1 (``paddle_amp_scaler.testing.round_linear_layers`` and
``round_through_float16``): its inputs, weight, bias and output rounded through float16,
and so their gradients, which overflow to inf above 65504 and flush to zero at or below
2**-25. An ``UnderflowCensus`` counts the nonzero scaled gradients reaching those
tensors, and those that float16 flushes or holds only as subnormals, in the iterations
whose step was taken. An fp32 run (no rounding, no scaler) gives the loss without fp16.

    PYTHONPATH=. python benchmarks/policy_bench.py --quick      # under a minute
    PYTHONPATH=. python benchmarks/policy_bench.py              # about 17 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.metadata
import json
import math
import os
import platform
import shlex
import statistics
import sys
import time
import warnings
from collections.abc import Callable

# Paddle warns about a missing ccache on import; it says nothing about this benchmark.
warnings.filterwarnings("ignore", message="No ccache found")

# scikit-learn before Paddle: Paddle 2.6 loads its own zlib, which breaks the numpy.random
# import that scikit-learn would otherwise make later.
from sklearn.datasets import load_digits  # noqa: E402  # isort: skip

import numpy as np  # noqa: E402
import paddle  # noqa: E402
import paddle.nn.functional as F  # noqa: E402

import paddle_amp_scaler  # noqa: E402
from paddle_amp_scaler import GradScaler  # noqa: E402
from paddle_amp_scaler.core.headroom import HeadroomRule  # noqa: E402
from paddle_amp_scaler.core.validation import FLOAT16_MAX  # noqa: E402
from paddle_amp_scaler.testing import (  # noqa: E402
    UnderflowCensus,
    round_linear_layers,
    round_through_float16,
)

SEED = 2027

# The policies, each through this package's GradScaler. PyTorch's GradScaler defaults
# (init 2**16, growth_interval 2000, backoff 0.5, growth 2) are Paddle's numbers exactly,
# so its rule is interval's: one run stands for both. DeepSpeed's (initial_scale_power
# 16, loss_scale_window 1000, hysteresis 2) as Paddle's arguments; DeepSpeed's own
# hysteresis counts overflows since the last growth, not in a row, unless
# consecutive_hysteresis is set.
POLICIES = {
    "interval": dict(
        init_loss_scaling=2.0**16,
        incr_ratio=2.0,
        decr_ratio=0.5,
        incr_every_n_steps=2000,
        decr_every_n_nan_or_inf=1,
    ),
    "headroom": dict(policy="headroom"),
    "deepspeed": dict(
        init_loss_scaling=2.0**16,
        incr_ratio=2.0,
        decr_ratio=0.5,
        incr_every_n_steps=1000,
        decr_every_n_nan_or_inf=2,
    ),
}
SAME_RUN_AS = {"pytorch": "interval"}
POLICY_LABELS = {
    "interval": "interval (Paddle's defaults: 2^16, 2000, x0.5, 1)",
    "headroom": "headroom (policy='headroom', defaults)",
    "pytorch": "PyTorch's (2^16, 2000, x0.5: Paddle's numbers, interval's run)",
    "deepspeed": "DeepSpeed's (2^16, window 1000, hysteresis 2)",
    "fp32": "fp32 (no fp16, no scaler)",
}
TABLE_ORDER = ["interval", "headroom", "pytorch", "deepspeed", "fp32"]
COLOURS = {"interval": "tab:blue", "headroom": "tab:orange", "deepspeed": "tab:green"}

# The targets for headroom against interval.
FLUSH_RATIO_EACH, FLUSH_RATIO_GEOMEAN, REACH_RATIO_GEOMEAN = 0.5, 0.25, 0.15
EXTRA_SKIPS_PER_1000 = 1.0
LOSS_TOLERANCE = 0.05

# The biased float32 exponent of 2**-25 and above, where float16 keeps a scaled gradient
# (2**-25 itself aside): float16 holds about 40 binades (2**-24 to 65504), and a gradient
# more than that below its iteration's largest flushes whatever the scale.
FLUSH_EXPONENT = 127 - 25


# -- workloads ---------------------------------------------------------------------------


@dataclasses.dataclass
class Workload:
    """A training job: a model built from a seed, its batches as a function of the
    iteration, and its loss. ``build(census)`` returns (model, optimizer); a census of
    None means fp32, nothing rounded."""

    name: str
    description: str
    iterations: int
    build: Callable[[UnderflowCensus | None], tuple[paddle.nn.Layer, paddle.optimizer.Optimizer]]
    batch: Callable[[int], tuple[np.ndarray, np.ndarray]]
    loss: Callable[[paddle.nn.Layer, tuple[np.ndarray, np.ndarray]], paddle.Tensor]
    # Iterations whose batch is an outlier (the outlier workload's), for the figure.
    outliers: tuple[int, ...] = ()
    # Backward passes per step: the batch is split into this many micro-batches, each
    # scaled and backpropagated on its own, their gradients summed (the loss averaged).
    accumulation: int = 1


def mlp(sizes: list[int]) -> paddle.nn.Layer:
    layers: list[paddle.nn.Layer] = []
    for index, (inputs, outputs) in enumerate(zip(sizes[:-1], sizes[1:])):
        if index:
            layers.append(paddle.nn.ReLU())
        layers.append(paddle.nn.Linear(inputs, outputs))
    return paddle.nn.Sequential(*layers)


def with_adamw(model, census, learning_rate: float, weight_decay: float):
    """``model``, its matmuls rounded as float16's under ``census`` (None: fp32), and an
    AdamW over its parameters."""
    if census is not None:
        round_linear_layers(model, census)
    optimizer = paddle.optimizer.AdamW(
        learning_rate=learning_rate, parameters=model.parameters(), weight_decay=weight_decay
    )
    return model, optimizer


def classification_loss(model, batch):
    features, labels = batch
    logits = model(paddle.to_tensor(features))
    return F.cross_entropy(logits, paddle.to_tensor(labels))


def digits_workload(iterations: int) -> Workload:
    """scikit-learn's 1797 digits, an MLP trained with AdamW far past the point where it
    classifies every training example: the loss, and the gradients with it, fall by
    orders of magnitude."""
    features, labels = load_digits(return_X_y=True)
    features = (features / 16.0).astype("float32")
    labels = labels.astype("int64")
    batch_size = 64
    per_epoch = len(features) // batch_size

    def build(census):
        paddle.seed(SEED)
        model = mlp([64, 256, 128, 10])
        return with_adamw(model, census, 2e-3, 1e-4)

    def batch(iteration):
        epoch, position = divmod(iteration, per_epoch)
        order = np.random.default_rng((SEED, epoch)).permutation(len(features))
        index = order[position * batch_size : (position + 1) * batch_size]
        return features[index], labels[index]

    return Workload(
        "digits-mlp",
        "digits (sklearn), MLP 64-256-128-10, AdamW 2e-3, batch 64, to training loss near 0",
        iterations,
        build,
        batch,
        classification_loss,
    )


class Attention(paddle.nn.Layer):
    """Causal self-attention whose two matmuls round as float16's would."""

    def __init__(self, width: int, heads: int, census: UnderflowCensus | None, name: str):
        super().__init__()
        self.heads, self.census, self.label = heads, census, name
        self.qkv = paddle.nn.Linear(width, 3 * width)
        self.out = paddle.nn.Linear(width, width)

    def rounded(self, tensor, label):
        if self.census is None:
            return tensor
        return round_through_float16(tensor, self.census, f"{self.label}.{label}")

    def forward(self, x, mask, keep):
        batch, length, width = x.shape
        head_width = width // self.heads
        qkv = self.qkv(x).reshape([batch, length, 3, self.heads, head_width])
        q, k, v = paddle.unbind(qkv.transpose([2, 0, 3, 1, 4]), axis=0)
        scores = paddle.matmul(self.rounded(q, "q"), self.rounded(k, "k"), transpose_y=True)
        scores = self.rounded(scores, "scores") * head_width**-0.5 + mask
        # Softmax in float32, as O1 keeps it, written out with the causal mask applied as
        # exact zeros: Paddle's CPU exp and softmax clamp their exponent (exp(-1e4) comes
        # out near 1e-28 or 1e-37), which leaves masked positions gradients that underflow,
        # where a GPU's are zero.
        shifted = paddle.exp(scores - scores.max(axis=-1, keepdim=True).detach()) * keep
        weights = shifted / shifted.sum(axis=-1, keepdim=True)
        mixed = self.rounded(paddle.matmul(self.rounded(weights, "p"), self.rounded(v, "v")), "pv")
        return self.out(mixed.transpose([0, 2, 1, 3]).reshape([batch, length, width]))


class Block(paddle.nn.Layer):
    def __init__(self, width: int, heads: int, census: UnderflowCensus | None, name: str):
        super().__init__()
        self.norm1, self.norm2 = paddle.nn.LayerNorm(width), paddle.nn.LayerNorm(width)
        self.attention = Attention(width, heads, census, f"{name}.attention")
        self.up, self.down = paddle.nn.Linear(width, 4 * width), paddle.nn.Linear(4 * width, width)

    def forward(self, x, mask, keep):
        x = x + self.attention(self.norm1(x), mask, keep)
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class TinyLM(paddle.nn.Layer):
    def __init__(self, vocab, length, width, heads, layers, census):
        super().__init__()
        self.tokens = paddle.nn.Embedding(vocab, width)
        self.positions = self.create_parameter(
            [length, width], default_initializer=paddle.nn.initializer.Normal(std=0.02)
        )
        self.blocks = paddle.nn.LayerList(
            [Block(width, heads, census, f"blocks.{index}") for index in range(layers)]
        )
        self.norm = paddle.nn.LayerNorm(width)
        self.head = paddle.nn.Linear(width, vocab)
        later = np.triu(np.ones((length, length), dtype=bool), 1)
        self.mask = paddle.to_tensor(np.where(later, -1e4, 0).astype("float32"))
        self.keep = paddle.to_tensor((~later).astype("float32"))

    def forward(self, ids):
        x = self.tokens(ids) + self.positions
        for block in self.blocks:
            x = block(x, self.mask, self.keep)
        return self.head(self.norm(x))


def copy_task(vocab: int, length: int, batch_size: int, stream: tuple[int, ...] = ()):
    """The batches of a copy task, sequences whose second half repeats the first (drawn
    from the random ``stream``), and its loss: the next token's cross-entropy."""
    half = length // 2

    def batch(iteration):
        rng = np.random.default_rng((SEED, *stream, iteration))
        first = rng.integers(0, vocab, (batch_size, half + 1))
        sequence = np.concatenate([first, first[:, :half]], axis=1)
        return sequence[:, :length], sequence[:, 1 : length + 1]

    def loss(model, batch):
        ids, targets = batch
        logits = model(paddle.to_tensor(ids))
        return F.cross_entropy(logits.reshape([-1, vocab]), paddle.to_tensor(targets).reshape([-1]))

    return batch, loss


def copy_lm_workload(iterations: int) -> Workload:
    """A 2-layer transformer language model on sequences whose second half repeats the
    first: half the tokens are random (log 32 nats each, for any model), half can be
    predicted exactly once the model has learned to look back."""
    vocab, length, width, heads, layers, batch_size = 32, 32, 32, 2, 2, 16

    def build(census):
        paddle.seed(SEED)
        model = TinyLM(vocab, length, width, heads, layers, census)
        return with_adamw(model, census, 1e-3, 0.01)

    batch, loss = copy_task(vocab, length, batch_size)
    return Workload(
        "copy-lm",
        "2-layer transformer LM (width 32, 2 heads, vocab 32, 32 tokens; second half "
        "repeats the first), AdamW 1e-3, batch 16, every matmul rounded, attention's too",
        iterations,
        build,
        batch,
        loss,
    )


def outlier_workload(iterations: int, gaps: tuple[int, int]) -> Workload:
    """A student MLP learning a random teacher's 10 classes of Gaussian inputs, fresh
    data every iteration; now and then (every ``gaps`` iterations, drawn at random) a
    batch arrives with its inputs multiplied by 1000, as a corrupt record or an unnormalised
    source would."""
    inputs, classes, batch_size = 32, 10, 64
    teacher_rng = np.random.default_rng((SEED, 1))
    teacher_hidden = teacher_rng.standard_normal((inputs, 64)).astype("float32")
    teacher_out = teacher_rng.standard_normal((64, classes)).astype("float32")
    gap_rng = np.random.default_rng((SEED, 1000))
    outliers, at = [], 0
    while True:
        at += int(gap_rng.integers(gaps[0], gaps[1] + 1))
        if at >= iterations:
            break
        outliers.append(at)
    outlier_set = set(outliers)

    def build(census):
        paddle.seed(SEED)
        model = mlp([inputs, 128, 128, classes])
        return with_adamw(model, census, 1e-3, 1e-4)

    def batch(iteration):
        rng = np.random.default_rng((SEED, 7, iteration))
        features = rng.standard_normal((batch_size, inputs)).astype("float32")
        labels = (np.maximum(features @ teacher_hidden, 0) @ teacher_out).argmax(axis=1)
        if iteration in outlier_set:
            features = features * np.float32(1000.0)
        return features, labels.astype("int64")

    return Workload(
        "outlier-batches",
        f"teacher-student classification (32 inputs, 10 classes), MLP 32-128-128-10, AdamW "
        f"1e-3, batch 64; {len(outliers)} batches with inputs x1000 (one every "
        f"{gaps[0]}-{gaps[1]} iterations)",
        iterations,
        build,
        batch,
        classification_loss,
        tuple(outliers),
    )


@functools.cache
def pretrained_digits_weights() -> dict[str, np.ndarray]:
    """The digits MLP trained for 400 fp32 iterations: where the fine-tuning run starts."""
    workload = digits_workload(400)
    model, optimizer = workload.build(None)
    for iteration in range(workload.iterations):
        workload.loss(model, workload.batch(iteration)).backward()
        optimizer.step()
        optimizer.clear_grad()
    return {name: value.numpy() for name, value in model.state_dict().items()}


def fine_tuning_workload(iterations: int) -> Workload:
    """A trained digits classifier fine-tuned on a shifted domain (dimmer, noisier
    images): a small learning rate, gradients small from the first step, four micro-
    batches accumulated per step, and fewer iterations than Paddle's growth period."""
    features, labels = load_digits(return_X_y=True)
    features = (features / 16.0).astype("float32")
    labels = labels.astype("int64")
    batch_size = 64

    def build(census):
        paddle.seed(SEED)
        model = mlp([64, 256, 128, 10])
        model.set_state_dict(pretrained_digits_weights())
        return with_adamw(model, census, 5e-5, 1e-4)

    def batch(iteration):
        rng = np.random.default_rng((SEED, 11, iteration))
        index = rng.choice(len(features), batch_size, replace=False)
        shifted = 0.7 * features[index] + rng.normal(0, 0.1, (batch_size, 64))
        return shifted.astype("float32"), labels[index]

    return Workload(
        "fine-tuning",
        "the digits MLP after 400 fp32 iterations, fine-tuned on dimmer, noisier images: "
        "AdamW 5e-5, batch 64 as 4 accumulated micro-batches of 16",
        iterations,
        build,
        batch,
        classification_loss,
        accumulation=4,
    )


class RecurrentLM(paddle.nn.Layer):
    """A GRU language model unrolled over time from Linear layers, so that every matmul,
    the recurrent one included, rounds as float16's would: gradients flow back through
    every time step."""

    def __init__(self, vocab: int, width: int, hidden: int):
        super().__init__()
        self.hidden = hidden
        self.tokens = paddle.nn.Embedding(vocab, width)
        self.from_input = paddle.nn.Linear(width, 3 * hidden)
        self.from_state = paddle.nn.Linear(hidden, 3 * hidden)
        self.head = paddle.nn.Linear(hidden, vocab)

    def forward(self, ids):
        inputs = self.from_input(self.tokens(ids))
        state = paddle.zeros([ids.shape[0], self.hidden])
        states = []
        for step in range(ids.shape[1]):
            update, reset, candidate = paddle.split(inputs[:, step], 3, axis=-1)
            mixed_update, mixed_reset, mixed_candidate = paddle.split(
                self.from_state(state), 3, axis=-1
            )
            keep = F.sigmoid(update + mixed_update)
            fresh = paddle.tanh(candidate + F.sigmoid(reset + mixed_reset) * mixed_candidate)
            state = keep * state + (1 - keep) * fresh
            states.append(state)
        return self.head(paddle.stack(states, axis=1))


def recurrent_workload(iterations: int) -> Workload:
    """A GRU on the copy task of ``copy_lm_workload``, shorter: it must carry each token
    twelve time steps to predict its repeat."""
    vocab, length, batch_size = 16, 24, 32

    def build(census):
        paddle.seed(SEED)
        model = RecurrentLM(vocab, 32, 64)
        return with_adamw(model, census, 2e-3, 0.01)

    batch, loss = copy_task(vocab, length, batch_size, stream=(13,))
    return Workload(
        "recurrent",
        "GRU LM unrolled from Linear layers (embedding 32, state 64, vocab 16, 24 steps; "
        "second half repeats the first), AdamW 2e-3, batch 32, the recurrent matmul rounded",
        iterations,
        build,
        batch,
        loss,
    )


@dataclasses.dataclass(frozen=True)
class Profile:
    digits: int
    lm: int
    outliers: int
    outlier_gaps: tuple[int, int]
    fine_tuning: int
    recurrent: int
    tail: int  # the final loss is the mean over this many last iterations
    window: int  # the figure's flushed fraction: per window of iterations


PROFILES = {
    "default": Profile(6000, 4000, 6000, (500, 1000), 1200, 2000, tail=300, window=100),
    "quick": Profile(240, 120, 240, (60, 90), 120, 120, tail=40, window=20),
}


def workloads_for(profile: Profile) -> list[Workload]:
    return [
        digits_workload(profile.digits),
        copy_lm_workload(profile.lm),
        outlier_workload(profile.outliers, profile.outlier_gaps),
        fine_tuning_workload(profile.fine_tuning),
        recurrent_workload(profile.recurrent),
    ]


# -- one training run per policy ---------------------------------------------------------


class Run:
    """One policy's model, optimizer, scaler and census, and what each iteration did."""

    def __init__(self, workload: Workload, policy: str):
        self.policy = policy
        self.emulated = policy != "fp32"
        self.census = UnderflowCensus(by_label=True, exponents=True) if self.emulated else None
        self.model, self.optimizer = workload.build(self.census)
        self.scaler = GradScaler(**POLICIES[policy]) if self.emulated else None
        self.loss, self.scale, self.skipped, self.step_ms = [], [], [], []
        self.nonzero, self.flushed, self.subnormal, self.beyond = [], [], [], []
        # Where each skipped iteration's inf came from: the first rounded tensor whose
        # gradient overflowed in the backward pass (later ones get the inf passed on).
        self.overflow_origins: dict[str, int] = {}

    def iterate(self, workload: Workload, batch) -> None:
        if self.scaler is not None:
            self.scale.append(self.scaler.get_loss_scaling())
        loss = 0.0
        for micro_batch in zip(*(np.array_split(part, workload.accumulation) for part in batch)):
            micro_loss = workload.loss(self.model, micro_batch) / workload.accumulation
            (micro_loss if self.scaler is None else self.scaler.scale(micro_loss)).backward()
            loss += float(micro_loss)
        if self.scaler is None:
            started = time.perf_counter()
            self.optimizer.step()
            self.step_ms.append((time.perf_counter() - started) * 1e3)
        else:
            started = time.perf_counter()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.step_ms.append((time.perf_counter() - started) * 1e3)
            self.record_census(self.scaler.last_step_skipped())
        self.optimizer.clear_grad()
        self.loss.append(loss)

    def record_census(self, skipped: bool) -> None:
        counts = self.census.end_iteration(skipped=skipped)
        self.skipped.append(skipped)
        if skipped:
            origin = next(
                (label for label, c in self.census.last_by_label.items() if c.overflowed),
                "no rounded tensor (inf/nan from elsewhere)",
            )
            self.overflow_origins[origin] = self.overflow_origins.get(origin, 0) + 1
        self.nonzero.append(counts.nonzero)
        self.flushed.append(counts.flushed)
        self.subnormal.append(counts.subnormal)
        self.beyond.append(beyond_any_scale(self.census.last_exponents, self.census.last_amax))

    def summary(self, tail: int) -> dict:
        iterations = len(self.loss)
        result = {
            "policy": self.policy,
            "iterations": iterations,
            "final_loss": float(np.mean(self.loss[-tail:])),
            "step_ms_median": statistics.median(self.step_ms),
            "step_ms_iqr": iqr(self.step_ms),
        }
        if not self.emulated:
            return result
        kept = ~np.array(self.skipped)
        nonzero = int(np.array(self.nonzero)[kept].sum())
        flushed = int(np.array(self.flushed)[kept].sum())
        stats = self.scaler.stats()
        sources = sorted(self.census.kept_by_label.items(), key=lambda item: -item[1].flushed)
        result.update(
            skipped=int(sum(self.skipped)),
            skipped_per_1000=1000.0 * sum(self.skipped) / iterations,
            nonzero=nonzero,
            flushed=flushed,
            flushed_fraction=flushed / nonzero if nonzero else 0.0,
            subnormal_fraction=int(np.array(self.subnormal)[kept].sum()) / nonzero
            if nonzero
            else 0.0,
            beyond_any_scale_fraction=int(np.array(self.beyond)[kept].sum()) / nonzero
            if nonzero
            else 0.0,
            final_scale=stats.scale,
            growths=stats.growths,
            backoffs=stats.backoffs,
            headroom_bits=stats.headroom_bits,
            overflow_origins=self.overflow_origins,
            # The tensors whose gradients lost the most, as fractions of all nonzero.
            flushed_by_label={
                label: counts.flushed / nonzero for label, counts in sources[:4] if counts.flushed
            },
        )
        return result

    def traces(self, window: int) -> dict:
        if not self.emulated:
            return {"loss": self.loss}
        kept = ~np.array(self.skipped)
        nonzero = np.where(kept, self.nonzero, 0)

        def per_window(counts):
            counts = np.where(kept, counts, 0)
            fractions = []
            for start in range(0, len(counts), window):
                total = int(nonzero[start : start + window].sum())
                fractions.append(
                    int(counts[start : start + window].sum()) / total if total else None
                )
            return fractions

        return {
            "loss": self.loss,
            "scale": self.scale,
            "skipped_at": [int(i) for i in np.flatnonzero(self.skipped)],
            "flushed_fraction_per_window": per_window(self.flushed),
            "beyond_any_scale_fraction_per_window": per_window(self.beyond),
        }


def beyond_any_scale(exponents: np.ndarray | None, amax: float) -> int:
    """How many of an iteration's nonzero gradient elements float16 flushes even at the
    best scale for that iteration, the largest power of two that keeps its largest
    element ``amax`` finite: flushed by any scale a policy could have chosen."""
    if exponents is None or not amax > 0:
        return 0
    best = math.floor(math.log2(FLOAT16_MAX / amax))  # the scale 2**best
    # Elements of biased exponent b lie below 2**(b - 126); scaled, at most 2**-25 flushes
    # (the boundary itself, a tie that flushes, is left out).
    return int(exponents[: max(FLUSH_EXPONENT - best, 0)].sum())


def iqr(values) -> float:
    low, high = np.percentile(values, [25, 75])
    return float(high - low)


def run_workload(workload: Workload, profile: Profile, log) -> dict:
    policies = [*POLICIES, "fp32"]
    runs = {policy: Run(workload, policy) for policy in policies}
    order_rng = np.random.default_rng((SEED, 3))
    started = time.perf_counter()
    for iteration in range(workload.iterations):
        batch = workload.batch(iteration)
        for index in order_rng.permutation(len(policies)):
            runs[policies[index]].iterate(workload, batch)
        done = iteration + 1
        if done % max(workload.iterations // 10, 1) == 0:
            elapsed = time.perf_counter() - started
            scales = " ".join(
                f"{name} 2^{math.log2(run.scale[-1]):.0f}"
                for name, run in runs.items()
                if run.emulated
            )
            log(f"  {workload.name}: {done}/{workload.iterations} in {elapsed:.0f} s; {scales}")
    summaries = {policy: run.summary(profile.tail) for policy, run in runs.items()}
    for alias, same in SAME_RUN_AS.items():
        summaries[alias] = dict(summaries[same], policy=alias, same_run_as=same)
    return {
        "name": workload.name,
        "description": workload.description,
        "iterations": workload.iterations,
        "outliers": list(workload.outliers),
        "summaries": summaries,
        "traces": {policy: run.traces(profile.window) for policy, run in runs.items()},
        "seconds": time.perf_counter() - started,
    }


# -- the report --------------------------------------------------------------------------


def print_table(results: list[dict]) -> None:
    print(
        "| workload | policy | skipped /1000 it | flushed to zero | subnormal | "
        "beyond any scale | final loss | step+update ms | final scale |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for result in results:
        for policy in TABLE_ORDER:
            row = result["summaries"][policy]
            cells = [result["name"], POLICY_LABELS[policy]]
            if policy == "fp32":
                cells += ["-", "-", "-", "-"]
            else:
                cells += [
                    f"{row['skipped_per_1000']:.2f}",
                    percent(row["flushed_fraction"]),
                    percent(row["subnormal_fraction"]),
                    percent(row["beyond_any_scale_fraction"]),
                ]
            cells.append(f"{row['final_loss']:.4g}")
            cells.append(f"{row['step_ms_median']:.3f}")
            cells.append("-" if policy == "fp32" else f"2^{math.log2(row['final_scale']):g}")
            print("| " + " | ".join(cells) + " |")


def percent(fraction: float) -> str:
    if fraction == 0:
        return "0"
    return f"{100 * fraction:.3g}%"


def ratio(headroom: float, interval: float) -> float | None:
    """headroom's fraction over interval's; None where interval's is 0 (a target then
    holds only if headroom's is 0 too)."""
    return headroom / interval if interval > 0 else None


def geometric_mean(ratios: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(max(r, 1e-12)) for r in ratios))


def check_targets(results: list[dict], reach: dict) -> list[dict]:
    """The issue's targets for headroom against interval. The flushed fraction counts what
    no scale could have kept ("beyond any scale"); the per-workload target is therefore
    on the part within reach, the flushed minus that (``reach``: ``within_reach(results)``)."""
    checks = []

    def check(name: str, passed: bool, detail: str) -> None:
        checks.append({"target": name, "passed": passed, "detail": detail})

    flushed, reached = [], []
    for result in results:
        name, rows = result["name"], result["summaries"]
        row = reach[name]
        if row["ratio"] is not None:
            reached.append(row["ratio"])
        flush = ratio(rows["headroom"]["flushed_fraction"], rows["interval"]["flushed_fraction"])
        if flush is not None:
            flushed.append(flush)
        check(
            f"{name}: headroom's flushes within reach at most {FLUSH_RATIO_EACH} of interval's",
            row["headroom"] == 0 if row["ratio"] is None else row["ratio"] <= FLUSH_RATIO_EACH,
            f"{percent(row['headroom'])} against {percent(row['interval'])}"
            + ("" if row["ratio"] is None else f": {row['ratio']:.3f}x")
            + " (all flushes: "
            + ("-" if flush is None else f"{flush:.3f}x")
            + ")",
        )
    for label, ratios, limit in (
        ("flushed", flushed, FLUSH_RATIO_GEOMEAN),
        ("flushed within reach", reached, REACH_RATIO_GEOMEAN),
    ):
        if ratios:
            mean = geometric_mean(ratios)
            check(
                f"{label}, geometric mean over the workloads, at most {limit}x",
                mean <= limit,
                f"{mean:.3f}x (" + ", ".join(f"{r:.3f}" for r in ratios) + ")",
            )
    for result in results:
        name, rows = result["name"], result["summaries"]
        extra = rows["headroom"]["skipped"] - rows["interval"]["skipped"]
        allowed = EXTRA_SKIPS_PER_1000 * max(1.0, result["iterations"] / 1000)
        check(
            f"{name}: headroom skips at most {EXTRA_SKIPS_PER_1000:g} more per 1000 iterations "
            f"(at least {EXTRA_SKIPS_PER_1000:g} in all)",
            extra <= allowed,
            f"{rows['headroom']['skipped']} against {rows['interval']['skipped']} in "
            f"{result['iterations']} iterations ({extra:+d}, at most {allowed:+.1f})",
        )
    for result in results:
        name, rows = result["name"], result["summaries"]
        headroom, interval = rows["headroom"]["final_loss"], rows["interval"]["final_loss"]
        change = headroom / interval - 1
        check(
            f"{name}: headroom's final loss within {LOSS_TOLERANCE:.0%} of interval's",
            abs(change) <= LOSS_TOLERANCE,
            f"{headroom:.4g} against {interval:.4g} ({change:+.1%}; fp32 "
            f"{rows['fp32']['final_loss']:.4g})",
        )
    return checks


def print_checks(checks: list[dict]) -> None:
    for item in checks:
        verdict = "PASS" if item["passed"] else "FAIL"
        print(f"{verdict}  {item['target']}: {item['detail']}")


def within_reach(results: list[dict]) -> dict:
    """The flushed fraction with the elements beyond any scale left out: what a policy
    could have kept, and did not."""
    ratios = {}
    for result in results:
        rows = result["summaries"]
        reach = {
            policy: rows[policy]["flushed_fraction"] - rows[policy]["beyond_any_scale_fraction"]
            for policy in ("interval", "headroom")
        }
        ratios[result["name"]] = {**reach, "ratio": ratio(reach["headroom"], reach["interval"])}
    return ratios


def print_details(results: list[dict]) -> None:
    """What the table leaves out: the scalers' own counts and where overflows came from."""
    for result in results:
        print(f"\n{result['name']} ({result['seconds']:.0f} s):")
        for policy in ("interval", "headroom", "deepspeed"):
            row = result["summaries"][policy]
            bits = row["headroom_bits"]
            origins = sorted(row["overflow_origins"].items(), key=lambda item: -item[1])
            print(
                f"  {policy:9s} skipped {row['skipped']:3d}, growths {row['growths']:3d}, "
                f"back-offs {row['backoffs']:3d}"
                + ("" if bits is None else f", headroom {bits:.1f} bits")
                + "; first overflow in: "
                + (", ".join(f"{label} x{count}" for label, count in origins[:3]) or "none")
            )
            print(
                "            flushed most in: "
                + (
                    ", ".join(
                        f"{label} {percent(share)}"
                        for label, share in row["flushed_by_label"].items()
                    )
                    or "none"
                )
            )
        cost = {p: result["summaries"][p]["step_ms_median"] for p in ("interval", "headroom")}
        base = result["summaries"]["fp32"]["step_ms_median"]
        print(
            f"  step+update median: interval {cost['interval']:.3f} ms, headroom "
            f"{cost['headroom']:.3f} ms ({cost['headroom'] - cost['interval']:+.3f}); the fp32 "
            f"run's optimizer.step alone {base:.3f} ms"
        )


def draw(results: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(
        len(results), 2, figsize=(12, 3.3 * len(results)), squeeze=False, sharex="row"
    )
    for (scale_panel, flush_panel), result in zip(axes, results):
        window = result["window"]
        for policy, colour in COLOURS.items():
            trace = result["traces"][policy]
            steps = np.arange(1, len(trace["scale"]) + 1)
            scale_panel.step(
                steps, np.log2(trace["scale"]), where="post", color=colour, lw=1.1, label=policy
            )
            skipped = np.array(trace["skipped_at"], dtype=int)
            if skipped.size:
                scale_panel.scatter(
                    skipped + 1,
                    np.log2(np.array(trace["scale"])[skipped]),
                    marker="x",
                    s=14,
                    color=colour,
                    linewidths=0.8,
                )
            fractions = np.array(
                [np.nan if f is None else f for f in trace["flushed_fraction_per_window"]]
            )
            centres = np.arange(len(fractions)) * window + window / 2
            flush_panel.plot(centres, 100 * fractions, color=colour, lw=1.1, label=policy)
            beyond = np.array(
                [np.nan if f is None else f for f in trace["beyond_any_scale_fraction_per_window"]]
            )
            flush_panel.plot(centres, 100 * beyond, color=colour, lw=0.8, ls=":")
        for outlier in result["outliers"]:
            scale_panel.axvline(outlier + 1, color="grey", lw=0.6, ls=":")
        scale_panel.set_ylabel("log2 loss scale")
        scale_panel.set_title(
            f"{result['name']}: loss scale (x: skipped step"
            + ("; dotted: outlier batch)" if result["outliers"] else ")"),
            fontsize=10,
        )
        flush_panel.set_ylabel(f"% flushed, per {window} it.")
        flush_panel.set_title(
            f"{result['name']}: nonzero grads flushed to zero (dotted: beyond any scale)",
            fontsize=10,
        )
        flush_panel.set_yscale("symlog", linthresh=1e-3)
        flush_panel.set_ylim(bottom=0)
        scale_panel.legend(loc="best", fontsize=8)
        flush_panel.legend(loc="best", fontsize=8)
    for panel in axes[-1]:
        panel.set_xlabel("iteration")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


# -- running -----------------------------------------------------------------------------


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="a few hundred iterations each (under a minute)"
    )
    parser.add_argument(
        "--workloads",
        help="comma-separated subset of: digits-mlp, copy-lm, outlier-batches, fine-tuning, "
        "recurrent (default: all)",
    )
    parser.add_argument("--json", metavar="PATH", help="write every result to PATH as JSON")
    parser.add_argument(
        "--figure",
        metavar="PATH",
        help="draw each workload's scale and flushed fraction over time (needs matplotlib)",
    )
    parser.add_argument(
        "--replot",
        metavar="RESULTS",
        help="train nothing: draw --figure again from the results --json wrote",
    )
    args = parser.parse_args(argv)
    if args.replot and not args.figure:
        parser.error("--replot needs --figure")
    return args


def machine_info() -> dict:
    return {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "paddle": paddle.__version__,
        "numpy": importlib.metadata.version("numpy"),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.replot:
        with open(args.replot) as saved:
            draw(json.load(saved)["results"], args.figure)
        return 0
    paddle.set_device("cpu")
    profile = PROFILES["quick" if args.quick else "default"]
    workloads = workloads_for(profile)
    if args.workloads:
        chosen = [name.strip() for name in args.workloads.split(",") if name.strip()]
        unknown = sorted(set(chosen) - {w.name for w in workloads})
        if unknown:
            sys.exit(f"--workloads: unknown {unknown}")
        workloads = [w for w in workloads if w.name in chosen]
    command = " ".join(shlex.quote(part) for part in [sys.executable, *sys.argv])
    info = machine_info()
    measure_every = HeadroomRule.measure_every
    print("Loss-scale policies on fp16-emulated training (every matmul rounded through float16)")
    print(f"command:  {command}")
    print(
        f"machine:  {info['cpu_count']} CPUs, {info['platform']}, load average "
        + " ".join(f"{load:.2f}" for load in info["load_average"] or [])
    )
    print(
        f"versions: Python {info['python']}, Paddle {info['paddle']}, NumPy {info['numpy']}, "
        f"paddle_amp_scaler {paddle_amp_scaler.__version__}"
    )
    rule = HeadroomRule()
    print(
        f"measures: headroom measures the amax in the first {rule.calibration_iterations} "
        f"iterations and every {measure_every}th"
    )
    print(
        f"headroom: margin {rule.margin} (calibration_margin {rule.calibration_margin}), "
        f"peak_half_life {rule.peak_half_life}, calibration {rule.calibration_iterations} x "
        f"{rule.calibration_stride}"
    )
    for workload in workloads:
        print(
            f"workload: {workload.name}, {workload.iterations} iterations: {workload.description}"
        )
    print(
        f"counted:  nonzero scaled gradients reaching the rounded tensors, in iterations whose "
        f"step was taken; final loss = mean of the last {profile.tail} iterations' training "
        f"loss; step+update = median time of scaler.step(optimizer) + scaler.update() per "
        f"iteration (AdamW's own step included; fp32: optimizer.step() alone)"
    )

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    started = time.perf_counter()
    results = []
    for workload in workloads:
        result = run_workload(workload, profile, log)
        result["window"] = profile.window
        results.append(result)
    elapsed = time.perf_counter() - started
    print()
    print_table(results)
    print()
    reach = within_reach(results)
    checks = check_targets(results, reach)
    print_checks(checks)
    print_details(results)
    print(f"\nmeasured in {elapsed:.0f} s")
    if args.json:
        with open(args.json, "w") as output:
            json.dump(
                {
                    "command": command,
                    "machine": info,
                    "quick": args.quick,
                    "measure_every": measure_every,
                    "policies": {**POLICIES, **{k: f"= {v}" for k, v in SAME_RUN_AS.items()}},
                    "results": results,
                    "checks": checks,
                    "within_reach": reach,
                    "elapsed_s": elapsed,
                },
                output,
                allow_nan=False,
            )
            output.write("\n")
    if args.figure:
        draw(results, args.figure)
    return 0


if __name__ == "__main__":
    sys.exit(main())
