"""Reverse-mode gradients (kiln.compile(..., gradients_of=, wrt=)): every
rule against central finite differences of the same model run by
onnxruntime in float64, an independent forward (docs/training.md)."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln


def make_model(path, nodes, inputs, weights, loss="loss", dtype=TensorProto.FLOAT):
    """inputs: {name: (shape, elem_type)}; weights: {name: array} as initializers."""
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, t if t != "x" else dtype, s) for n, (s, t) in inputs.items()],
        [helper.make_tensor_value_info(loss, dtype, None)],
        [numpy_helper.from_array(w.astype(np.float64 if dtype == TensorProto.DOUBLE else np.float32), n)
         for n, w in weights.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)


def finite_differences(tmp_path, build, feeds, weights, wrt, eps=1e-6, dtype=TensorProto.DOUBLE):
    """d loss / d w by central differences of the model in onnxruntime, in float64 (or, for operators it has no
    float64 kernel for, float32 with a larger eps)."""
    numpy_type = np.float64 if dtype == TensorProto.DOUBLE else np.float32
    build(tmp_path / "fd.onnx", weights, dtype)
    # The weights become inputs, so that each perturbation needs no new model.
    model = onnx.load(tmp_path / "fd.onnx")
    for init in list(model.graph.initializer):
        if init.name in wrt:
            model.graph.input.append(helper.make_tensor_value_info(init.name, dtype, list(init.dims)))
            model.graph.initializer.remove(init)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    base = {k: (v.astype(numpy_type) if v.dtype.kind == "f" else v) for k, v in feeds.items()}
    base.update({w: weights[w].astype(numpy_type) for w in wrt})
    loss = lambda f: float(session.run(["loss"], f)[0].reshape(()))  # noqa: E731
    grads = {}
    for w in wrt:
        g = np.zeros(weights[w].shape)
        for index in np.ndindex(*weights[w].shape):
            plus, minus = dict(base), dict(base)
            plus[w] = base[w].copy()
            minus[w] = base[w].copy()
            plus[w][index] += eps
            minus[w][index] -= eps
            g[index] = (loss(plus) - loss(minus)) / (2 * eps)
        grads[w] = g
    return grads


def check(tmp_path, build, feeds, weights, wrt, rtol=2e-3, atol=2e-4, **fd):
    build(tmp_path / "m.onnx", weights, TensorProto.FLOAT)
    kiln.compile(tmp_path / "m.onnx", tmp_path / "m.kiln", gradients_of="loss", wrt=wrt)
    got = kiln.Runner(tmp_path / "m.kiln").run(feeds)
    want = finite_differences(tmp_path, build, feeds, weights, wrt, **fd)
    for w in wrt:
        np.testing.assert_allclose(got[f"{w}_grad"], want[w], rtol=rtol, atol=atol, err_msg=w)


RNG = np.random.default_rng(0)


def test_an_mlp_with_softmax_cross_entropy(tmp_path):
    """Gemm (transB), Relu, MatMul with a broadcast bias Add, SoftmaxCrossEntropyLoss (mean)."""
    weights = {"w1": RNG.standard_normal((5, 4)) * 0.5, "b1": RNG.standard_normal(5) * 0.1,
               "w2": RNG.standard_normal((5, 3)) * 0.5, "b2": RNG.standard_normal(3) * 0.1}

    def build(path, w, dtype):
        nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=1),
                 helper.make_node("Relu", ["h"], ["r"]),
                 helper.make_node("MatMul", ["r", "w2"], ["s"]),
                 helper.make_node("Add", ["s", "b2"], ["scores"]),
                 helper.make_node("SoftmaxCrossEntropyLoss", ["scores", "labels"], ["loss"])]
        make_model(path, nodes, {"x": ([6, 4], "x"), "labels": ([6], TensorProto.INT64)}, w, dtype=dtype)

    feeds = {"x": RNG.standard_normal((6, 4)).astype(np.float32), "labels": np.array([0, 2, 1, 1, 0, 2])}
    check(tmp_path, build, feeds, weights, ["w1", "b1", "w2", "b2"])


def test_elementwise_rules_and_a_mean_squared_error(tmp_path):
    """Sigmoid, Tanh, Mul, Div, Sub, Exp, Log, Sqrt, Pow, Neg, Transpose, Reshape, ReduceMean, ReduceSum."""
    weights = {"a": RNG.uniform(0.5, 1.5, (3, 4)), "b": RNG.uniform(0.5, 1.5, (4,))}

    def build(path, w, dtype):
        nodes = [helper.make_node("Mul", ["x", "a"], ["m"]),
                 helper.make_node("Sigmoid", ["m"], ["s"]),
                 helper.make_node("Div", ["s", "b"], ["d"]),
                 helper.make_node("Tanh", ["d"], ["t"]),
                 helper.make_node("Exp", ["t"], ["e"]),
                 helper.make_node("Log", ["e"], ["l"]),
                 helper.make_node("Sqrt", ["e"], ["q"]),
                 helper.make_node("Add", ["l", "q"], ["u"]),
                 helper.make_node("Transpose", ["u"], ["ut"], perm=[1, 0]),
                 helper.make_node("Reshape", ["ut", "shape"], ["flat"]),
                 helper.make_node("Neg", ["flat"], ["n"]),
                 helper.make_node("Sub", ["n", "target"], ["diff"]),
                 helper.make_node("Pow", ["diff", "two"], ["sq"]),
                 helper.make_node("ReduceSum", ["sq", "axes"], ["per_row"], keepdims=0),
                 helper.make_node("ReduceMean", ["per_row"], ["loss"], keepdims=0)]
        const = {"shape": np.array([2, 6], np.int64), "axes": np.array([1], np.int64),
                 "two": np.array(2.0)}
        make_model(path, nodes, {"x": ([3, 4], "x"), "target": ([2, 6], "x")}, w, dtype=dtype)
        model = onnx.load(path)
        for name, value in const.items():
            array = value.astype(np.float64 if dtype == TensorProto.DOUBLE else np.float32) if value.dtype.kind == "f" else value
            model.graph.initializer.append(numpy_helper.from_array(array, name))
        onnx.save(model, path)

    feeds = {"x": RNG.standard_normal((3, 4)).astype(np.float32),
             "target": RNG.standard_normal((2, 6)).astype(np.float32)}
    check(tmp_path, build, feeds, weights, ["a", "b"])


def test_softmax_log_softmax_and_a_batched_matmul(tmp_path):
    weights = {"w": RNG.standard_normal((2, 4, 3)) * 0.5, "v": RNG.standard_normal((3, 3)) * 0.5}

    def build(path, w, dtype):
        nodes = [helper.make_node("MatMul", ["x", "w"], ["p"]),        # [2, 5, 4] @ [2, 4, 3]
                 helper.make_node("Softmax", ["p"], ["sm"], axis=-1),
                 helper.make_node("MatMul", ["sm", "v"], ["q"]),       # [2, 5, 3] @ [3, 3] (broadcast)
                 helper.make_node("LogSoftmax", ["q"], ["ls"], axis=1),
                 helper.make_node("Mul", ["ls", "x_weights"], ["weighted"]),
                 helper.make_node("ReduceSum", ["weighted"], ["loss"], keepdims=0)]
        make_model(path, nodes, {"x": ([2, 5, 4], "x"), "x_weights": ([2, 5, 3], "x")}, w, dtype=dtype)

    feeds = {"x": RNG.standard_normal((2, 5, 4)).astype(np.float32),
             "x_weights": RNG.standard_normal((2, 5, 3)).astype(np.float32)}
    check(tmp_path, build, feeds, weights, ["w", "v"])


def test_an_input_is_differentiated_too_and_an_unused_weight_gets_zeros(tmp_path):
    weights = {"w": RNG.standard_normal((4,)), "unused": RNG.standard_normal((2,))}

    def build(path, w, dtype):
        nodes = [helper.make_node("Mul", ["x", "w"], ["m"]), helper.make_node("Mul", ["m", "m"], ["sq"]),
                 helper.make_node("ReduceSum", ["sq"], ["loss"], keepdims=0),
                 helper.make_node("Identity", ["unused"], ["side"])]
        make_model(path, nodes, {"x": ([3, 4], "x")}, w, dtype=dtype)

    feeds = {"x": RNG.standard_normal((3, 4)).astype(np.float32)}
    build = build
    build(tmp_path / "m.onnx", weights, TensorProto.FLOAT)
    kiln.compile(tmp_path / "m.onnx", tmp_path / "m.kiln", gradients_of="loss", wrt=["x", "w", "unused"])
    got = kiln.Runner(tmp_path / "m.kiln").run(feeds)
    x, w = feeds["x"], weights["w"].astype(np.float32)
    np.testing.assert_allclose(got["x_grad"], 2 * x * w * w, rtol=1e-5)
    np.testing.assert_allclose(got["w_grad"], (2 * x * x * w).sum(axis=0), rtol=1e-5)
    np.testing.assert_array_equal(got["unused_grad"], np.zeros(2, np.float32))


def test_an_op_without_a_rule_is_named(tmp_path):
    nodes = [helper.make_node("Sin", ["x"], ["s"]), helper.make_node("ReduceSum", ["s"], ["loss"], keepdims=0)]
    make_model(tmp_path / "m.onnx", nodes, {"x": ([3], "x")}, {})
    with pytest.raises(kiln.Error, match=r"node '.*' \(Sin\) lies between the loss and a value to differentiate, and "
                                         r"kiln has no gradient rule for Sin yet"):
        kiln.compile(tmp_path / "m.onnx", tmp_path / "m.kiln", gradients_of="loss", wrt=["x"])
    with pytest.raises(kiln.Error, match="the loss 'nope' is no value of the model"):
        kiln.compile(tmp_path / "m.onnx", tmp_path / "m.kiln", gradients_of="nope", wrt=["x"])


def test_a_small_cnn(tmp_path):
    """Conv (strides, pads, bias; and dilations), MaxPool and AveragePool over tiling windows, GlobalAveragePool,
    Flatten, Gemm, SoftmaxCrossEntropyLoss."""
    weights = {"c1": RNG.standard_normal((4, 3, 3, 3)) * 0.3, "cb1": RNG.standard_normal(4) * 0.1,
               "c2": RNG.standard_normal((5, 4, 3, 3)) * 0.3, "c3": RNG.standard_normal((5, 3, 2, 2)) * 0.3,
               "fc": RNG.standard_normal((3, 10)) * 0.3}

    def build(path, w, dtype):
        nodes = [helper.make_node("Conv", ["x", "c1", "cb1"], ["a"], strides=[2, 2], pads=[1, 1, 1, 1]),
                 helper.make_node("Relu", ["a"], ["ar"]),
                 helper.make_node("MaxPool", ["ar"], ["mp"], kernel_shape=[2, 2], strides=[2, 2]),
                 helper.make_node("Conv", ["mp", "c2"], ["b"], pads=[1, 1, 1, 1]),
                 helper.make_node("AveragePool", ["b"], ["ap"], kernel_shape=[2, 2], strides=[2, 2]),
                 helper.make_node("GlobalAveragePool", ["ap"], ["gp"]),
                 helper.make_node("Flatten", ["gp"], ["f1"]),
                 helper.make_node("Conv", ["x", "c3"], ["d"], dilations=[2, 2], pads=[1, 0, 1, 0], strides=[3, 3]),
                 helper.make_node("GlobalAveragePool", ["d"], ["gd"]),
                 helper.make_node("Flatten", ["gd"], ["f2"]),
                 helper.make_node("Concat", ["f1", "f2"], ["f"], axis=1),
                 helper.make_node("Gemm", ["f", "fc"], ["scores"], transB=1),
                 helper.make_node("SoftmaxCrossEntropyLoss", ["scores", "labels"], ["loss"])]
        make_model(path, nodes, {"x": ([2, 3, 8, 8], "x"), "labels": ([2], TensorProto.INT64)}, w, dtype=dtype)

    feeds = {"x": RNG.standard_normal((2, 3, 8, 8)).astype(np.float32), "labels": np.array([2, 0])}
    # onnxruntime has no float64 Conv: differences in float32, eps 1e-3.
    check(tmp_path, build, feeds, weights, ["c1", "cb1", "c2", "c3", "fc"], rtol=1e-2, atol=5e-4, eps=1e-3,
          dtype=TensorProto.FLOAT)


def test_embeddings_layer_norm_concat_and_slice(tmp_path):
    weights = {"table": RNG.standard_normal((10, 6)), "gamma": RNG.uniform(0.5, 1.5, 6),
               "beta": RNG.standard_normal(6) * 0.1, "mix": RNG.standard_normal((2, 3, 4))}

    def build(path, w, dtype):
        nodes = [helper.make_node("Gather", ["table", "ids"], ["e"]),                 # [2, 3, 6]
                 helper.make_node("LayerNormalization", ["e", "gamma", "beta"], ["n"], axis=-1),
                 helper.make_node("Slice", ["n", "starts", "ends", "axes"], ["s"]),   # [2, 3, 4]
                 helper.make_node("Concat", ["s", "mix"], ["c"], axis=2),             # [2, 3, 8]
                 helper.make_node("Mul", ["c", "c"], ["c2"]),
                 helper.make_node("ReduceSum", ["c2"], ["loss"], keepdims=0)]
        make_model(path, nodes, {"ids": ([2, 3], TensorProto.INT64)}, w, dtype=dtype)
        model = onnx.load(path)
        for name, value in {"starts": [1], "ends": [5], "axes": [2]}.items():
            model.graph.initializer.append(numpy_helper.from_array(np.array(value, np.int64), name))
        onnx.save(model, path)

    feeds = {"ids": np.array([[1, 4, 4], [9, 0, 1]])}
    check(tmp_path, build, feeds, weights, ["table", "gamma", "beta", "mix"])


def test_grouped_convolutions_and_batch_norm_with_running_statistics(tmp_path):
    """Conv of 2 groups and depthwise (group = channels), BatchNormalization in inference mode (the running
    statistics given; they get no gradient), Dropout outside training (it passes its input through)."""
    weights = {"k1": RNG.standard_normal((4, 2, 3, 3)) * 0.3, "dw": RNG.standard_normal((4, 1, 3, 3)) * 0.3,
               "scale": 1 + RNG.standard_normal(4) * 0.1, "bias": RNG.standard_normal(4) * 0.1,
               "mean": RNG.standard_normal(4) * 0.1, "var": 1 + RNG.random(4)}

    def build(path, w, dtype):
        nodes = [helper.make_node("Conv", ["x", "k1"], ["a"], pads=[1, 1, 1, 1], group=2, strides=[2, 1]),
                 helper.make_node("BatchNormalization", ["a", "scale", "bias", "mean", "var"], ["n"]),
                 helper.make_node("Tanh", ["n"], ["t"]),
                 helper.make_node("Conv", ["t", "dw"], ["d"], pads=[0, 1, 0, 1], group=4, dilations=[1, 2]),
                 helper.make_node("Dropout", ["d"], ["dd"]),
                 helper.make_node("Mul", ["dd", "dd"], ["sq"]),
                 helper.make_node("ReduceSum", ["sq"], ["loss"], keepdims=0)]
        make_model(path, nodes, {"x": ([2, 4, 6, 6], "x")}, w, dtype=dtype)

    feeds = {"x": RNG.standard_normal((2, 4, 6, 6)).astype(np.float32)}
    check(tmp_path, build, feeds, weights, ["k1", "dw", "scale", "bias"], rtol=1e-2, atol=1e-3, eps=1e-3,
          dtype=TensorProto.FLOAT)


def test_a_training_dropout_scales_the_gradient_by_its_mask(tmp_path):
    """Dropout with training_mode true: d x = d y * mask / (1 - ratio), with the mask of the same run."""
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Dropout", ["x", "ratio", "training"], ["y", "mask"], seed=3),
             helper.make_node("Mul", ["y", "r"], ["p"]),
             helper.make_node("ReduceSum", ["p"], ["loss"], keepdims=0)]
    r = RNG.standard_normal((4, 50)).astype(np.float32)
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", f, [4, 50])],
        [helper.make_tensor_value_info("loss", f, []), helper.make_tensor_value_info("mask", TensorProto.BOOL, None)],
        [numpy_helper.from_array(r, "r"), numpy_helper.from_array(np.array(0.3, np.float32), "ratio"),
         numpy_helper.from_array(np.array(True), "training")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    kiln.compile(tmp_path / "m.onnx", tmp_path / "m.kiln", gradients_of="loss", wrt=["x"])
    out = kiln.Runner(tmp_path / "m.kiln").run({"x": RNG.standard_normal((4, 50)).astype(np.float32)})
    assert 0.15 < 1 - out["mask"].mean() < 0.45
    np.testing.assert_allclose(out["x_grad"], r * out["mask"] / 0.7, rtol=1e-6)


def test_a_value_reaching_the_loss_only_through_undifferentiated_inputs_is_refused(tmp_path):
    """Pow's exponent gets no gradient: asking for it is an error, not zeros."""
    nodes = [helper.make_node("Pow", ["x", "p"], ["y"]), helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0)]
    make_model(tmp_path / "m.onnx", nodes, {"x": ([3], "x")}, {"p": np.array([2.0, 3.0, 1.5])})
    with pytest.raises(kiln.Error, match="the loss depends on 'p' only through inputs kiln does not differentiate"):
        kiln.compile(tmp_path / "m.onnx", tmp_path / "m.kiln", gradients_of="loss", wrt=["p"])


