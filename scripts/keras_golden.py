#!/usr/bin/env python3
"""Golden values from Keras 3 (pinned: keras 3.15.1 on CPU JAX 0.10.2) for weft's conformance
test (nn/tests/keras_conformance.rs): losses and their gradients, optimizers after 3 steps,
learning-rate schedules, layers (Dense, LayerNormalization, EinsumDense, MultiHeadAttention with a
mask), truncated initializer statistics, `validation_split` row counts, what "accuracy"
resolves to, activations (all of Keras' elementwise ones and the softmaxes) and their gradients, metric values with ties, and `fit`'s History and final weights, alone and under
EarlyStopping.

    pip install keras==3.15.1 jax==0.10.2 jaxlib==0.10.2 numpy
    KERAS_BACKEND=jax python3 scripts/keras_golden.py data/keras/golden.json
"""

import json
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax
import jax.numpy as jnp
import keras
import numpy as np
from keras.src.trainers import compile_utils

rng = np.random.default_rng(7)
# Keras' own initializers (the attention's weights) draw from this seed: the file is reproducible.
keras.utils.set_random_seed(7)


def arr(*shape, lo=-1.0, hi=1.0):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def tolist(x):
    return np.asarray(x, dtype=np.float64).tolist()


out = {"keras": keras.__version__, "jax": jax.__version__}

# Losses: value and gradient with respect to y_pred.
losses = []
logits = np.array([[-30.0, 0.5, 2.0], [25.0, -1.5, 0.0], [0.1, 0.2, -0.3], [3.0, -4.0, 1.0]], np.float32)
probs = np.abs(arr(4, 3)) + 0.05  # rows do not sum to 1: Keras renormalises
binary_true = np.array([[1, 0, 1], [0, 1, 0], [1, 1, 0], [0, 0, 1]], np.float32)
onehot = np.eye(3, dtype=np.float32)[[1, 0, 2, 2]]
labels = np.array([1, 0, 2, 2], np.int32)
cases = [
    ("mse", keras.losses.MeanSquaredError(), arr(4, 3), arr(4, 3), {}),
    ("bce_logits", keras.losses.BinaryCrossentropy(from_logits=True), binary_true, logits, {}),
    ("bce_probs", keras.losses.BinaryCrossentropy(), binary_true, np.clip(probs, 0, 1), {}),
    ("cce_logits", keras.losses.CategoricalCrossentropy(from_logits=True), onehot, logits, {}),
    ("cce_probs", keras.losses.CategoricalCrossentropy(), onehot, probs, {}),
    ("scce_logits", keras.losses.SparseCategoricalCrossentropy(from_logits=True), labels, logits, {}),
    ("scce_probs", keras.losses.SparseCategoricalCrossentropy(), labels, probs, {}),
]
for name, fn, y_true, y_pred, _ in cases:
    value, grad = jax.value_and_grad(lambda p: fn(jnp.asarray(y_true), p))(jnp.asarray(y_pred))
    losses.append(
        {"name": name, "y_true": tolist(y_true), "y_pred": tolist(y_pred), "value": float(value), "grad": tolist(grad)}
    )
out["losses"] = losses

# Optimizers: 3 steps on one variable from fixed gradients.
w0 = arr(5)
grads = [arr(5), arr(5), arr(5)]
opts = [
    ("sgd", keras.optimizers.SGD(0.1)),
    ("sgd_momentum", keras.optimizers.SGD(0.1, momentum=0.9)),
    ("sgd_nesterov", keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True)),
    ("adam", keras.optimizers.Adam(0.01)),
    ("adamw", keras.optimizers.AdamW(0.01)),
    ("rmsprop", keras.optimizers.RMSprop(0.01)),
    ("adam_clip", keras.optimizers.Adam(0.01, global_clipnorm=0.5)),
]
optimizers = []
for name, opt in opts:
    v = keras.Variable(w0)
    for g in grads:
        opt.apply_gradients([(jnp.asarray(g), v)])
    optimizers.append({"name": name, "w": tolist(v.numpy())})
out["optimizers"] = {"w0": tolist(w0), "grads": [tolist(g) for g in grads], "after_3": optimizers}

# Schedules at steps 0..11.
steps = list(range(12))
scheds = [
    ("piecewise", keras.optimizers.schedules.PiecewiseConstantDecay([3, 6], [1.0, 0.5, 0.1])),
    ("exponential", keras.optimizers.schedules.ExponentialDecay(0.1, 4, 0.5)),
    ("exponential_staircase", keras.optimizers.schedules.ExponentialDecay(0.1, 4, 0.5, staircase=True)),
    ("cosine_warmup", keras.optimizers.schedules.CosineDecay(0.0, 6, alpha=0.1, warmup_target=1.0, warmup_steps=3)),
]
out["schedules"] = [{"name": n, "values": [float(s(i)) for i in steps]} for n, s in scheds]

# Layers with given weights.
x = arr(2, 3, 4)
dense = keras.layers.Dense(5)
dense.build((None, 3, 4))
dk, db = arr(4, 5), arr(5)
dense.set_weights([dk, db])
ln = keras.layers.LayerNormalization(epsilon=1e-3)
ln.build((None, 3, 4))
lg, lb = arr(4), arr(4)
ln.set_weights([lg, lb])
ein = keras.layers.EinsumDense("abc,cde->abde", output_shape=(3, 2, 6), bias_axes="de")
ein.build((None, 3, 4))
ek, eb = arr(4, 2, 6), arr(2, 6)
ein.set_weights([ek, eb])
mha = keras.layers.MultiHeadAttention(num_heads=2, key_dim=3)
q, val = arr(2, 3, 4), arr(2, 5, 6)
keep = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
mha_out, mha_scores = mha(q, val, attention_mask=np.repeat(keep[:, None, :], 3, axis=1), return_attention_scores=True)
out["layers"] = {
    "x": tolist(x),
    "dense": {"kernel": tolist(dk), "bias": tolist(db), "y": tolist(dense(x))},
    "layer_norm": {"gamma": tolist(lg), "beta": tolist(lb), "epsilon": 1e-3, "y": tolist(ln(x))},
    "einsum_dense": {"kernel": tolist(ek), "bias": tolist(eb), "y": tolist(ein(x))},
    "mha": {
        "query": tolist(q),
        "value": tolist(val),
        "key_mask": tolist(keep.astype(np.float32)),
        "weights": [tolist(w) for w in mha.get_weights()],
        "y": tolist(mha_out),
        "scores": tolist(mha_scores),
    },
}

