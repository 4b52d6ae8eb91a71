"""Training-step speed: kiln against JAX (jit, CPU), the same models, batch,
optimiser and data, side by side in one process (docs/training.md).

    OMP_NUM_THREADS=2 PYTHONPATH=build/release/python .venv/bin/python bench/train_bench.py [--steps 200]

Models: the digits CNN of examples/train_digits.py (batch 32, 8x8 images,
Adam) and an MLP (batch 64, 256 -> 512 -> 512 -> 10, SGD with momentum).
kiln runs `steps` training steps per Session.run (num_host_transfers);
JAX runs a jitted step function in a Python loop (each step's loss read
back, as a training loop does) and is timed after its compile. Prints
milliseconds per step for each and kiln's speed-up (JAX time / kiln time).
"""

import argparse
import os
import pathlib
import sys
import tempfile
import time

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=true intra_op_parallelism_threads=2")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import kiln  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "examples"))
import train_digits  # noqa: E402

jax.config.update("jax_platforms", "cpu")


def cnn_jax(p, x, labels):
    conv = lambda v, k: jax.lax.conv_general_dilated(v, k, (1, 1), [(1, 1), (1, 1)],  # noqa: E731
                                                     dimension_numbers=("NCHW", "OIHW", "NCHW"))
    pool = lambda v: jax.lax.reduce_window(v, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")  # noqa
    h = pool(jax.nn.relu(conv(x, p["k1"]) + p["b1"][None, :, None, None]))
    h = pool(jax.nn.relu(conv(h, p["k2"]) + p["b2"][None, :, None, None]))
    scores = h.reshape(h.shape[0], -1) @ p["w"].T + p["b"]
    log_p = jax.nn.log_softmax(scores, axis=1)
    return -jnp.mean(jnp.take_along_axis(log_p, labels[:, None], axis=1))


def mlp_onnx(path, weights):
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h1"]), helper.make_node("Relu", ["h1"], ["r1"]),
             helper.make_node("Gemm", ["r1", "w2", "b2"], ["h2"]), helper.make_node("Relu", ["h2"], ["r2"]),
             helper.make_node("Gemm", ["r2", "w3", "b3"], ["scores"]),
             helper.make_node("SoftmaxCrossEntropyLoss", ["scores", "labels"], ["loss"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 256]),
                                             helper.make_tensor_value_info("labels", TensorProto.INT64, [64])],
                              [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
                              [numpy_helper.from_array(v, k) for k, v in weights.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def mlp_jax(p, x, labels):
    h = jax.nn.relu(x @ p["w1"] + p["b1"])
    h = jax.nn.relu(h @ p["w2"] + p["b2"])
    log_p = jax.nn.log_softmax(h @ p["w3"] + p["b3"], axis=1)
    return -jnp.mean(jnp.take_along_axis(log_p, labels[:, None], axis=1))


def adam_step(loss_fn, lr=0.01, b1=0.9, b2=0.999, eps=1e-8):
    def step(params, m, v, t, x, labels):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, labels)
        m = {k: b1 * m[k] + (1 - b1) * grads[k] for k in params}
        v = {k: b2 * v[k] + (1 - b2) * grads[k] ** 2 for k in params}
        params = {k: params[k] - lr * (m[k] / (1 - b1 ** t)) / (jnp.sqrt(v[k] / (1 - b2 ** t)) + eps) for k in params}
        return params, m, v, loss
    return jax.jit(step)


def sgd_step(loss_fn, lr=0.05, momentum=0.9):
    def step(params, m, v, t, x, labels):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, labels)
        m = {k: momentum * m[k] + grads[k] for k in params}
        return {k: params[k] - lr * m[k] for k in params}, m, v, loss
    return jax.jit(step)


def time_jax(step_fn, init, xs, ys):
    params = {k: jnp.asarray(v) for k, v in init.items()}
    m = {k: jnp.zeros_like(v) for k, v in params.items()}
    v = {k: jnp.zeros_like(w) for k, w in params.items()}
    params, m, v, loss = step_fn(params, m, v, 1.0, xs[0], ys[0])  # compile
    float(loss)
    start = time.perf_counter()
    for i in range(len(xs)):
        params, m, v, loss = step_fn(params, m, v, float(i + 2), xs[i], ys[i])
        float(loss)
    return (time.perf_counter() - start) / len(xs)


def time_kiln(onnx_path, work, optimizer, xs, ys):
    kiln.compile_training(onnx_path, work / "train.kiln", loss="loss", optimizer=optimizer)
    session = kiln.Session(work / "train.kiln", "cpu", num_host_transfers=len(xs))
    with session:
        session.run({"x": xs, "labels": ys})  # warm-up
        start = time.perf_counter()
        session.run({"x": xs, "labels": ys})
        return (time.perf_counter() - start) / len(xs)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    work = pathlib.Path(tempfile.mkdtemp(prefix="kiln-train-bench-"))
    rows = []

    init = train_digits.initial_weights(rng)
    train_digits.build_model(work / "cnn.onnx", init, 32)
    xs = rng.random((args.steps, 32, 1, 8, 8), dtype=np.float32)
    ys = rng.integers(0, 10, (args.steps, 32)).astype(np.int64)
    rows.append(("digits CNN, batch 32, Adam", time_kiln(work / "cnn.onnx", work, kiln.optim.Adam(0.01), xs, ys),
                 time_jax(adam_step(cnn_jax), init, xs, ys)))

    init = {"w1": (rng.standard_normal((256, 512)) * 0.06).astype(np.float32), "b1": np.zeros(512, np.float32),
            "w2": (rng.standard_normal((512, 512)) * 0.04).astype(np.float32), "b2": np.zeros(512, np.float32),
            "w3": (rng.standard_normal((512, 10)) * 0.04).astype(np.float32), "b3": np.zeros(10, np.float32)}
    mlp_onnx(work / "mlp.onnx", init)
    xs = rng.standard_normal((args.steps, 64, 256)).astype(np.float32)
    ys = rng.integers(0, 10, (args.steps, 64)).astype(np.int64)
    rows.append(("MLP 256-512-512-10, batch 64, SGD momentum",
                 time_kiln(work / "mlp.onnx", work, kiln.optim.SGD(0.05, momentum=0.9), xs, ys),
                 time_jax(sgd_step(mlp_jax), init, xs, ys)))

    print("| model | kiln (ms/step) | JAX jit (ms/step) | kiln speed-up |")
    print("|---|---:|---:|---:|")
    for name, kiln_s, jax_s in rows:
        print(f"| {name} | {kiln_s * 1e3:.3f} | {jax_s * 1e3:.3f} | {jax_s / kiln_s:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
