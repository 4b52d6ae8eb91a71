"""compile(..., quantize_activations=True) (passes/activation_quantization.h):
MatMuls and Gemms over int8 weights, written as Cast + Mul or as DequantizeLinear,
become kiln.DynamicInt8MatMul steps that quantize their activations per row
in groups of 32 as they run. Checked against numpy computing the documented
quantization (kernels/cpu/dynamic_int8_matmul.h) in float64; the bias Add and
an activation (Relu, Gelu's Erf form) fold into the step; other forms (a
non-zero zero point) keep their f32 MatMul, exact to f32 rounding; without
the option nothing changes. (The command line's messages:
tests/cli/test_quantize_activations_flag.py.)"""

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln

GROUP = 32
K, N = 100, 40  # k not a multiple of the group, n not of the 32-column blocks


def fake_quantized(x):
    """x [..., k] quantized and dequantized per row in groups of 32, as the
    kernel does (its f32 rounding of the scale included)."""
    out = np.empty(x.shape, np.float64)
    for begin in range(0, x.shape[-1], GROUP):
        g = x[..., begin:begin + GROUP].astype(np.float32)
        lo = np.minimum(g.min(axis=-1, keepdims=True), np.float32(0))
        hi = np.maximum(g.max(axis=-1, keepdims=True), np.float32(0))
        scale = ((hi - lo) / np.float32(255)).astype(np.float32)
        scale = np.where(scale >= np.finfo(np.float32).tiny, scale, np.float32(1))
        inverse = (np.float32(1) / scale).astype(np.float32)
        zero = np.clip(np.rint(-lo * inverse), 0, 255)
        q = np.clip(np.rint(g * inverse) + zero, 0, 255)
        out[..., begin:begin + GROUP] = (q - zero) * scale
    return out


def weights(rng):
    w = rng.integers(-128, 128, (K, N)).astype(np.int8)
    scale = (rng.random(N) * 0.02 + 0.001).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    return w, scale, bias