# Truncated initializers: the limit and the standard deviation of a large draw.
inits = []
for name, init, shape in [
    ("glorot_normal", keras.initializers.GlorotNormal(seed=1), (300, 200)),
    ("he_normal", keras.initializers.HeNormal(seed=1), (300, 200)),
    ("glorot_normal_3d", keras.initializers.GlorotNormal(seed=1), (8, 30, 20)),
]:
    w = np.asarray(init(shape))
    inits.append({"name": name, "shape": list(shape), "std": float(w.std()), "max_abs": float(np.abs(w).max())})
out["initializers"] = inits

# validation_split: how many rows Keras trains on.
from keras.src.trainers.data_adapters.array_slicing import train_validation_split

splits = []
for n, s in [(10, 0.25), (10, 0.2), (7, 0.3), (33, 0.1), (5, 0.5)]:
    (tx,), _ = train_validation_split((np.arange(n),), validation_split=s)
    splits.append({"n": n, "split": s, "train": int(len(tx))})
out["validation_split"] = splits

# What "accuracy" becomes, by the shapes of y_true and y_pred.
acc = []
for yt, yp in [((8,), (8, 3)), ((8, 1), (8, 3)), ((8, 3), (8, 3)), ((8, 1), (8, 1)), ((8, 4), (8, 4))]:
    m = compile_utils.get_metric("accuracy", np.zeros(yt), np.zeros(yp))
    acc.append({"y_true": list(yt), "y_pred": list(yp), "metric": type(m).__name__})
out["accuracy"] = acc


# Activations, value and gradient, on values that cover the tails.
xa = np.concatenate([np.linspace(-6.0, 6.0, 25), [-20.0, -0.1, 0.0, 0.1, 20.0]]).astype(np.float32).reshape(5, 6)
activations = []
for name, fn in [
    ("relu", keras.activations.relu),
    ("gelu", keras.activations.gelu),
    ("gelu_tanh", lambda v: keras.activations.gelu(v, approximate=True)),
    ("tanh", keras.activations.tanh),
    ("sigmoid", keras.activations.sigmoid),
    ("silu", keras.activations.silu),
    ("softmax", keras.activations.softmax),
    ("log_softmax", keras.activations.log_softmax),
    ("leaky_relu", keras.activations.leaky_relu),
    ("leaky_relu_0.1", lambda v: keras.activations.leaky_relu(v, negative_slope=0.1)),
    ("elu", keras.activations.elu),
    ("elu_0.5", lambda v: keras.activations.elu(v, alpha=0.5)),
    ("selu", keras.activations.selu),
    ("softplus", keras.activations.softplus),
    ("softsign", keras.activations.softsign),
    ("relu6", keras.activations.relu6),
    ("hard_sigmoid", keras.activations.hard_sigmoid),
    ("hard_silu", keras.activations.hard_silu),
    ("mish", keras.activations.mish),
    ("log_sigmoid", keras.activations.log_sigmoid),
    ("exponential", keras.activations.exponential),
]:
    y = fn(jnp.asarray(xa))
    # The gradient of sum(y * w) for fixed weights w, so softmax's is not trivially zero.
    wa = np.linspace(-1.0, 1.0, xa.size).astype(np.float32).reshape(xa.shape)
    grad = jax.grad(lambda v: jnp.sum(fn(v) * wa))(jnp.asarray(xa))
    activations.append({"name": name, "y": tolist(y), "grad": tolist(grad)})
out["activations"] = {"x": tolist(xa), "w": tolist(np.linspace(-1.0, 1.0, xa.size).astype(np.float32).reshape(xa.shape)), "cases": activations}

# Metric values, ties included: a prediction of exactly 0.5 is not positive (Keras: `> 0.5`), and
# an arg-max tie goes to the first index.
yt_bin = np.array([[1, 0], [0, 1], [1, 1], [0, 0]], np.float32)
yp_bin = np.array([[0.5, 0.2], [0.7, 0.51], [0.9, 0.5], [0.49, 0.0]], np.float32)
yp_cat = np.array([[0.2, 0.2, 0.1], [0.1, 0.8, 0.1], [0.3, 0.3, 0.3], [0.0, 0.1, 0.9]], np.float32)
lab = np.array([1, 1, 0, 2], np.int32)
metric_values = []
for name, m, yt, yp in [
    ("binary_accuracy", keras.metrics.BinaryAccuracy(), yt_bin, yp_bin),
    ("categorical_accuracy", keras.metrics.CategoricalAccuracy(), np.eye(3, dtype=np.float32)[lab], yp_cat),
    ("sparse_categorical_accuracy", keras.metrics.SparseCategoricalAccuracy(), lab, yp_cat),
]:
    m.update_state(yt, yp)
    metric_values.append({"name": name, "y_true": tolist(yt), "y_pred": tolist(yp), "value": float(m.result())})
out["metric_values"] = metric_values

# fit: a small model from given weights, no shuffle, validation_split 0.2 of 11 rows (8 train in
# batches of 3, 3, 2), Adam, sparse cross-entropy from logits and "accuracy"; then the same run
# under EarlyStopping in several configurations. Each case keeps Keras' History (flat keys), the
# epochs it ran and the final weights.
xf = arr(11, 5, lo=-2.0, hi=2.0)
yf = np.array([0, 1, 2, 1, 0, 2, 2, 1, 0, 1, 2], np.int32)
w_init = [arr(5, 4), arr(4), arr(4, 3), arr(3)]


