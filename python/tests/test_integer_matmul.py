"""MatMulInteger with constant weights (kernels/cpu/exact_int_gemm.h): exact
i32 results against onnxruntime for u8 and i8 activations, i8 and u8 weights,
zero points of one value or one per column, K past the 256-deep blocks that
keep the f32 route exact, a batch of matrices, and the activation's zero
point computed per call by DynamicQuantizeLinear (as dynamically quantized
transformers do)."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln

TYPES = {np.uint8: TensorProto.UINT8, np.int8: TensorProto.INT8}


def limits(dtype):
    info = np.iinfo(dtype)
    return int(info.min), int(info.max) + 1


@pytest.mark.parametrize("a_type,b_type,b_zero_kind,k", [
    (np.uint8, np.int8, "one", 600),      # the VNNI route where the CPU has it
    (np.int8, np.int8, "none", 300),
    (np.uint8, np.int8, "column", 600),   # per-column zero points: the f32 route
    (np.uint8, np.uint8, "one", 257),     # u8 weights: the f32 route
])
def test_constant_weights_are_exact(tmp_path, a_type, b_type, b_zero_kind, k):
    rng = np.random.default_rng(8)
    m, n = 7, 45
    a = rng.integers(*limits(a_type), (2, m, k)).astype(a_type)
    b = rng.integers(*limits(b_type), (k, n)).astype(b_type)
    inits = [numpy_helper.from_array(b, "B"), numpy_helper.from_array(np.array(rng.integers(*limits(a_type)), a_type), "a_zero")]
    inputs = ["a", "B", "a_zero"]
    if b_zero_kind != "none":
        shape = () if b_zero_kind == "one" else (n,)
        inits.append(numpy_helper.from_array(np.array(rng.integers(*limits(b_type), shape), b_type), "b_zero"))
        inputs.append("b_zero")
    graph = helper.make_graph([helper.make_node("MatMulInteger", inputs, ["y"])], "mmi",
                              [helper.make_tensor_value_info("a", TYPES[a_type], list(a.shape))],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "m.onnx")
    kiln.compile(tmp_path / "m.onnx", tmp_path / "m.kiln")
    ours = kiln.Runner(tmp_path / "m.kiln").run({"a": a})["y"]
    want = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"]).run(None, {"a": a})[0]
    np.testing.assert_array_equal(ours, want)


def test_dynamically_quantized_linear_layer(tmp_path):
    rng = np.random.default_rng(9)
    w = rng.integers(-128, 128, (384, 96)).astype(np.int8)
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             helper.make_node("MatMulInteger", ["xq", "W", "xz", "wz"], ["acc"]),
             helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["accf", "xs"], ["y"])]
    graph = helper.make_graph(nodes, "dq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 384])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.array(0, np.int8), "wz")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "dq.onnx")
    kiln.compile(tmp_path / "dq.onnx", tmp_path / "dq.kiln")
    x = rng.standard_normal((5, 384)).astype(np.float32)
    ours = kiln.Runner(tmp_path / "dq.kiln").run({"x": x})["y"]
    want = ort.InferenceSession(str(tmp_path / "dq.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(ours, want)  # the same quantization, exact products
