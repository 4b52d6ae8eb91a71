"""Training packages (kiln.compile_training) run by kiln.Session: ten steps
of an MLP with SGD (momentum, weight decay), Adam and AdamW against the same
steps in JAX (same initial weights, same data; docs/training.md), on cpu
and sim."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln

jax = pytest.importorskip("jax")
jnp = jax.numpy
jax.config.update("jax_platforms", "cpu")

STEPS, BATCH, FEATURES, HIDDEN, CLASSES = 10, 8, 6, 16, 4
RNG = np.random.default_rng(7)
INIT = {"w1": (RNG.standard_normal((FEATURES, HIDDEN)) * 0.4).astype(np.float32),
        "b1": (RNG.standard_normal(HIDDEN) * 0.1).astype(np.float32),
        "w2": (RNG.standard_normal((HIDDEN, CLASSES)) * 0.4).astype(np.float32),
        "b2": (RNG.standard_normal(CLASSES) * 0.1).astype(np.float32)}
X = RNG.standard_normal((STEPS, BATCH, FEATURES)).astype(np.float32)
LABELS = RNG.integers(0, CLASSES, (STEPS, BATCH)).astype(np.int64)


def mlp(path, batch=BATCH):
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h0"]), helper.make_node("Add", ["h0", "b1"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["h"]), helper.make_node("MatMul", ["h", "w2"], ["s0"]),
             helper.make_node("Add", ["s0", "b2"], ["scores"]),
             helper.make_node("SoftmaxCrossEntropyLoss", ["scores", "labels"], ["loss"])]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, FEATURES]),
                       helper.make_tensor_value_info("labels", TensorProto.INT64, [batch])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        [numpy_helper.from_array(value, name) for name, value in INIT.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def jax_loss(params, x, labels):
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    scores = h @ params["w2"] + params["b2"]
    log_p = jax.nn.log_softmax(scores, axis=1)
    return -jnp.mean(jnp.take_along_axis(log_p, labels[:, None], axis=1))


def jax_training(optimizer):
    """The ten steps in JAX, with the optimiser written out (PyTorch's rules)."""
    params = {k: jnp.asarray(v) for k, v in INIT.items()}
    state = {k: (jnp.zeros_like(v), jnp.zeros_like(v)) for k, v in params.items()}
    grad = jax.jit(jax.grad(jax_loss))
    losses = []
    for t in range(1, STEPS + 1):
        losses.append(float(jax_loss(params, X[t - 1], LABELS[t - 1])))
        grads = grad(params, X[t - 1], LABELS[t - 1])
        new = {}
        for k, w in params.items():
            g, (m, v) = grads[k], state[k]
            o = optimizer
            if isinstance(o, kiln.optim.SGD):
                g = g + o.weight_decay * w
                m = o.momentum * m + g if o.momentum > 0 else g
                new[k] = w - o.learning_rate * m
            else:
                if o.kind == "adam":  # AdamW decays apart from the gradient
                    g = g + o.weight_decay * w
                m = o.beta1 * m + (1 - o.beta1) * g
                v = o.beta2 * v + (1 - o.beta2) * g * g
                direction = (m / (1 - o.beta1 ** t)) / (jnp.sqrt(v / (1 - o.beta2 ** t)) + o.epsilon)
                if o.kind == "adamw":
                    direction = direction + o.weight_decay * w
                new[k] = w - o.learning_rate * direction
            state[k] = (m, v)
        params = new
    return {k: np.asarray(v) for k, v in params.items()}, np.array(losses, np.float32)


@pytest.mark.parametrize("optimizer", [kiln.optim.SGD(0.1, momentum=0.9, weight_decay=1e-3),
                                       kiln.optim.Adam(0.01, weight_decay=1e-3), kiln.optim.AdamW(0.01)],
                         ids=["sgd", "adam", "adamw"])
def test_ten_steps_match_jax(tmp_path, device, optimizer):
    mlp(tmp_path / "mlp.onnx")
    report = kiln.compile_training(tmp_path / "mlp.onnx", tmp_path / "mlp.kiln", loss="loss", optimizer=optimizer)
    # The updates are written over their variables by the steps computing them, not copied by kiln.Assign
    # (Adam's step count, a scalar Add, aside).
    assert report["step_kernels"].get("kiln.Assign", 0) <= 1, report["step_kernels"]
    session = kiln.Session(tmp_path / "mlp.kiln", device, num_host_transfers=STEPS)
    assert set(session.variables) >= set(INIT)
    with session:
        losses = session.run({"x": X, "labels": LABELS})["loss"]
    want, want_losses = jax_training(optimizer)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5, atol=1e-6)
    trained = session.get_tensors_data(list(INIT))
    for name in INIT:
        np.testing.assert_allclose(trained[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)
    assert not np.allclose(trained["w1"], INIT["w1"])  # it did train


def test_training_continues_across_runs_and_restarts_from_written_weights(tmp_path):
    mlp(tmp_path / "mlp.onnx")
    kiln.compile_training(tmp_path / "mlp.onnx", tmp_path / "mlp.kiln", loss="loss", optimizer=kiln.optim.SGD(0.1))
    session = kiln.Session(tmp_path / "mlp.kiln", num_host_transfers=5)
    with session:
        session.run({"x": X[:5], "labels": LABELS[:5]})
        session.run({"x": X[5:], "labels": LABELS[5:]})  # the second half of the ten steps
        trained = session.get_tensors_data(list(INIT))
        want, _ = jax_training(kiln.optim.SGD(0.1))
        for name in INIT:
            np.testing.assert_allclose(trained[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)
        session.write_variables_data(INIT)  # back to the start: the same ten steps again
        session.run({"x": X[:5], "labels": LABELS[:5]})
        session.run({"x": X[5:], "labels": LABELS[5:]})
        np.testing.assert_allclose(session.get_tensor_data("w2"), want["w2"], rtol=1e-5, atol=1e-6)


def test_replicas_of_a_training_package_compiled_without_them_are_refused(tmp_path):
    mlp(tmp_path / "mlp.onnx")
    kiln.compile_training(tmp_path / "mlp.onnx", tmp_path / "mlp.kiln", loss="loss")
    with pytest.raises(kiln.Error, match="replicas of it .* would train apart: compile it for replicas"):
        kiln.Session(tmp_path / "mlp.kiln", replication_factor=2)
    with pytest.raises(kiln.Error, match="data_parallel is None, 'replicas' or 'mpi'"):
        kiln.compile_training(tmp_path / "mlp.onnx", tmp_path / "x.kiln", loss="loss", data_parallel=True)


@pytest.mark.parametrize("optimizer", [kiln.optim.SGD(0.1, momentum=0.9), kiln.optim.Adam(0.01)], ids=["sgd", "adam"])
def test_replicas_train_in_step_like_one_copy_on_the_global_batch(tmp_path, device, optimizer):
    """Two replicas, each on its half of every global batch of 16, their gradients averaged by the replicas'
    all-reduce: the same steps as one copy training on the whole batches."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((STEPS, 2 * BATCH, FEATURES)).astype(np.float32)
    labels = rng.integers(0, CLASSES, (STEPS, 2 * BATCH)).astype(np.int64)
    mlp(tmp_path / "shard.onnx")
    kiln.compile_training(tmp_path / "shard.onnx", tmp_path / "replicas.kiln", loss="loss", optimizer=optimizer,
                          data_parallel="replicas")
    with kiln.Session(tmp_path / "replicas.kiln", device, replication_factor=2, num_host_transfers=STEPS) as session:
        # [steps, replicas, *shape]: replica r takes rows r*BATCH .. (r+1)*BATCH of each global batch.
        losses = session.run({"x": x.reshape(STEPS, 2, BATCH, FEATURES),
                              "labels": labels.reshape(STEPS, 2, BATCH)})["loss"]
        trained = session.get_tensors_data(list(INIT))
    mlp(tmp_path / "global.onnx", batch=2 * BATCH)
    kiln.compile_training(tmp_path / "global.onnx", tmp_path / "global.kiln", loss="loss", optimizer=optimizer)
    with kiln.Session(tmp_path / "global.kiln", device, num_host_transfers=STEPS) as session:
        want_losses = session.run({"x": x, "labels": labels})["loss"]
        want = session.get_tensors_data(list(INIT))
    assert losses.shape == (STEPS, 2)
    # Both replicas' losses follow the global run's weights at every step: they stayed in step.
    np.testing.assert_allclose(losses.mean(axis=1), want_losses, rtol=1e-5, atol=1e-6)
    for name in INIT:
        np.testing.assert_allclose(trained[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)
    assert not np.allclose(trained["w1"], INIT["w1"])


CNN_INIT = {"k1": (RNG.standard_normal((4, 1, 3, 3)) * 0.5).astype(np.float32),
            "kb1": (RNG.standard_normal(4) * 0.1).astype(np.float32),
            "k2": (RNG.standard_normal((8, 4, 3, 3)) * 0.3).astype(np.float32),
            "fc": (RNG.standard_normal((10, 8)) * 0.3).astype(np.float32),
            "fb": np.zeros(10, np.float32)}
IMAGES = RNG.standard_normal((STEPS, 8, 1, 8, 8)).astype(np.float32)
DIGITS = RNG.integers(0, 10, (STEPS, 8)).astype(np.int64)


def cnn(path):
    nodes = [helper.make_node("Conv", ["x", "k1", "kb1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p1", "k2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "fc", "fb"], ["scores"], transB=1),
             helper.make_node("SoftmaxCrossEntropyLoss", ["scores", "labels"], ["loss"])]
    graph = helper.make_graph(
        nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 1, 8, 8]),
                       helper.make_tensor_value_info("labels", TensorProto.INT64, [8])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        [numpy_helper.from_array(value, name) for name, value in CNN_INIT.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def jax_cnn_loss(p, x, labels):
    conv = lambda v, k: jax.lax.conv_general_dilated(v, k, (1, 1), [(1, 1), (1, 1)],  # noqa: E731
                                                     dimension_numbers=("NCHW", "OIHW", "NCHW"))
    h = jax.nn.relu(conv(x, p["k1"]) + p["kb1"][None, :, None, None])
    h = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")
    h = jax.nn.relu(conv(h, p["k2"])).mean(axis=(2, 3))
    log_p = jax.nn.log_softmax(h @ p["fc"].T + p["fb"], axis=1)
    return -jnp.mean(jnp.take_along_axis(log_p, labels[:, None], axis=1))


def test_ten_steps_of_a_small_cnn_match_jax(tmp_path, device):
    cnn(tmp_path / "cnn.onnx")
    optimizer = kiln.optim.SGD(0.1, momentum=0.9)
    kiln.compile_training(tmp_path / "cnn.onnx", tmp_path / "cnn.kiln", loss="loss", optimizer=optimizer)
    session = kiln.Session(tmp_path / "cnn.kiln", device, num_host_transfers=STEPS)
    with session:
        losses = session.run({"x": IMAGES, "labels": DIGITS})["loss"]
        trained = session.get_tensors_data(list(CNN_INIT))
    params = {k: jnp.asarray(v) for k, v in CNN_INIT.items()}
    velocity = {k: jnp.zeros_like(v) for k, v in params.items()}
    grad = jax.jit(jax.value_and_grad(jax_cnn_loss))
    want_losses = []
    for t in range(STEPS):
        loss, grads = grad(params, IMAGES[t], DIGITS[t])
        want_losses.append(float(loss))
        velocity = {k: 0.9 * velocity[k] + grads[k] for k in params}
        params = {k: params[k] - 0.1 * velocity[k] for k in params}
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5, atol=1e-6)
    for name in CNN_INIT:
        np.testing.assert_allclose(trained[name], np.asarray(params[name]), rtol=1e-5, atol=1e-6, err_msg=name)


def test_the_digits_example_reaches_97_percent(tmp_path):
    """examples/train_digits.py, as a user runs it (a process of its own), on cpu and sim."""
    import os
    import pathlib
    import subprocess
    import sys
    example = pathlib.Path(__file__).resolve().parents[2] / "examples" / "train_digits.py"
    env = dict(os.environ, KILN_SIM_DEVICES="1", KILN_DEVICE_LOCK_DIR=str(tmp_path / "locks"))
    for device in ("cpu", "sim"):
        result = subprocess.run([sys.executable, str(example), "--device", device], env=env, capture_output=True,
                                text=True, timeout=600)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "test accuracy 9" in result.stdout


@pytest.mark.parametrize("optimizer", [kiln.optim.SGD(0.1, momentum=0.9, weight_decay=1e-3), kiln.optim.Adam(0.01)],
                         ids=["sgd", "adam"])
def test_gradient_accumulation_steps_once_every_k_runs(tmp_path, device, optimizer):
    """gradient_accumulation=2: ten runs are five optimiser steps, each with the mean gradient of two
    micro-batches; the same in JAX."""
    mlp(tmp_path / "mlp.onnx")
    kiln.compile_training(tmp_path / "mlp.onnx", tmp_path / "mlp.kiln", loss="loss", optimizer=optimizer,
                          gradient_accumulation=2)
    session = kiln.Session(tmp_path / "mlp.kiln", device, num_host_transfers=STEPS)
    with session:
        losses = session.run({"x": X, "labels": LABELS})["loss"]
        trained = session.get_tensors_data(list(INIT))
    params = {k: jnp.asarray(v) for k, v in INIT.items()}
    state = {k: (jnp.zeros_like(v), jnp.zeros_like(v)) for k, v in params.items()}
    grad = jax.jit(jax.grad(jax_loss))
    want_losses = []
    for t in range(1, STEPS // 2 + 1):
        pair = [2 * t - 2, 2 * t - 1]
        want_losses += [float(jax_loss(params, X[i], LABELS[i])) for i in pair]
        g0, g1 = (grad(params, X[i], LABELS[i]) for i in pair)
        new = {}
        for k, w in params.items():
            g, (m, v) = (g0[k] + g1[k]) / 2, state[k]
            o = optimizer
            if o.kind == "sgd":
                g = g + o.weight_decay * w
                m = o.momentum * m + g
                new[k] = w - o.learning_rate * m
            else:
                m = o.beta1 * m + (1 - o.beta1) * g
                v = o.beta2 * v + (1 - o.beta2) * g * g
                new[k] = w - o.learning_rate * (m / (1 - o.beta1 ** t)) / (jnp.sqrt(v / (1 - o.beta2 ** t)) + o.epsilon)
            state[k] = (m, v)
        params = new
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5, atol=1e-6)
    for name in INIT:
        np.testing.assert_allclose(trained[name], np.asarray(params[name]), rtol=1e-5, atol=1e-6, err_msg=name)