def fit_case(name, epochs, callback=None, **es):
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(3)])
    model.set_weights(w_init)
    model.compile(
        keras.optimizers.Adam(0.05),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    callbacks = [keras.callbacks.EarlyStopping(**es)] if es else []
    h = model.fit(xf, yf, batch_size=3, epochs=epochs, validation_split=0.2, shuffle=False, verbose=0, callbacks=callbacks)
    return {
        "name": name,
        "epochs": epochs,
        "early_stopping": {k: v for k, v in es.items()},
        "history": {k: [float(v) for v in vs] for k, vs in h.history.items()},
        "weights": [tolist(w) for w in model.get_weights()],
    }


out["fit"] = {
    "x": tolist(xf),
    "y": tolist(yf),
    "weights": [tolist(w) for w in w_init],
    "cases": [
        fit_case("plain", 3),
        fit_case("min_delta_restore", 6, monitor="val_loss", patience=1, min_delta=0.5, restore_best_weights=True),
        fit_case("accuracy_from_epoch_2", 8, monitor="accuracy", patience=1, start_from_epoch=2),
        fit_case("val_accuracy_restore", 8, monitor="val_accuracy", patience=0, start_from_epoch=3, restore_best_weights=True),
        fit_case("baseline", 8, monitor="val_accuracy", patience=2, baseline=0.5),
        fit_case("no_baseline", 8, monitor="val_accuracy", patience=2),
        fit_case("mode_max_loss", 6, monitor="val_loss", patience=1, mode="max"),
    ],
}

# More losses, drawn from a generator of their own so the values above stay as they were.
rng2 = np.random.default_rng(11)


def arr2(*shape, lo=-1.0, hi=1.0):
    return rng2.uniform(lo, hi, size=shape).astype(np.float32)


pos_true, pos_pred = arr2(4, 3, lo=0.05, hi=2.0), arr2(4, 3, lo=0.05, hi=2.0)
dist_true = arr2(4, 3, lo=0.05, hi=1.0)
dist_true = dist_true / dist_true.sum(-1, keepdims=True)
dist_pred = arr2(4, 3, lo=0.05, hi=1.0)
dist_pred = dist_pred / dist_pred.sum(-1, keepdims=True)
signs = np.where(arr2(4, 3) > 0, 1.0, -1.0).astype(np.float32)
bits = (arr2(4, 3) > 0).astype(np.float32)
onehot2 = np.eye(3, dtype=np.float32)[[2, 0, 1, 1]]
more = [
    ("mae", keras.losses.MeanAbsoluteError(), arr2(4, 3), arr2(4, 3)),
    ("mape", keras.losses.MeanAbsolutePercentageError(), arr2(4, 3), arr2(4, 3)),
    ("msle", keras.losses.MeanSquaredLogarithmicError(), pos_true, arr2(4, 3, lo=-0.5, hi=2.0)),
    ("huber", keras.losses.Huber(), arr2(4, 3, lo=-2, hi=2), arr2(4, 3, lo=-2, hi=2)),
    ("huber_0.3", keras.losses.Huber(delta=0.3), arr2(4, 3), arr2(4, 3)),
    ("log_cosh", keras.losses.LogCosh(), arr2(4, 3, lo=-30, hi=30), arr2(4, 3, lo=-30, hi=30)),
    ("kld", keras.losses.KLDivergence(), dist_true, dist_pred),
    ("poisson", keras.losses.Poisson(), pos_true, pos_pred),
    ("cosine_similarity", keras.losses.CosineSimilarity(), arr2(4, 3), arr2(4, 3)),
    ("hinge_signs", keras.losses.Hinge(), signs, arr2(4, 3, lo=-2, hi=2)),
    ("hinge_bits", keras.losses.Hinge(), bits, arr2(4, 3, lo=-2, hi=2)),
    ("squared_hinge", keras.losses.SquaredHinge(), bits, arr2(4, 3, lo=-2, hi=2)),
    ("categorical_hinge", keras.losses.CategoricalHinge(), onehot2, arr2(4, 3, lo=-2, hi=2)),
]
losses_more = []
for name, fn, y_true, y_pred in more:
    value, grad = jax.value_and_grad(lambda p: fn(jnp.asarray(y_true), p))(jnp.asarray(y_pred))
    losses_more.append(
        {"name": name, "y_true": tolist(y_true), "y_pred": tolist(y_pred), "value": float(value), "grad": tolist(grad)}
    )
out["losses_more"] = losses_more

# More optimizers: 5 steps on one variable from gradients large enough to clip, from a
# generator of their own; and the default learning rates.
rng3 = np.random.default_rng(13)
w3 = rng3.uniform(-1, 1, size=(6,)).astype(np.float32)
grads3 = [rng3.uniform(-2, 2, size=(6,)).astype(np.float32) for _ in range(5)]
opts3 = [
    ("adagrad", keras.optimizers.Adagrad(0.1)),
    ("adamax", keras.optimizers.Adamax(0.01)),
    ("nadam", keras.optimizers.Nadam(0.01)),
    ("lion", keras.optimizers.Lion(0.01)),
    ("adam_amsgrad", keras.optimizers.Adam(0.01, amsgrad=True)),
    ("adamw_amsgrad", keras.optimizers.AdamW(0.01, amsgrad=True)),
    ("rmsprop_momentum", keras.optimizers.RMSprop(0.01, momentum=0.9)),
    ("rmsprop_centered", keras.optimizers.RMSprop(0.01, centered=True)),
    ("rmsprop_centered_momentum", keras.optimizers.RMSprop(0.01, momentum=0.5, centered=True)),
    ("sgd_clipnorm", keras.optimizers.SGD(0.1, clipnorm=0.5)),
    ("adam_clipvalue", keras.optimizers.Adam(0.01, clipvalue=0.2)),
]
after3 = []
for name, opt in opts3:
    v = keras.Variable(w3)
    for g in grads3:
        opt.apply_gradients([(jnp.asarray(g), v)])
    after3.append({"name": name, "w": tolist(v.numpy())})
defaults = {
    n: float(c().learning_rate.numpy() if hasattr(c().learning_rate, "numpy") else c().learning_rate)
    for n, c in [
        ("sgd", keras.optimizers.SGD),
        ("adam", keras.optimizers.Adam),
        ("adamw", keras.optimizers.AdamW),
        ("rmsprop", keras.optimizers.RMSprop),
        ("adagrad", keras.optimizers.Adagrad),
        ("adamax", keras.optimizers.Adamax),
        ("nadam", keras.optimizers.Nadam),
        ("lion", keras.optimizers.Lion),
    ]
}
out["optimizers_more"] = {"w0": tolist(w3), "grads": [tolist(g) for g in grads3], "after_5": after3, "default_lr": defaults}

# More schedules, at steps 0..25.
steps2 = list(range(26))
scheds2 = [
    ("polynomial", keras.optimizers.schedules.PolynomialDecay(0.1, 10)),
    ("polynomial_power_cycle", keras.optimizers.schedules.PolynomialDecay(0.1, 7, end_learning_rate=0.01, power=2.0, cycle=True)),
    ("inverse_time", keras.optimizers.schedules.InverseTimeDecay(0.1, 5, 0.5)),
    ("inverse_time_staircase", keras.optimizers.schedules.InverseTimeDecay(0.1, 5, 0.5, staircase=True)),
    ("cosine_restarts", keras.optimizers.schedules.CosineDecayRestarts(0.1, 4)),
    ("cosine_restarts_t1_m", keras.optimizers.schedules.CosineDecayRestarts(0.1, 5, t_mul=1.0, m_mul=0.5, alpha=0.1)),
]
out["schedules_more"] = [{"name": n, "values": [float(s(i)) for i in steps2]} for n, s in scheds2]

# More initializers: the statistics of a large draw (Keras' draws differ from weft's; their
# distributions must not), and for orthogonal ones the largest deviation from gain^2 I.
inits2 = []
for name, init, shape in [
    ("lecun_normal", keras.initializers.LecunNormal(seed=1), (300, 200)),
    ("lecun_uniform", keras.initializers.LecunUniform(seed=1), (300, 200)),
    ("variance_scaling_fan_out_uniform", keras.initializers.VarianceScaling(2.0, "fan_out", "uniform", seed=1), (300, 200)),
    ("variance_scaling_fan_avg_normal", keras.initializers.VarianceScaling(0.5, "fan_avg", "untruncated_normal", seed=1), (8, 30, 20)),
    ("orthogonal_tall", keras.initializers.Orthogonal(1.5, seed=1), (300, 200)),
    ("orthogonal_wide", keras.initializers.Orthogonal(1.0, seed=1), (50, 120)),
    ("orthogonal_3d", keras.initializers.Orthogonal(1.0, seed=1), (4, 30, 20)),
    ("constant", keras.initializers.Constant(0.25), (3, 4)),
]:
    w = np.asarray(init(shape), dtype=np.float64)
    inits2.append({"name": name, "shape": list(shape), "std": float(w.std()), "mean": float(w.mean()), "max_abs": float(np.abs(w).max())})
out["initializers_more"] = inits2

# More metrics, over two batches (a running count across batches, as in an epoch), with ties:
# top-k with equal scores, a prediction exactly at the threshold.
mt_pred = [np.array([[0.1, 0.5, 0.5, 0.2], [0.9, 0.05, 0.05, 0.0], [0.3, 0.3, 0.3, 0.1]], np.float32),
           np.array([[0.0, 0.0, 1.0, 0.0], [0.25, 0.25, 0.25, 0.25], [0.4, 0.1, 0.2, 0.3]], np.float32)]
mt_labels = [np.array([2, 1, 3], np.int32), np.array([1, 0, 3], np.int32)]
mt_onehot = [np.eye(4, dtype=np.float32)[l] for l in mt_labels]
mb_pred = [np.array([[0.7, 0.5, 0.2], [0.9, 0.51, 0.0]], np.float32), np.array([[0.3, 0.8, 0.6], [0.5, 0.2, 0.95]], np.float32)]
mb_true = [np.array([[1, 0, 0], [1, 1, 0]], np.float32), np.array([[0, 1, 1], [1, 0, 0]], np.float32)]
mr_pred = [arr2(3, 2), arr2(3, 2)]
mr_true = [arr2(3, 2), arr2(3, 2)]
metric_cases = [
    ("top_2", keras.metrics.TopKCategoricalAccuracy(k=2), mt_onehot, mt_pred),
    ("top_1", keras.metrics.TopKCategoricalAccuracy(k=1), mt_onehot, mt_pred),
    ("sparse_top_2", keras.metrics.SparseTopKCategoricalAccuracy(k=2), mt_labels, mt_pred),
    ("binary_accuracy_0.6", keras.metrics.BinaryAccuracy(threshold=0.6), mb_true, mb_pred),
    ("precision", keras.metrics.Precision(), mb_true, mb_pred),
    ("recall", keras.metrics.Recall(), mb_true, mb_pred),
    ("precision_0.7", keras.metrics.Precision(thresholds=0.7), mb_true, mb_pred),
    ("recall_0.7", keras.metrics.Recall(thresholds=0.7), mb_true, mb_pred),
    ("mae", keras.metrics.MeanAbsoluteError(), mr_true, mr_pred),
    ("mse", keras.metrics.MeanSquaredError(), mr_true, mr_pred),
]
metrics_more = []
for name, m, ys, ps in metric_cases:
    for y_, p_ in zip(ys, ps):
        m.update_state(y_, p_)
    metrics_more.append({"name": name, "y_true": [tolist(v) for v in ys], "y_pred": [tolist(v) for v in ps], "value": float(m.result())})
out["metrics_more"] = metrics_more

# ReduceLROnPlateau: the learning rate after each epoch's end, for a fixed series of monitored
# values (plateaus, small changes under min_delta, cooldowns, the floor at min_lr).
plateau_series = {
    "val_loss": [1.0, 0.9, 0.95, 0.9, 0.91, 0.89995, 0.92, 0.5, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6],
    "val_accuracy": [0.5, 0.6, 0.6, 0.55, 0.6, 0.7, 0.7, 0.7, 0.7, 0.71, 0.7, 0.7, 0.7, 0.7],
}
plateau_cases = [
    ("defaults_p2", "val_loss", dict(patience=2)),
    ("factor_cooldown", "val_loss", dict(factor=0.5, patience=1, cooldown=2)),
    ("min_lr_delta", "val_loss", dict(factor=0.2, patience=1, min_delta=0.02, min_lr=0.003)),
    ("accuracy_max", "val_accuracy", dict(factor=0.5, patience=2, min_delta=0.0, mode="max")),
    ("loss_mode_max", "val_loss", dict(factor=0.5, patience=1, mode="max")),
]
plateau = []
for name, monitor, kw in plateau_cases:
    pm = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    pm.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    cb = keras.callbacks.ReduceLROnPlateau(monitor=monitor, **kw)
    cb.set_model(pm)
    cb.on_train_begin()
    lrs = []
    for e, v in enumerate(plateau_series[monitor]):
        cb.on_epoch_end(e, {monitor: v})
        lrs.append(float(pm.optimizer.learning_rate.numpy()))
    plateau.append({"name": name, "monitor": monitor, "args": kw, "values": plateau_series[monitor], "lr_after": lrs})
out["reduce_lr_on_plateau"] = plateau

def with_gradients(cases, draw, names=True):
    """Each (name, layer, input shape) with weights from `draw`: the output, and the gradients of
    sum(y * w) for fixed weights w with respect to the input and each variable."""
    result = []
    for name, layer, shape in cases:
        xc = draw(*shape)
        layer.build(shape)
        ws = [draw(*w.shape) for w in layer.weights]
        if ws:
            layer.set_weights(ws)
        yc = np.asarray(layer(xc))
        wc = draw(*yc.shape)

        def objective(xv, *vs):
            out_, _ = layer.stateless_call(list(vs), [], xv)
            return jnp.sum(out_ * wc)

        gs = jax.grad(objective, argnums=tuple(range(1 + len(ws))))(jnp.asarray(xc), *[jnp.asarray(v) for v in ws])
        case = {"name": name, "x": tolist(xc), "weights": [tolist(v) for v in ws]}
        if names:
            case["weight_names"] = [w.name for w in layer.weights]
        case.update({"y": tolist(yc), "w": tolist(wc), "grad_x": tolist(gs[0]), "grad_weights": [tolist(g) for g in gs[1:]]})
        result.append(case)
    return result


# Convolution and pooling layers with given weights: the output, and the gradients of
# sum(y * w) for fixed weights w with respect to the input and each variable.
rng3 = np.random.default_rng(13)


def arr3(*shape):
    return rng3.uniform(-1.0, 1.0, size=shape).astype(np.float32)


conv_cases = [
    ("conv2d_valid", keras.layers.Conv2D(3, (2, 3)), (2, 5, 6, 2)),
    ("conv2d_same_strided", keras.layers.Conv2D(4, 3, strides=2, padding="same"), (2, 7, 6, 3)),
    ("conv2d_same_dilated", keras.layers.Conv2D(2, 3, dilation_rate=2, padding="same"), (1, 7, 7, 2)),
    ("conv2d_pointwise_relu_no_bias", keras.layers.Conv2D(3, 1, activation="relu", use_bias=False), (2, 3, 4, 5)),
    ("conv1d_causal_dilated", keras.layers.Conv1D(3, 3, padding="causal", dilation_rate=2), (2, 9, 2)),
    ("conv1d_same_strided", keras.layers.Conv1D(2, 4, strides=2, padding="same"), (2, 9, 3)),
    ("max_pool2d", keras.layers.MaxPooling2D(2), (2, 5, 5, 3)),
    ("max_pool2d_same", keras.layers.MaxPooling2D(3, strides=2, padding="same"), (2, 7, 6, 2)),
    ("avg_pool2d_same", keras.layers.AveragePooling2D(3, strides=2, padding="same"), (2, 7, 6, 2)),
    ("avg_pool2d_valid_strided", keras.layers.AveragePooling2D((2, 3), strides=(1, 2)), (1, 5, 7, 2)),
    ("max_pool1d", keras.layers.MaxPooling1D(2), (2, 7, 3)),
    ("avg_pool1d_same", keras.layers.AveragePooling1D(3, strides=1, padding="same"), (2, 6, 2)),
    ("global_avg_pool2d", keras.layers.GlobalAveragePooling2D(), (2, 3, 4, 5)),
    ("global_max_pool2d", keras.layers.GlobalMaxPooling2D(), (2, 3, 4, 5)),
    ("global_max_pool1d", keras.layers.GlobalMaxPooling1D(), (2, 6, 3)),
    ("conv2d_groups_same", keras.layers.Conv2D(4, 3, groups=2, padding="same"), (2, 5, 5, 4)),
    ("conv1d_groups_3", keras.layers.Conv1D(6, 2, groups=3, activation="relu"), (2, 6, 3)),
]
conv_out = with_gradients(conv_cases, arr3, names=False)
out["conv_layers"] = conv_out

# Normalization options with given weights, as the convolution cases: LayerNormalization's
# axis, center and scale, and RMSNormalization.
rng4 = np.random.default_rng(17)


def arr4(*shape):
    return rng4.uniform(-1.0, 1.0, size=shape).astype(np.float32)


norm_cases = [
    ("layer_norm_axis_1", keras.layers.LayerNormalization(axis=1), (2, 3, 4)),
    ("layer_norm_no_center", keras.layers.LayerNormalization(center=False, epsilon=1e-5), (2, 3, 4)),
    ("layer_norm_no_scale", keras.layers.LayerNormalization(scale=False), (2, 3, 4)),
    ("layer_norm_plain", keras.layers.LayerNormalization(center=False, scale=False), (2, 5)),
    ("rms_norm", keras.layers.RMSNormalization(), (2, 3, 4)),
    ("rms_norm_eps", keras.layers.RMSNormalization(epsilon=1e-3), (2, 5)),
]
norm_out = with_gradients(norm_cases, arr4)
out["norm_layers"] = norm_out

# Label smoothing: the loss and its gradient with respect to y_pred.
rng5 = np.random.default_rng(19)
ls_onehot = np.eye(4, dtype=np.float32)[[0, 3, 1]]
ls_bits = (rng5.uniform(size=(3, 4)) > 0.5).astype(np.float32)
ls_logits = rng5.uniform(-2.0, 2.0, size=(3, 4)).astype(np.float32)
ls_probs = np.asarray(keras.activations.softmax(ls_logits))
ls_sig = np.asarray(keras.activations.sigmoid(ls_logits))
smoothing = []
for name, fn, yt, yp in [
    ("bce_logits_0.1", keras.losses.BinaryCrossentropy(from_logits=True, label_smoothing=0.1), ls_bits, ls_logits),
    ("bce_probs_0.3", keras.losses.BinaryCrossentropy(label_smoothing=0.3), ls_bits, ls_sig),
    ("cce_logits_0.1", keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=0.1), ls_onehot, ls_logits),
    ("cce_probs_0.2", keras.losses.CategoricalCrossentropy(label_smoothing=0.2), ls_onehot, ls_probs),
]:
    value, grad = jax.value_and_grad(lambda p: fn(jnp.asarray(yt), p))(jnp.asarray(yp))
    smoothing.append({"name": name, "y_true": tolist(yt), "y_pred": tolist(yp), "value": float(value), "grad": tolist(grad)})
