"""Gradients through plugin ops (docs/plugins.md, "Gradient ops"): the
example library's Rotate declares RotateGrad, which gives every input's
gradient at once (separate_gradients = 0); SerializedMatMul declares
SerializedMatMulGrad, one node per input (separate_gradients = 1); Swish,
a composite op, is differentiated through its body. Each against central
finite differences of the forward ops written in numpy in float64, and a
training package with a plugin op steps like the same model in ONNX ops."""

import pathlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln

BUILD = pathlib.Path(kiln.__file__).resolve().parents[2]
EXAMPLE = BUILD / "examples" / "libkiln_example_ops.so"
RNG = np.random.default_rng(3)


def save(path, nodes, inputs, weights, outputs=("loss",)):
    f = TensorProto.FLOAT
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, f, s) for n, s in inputs.items()],
                              [helper.make_tensor_value_info(n, f, None) for n in outputs],
                              [numpy_helper.from_array(w.astype(np.float32), n) for n, w in weights.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)]),
              path)


def numeric_gradient(loss, values, name, eps=1e-6):
    grad = np.zeros(values[name].shape)
    for index in np.ndindex(*values[name].shape):
        plus = {k: v.copy() for k, v in values.items()}
        minus = {k: v.copy() for k, v in values.items()}
        plus[name][index] += eps
        minus[name][index] -= eps
        grad[index] = (loss(plus) - loss(minus)) / (2 * eps)
    return grad


