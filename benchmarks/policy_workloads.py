"""The policy benchmark's workloads (``policy_bench.py``): five fp16-emulated training
problems, each a model, its optimizer and its batches, built from a fixed seed so that
every policy trains on the same weights and the same data."""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable

warnings.filterwarnings("ignore", message="No ccache found")

# scikit-learn before Paddle: Paddle 2.6 loads its own zlib, which breaks the numpy.random
# import that scikit-learn would otherwise make later.
from sklearn.datasets import load_digits  # noqa: E402  # isort: skip

import numpy as np  # noqa: E402
import paddle  # noqa: E402
import paddle.nn.functional as F  # noqa: E402

from paddle_amp_scaler.testing import (  # noqa: E402
    UnderflowCensus,
    round_linear_layers,
    round_through_float16,
)

SEED = 2027


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


def digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 1797 digits: features scaled to [0, 1], and labels."""
    features, labels = load_digits(return_X_y=True)
    return (features / 16.0).astype("float32"), labels.astype("int64")


def digits_mlp() -> paddle.nn.Layer:
    paddle.seed(SEED)
    return mlp([64, 256, 128, 10])


def digits_workload(iterations: int) -> Workload:
    """scikit-learn's 1797 digits, an MLP trained with AdamW far past the point where it
    classifies every training example: the loss, and the gradients with it, fall by
    orders of magnitude."""
    features, labels = digits()
    batch_size = 64
    per_epoch = len(features) // batch_size

    def build(census):
        return with_adamw(digits_mlp(), census, 2e-3, 1e-4)

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
    features, labels = digits()
    batch_size = 64

    def build(census):
        model = digits_mlp()
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