out["label_smoothing"] = smoothing

# BatchNormalization in training mode (batch statistics, with and without a mask): the output,
# the gradients of sum(y * w) with respect to the input, gamma and beta, the moving statistics
# the call leaves, and the output in inference mode (the given moving statistics).
rng6 = np.random.default_rng(23)


def arr6(*shape, lo=-1.0, hi=1.0):
    return rng6.uniform(lo, hi, size=shape).astype(np.float32)


bn_cases = [
    ("batch_norm", keras.layers.BatchNormalization(), (6, 3), None),
    ("batch_norm_axis_1", keras.layers.BatchNormalization(axis=1, momentum=0.9, epsilon=1e-5), (3, 4, 2), None),
    ("batch_norm_no_center", keras.layers.BatchNormalization(center=False), (2, 3, 4), None),
    ("batch_norm_no_scale", keras.layers.BatchNormalization(scale=False, momentum=0.5), (5, 2), None),
    ("batch_norm_masked", keras.layers.BatchNormalization(momentum=0.8), (2, 5, 3), (2, 5)),
]
bn_out = []
for name, layer, shape, mask_shape in bn_cases:
    xc = arr6(*shape, lo=-2.0, hi=3.0)
    mask = None if mask_shape is None else (rng6.uniform(size=mask_shape) > 0.4)
    layer.build(shape)
    ws = []
    for w in layer.weights:
        lo = 0.2 if "variance" in w.name else -1.0
        ws.append(arr6(*w.shape, lo=lo, hi=1.5))
    layer.set_weights(ws)
    tv = [jnp.asarray(v) for v in ws[: len(layer.trainable_weights)]]
    ntv = [jnp.asarray(v) for v in ws[len(layer.trainable_weights):]]
    kw = {} if mask is None else {"mask": jnp.asarray(mask)}
    y_train, new_ntv = layer.stateless_call(tv, ntv, jnp.asarray(xc), training=True, **kw)
    y_infer, _ = layer.stateless_call(tv, ntv, jnp.asarray(xc), training=False, **kw)
    wc = arr6(*y_train.shape)

    def objective(xv, *vs):
        out_, _ = layer.stateless_call(list(vs), ntv, xv, training=True, **kw)
        return jnp.sum(out_ * wc)

    gs = jax.grad(objective, argnums=tuple(range(1 + len(tv))))(jnp.asarray(xc), *tv)
    bn_out.append({
        "name": name, "x": tolist(xc), "mask": None if mask is None else tolist(mask.astype(np.float32)),
        "weights": [tolist(v) for v in ws], "weight_names": [w.name for w in layer.weights],
        "y_train": tolist(y_train), "y_infer": tolist(y_infer), "moving_after": [tolist(v) for v in new_ntv],
        "w": tolist(wc), "grad_x": tolist(gs[0]), "grad_weights": [tolist(g) for g in gs[1:]],
    })
