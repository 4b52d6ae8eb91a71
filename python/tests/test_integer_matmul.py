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


@pytest.mark.parametrize("scale_kind,addend", [("one", None), ("column", "bias"), ("one", "residual")])
def test_dynamic_quantization_chain_is_one_step(tmp_path, scale_kind, addend):
    """onnxruntime's dynamic quantizer's chain, DynamicQuantizeLinear ->
    MatMulInteger -> Cast -> Mul(x_scale * w_scale) (-> Add), becomes one
    kiln.MatMulIntegerToFloat step (passes/integer_matmul_fusion.h) whose
    results are the chain's: the same f32 arithmetic."""
    rng = np.random.default_rng(9)
    m, k, n = 9, 300, 40
    x = rng.standard_normal((2, m, k)).astype(np.float32)
    w = rng.integers(-128, 128, (k, n)).astype(np.int8)
    w_scale = np.array(0.02, np.float32) if scale_kind == "one" else (rng.random(n) * 0.05 + 0.01).astype(np.float32)
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.array(3, np.int8), "w_zero"),
             numpy_helper.from_array(w_scale, "w_scale"),
             numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "bias")]
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "x_scale", "x_zero"]),
             helper.make_node("MatMulInteger", ["xq", "W", "x_zero", "w_zero"], ["sums"]),
             helper.make_node("Cast", ["sums"], ["sums_f"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["x_scale", "w_scale"], ["scale"]),
             helper.make_node("Mul", ["sums_f", "scale"], ["y" if addend is None else "scaled"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))]
    feeds = {"x": x}
    if addend == "bias":
        nodes.append(helper.make_node("Add", ["bias", "scaled"], ["y"]))
    elif addend == "residual":
        inputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, [2, m, n]))
        feeds["r"] = rng.standard_normal((2, m, n)).astype(np.float32)
        nodes.append(helper.make_node("Add", ["scaled", "r"], ["y"]))
    graph = helper.make_graph(nodes, "dq", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "m.onnx")
    report = kiln.compile(tmp_path / "m.onnx", tmp_path / "m.kiln")
    assert report["step_kernels"].get("kiln.MatMulIntegerToFloat") == 1, report["step_kernels"]
    assert "Cast" not in report["step_kernels"] and "Add" not in report["step_kernels"], report["step_kernels"]
    ours = kiln.Runner(tmp_path / "m.kiln").run(feeds)["y"]
    want = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(ours, want, rtol=1e-6, atol=1e-6)


def test_sums_read_elsewhere_stay_a_plain_matmul_integer(tmp_path):
    """The i32 sums are an output too: nothing fuses, both outputs agree."""
    rng = np.random.default_rng(10)
    a = rng.integers(0, 256, (5, 64)).astype(np.uint8)
    inits = [numpy_helper.from_array(rng.integers(-128, 128, (64, 8)).astype(np.int8), "W"),
             numpy_helper.from_array(np.array(0.5, np.float32), "s")]
    nodes = [helper.make_node("MatMulInteger", ["a", "W"], ["sums"]),
             helper.make_node("Cast", ["sums"], ["f"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["f", "s"], ["y"])]
    graph = helper.make_graph(nodes, "mmi", [helper.make_tensor_value_info("a", TensorProto.UINT8, [5, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("sums", TensorProto.INT32, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "m.onnx")
    report = kiln.compile(tmp_path / "m.onnx", tmp_path / "m.kiln")
    assert "kiln.MatMulIntegerToFloat" not in report["step_kernels"], report["step_kernels"]
    ours = kiln.Runner(tmp_path / "m.kiln").run({"a": a})
    want = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"]).run(None, {"a": a})
    np.testing.assert_array_equal(ours["sums"], want[1])
    np.testing.assert_allclose(ours["y"], want[0], rtol=1e-6)


@pytest.mark.parametrize("shape", [(3, 5), (300, 401)])
def test_dynamic_quantize_linear_matches_onnxruntime(tmp_path, shape):
    """Small and large inputs: the large one takes the range in blocks on the threads."""
    x = (np.random.default_rng(12).standard_normal(shape) * 4 + 1).astype(np.float32)
    x.flat[x.size // 2] = 40.0  # the maximum deep inside one block
    graph = helper.make_graph([helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "scale", "zero"])], "dq",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info(n, t, None) for n, t in
                               (("y", TensorProto.UINT8), ("scale", TensorProto.FLOAT), ("zero", TensorProto.UINT8))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "m.onnx")
    kiln.compile(tmp_path / "m.onnx", tmp_path / "m.kiln")
    ours = kiln.Runner(tmp_path / "m.kiln").run({"x": x})
    want = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert ours["scale"] == want[1] and ours["zero"] == want[2]
    np.testing.assert_array_equal(ours["y"], want[0])
