"""Training mode of the layers that behave differently when training
(docs/training.md): BatchNormalization normalises with the batch's
statistics and updates its running mean and variance; Dropout draws a new
seeded mask each step; a grouped (depthwise) convolution trains. Ten steps
of a CNN with all three against the same steps in JAX, on cpu and sim."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln

jax = pytest.importorskip("jax")
jnp = jax.numpy
jax.config.update("jax_platforms", "cpu")

STEPS, BATCH, RATIO, MOMENTUM, EPS = 10, 8, 0.25, 0.9, 1e-5
RNG = np.random.default_rng(11)
INIT = {"k1": (RNG.standard_normal((6, 2, 3, 3)) * 0.4).astype(np.float32),
        "gamma": (1 + RNG.standard_normal(6) * 0.1).astype(np.float32),
        "beta": (RNG.standard_normal(6) * 0.1).astype(np.float32),
        "dw": (RNG.standard_normal((6, 1, 3, 3)) * 0.4).astype(np.float32),  # depthwise: group 6
        "k3": (RNG.standard_normal((6, 3, 1, 1)) * 0.4).astype(np.float32),  # group 2: 3 channels each
        "fc": (RNG.standard_normal((5, 6)) * 0.3).astype(np.float32)}
STATS = {"bn_mean": (RNG.standard_normal(6) * 0.1).astype(np.float32),
         "bn_var": (1 + RNG.random(6)).astype(np.float32)}
X = RNG.standard_normal((STEPS, BATCH, 2, 6, 6)).astype(np.float32)
LABELS = RNG.integers(0, 5, (STEPS, BATCH)).astype(np.int64)


def model(path):
    nodes = [helper.make_node("Conv", ["x", "k1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c1", "gamma", "beta", "bn_mean", "bn_var"], ["b1"],
                              epsilon=EPS, momentum=MOMENTUM),
             helper.make_node("Relu", ["b1"], ["r1"]),
             helper.make_node("Conv", ["r1", "dw"], ["c2"], pads=[1, 1, 1, 1], group=6),
             helper.make_node("Conv", ["c2", "k3"], ["c3"], group=2),
             helper.make_node("Relu", ["c3"], ["r3"]),
             helper.make_node("GlobalAveragePool", ["r3"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Dropout", ["f", "ratio"], ["d", "mask"]),
             helper.make_node("Gemm", ["d", "fc"], ["scores"], transB=1),
             helper.make_node("SoftmaxCrossEntropyLoss", ["scores", "labels"], ["loss"])]
    graph = helper.make_graph(
        nodes, "layers", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [BATCH, 2, 6, 6]),
                          helper.make_tensor_value_info("labels", TensorProto.INT64, [BATCH])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, []),
         helper.make_tensor_value_info("mask", TensorProto.BOOL, [BATCH, 6])],
        [numpy_helper.from_array(v, n) for n, v in {**INIT, **STATS}.items()] +
        [numpy_helper.from_array(np.array(RATIO, np.float32), "ratio")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def conv(x, k, pad, groups=1):
    return jax.lax.conv_general_dilated(x, k, (1, 1), [(pad, pad), (pad, pad)], feature_group_count=groups,
                                        dimension_numbers=("NCHW", "OIHW", "NCHW"))


def jax_forward(p, x, labels, mask):
    """The loss, and the batch's mean and (biased) variance, which update the running statistics (ONNX's rule)."""
    c1 = conv(x, p["k1"], 1)
    mean, var = c1.mean(axis=(0, 2, 3)), c1.var(axis=(0, 2, 3))
    b1 = (c1 - mean[None, :, None, None]) / jnp.sqrt(var[None, :, None, None] + EPS)
    b1 = b1 * p["gamma"][None, :, None, None] + p["beta"][None, :, None, None]
    h = jax.nn.relu(conv(conv(jax.nn.relu(b1), p["dw"], 1, groups=6), p["k3"], 0, groups=2)).mean(axis=(2, 3))
    h = h * mask / (1 - RATIO)
    log_p = jax.nn.log_softmax(h @ p["fc"].T, axis=1)
    return -jnp.mean(jnp.take_along_axis(log_p, labels[:, None], axis=1)), (mean, var)


def test_batch_norm_dropout_and_grouped_convs_train_as_in_jax(tmp_path, device):
    model(tmp_path / "m.onnx")
    kiln.compile_training(tmp_path / "m.onnx", tmp_path / "m.kiln", loss="loss", optimizer=kiln.optim.SGD(0.1))
    session = kiln.Session(tmp_path / "m.kiln", device, num_host_transfers=STEPS)
    # The running statistics are variables, never trained.
    assert {"bn_mean", "bn_var"} <= set(session.variables)
    with session:
        out = session.run({"x": X, "labels": LABELS})
        trained = session.get_tensors_data(list(INIT) + list(STATS))
    masks = out["mask"]
    # A new mask each step, dropping about RATIO of the features.
    assert len({m.tobytes() for m in masks}) == STEPS
    assert 0.1 < 1 - masks.mean() < 0.4
    params = {k: jnp.asarray(v) for k, v in INIT.items()}
    stats = {k: jnp.asarray(v) for k, v in STATS.items()}
    step = jax.jit(jax.value_and_grad(jax_forward, has_aux=True))
    want_losses = []
    for t in range(STEPS):
        (loss, (mean, var)), grads = step(params, X[t], LABELS[t], masks[t].astype(np.float32))
        want_losses.append(float(loss))
        params = {k: params[k] - 0.1 * grads[k] for k in params}
        stats = {"bn_mean": stats["bn_mean"] * MOMENTUM + mean * (1 - MOMENTUM),
                 "bn_var": stats["bn_var"] * MOMENTUM + var * (1 - MOMENTUM)}
    np.testing.assert_allclose(out["loss"], want_losses, rtol=1e-5, atol=1e-6)
    for name, want in {**params, **stats}.items():
        np.testing.assert_allclose(trained[name], np.asarray(want), rtol=1e-5, atol=1e-6, err_msg=name)


def test_the_same_package_draws_the_same_masks_in_every_session(tmp_path):
    model(tmp_path / "m.onnx")
    kiln.compile_training(tmp_path / "m.onnx", tmp_path / "m.kiln", loss="loss", seed=5)
    runs = []
    for _ in range(2):
        with kiln.Session(tmp_path / "m.kiln", num_host_transfers=3) as session:
            runs.append(session.run({"x": X[:3], "labels": LABELS[:3]})["mask"])
    np.testing.assert_array_equal(runs[0], runs[1])
    kiln.compile_training(tmp_path / "m.onnx", tmp_path / "other.kiln", loss="loss", seed=6)
    with kiln.Session(tmp_path / "other.kiln", num_host_transfers=3) as session:
        assert not np.array_equal(session.run({"x": X[:3], "labels": LABELS[:3]})["mask"], runs[0])


def test_a_running_statistic_cannot_be_trained(tmp_path):
    model(tmp_path / "m.onnx")
    with pytest.raises(kiln.Error, match="'bn_var' is a BatchNormalization running statistic"):
        kiln.compile_training(tmp_path / "m.onnx", tmp_path / "m.kiln", loss="loss", trainable=["k1", "bn_var"])


RES_INIT = {"stem": (RNG.standard_normal((8, 3, 5, 5)) * 0.2).astype(np.float32),
            "g0": np.ones(8, np.float32), "b0": np.zeros(8, np.float32),
            "ka": (RNG.standard_normal((8, 8, 3, 3)) * 0.15).astype(np.float32),
            "ga": np.ones(8, np.float32), "ba": np.zeros(8, np.float32),
            "kb": (RNG.standard_normal((8, 8, 3, 3)) * 0.15).astype(np.float32),
            "gb": np.ones(8, np.float32), "bb": np.zeros(8, np.float32),
            "fc": (RNG.standard_normal((5, 8)) * 0.3).astype(np.float32), "fcb": np.zeros(5, np.float32)}
RES_STATS = {f"{p}_{s}": (np.zeros(8) if s == "mean" else np.ones(8)).astype(np.float32)
             for p in ("m0", "ma", "mb") for s in ("mean", "var")}
RES_X = RNG.standard_normal((STEPS, 4, 3, 16, 16)).astype(np.float32)
RES_LABELS = RNG.integers(0, 5, (STEPS, 4)).astype(np.int64)


def resnet(path):
    """A ResNet in small: strided stem, BatchNormalization, 3x3 max pooling with stride 2 and padding, a residual
    block, global pooling, a dense layer."""
    def bn(x, g, b, m, y):
        return helper.make_node("BatchNormalization", [x, g, b, f"{m}_mean", f"{m}_var"], [y])
    nodes = [helper.make_node("Conv", ["x", "stem"], ["c0"], strides=[2, 2], pads=[2, 2, 2, 2]), bn("c0", "g0", "b0", "m0", "n0"),
             helper.make_node("Relu", ["n0"], ["r0"]),
             helper.make_node("MaxPool", ["r0"], ["p0"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["p0", "ka"], ["ca"], pads=[1, 1, 1, 1]), bn("ca", "ga", "ba", "ma", "na"),
             helper.make_node("Relu", ["na"], ["ra"]),
             helper.make_node("Conv", ["ra", "kb"], ["cb"], pads=[1, 1, 1, 1]), bn("cb", "gb", "bb", "mb", "nb"),
             helper.make_node("Add", ["nb", "p0"], ["res"]), helper.make_node("Relu", ["res"], ["rr"]),
             helper.make_node("GlobalAveragePool", ["rr"], ["gp"]), helper.make_node("Flatten", ["gp"], ["f"]),
             helper.make_node("Gemm", ["f", "fc", "fcb"], ["scores"], transB=1),
             helper.make_node("SoftmaxCrossEntropyLoss", ["scores", "labels"], ["loss"])]
    graph = helper.make_graph(
        nodes, "resnet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3, 16, 16]),
                          helper.make_tensor_value_info("labels", TensorProto.INT64, [4])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        [numpy_helper.from_array(v, n) for n, v in {**RES_INIT, **RES_STATS}.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def jax_resnet(p, x, labels):
    def bn(v, g, b):
        mean, var = v.mean(axis=(0, 2, 3)), v.var(axis=(0, 2, 3))
        v = (v - mean[None, :, None, None]) / jnp.sqrt(var[None, :, None, None] + 1e-5)
        return v * g[None, :, None, None] + b[None, :, None, None], (mean, var)
    h, s0 = bn(jax.lax.conv_general_dilated(x, p["stem"], (2, 2), [(2, 2), (2, 2)],
                                            dimension_numbers=("NCHW", "OIHW", "NCHW")), p["g0"], p["b0"])
    pooled = jax.lax.reduce_window(jax.nn.relu(h), -jnp.inf, jax.lax.max, (1, 1, 3, 3), (1, 1, 2, 2),
                                   ((0, 0), (0, 0), (1, 1), (1, 1)))
    a, sa = bn(conv(pooled, p["ka"], 1), p["ga"], p["ba"])
    b, sb = bn(conv(jax.nn.relu(a), p["kb"], 1), p["gb"], p["bb"])
    f = jax.nn.relu(b + pooled).mean(axis=(2, 3))
    log_p = jax.nn.log_softmax(f @ p["fc"].T + p["fcb"], axis=1)
    return -jnp.mean(jnp.take_along_axis(log_p, labels[:, None], axis=1)), (s0, sa, sb)


def test_a_small_resnet_trains_as_in_jax(tmp_path, device):
    resnet(tmp_path / "r.onnx")
    kiln.compile_training(tmp_path / "r.onnx", tmp_path / "r.kiln", loss="loss",
                          optimizer=kiln.optim.SGD(0.05, momentum=0.9))
    with kiln.Session(tmp_path / "r.kiln", device, num_host_transfers=STEPS) as session:
        losses = session.run({"x": RES_X, "labels": RES_LABELS})["loss"]
        trained = session.get_tensors_data(list(RES_INIT) + list(RES_STATS))
    params = {k: jnp.asarray(v) for k, v in RES_INIT.items()}
    stats = {k: jnp.asarray(v) for k, v in RES_STATS.items()}
    velocity = {k: jnp.zeros_like(v) for k, v in params.items()}
    step = jax.jit(jax.value_and_grad(jax_resnet, has_aux=True))
    want = []
    for t in range(STEPS):
        (loss, batch_stats), grads = step(params, RES_X[t], RES_LABELS[t])
        want.append(float(loss))
        velocity = {k: 0.9 * velocity[k] + grads[k] for k in params}
        params = {k: params[k] - 0.05 * velocity[k] for k in params}
        for prefix, (mean, var) in zip(("m0", "ma", "mb"), batch_stats):
            stats[f"{prefix}_mean"] = stats[f"{prefix}_mean"] * MOMENTUM + mean * (1 - MOMENTUM)
            stats[f"{prefix}_var"] = stats[f"{prefix}_var"] * MOMENTUM + var * (1 - MOMENTUM)
    np.testing.assert_allclose(losses, want, rtol=1e-5, atol=1e-6)
    for name, value in {**params, **stats}.items():
        np.testing.assert_allclose(trained[name], np.asarray(value), rtol=1e-5, atol=1e-6, err_msg=name)