def test_rotate_gives_every_gradient_from_one_grad_node(tmp_path):
    kiln.load_plugin(EXAMPLE)
    weights = {"y": RNG.standard_normal((3, 4)), "angle": RNG.standard_normal((3, 4)), "r": RNG.standard_normal((3, 4))}
    nodes = [helper.make_node("Rotate", ["x", "y", "angle"], ["xr", "yr"], domain="com.example"),
             helper.make_node("Mul", ["xr", "xr"], ["a"]), helper.make_node("Mul", ["yr", "r"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("ReduceSum", ["s"], ["loss"], keepdims=0)]
    save(tmp_path / "m.onnx", nodes, {"x": [3, 4]}, weights)
    kiln.compile(tmp_path / "m.onnx", tmp_path / "m.kiln", gradients_of="loss", wrt=["x", "y", "angle"],
                 plugins=[EXAMPLE])
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    got = kiln.Runner(tmp_path / "m.kiln").run({"x": x})

    def loss(v):
        c, s = np.cos(v["angle"]), np.sin(v["angle"])
        xr, yr = v["x"] * c - v["y"] * s, v["x"] * s + v["y"] * c
        return float((xr * xr + yr * v["r"]).sum())

    values = {k: w.astype(np.float32).astype(np.float64) for k, w in weights.items()}
    values["x"] = x.astype(np.float64)
    for name in ("x", "y", "angle"):
        np.testing.assert_allclose(got[f"{name}_grad"], numeric_gradient(loss, values, name), rtol=1e-4, atol=1e-4,
                                   err_msg=name)


def test_serialized_matmul_gives_one_gradient_per_grad_node(tmp_path):
    kiln.load_plugin(EXAMPLE)
    weights = {"w": RNG.standard_normal((6, 5))}
    nodes = [helper.make_node("SerializedMatMul", ["x", "w"], ["p"], domain="com.example", serialization_factor=3),
             helper.make_node("Tanh", ["p"], ["t"]), helper.make_node("ReduceSum", ["t"], ["loss"], keepdims=0)]
    save(tmp_path / "m.onnx", nodes, {"x": [4, 6]}, weights)
    kiln.compile(tmp_path / "m.onnx", tmp_path / "m.kiln", gradients_of="loss", wrt=["x", "w"], plugins=[EXAMPLE])
    x = RNG.standard_normal((4, 6)).astype(np.float32)
    got = kiln.Runner(tmp_path / "m.kiln").run({"x": x})
    values = {"x": x.astype(np.float64), "w": weights["w"].astype(np.float32).astype(np.float64)}
    loss = lambda v: float(np.tanh(v["x"] @ v["w"]).sum())  # noqa: E731
    for name in ("x", "w"):
        np.testing.assert_allclose(got[f"{name}_grad"], numeric_gradient(loss, values, name), rtol=1e-4, atol=1e-4,
                                   err_msg=name)


def test_a_composite_op_is_differentiated_through_its_body(tmp_path):
    kiln.load_plugin(EXAMPLE)
    nodes = [helper.make_node("Swish", ["x"], ["s"], domain="com.example", beta=1.5),
             helper.make_node("ReduceSum", ["s"], ["loss"], keepdims=0)]
    save(tmp_path / "m.onnx", nodes, {"x": [2, 5]}, {})
    kiln.compile(tmp_path / "m.onnx", tmp_path / "m.kiln", gradients_of="loss", wrt=["x"], plugins=[EXAMPLE])
    x = RNG.standard_normal((2, 5)).astype(np.float32)
    sigmoid = 1 / (1 + np.exp(-1.5 * x.astype(np.float64)))
    want = sigmoid + 1.5 * x * sigmoid * (1 - sigmoid)
    np.testing.assert_allclose(kiln.Runner(tmp_path / "m.kiln").run({"x": x})["x_grad"], want, rtol=1e-5, atol=1e-6)


def test_an_op_without_a_gradient_op_is_named(tmp_path):
    kiln.load_plugin(EXAMPLE)
    nodes = [helper.make_node("AddInPlace", ["x", "w"], ["a"], domain="com.example"),
             helper.make_node("ReduceSum", ["a"], ["loss"], keepdims=0)]
    save(tmp_path / "m.onnx", nodes, {"x": [2, 3]}, {"w": np.ones((2, 3))})
    with pytest.raises(kiln.Error, match=r"plugin op com.example.AddInPlace.*declares no gradient op"):
        kiln.compile(tmp_path / "m.onnx", tmp_path / "m.kiln", gradients_of="loss", wrt=["w"], plugins=[EXAMPLE])


def test_training_through_a_plugin_op_steps_like_onnx_ops(tmp_path):
    """Five SGD steps of a linear layer written as SerializedMatMul and as MatMul give the same weights."""
    kiln.load_plugin(EXAMPLE)
    w0 = RNG.standard_normal((6, 5)) * 0.3
    x = RNG.standard_normal((5, 4, 6)).astype(np.float32)
    target = RNG.standard_normal((5, 4, 5)).astype(np.float32)
    trained = {}
    for kind in ("plugin", "onnx"):
        product = (helper.make_node("SerializedMatMul", ["x", "w"], ["p"], domain="com.example", serialization_factor=2)
                   if kind == "plugin" else helper.make_node("MatMul", ["x", "w"], ["p"]))
        nodes = [product, helper.make_node("Sub", ["p", "target"], ["e"]), helper.make_node("Mul", ["e", "e"], ["sq"]),
                 helper.make_node("ReduceMean", ["sq"], ["loss"], keepdims=0)]
        save(tmp_path / f"{kind}.onnx", nodes, {"x": [4, 6], "target": [4, 5]}, {"w": w0})
        kiln.compile_training(tmp_path / f"{kind}.onnx", tmp_path / f"{kind}.kiln", loss="loss",
                              optimizer=kiln.optim.SGD(0.1), plugins=[EXAMPLE])
        with kiln.Session(tmp_path / f"{kind}.kiln", num_host_transfers=5) as session:
            session.run({"x": x, "target": target})
            trained[kind] = session.get_tensor_data("w")
    assert not np.allclose(trained["onnx"], w0)
    np.testing.assert_allclose(trained["plugin"], trained["onnx"], rtol=1e-5, atol=1e-6)
