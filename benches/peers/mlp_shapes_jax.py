"""Peer for `cargo bench --bench mlp_shapes`: the same MLPs (ReLU, softmax cross-entropy on
logits, Adam 1e-3 with the kit's hand-written update, random data) as one `jax.jit` training step
and a jitted forward, measured as the peer kit measures (a warm-up, then the median of 5 blocks).
Shapes from WEFT_MLP_SHAPES (`batch:in-hidden-..-classes`, comma-separated; default: the bench's),
MIN_SECS (default 1) each. Prints one JSON line per figure, named as the bench names its own."""
import json
import os
import statistics
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

SHAPES = ("32:784-256-10,64:784-512-512-10,128:784-256-256-10,256:784-1024-1024-10,"
          "1024:784-512-512-10,32:784-1024-1024-10,256:64-64-64-10,32:32-64-64-2")


def median_block_rate(run_k, min_secs, blocks=5):
    """run_k(k) runs k units and waits for them: the median rate of `blocks` blocks."""
    t0 = time.perf_counter()
    n = 0
    while n < 3 or time.perf_counter() - t0 < 1.0:
        run_k(1)
        n += 1
    target, k = min_secs / blocks, 1
    while True:
        t = time.perf_counter()
        run_k(k)
        dt = time.perf_counter() - t
        if dt >= target:
            break
        k = max(k * 2, int(k * target / max(dt, 1e-6) * 1.2))
    rates = []
    for _ in range(blocks):
        t = time.perf_counter()
        run_k(k)
        rates.append(k / (time.perf_counter() - t))
    return statistics.median(rates)


def measure(batch, dims, min_secs):
    key = jax.random.PRNGKey(0)
    params = []
    for din, dout in zip(dims[:-1], dims[1:]):
        key, k1 = jax.random.split(key)
        lim = (6.0 / (din + dout)) ** 0.5
        params.append((jax.random.uniform(k1, (din, dout), jnp.float32, -lim, lim), jnp.zeros((dout,), jnp.float32)))

    def forward(p, x):
        for i, (w, b) in enumerate(p):
            x = x @ w + b
            if i < len(p) - 1:
                x = jax.nn.relu(x)
        return x

    def loss_fn(p, x, y):
        logp = jax.nn.log_softmax(forward(p, x))
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))

    b1, b2, eps, lr = 0.9, 0.999, 1e-7, 1e-3

    def step(state, x, y):
        p, m, v, t = state
        loss, g = jax.value_and_grad(loss_fn)(p, x, y)
        t = t + 1
        m = jax.tree_util.tree_map(lambda m_, g_: b1 * m_ + (1 - b1) * g_, m, g)
        v = jax.tree_util.tree_map(lambda v_, g_: b2 * v_ + (1 - b2) * g_ * g_, v, g)
        a = lr * jnp.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        p = jax.tree_util.tree_map(lambda p_, m_, v_: p_ - a * m_ / (jnp.sqrt(v_) + eps), p, m, v)
        return (p, m, v, t), loss

    step = jax.jit(step, donate_argnums=(0,))
    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    state = [(params, zeros, jax.tree_util.tree_map(jnp.zeros_like, params), jnp.float32(0))]
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.random((batch, dims[0]), dtype=np.float32))
    y = jnp.asarray((np.arange(batch) * 7 % dims[-1]).astype(np.int32))

    def train(k):
        s, loss = state[0], None
        for _ in range(k):
            s, loss = step(s, x, y)
        loss.block_until_ready()
        state[0] = s

    fwd = jax.jit(forward)

    def infer(k):
        o = None
        for _ in range(k):
            o = fwd(state[0][0], x)
        o.block_until_ready()

    return median_block_rate(train, min_secs), median_block_rate(infer, min_secs) * batch


def main():
    secs = float(os.environ.get("MIN_SECS", "1"))
    for shape in filter(None, os.environ.get("WEFT_MLP_SHAPES", SHAPES).split(",")):
        b, w = shape.split(":")
        train, infer = measure(int(b), [int(d) for d in w.split("-")], secs)
        size = f"b{b}/{w}"
        for bench, value, unit in (("mlp_shape_train", train, "steps/s"), ("mlp_shape_infer", infer, "samples/s")):
            print(json.dumps({"peer": "jax.jit", "jax": jax.__version__, "bench": bench, "size": size,
                              "value": round(value, 3), "unit": unit}), flush=True)


if __name__ == "__main__":
    main()
