"""kiln.Expression nodes: an elementwise formula as text, expanded into ONNX
operators that kiln infers, broadcasts and fuses like any others
(src/passes/expression_expansion.h); malformed ones are compile errors that
point at the column."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import kiln


def model(path, expression, dtype=TensorProto.FLOAT, names=None, after="Relu", opset=17):
    attributes = {"expression": expression}
    if names:
        attributes["input_names"] = names
    nodes = [helper.make_node("Expression", ["x", "y"], ["e"], domain="kiln", name="expr", **attributes)]
    nodes.append(helper.make_node(after, ["e"], ["out"]))
    graph = helper.make_graph(nodes, "expression",
                              [helper.make_tensor_value_info("x", dtype, [3, 4]),
                               helper.make_tensor_value_info("y", dtype, [4])],
                              [helper.make_tensor_value_info("out", dtype, None)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                      helper.make_opsetid("kiln", 1)]), path)


def inputs(dtype=np.float32):
    rng = np.random.default_rng(5)
    return {"x": rng.standard_normal((3, 4)).astype(dtype), "y": rng.standard_normal(4).astype(dtype)}


@pytest.mark.parametrize("expression, reference", [
    ("x * sin(y) + 2", lambda x, y: x * np.sin(y) + 2),
    ("-x^2 + 2^3^0.5 - y / (1 + abs(x))", lambda x, y: -x ** 2 + 2 ** (3 ** 0.5) - y / (1 + np.abs(x))),
    ("max(x, y) - min(x, 0.5) * exp(-abs(y))", lambda x, y: np.maximum(x, y) - np.minimum(x, 0.5) * np.exp(-np.abs(y))),
    ("sigmoid(x) * tanh(y) + sqrt(abs(x)) + pow(abs(y), 1.5)",
     lambda x, y: 1 / (1 + np.exp(-x)) * np.tanh(y) + np.sqrt(np.abs(x)) + np.abs(y) ** 1.5),
])
def test_expressions_match_numpy_with_broadcasting(tmp_path, expression, reference):
    model(tmp_path / "m.onnx", expression)
    kiln.compile(tmp_path / "m.onnx", tmp_path / "m.kiln")
    feeds = inputs()
    got = kiln.Runner(tmp_path / "m.kiln").run(feeds)["out"]
    np.testing.assert_allclose(got, np.maximum(reference(feeds["x"], feeds["y"]), 0), rtol=2e-6, atol=2e-6)


def test_arithmetic_fuses_with_its_neighbours_into_one_step(tmp_path):
    model(tmp_path / "m.onnx", "(x - y) * 0.5 + x * y", names=None)
    report = kiln.compile(tmp_path / "m.onnx", tmp_path / "m.kiln")
    assert report["step_kernels"] == {"kiln.FusedElementwise": 1}, report["step_kernels"]


def test_input_names_and_double_precision(tmp_path):
    model(tmp_path / "m.onnx", "a * b + 0.1", dtype=TensorProto.DOUBLE, names=["a", "b"], after="Identity")
    kiln.compile(tmp_path / "m.onnx", tmp_path / "m.kiln")
    feeds = inputs(np.float64)
    got = kiln.Runner(tmp_path / "m.kiln").run(feeds)["out"]
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, feeds["x"] * feeds["y"] + 0.1, rtol=1e-12)


@pytest.mark.parametrize("expression, message", [
    ("x * sin(y", "column 10: expected ')'"),
    ("x * foo(y)", "column 5: unknown function 'foo'"),
    ("x + z", "column 5: 'z' is not an input of the node (its inputs: x, y)"),
    ("x +", "column 4: expected an operand, found the end"),
    ("2 ** x", "column 4: expected an operand, found '*'"),
    ("max(x)", "column 6: expected ','"),
    ("x y", "column 3: unexpected 'y'"),
    ("", "the expression is empty"),
])
def test_malformed_expressions_point_at_the_column(tmp_path, expression, message):
    model(tmp_path / "m.onnx", expression)
    with pytest.raises(kiln.Error) as error:
        kiln.compile(tmp_path / "m.onnx", tmp_path / "m.kiln")
    assert f"node 'expr' (kiln.Expression): expression \"{expression}\" {message}" in str(error.value) or \
        message in str(error.value)
