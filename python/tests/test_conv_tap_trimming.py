"""Convolutions whose kernel taps partly read only padding (passes/
conv_tap_trimming.h): a 3x3 Conv over a map one row high, wide kernels over
small maps, strides and dilations, 1-D and 3-D. kiln drops the taps that
never meet the input; the results must stay onnxruntime's, and the package
must show the smaller kernel (fewer constant bytes)."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln


def conv_model(path, x_shape, w_shape, attrs, bias=True):
    rng = np.random.default_rng(7)
    w = rng.standard_normal(w_shape).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w")]
    inputs = ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(w_shape[0]).astype(np.float32), "b"))
        inputs.append("b")
    node = helper.make_node("Conv", inputs, ["y"], **attrs)
    graph = helper.make_graph([node], "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return w.nbytes


@pytest.mark.parametrize("x_shape,w_shape,attrs,trimmed", [
    ((1, 64, 1, 40), (32, 64, 3, 3), dict(pads=[1, 1, 1, 1]), True),  # SVTR's neck: one row
    ((2, 8, 40, 1), (8, 8, 3, 3), dict(pads=[1, 1, 1, 1]), True),  # one column
    ((1, 4, 2, 3), (6, 4, 5, 5), dict(pads=[2, 2, 2, 2]), True),  # a wide kernel over a small map
    ((1, 4, 1, 9), (6, 2, 3, 3), dict(pads=[2, 1, 2, 1], dilations=[2, 1], group=2), True),
    ((1, 3, 1, 11), (5, 3, 5, 3), dict(pads=[2, 1, 2, 1], strides=[2, 2]), True),
    ((1, 3, 3, 11), (5, 3, 5, 3), dict(pads=[2, 1, 2, 1], strides=[2, 2]), False),  # every tap meets a row
    ((1, 3, 1, 9), (5, 3, 3, 3), dict(pads=[0, 0, 2, 0]), True),  # asymmetric padding
    ((1, 16, 24), (8, 16, 7), dict(pads=[3, 3]), False),  # 1-D, every tap used
    ((1, 16, 2), (8, 16, 7), dict(pads=[3, 3]), True),  # 1-D over two positions
    ((1, 4, 1, 12), (4, 1, 3, 3), dict(pads=[1, 1, 1, 1], group=4), True),  # depthwise
    ((1, 2, 1, 1, 6), (3, 2, 3, 3, 3), dict(pads=[1, 1, 1, 1, 1, 1]), True),  # 3-D
    ((1, 8, 6, 6), (8, 8, 3, 3), dict(pads=[1, 1, 1, 1]), False),  # an ordinary 3x3
])
def test_matches_onnxruntime(tmp_path, x_shape, w_shape, attrs, trimmed):
    path = tmp_path / "conv.onnx"
    weight_bytes = conv_model(path, x_shape, w_shape, attrs)
    x = np.random.default_rng(1).standard_normal(x_shape).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    package = tmp_path / "conv.kiln"
    report = kiln.compile(path, package)
    got = kiln.Runner(str(package)).run({"x": x})["y"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    # The trimmed kernel is a smaller constant than the model's weights.
    assert (report["constant_bytes"] < weight_bytes) == trimmed, (report["constant_bytes"], weight_bytes)