out["batch_norm"] = bn_out

# GroupNormalization, as the normalization cases above.
gn_cases = [
    ("group_norm_2", keras.layers.GroupNormalization(groups=2), (2, 3, 4)),
    ("group_norm_instance", keras.layers.GroupNormalization(groups=-1, epsilon=1e-5), (2, 5, 3)),
    ("group_norm_axis_1", keras.layers.GroupNormalization(groups=2, axis=1, center=False), (2, 4, 3)),
    ("group_norm_4_of_8", keras.layers.GroupNormalization(groups=4, scale=False), (3, 8)),
    ("group_norm_image", keras.layers.GroupNormalization(groups=3), (2, 2, 3, 6)),
]
gn_out = with_gradients(gn_cases, arr6)
out["group_norm"] = gn_out

# fit through a BatchNormalization: Dense, BatchNormalization, relu, Dense; SGD, 2 epochs of
# batches of 4 (the last of 3) without shuffling: the History, every weight after it (the moving
# statistics included) and predict's output (inference mode, the moving statistics).
bn_w = [arr6(5, 4), arr6(4), arr6(4, lo=0.5, hi=1.5), arr6(4), np.zeros(4, np.float32), np.ones(4, np.float32), arr6(4, 3), arr6(3)]
bn_model = keras.Sequential([
    keras.Input((5,)), keras.layers.Dense(4), keras.layers.BatchNormalization(momentum=0.7),
    keras.layers.Activation("relu"), keras.layers.Dense(3),
])
bn_model.set_weights(bn_w)
bn_model.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
bn_h = bn_model.fit(xf, yf, batch_size=4, epochs=2, shuffle=False, verbose=0)
out["batch_norm_fit"] = {
    "weights": [tolist(w) for w in bn_w],
    "loss": [float(v) for v in bn_h.history["loss"]],
    "after": [tolist(w) for w in bn_model.get_weights()],
    "predict": tolist(bn_model.predict(xf, verbose=0)),
}