def save_model(path, nodes, inits, x_shape):
    graph = helper.make_graph(nodes, "int8w", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


def cast_mul_model(path, w, scale, bias, activation, x_shape):
    """MatMul(x, Cast(w) * scale[1, N]) + bias, then the activation."""
    nodes = [helper.make_node("Cast", ["w"], ["wf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["wf", "scale"], ["wd"]),
             helper.make_node("MatMul", ["x", "wd"], ["mm"]),
             helper.make_node("Add", ["bias", "mm"], ["pre" if activation else "y"])]
    if activation == "relu":
        nodes.append(helper.make_node("Relu", ["pre"], ["y"]))
    elif activation == "gelu":  # the Erf form exporters write
        nodes += [helper.make_node("Div", ["pre", "sqrt2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
                  helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", ["pre", "e1"], ["p"]),
                  helper.make_node("Mul", ["p", "half"], ["y"])]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(scale.reshape(1, N), "scale"),
             numpy_helper.from_array(bias, "bias"), numpy_helper.from_array(np.array(np.sqrt(2), np.float32), "sqrt2"),
             numpy_helper.from_array(np.array(1, np.float32), "one"),
             numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    save_model(path, nodes, inits, x_shape)


def expected(x, w, scale, bias, activation):
    y = fake_quantized(x) @ w.astype(np.float64) * scale.astype(np.float64) + bias
    if activation == "relu":
        return np.maximum(y, 0)
    if activation == "gelu":
        return y * 0.5 * (1 + np.vectorize(math.erf)(y / np.sqrt(2)))
    return y


def inputs(rng, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    x.reshape(-1, K)[::3, 5] = 30.0  # outliers: their own group gets a coarse step
    return x


def assert_close(ours, want, rtol):
    assert np.abs(ours - want).max() <= rtol * np.abs(want).max(), np.abs(ours - want).max() / np.abs(want).max()


@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
def test_cast_mul_weights_compute_in_int8_with_bias_and_activation(tmp_path, activation):
    rng = np.random.default_rng(3)
    w, scale, bias = weights(rng)
    x = inputs(rng, (2, 9, K))
    cast_mul_model(tmp_path / "m.onnx", w, scale, bias, activation, list(x.shape))
    report = kiln.compile(tmp_path / "m.onnx", tmp_path / "m.kiln", quantize_activations=True)
    assert report["int8_matmuls"] == 1
    assert report["step_kernels"] == {"kiln.DynamicInt8MatMul": 1}, report["step_kernels"]
    ours = kiln.Runner(tmp_path / "m.kiln").run({"x": x})["y"]
    assert_close(ours, expected(x, w, scale, bias, activation), 1e-5)
    # It is an approximation: onnxruntime's f32 result is farther away.
    want = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.abs(ours - want).max() > 1e-4 * np.abs(want).max()


def test_without_the_option_nothing_changes(tmp_path):
    rng = np.random.default_rng(4)
    w, scale, bias = weights(rng)
    x = inputs(rng, (5, K))
    cast_mul_model(tmp_path / "m.onnx", w, scale, bias, "relu", list(x.shape))
    report = kiln.compile(tmp_path / "m.onnx", tmp_path / "m.kiln")
    assert report["int8_matmuls"] == 0 and "kiln.DynamicInt8MatMul" not in report["step_kernels"]
    ours = kiln.Runner(tmp_path / "m.kiln").run({"x": x})["y"]
    want = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert_close(ours, want, 1e-5)


@pytest.mark.parametrize("scale_kind,zero_kind,rewritten", [
    ("column", "zeros", True),    # per column (axis 1), explicit zero points of 0
    ("tensor", "none", True),     # one scale, no zero point
    ("column", "nonzero", False),  # a zero point the kernel has no room for: f32 as before
])
def test_dequantize_linear_weights(tmp_path, scale_kind, zero_kind, rewritten):
    rng = np.random.default_rng(5)
    w, scale, _ = weights(rng)
    if scale_kind == "tensor":
        scale = scale[:1]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(scale if scale_kind == "column" else scale.reshape(()), "scale")]
    dq_inputs = ["w", "scale"]
    if zero_kind != "none":
        zero = np.zeros(N, np.int8) if zero_kind == "zeros" else rng.integers(-3, 4, N).astype(np.int8)
        inits.append(numpy_helper.from_array(zero, "zero"))
        dq_inputs.append("zero")
    nodes = [helper.make_node("DequantizeLinear", dq_inputs, ["wd"], axis=1), helper.make_node("MatMul", ["x", "wd"], ["y"])]
    x = inputs(rng, (7, K))
    save_model(tmp_path / "m.onnx", nodes, inits, list(x.shape))
    report = kiln.compile(tmp_path / "m.onnx", tmp_path / "m.kiln", quantize_activations=True)
    assert report["int8_matmuls"] == (1 if rewritten else 0)
    ours = kiln.Runner(tmp_path / "m.kiln").run({"x": x})["y"]
    if rewritten:
        full_scale = np.broadcast_to(scale, (N,))
        assert_close(ours, expected(x, w, full_scale, np.zeros(N), None), 1e-5)
    else:
        # Against float64, not onnxruntime: its DequantizeLinear -> MatMul with
        # these zero points is itself 4.7e-3 away from the exact product.
        assert_close(ours, x.astype(np.float64) @ ((w.astype(np.float64) - zero) * scale), 1e-5)


def test_dynamic_shapes_compile_the_int8_step_per_signature(tmp_path):
    rng = np.random.default_rng(6)
    w, scale, bias = weights(rng)
    cast_mul_model(tmp_path / "m.onnx", w, scale, bias, None, ["batch", K])
    report = kiln.compile(tmp_path / "m.onnx", tmp_path / "m.kiln", dynamic=True, quantize_activations=True)
    assert report["runtime_shapes"] and report["int8_matmuls"] == 1
    runner = kiln.Runner(tmp_path / "m.kiln")
    for rows in (1, 13):
        x = inputs(rng, (rows, K))
        assert_close(runner.run({"x": x})["y"], expected(x, w, scale, bias, None), 1e-5)


@pytest.mark.parametrize("trans_b,form,with_c,beta", [
    (1, "dequantize", True, 1.0),   # torch's Linear on 2-D input: weights [N, K], per-row scales
    (1, "cast_mul", True, 0.5),     # beta scales the bias
    (0, "dequantize", False, 1.0),
])
def test_gemm_weights(tmp_path, trans_b, form, with_c, beta):
    rng = np.random.default_rng(8)
    w, scale, bias = weights(rng)
    stored = w.T.copy() if trans_b else w
    inits = [numpy_helper.from_array(stored, "w")]
    if form == "dequantize":
        inits.append(numpy_helper.from_array(scale, "scale"))
        nodes = [helper.make_node("DequantizeLinear", ["w", "scale"], ["wd"], axis=0 if trans_b else 1)]
    else:
        inits.append(numpy_helper.from_array(scale.reshape((N, 1) if trans_b else (1, N)), "scale"))
        nodes = [helper.make_node("Cast", ["w"], ["wf"], to=TensorProto.FLOAT),
                 helper.make_node("Mul", ["wf", "scale"], ["wd"])]
    gemm_inputs = ["x", "wd"]
    if with_c:
        inits.append(numpy_helper.from_array(bias, "c"))
        gemm_inputs.append("c")
    nodes.append(helper.make_node("Gemm", gemm_inputs, ["y"], transB=trans_b, beta=beta))
    x = inputs(rng, (6, K))
    save_model(tmp_path / "m.onnx", nodes, inits, list(x.shape))
    report = kiln.compile(tmp_path / "m.onnx", tmp_path / "m.kiln", quantize_activations=True)
    assert report["int8_matmuls"] == 1 and report["step_kernels"] == {"kiln.DynamicInt8MatMul": 1}
    ours = kiln.Runner(tmp_path / "m.kiln").run({"x": x})["y"]
    want = expected(x, w, scale, beta * bias if with_c else np.zeros(N), None)
    assert_close(ours, want, 1e-5)


def test_gemm_with_alpha_keeps_its_f32_product(tmp_path):
    rng = np.random.default_rng(9)
    w, scale, _ = weights(rng)
    nodes = [helper.make_node("DequantizeLinear", ["w", "scale"], ["wd"], axis=1),
             helper.make_node("Gemm", ["x", "wd"], ["y"], alpha=2.0)]
    save_model(tmp_path / "m.onnx", nodes, [numpy_helper.from_array(w, "w"), numpy_helper.from_array(scale, "scale")],
               [4, K])
    report = kiln.compile(tmp_path / "m.onnx", tmp_path / "m.kiln", quantize_activations=True)
    assert report["int8_matmuls"] == 0
    x = inputs(rng, (4, K))
    ours = kiln.Runner(tmp_path / "m.kiln").run({"x": x})["y"]
    assert_close(ours, 2 * x.astype(np.float64) @ (w.astype(np.float64) * scale), 1e-5)
