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


@pytest.fixture(params=["cpu", "sim"])
def device(request, monkeypatch, tmp_path):
    monkeypatch.setenv("KILN_SIM_DEVICES", "1")
    monkeypatch.setenv("KILN_DEVICE_LOCK_DIR", str(tmp_path / "locks"))
    return request.param


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