# Sample weights, reductions and ignore_class: the loss and its gradient with respect to y_pred.
rng7 = np.random.default_rng(29)


def arr7(*shape, lo=-1.0, hi=1.0):
    return rng7.uniform(lo, hi, size=shape).astype(np.float32)


sw_labels = np.array([0, 2, -1, 1, 2], np.int32)
sw_logits = arr7(5, 3, lo=-2.0, hi=2.0)
sw_temporal = (arr7(2, 3, 4) > 0).astype(np.float32)
weighted = []
for name, fn, yt, yp, sw in [
    ("mse_weighted", keras.losses.MeanSquaredError(), arr7(4, 3), arr7(4, 3), arr7(4, lo=0.0, hi=2.0)),
    ("mae_sum", keras.losses.MeanAbsoluteError(reduction="sum"), arr7(4, 3), arr7(4, 3), None),
    ("mae_sum_weighted", keras.losses.MeanAbsoluteError(reduction="sum"), arr7(4, 3), arr7(4, 3), arr7(4, lo=0.0, hi=2.0)),
    ("huber_mean_with_sample_weight", keras.losses.Huber(reduction="mean_with_sample_weight"), arr7(4, 2, lo=-3.0, hi=3.0), arr7(4, 2), arr7(4, lo=0.0, hi=2.0)),
    ("cce_logits_weighted", keras.losses.CategoricalCrossentropy(from_logits=True), np.eye(3, dtype=np.float32)[[0, 2, 1, 1]], arr7(4, 3), arr7(4, lo=0.0, hi=2.0)),
    ("scce_logits_ignore", keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=-1), sw_labels, sw_logits, None),
    ("scce_logits_ignore_weighted", keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=-1), sw_labels, sw_logits, arr7(5, lo=0.0, hi=2.0)),
    ("scce_probs_ignore_sum", keras.losses.SparseCategoricalCrossentropy(ignore_class=2, reduction="sum"), np.array([0, 2, 1, 2], np.int32), np.asarray(keras.activations.softmax(arr7(4, 3))), None),
    ("bce_logits_temporal_weighted", keras.losses.BinaryCrossentropy(from_logits=True), sw_temporal, arr7(2, 3, 4), arr7(2, 3, lo=0.0, hi=2.0)),
    ("kld_mean_with_sample_weight", keras.losses.KLDivergence(reduction="mean_with_sample_weight"), np.asarray(keras.activations.softmax(arr7(3, 4))), np.asarray(keras.activations.softmax(arr7(3, 4))), arr7(3, lo=0.0, hi=2.0)),
]:
    kw = {} if sw is None else {"sample_weight": jnp.asarray(sw)}
    value, grad = jax.value_and_grad(lambda p: fn(jnp.asarray(yt), p, **kw))(jnp.asarray(yp))
    weighted.append({
        "name": name, "y_true": tolist(yt), "y_pred": tolist(yp), "sample_weight": None if sw is None else tolist(sw),
        "value": float(value), "grad": tolist(grad),
    })
