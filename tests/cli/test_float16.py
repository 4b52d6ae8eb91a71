"""Float16 models (passes/float16_in_float32.h): kiln computes them in f32 as
onnxruntime does on CPUs, exchanging f16 at the model's inputs and outputs,
and keeps the model's own Casts to f16 (their rounding). `kiln compile
--keep-float16` keeps the f16 kernels instead."""

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

H = TensorProto.FLOAT16


def half_model():
    """x f16 [1, 8, 16] -> Conv1d -> Relu -> MatMul -> Softmax -> y f16, with
    an f32 side input cast to f16 on the way (an embedding's habit)."""
    rng = np.random.default_rng(3)
    inits = [
        numpy_helper.from_array((rng.standard_normal((12, 8, 3)) * 0.3).astype(np.float16), "W"),
        numpy_helper.from_array((rng.standard_normal(12) * 0.1).astype(np.float16), "B"),
        numpy_helper.from_array((rng.standard_normal((16, 5)) * 0.3).astype(np.float16), "M"),
        numpy_helper.from_array(rng.standard_normal((12, 5)).astype(np.float32), "side"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MatMul", ["r", "M"], ["m"]),
        helper.make_node("Cast", ["side"], ["side16"], to=H),
        helper.make_node("Add", ["m", "side16"], ["s"]),
        helper.make_node("Softmax", ["s"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(nodes, "half", [helper.make_tensor_value_info("x", H, [1, 8, 16])],
                              [helper.make_tensor_value_info("y", H, [1, 12, 5])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def run_kiln(kiln, tmp_path, *flags):
    package = tmp_path / "half.kiln"
    result = kiln("compile", tmp_path / "half.onnx", "-o", package, *flags)
    assert result.returncode == 0, result.stderr
    out = tmp_path / ("out" + "".join(flags))
    result = kiln("run", package, "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", out)
    assert result.returncode == 0, result.stderr
    return np.load(out / "y.npy")


def test_float16_model_runs_in_float32_like_onnxruntime(kiln, tmp_path):
    onnx.save(half_model(), tmp_path / "half.onnx")
    x = np.random.default_rng(4).standard_normal((1, 8, 16)).astype(np.float16)
    np.save(tmp_path / "x.npy", x)
    want = ort.InferenceSession(str(tmp_path / "half.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    ours = run_kiln(kiln, tmp_path)
    assert ours.dtype == np.float16 and ours.shape == want.shape
    # Both compute in f32 and round once at the output: at most one f16 ulp apart.
    np.testing.assert_allclose(ours.astype(np.float32), want.astype(np.float32), rtol=1e-3, atol=1e-4)


def test_keep_float16_rounds_after_every_operator(kiln, tmp_path):
    model = half_model()
    model.graph.node.pop()  # no f16 Softmax kernel: stop at the Add
    model.graph.output[0].name = "y"
    model.graph.node[-1].output[0] = "y"
    onnx.save(model, tmp_path / "half.onnx")
    x = np.random.default_rng(4).standard_normal((1, 8, 16)).astype(np.float16)
    np.save(tmp_path / "x.npy", x)
    want = ort.InferenceSession(str(tmp_path / "half.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    strict = run_kiln(kiln, tmp_path, "--keep-float16")
    assert strict.dtype == np.float16
    # f16 after every operator: a few f16 ulps from the f32 evaluation.
    np.testing.assert_allclose(strict.astype(np.float32), want.astype(np.float32), rtol=1e-2, atol=1e-2)