def test_dilated_and_overlapping_pooling(tmp_path):
    """MaxPool with dilations and a column-major storage_order (JAX has no gradient for it), MaxPool with
    ceil_mode, and overlapping AveragePool windows. Differences in float32 (onnxruntime has no float64 AveragePool)
    with eps 1e-3: small enough that no window's maximum changes under the perturbation, with this seed."""
    weights = {"v": np.random.default_rng(21).standard_normal((2, 3, 7, 6))}

    def build(path, w, dtype):
        nodes = [helper.make_node("Mul", ["v", "s"], ["c"]),
                 helper.make_node("MaxPool", ["c"], ["m0"], kernel_shape=[2, 2], dilations=[2, 2], pads=[1, 0, 0, 1],
                                  storage_order=1),
                 helper.make_node("MaxPool", ["m0"], ["m"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1),
                 helper.make_node("AveragePool", ["m"], ["a"], kernel_shape=[3, 3], strides=[2, 1], pads=[1, 1, 1, 1]),
                 helper.make_node("Mul", ["a", "a"], ["sq"]),
                 helper.make_node("ReduceSum", ["sq"], ["loss"], keepdims=0)]
        make_model(path, nodes, {"s": ([1], "x")}, w, dtype=dtype)

    check(tmp_path, build, {"s": np.array([1.5], np.float32)}, weights, ["v"], rtol=1e-2, atol=1e-3, eps=1e-3,
          dtype=TensorProto.FLOAT)