out["weighted_losses"] = weighted

# fit with sample_weight (and validation_split, which splits them) and with class_weight: the
# model, data and starting weights of the fit cases above, SGD, batches of 4, no shuffling.
def weighted_fit(**kw):
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(3)])
    model.set_weights(w_init)
    model.compile(keras.optimizers.SGD(0.2), keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    h = model.fit(xf, yf, batch_size=4, epochs=3, shuffle=False, verbose=0, **kw)
    return {"history": {k: [float(v) for v in vs] for k, vs in h.history.items()}, "weights": [tolist(w) for w in model.get_weights()]}


fit_sw = arr7(11, lo=0.0, hi=2.0)
out["weighted_fit"] = {
    "sample_weight": tolist(fit_sw),
    "class_weight": {"0": 2.0, "2": 0.5},
    "sample_weighted": weighted_fit(sample_weight=fit_sw, validation_split=0.2),
    "class_weighted": weighted_fit(class_weight={0: 2.0, 2: 0.5}, validation_split=0.2),
}

# AUC accumulated over two batches (ties at the thresholds included), for each curve and a
# coarse row of thresholds.
rng8 = np.random.default_rng(31)
auc_batches = []
for rows in (7, 5):
    p = rng8.uniform(0.0, 1.0, size=(rows, 2)).astype(np.float32)
    p[0, 0] = 0.5  # exactly a threshold of the 51-threshold row
    y = (rng8.uniform(size=(rows, 2)) > 0.5).astype(np.float32)
    auc_batches.append((p, y))
auc_logits = [(rng8.uniform(-3.0, 3.0, size=(6, 1)).astype(np.float32), (rng8.uniform(size=(6, 1)) > 0.5).astype(np.float32)) for _ in range(2)]
auc_out = []
for name, metric, batches in [
    ("roc", keras.metrics.AUC(), auc_batches),
    ("pr", keras.metrics.AUC(curve="PR"), auc_batches),
    ("roc_51", keras.metrics.AUC(num_thresholds=51), auc_batches),
    ("pr_51", keras.metrics.AUC(num_thresholds=51, curve="PR"), auc_batches),
    ("roc_logits", keras.metrics.AUC(from_logits=True), auc_logits),
]:
    for p, y in batches:
        metric.update_state(y, p)
    auc_out.append({
        "name": name, "batches": [{"y_pred": tolist(p), "y_true": tolist(y)} for p, y in batches], "value": float(metric.result()),
    })
out["auc"] = auc_out

# Regularizers and constraints: each penalty and projection on given values, and fit through
# a Dense with a kernel and a bias regularizer, an activity regularizer and a kernel constraint,
# then a Dense with L1L2 and a non-negative bias (SGD, batches of 4, a validation split: the
# History's losses include the penalties).
rng9 = np.random.default_rng(37)
reg_w = rng9.uniform(-1.0, 1.0, size=(4, 3)).astype(np.float32)
conv_w = rng9.uniform(-1.0, 1.0, size=(2, 2, 3, 2)).astype(np.float32)
out["regularizers"] = {
    "w": tolist(reg_w),
    "penalties": {
        "l1": float(keras.regularizers.L1(0.03)(reg_w)),
        "l2": float(keras.regularizers.L2(0.02)(reg_w)),
        "l1l2": float(keras.regularizers.L1L2(l1=0.01, l2=0.05)(reg_w)),
    },
    "constraints": {
        "max_norm": tolist(keras.constraints.MaxNorm(0.9)(reg_w)),
        "max_norm_axis_1": tolist(keras.constraints.MaxNorm(0.7, axis=1)(reg_w)),
        "non_neg": tolist(keras.constraints.NonNeg()(reg_w)),
        "unit_norm": tolist(keras.constraints.UnitNorm()(reg_w)),
        "min_max_norm": tolist(keras.constraints.MinMaxNorm(0.5, 0.8, rate=0.7)(reg_w)),
    },
    "conv_w": tolist(conv_w),
    "conv_max_norm": tolist(keras.constraints.MaxNorm(1.0, axis=[0, 1, 2])(conv_w)),
}
reg_model = keras.Sequential([
    keras.Input((5,)),
    keras.layers.Dense(4, activation="relu", kernel_regularizer=keras.regularizers.L2(0.01), bias_regularizer=keras.regularizers.L1(0.02),
                       activity_regularizer=keras.regularizers.L2(0.005), kernel_constraint=keras.constraints.MaxNorm(0.8)),
    keras.layers.Dense(3, kernel_regularizer=keras.regularizers.L1L2(l1=0.01, l2=0.02), bias_constraint=keras.constraints.NonNeg()),
])
reg_model.set_weights(w_init)
reg_model.compile(keras.optimizers.SGD(0.2), keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
reg_h = reg_model.fit(xf, yf, batch_size=4, epochs=3, shuffle=False, verbose=0, validation_split=0.2)
out["regularized_fit"] = {
    "history": {k: [float(v) for v in vs] for k, vs in reg_h.history.items()},
    "weights": [tolist(w) for w in reg_model.get_weights()],
}

# Optimizer options in fit (the model, data and weights of the fit cases; 3 epochs of batches
# of 4, 9 calls): weight decay leaving the biases out, gradient accumulation, and an EMA of the
# weights (taken at the end of fit, or every 2 updates).
def optimizer_fit(optimizer):
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(3)])
    model.set_weights(w_init)
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    h = model.fit(xf, yf, batch_size=4, epochs=3, shuffle=False, verbose=0)
    return {"loss": [float(v) for v in h.history["loss"]], "weights": [tolist(w) for w in model.get_weights()]}


adamw_excluding = keras.optimizers.AdamW(0.05, weight_decay=0.3)
adamw_excluding.exclude_from_weight_decay(var_names=["bias"])
out["optimizer_options"] = {
    "adamw_exclude_bias": optimizer_fit(adamw_excluding),
    "adam_accumulate_2": optimizer_fit(keras.optimizers.Adam(0.05, gradient_accumulation_steps=2)),
    "sgd_accumulate_3": optimizer_fit(keras.optimizers.SGD(0.3, momentum=0.5, gradient_accumulation_steps=3)),
    "sgd_ema": optimizer_fit(keras.optimizers.SGD(0.3, momentum=0.9, use_ema=True, ema_momentum=0.9)),
    "adam_ema_overwrite_2": optimizer_fit(keras.optimizers.Adam(0.05, use_ema=True, ema_momentum=0.8, ema_overwrite_frequency=2)),
    "adam_accumulate_2_schedule": optimizer_fit(keras.optimizers.Adam(
        keras.optimizers.schedules.ExponentialDecay(0.05, decay_steps=2, decay_rate=0.5), gradient_accumulation_steps=2)),
}

# Recurrent layers with given weights (and masks): the output and the gradients of sum(y * w)
# with respect to the input and each variable.
rng10 = np.random.default_rng(41)


def arr10(*shape):
    return rng10.uniform(-1.0, 1.0, size=shape).astype(np.float32)


rnn_cases = [
    ("simple_rnn", keras.layers.SimpleRNN(3), (2, 4, 2), False),
    ("simple_rnn_relu_seq_backwards", keras.layers.SimpleRNN(3, activation="relu", return_sequences=True, go_backwards=True), (2, 4, 2), False),
    ("gru_seq", keras.layers.GRU(3, return_sequences=True), (2, 5, 2), False),
    ("gru_reset_before", keras.layers.GRU(3, reset_after=False), (2, 4, 3), False),
    ("gru_masked", keras.layers.GRU(4, return_sequences=True), (2, 5, 2), True),
    ("lstm", keras.layers.LSTM(3), (2, 4, 2), False),
    ("lstm_masked_seq", keras.layers.LSTM(3, return_sequences=True), (3, 5, 2), True),
    ("lstm_backwards_no_bias", keras.layers.LSTM(2, go_backwards=True, use_bias=False), (2, 4, 3), False),
    ("lstm_masked_last", keras.layers.LSTM(3), (3, 5, 2), True),
    ("bidirectional_lstm_seq_masked", keras.layers.Bidirectional(keras.layers.LSTM(3, return_sequences=True)), (3, 5, 2), True),
    ("bidirectional_gru_sum", keras.layers.Bidirectional(keras.layers.GRU(2), merge_mode="sum"), (2, 4, 3), False),
    ("bidirectional_simple_rnn_ave_seq", keras.layers.Bidirectional(keras.layers.SimpleRNN(2, return_sequences=True), merge_mode="ave"), (2, 4, 2), False),
]
rnn_out = []
for name, layer, shape, masked in rnn_cases:
    xc = arr10(*shape)
    mask = None
    if masked:
        mask = np.ones(shape[:2], bool)
        mask[0, 3:] = False   # padding at the end
        mask[1, 1] = False    # a gap
        mask[-1, 0] = False   # padding at the start
    layer.build(shape)
    ws = [arr10(*w.shape) for w in layer.trainable_weights]
    for var, v in zip(layer.trainable_weights, ws):
        var.assign(v)
    # The non-trainable state (a dropout seed) as it is.
    ntv = [jnp.asarray(v.numpy()) for v in layer.non_trainable_variables]
    kw = {} if mask is None else {"mask": jnp.asarray(mask)}
    yc, _ = layer.stateless_call([jnp.asarray(v) for v in ws], ntv, jnp.asarray(xc), **kw)
    wc = arr10(*yc.shape)

    def objective(xv, *vs):
        out_, _ = layer.stateless_call(list(vs), ntv, xv, **kw)
        return jnp.sum(out_ * wc)

    gs = jax.grad(objective, argnums=tuple(range(1 + len(ws))))(jnp.asarray(xc), *[jnp.asarray(v) for v in ws])
    rnn_out.append({
        "name": name, "x": tolist(xc), "mask": None if mask is None else tolist(mask.astype(np.float32)),
        "weights": [tolist(v) for v in ws], "weight_names": [w.name for w in layer.trainable_weights],
        "y": tolist(yc), "w": tolist(wc), "grad_x": tolist(gs[0]), "grad_weights": [tolist(g) for g in gs[1:]],
    })
out["recurrent_layers"] = rnn_out

os.makedirs(os.path.dirname(sys.argv[1]) or ".", exist_ok=True)
with open(sys.argv[1], "w") as f:
    json.dump(out, f)
    f.write("\n")
