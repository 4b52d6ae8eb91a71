"""Small real-architecture models compiled by kiln and run beside
onnxruntime: a CNN (Conv, BatchNormalization, pooling, Gemm, Softmax) and an
attention block (Gather embeddings, LayerNormalization, MatMul, Transpose,
Softmax, Erf-based Gelu, shape arithmetic folded at compile time)."""

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

RNG = np.random.default_rng(123)


def tensor(name, *shape, scale=0.2, dtype=np.float32):
    return numpy_helper.from_array((RNG.standard_normal(shape) * scale).astype(dtype), name)


def save(nodes, inputs, outputs, inits, path, opset=17):
    graph = helper.make_graph(nodes, "m", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)


def compile_and_compare(kiln, tmp_path, feeds, rtol=1e-4, atol=1e-5):
    """Compiles tmp_path/m.onnx, runs it on `feeds` beside onnxruntime and
    compares every output; returns the compile's result (its stdout says how
    many steps)."""
    onnx_path, kiln_path = tmp_path / "m.onnx", tmp_path / "m.kiln"
    compiled = kiln("compile", onnx_path, "-o", kiln_path, "--plan-report")
    assert compiled.returncode == 0, compiled.stderr
    args = []
    for name, value in feeds.items():
        np.save(tmp_path / f"{name}.npy", value)
        args += ["--input", f"{name}={tmp_path / f'{name}.npy'}"]
    result = kiln("run", kiln_path, *args, "--output-dir", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    session = ort.InferenceSession(str(onnx_path))
    expected = session.run(None, feeds)
    for output, want in zip(session.get_outputs(), expected):
        got = np.load(tmp_path / "out" / f"{output.name}.npy")
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=output.name)
    return compiled


def test_small_cnn_matches_onnxruntime(kiln, tmp_path):
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("BatchNormalization", ["c1", "g", "beta", "mean", "var"], ["bn"]),
        helper.make_node("Relu", ["bn"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["p1", "w2"], ["c2"], group=8, kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["c2", "lo", "hi"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"]),
        helper.make_node("Gemm", ["flat", "fc", "fcb"], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=1),
    ]
    inits = [tensor("w1", 8, 3, 3, 3), tensor("b1", 8), numpy_helper.from_array(np.ones(8, np.float32) * 1.5, "g"),
             tensor("beta", 8), tensor("mean", 8), numpy_helper.from_array(np.full(8, 0.7, np.float32), "var"),
             tensor("w2", 8, 1, 3, 3), numpy_helper.from_array(np.float32(0.0), "lo"),
             numpy_helper.from_array(np.float32(6.0), "hi"), tensor("fc", 10, 8), tensor("fcb", 10)]
    save(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 32, 32])],
         [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [2, 10])], inits, tmp_path / "m.onnx")
    x = RNG.standard_normal((2, 3, 32, 32)).astype(np.float32)
    compile_and_compare(kiln, tmp_path, {"x": x})


def test_attention_block_matches_onnxruntime(kiln, tmp_path):
    seq, hidden, heads = 16, 32, 4
    head = hidden // heads
    nodes = [
        helper.make_node("Gather", ["emb", "ids"], ["e"], axis=0),                      # [1, seq, hidden]
        helper.make_node("LayerNormalization", ["e", "ln_g", "ln_b"], ["h"], axis=-1, epsilon=1e-5),
        helper.make_node("MatMul", ["h", "wq"], ["q"]),
        helper.make_node("MatMul", ["h", "wk"], ["k"]),
        helper.make_node("MatMul", ["h", "wv"], ["v"]),
        # Heads: the target shape is computed from Shape() as exporters do, then folded.
        helper.make_node("Shape", ["q"], ["qs"]),
        helper.make_node("Gather", ["qs", "zero"], ["b0"], axis=0),
        helper.make_node("Unsqueeze", ["b0", "axes0"], ["b1"]),
        helper.make_node("Concat", ["b1", "rest"], ["heads_shape"], axis=0),
        helper.make_node("Reshape", ["q", "heads_shape"], ["q4"]),
        helper.make_node("Reshape", ["k", "heads_shape"], ["k4"]),
        helper.make_node("Reshape", ["v", "heads_shape"], ["v4"]),
        helper.make_node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
        helper.make_node("Transpose", ["v4"], ["vt"], perm=[0, 2, 1, 3]),
        helper.make_node("MatMul", ["qt", "kt"], ["scores"]),
        helper.make_node("Mul", ["scores", "scale"], ["scaled"]),
        helper.make_node("Add", ["scaled", "mask"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["attn"], axis=-1),
        helper.make_node("MatMul", ["attn", "vt"], ["ctx"]),
        helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ctx_t", "merge_shape"], ["merged"]),
        # Gelu as exporters emit it: x * 0.5 * (1 + Erf(x / sqrt(2)))
        helper.make_node("Div", ["merged", "sqrt2"], ["gd"]),
        helper.make_node("Erf", ["gd"], ["ge"]),
        helper.make_node("Add", ["ge", "one"], ["g1"]),
        helper.make_node("Mul", ["merged", "g1"], ["gm"]),
        helper.make_node("Mul", ["gm", "half"], ["y"]),
        helper.make_node("ReduceMean", ["y"], ["pooled"], axes=[1], keepdims=0),
    ]
    mask = np.zeros((1, 1, 1, seq), np.float32)
    mask[..., seq - 3:] = -1e4
    inits = [tensor("emb", 50, hidden), tensor("ln_g", hidden), tensor("ln_b", hidden), tensor("wq", hidden, hidden),
             tensor("wk", hidden, hidden), tensor("wv", hidden, hidden),
             numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array([0], np.int64), "axes0"),
             numpy_helper.from_array(np.array([-1, heads, head], np.int64), "rest"),
             numpy_helper.from_array(np.array([1, seq, hidden], np.int64), "merge_shape"),
             numpy_helper.from_array(np.float32(1 / np.sqrt(head)), "scale"), numpy_helper.from_array(mask, "mask"),
             numpy_helper.from_array(np.float32(np.sqrt(2)), "sqrt2"), numpy_helper.from_array(np.float32(1), "one"),
             numpy_helper.from_array(np.float32(0.5), "half")]
    save(nodes, [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, seq])],
         [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, [1, hidden])], inits, tmp_path / "m.onnx")
    ids = RNG.integers(0, 50, (1, seq)).astype(np.int64)
    compile_and_compare(kiln, tmp_path, {"ids": ids})


def test_pre_opset_13_softmax_on_an_inner_axis_is_refused(kiln, tmp_path):
    save([helper.make_node("Softmax", ["x"], ["y"], axis=1)],
         [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
         [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])], [], tmp_path / "m.onnx", opset=11)
    result = kiln("compile", tmp_path / "m.onnx", "-o", tmp_path / "m.kiln")
    assert result.returncode == 1
    assert "pre-opset-13 flattening semantics" in result.stderr


def test_conv_batchnorm_is_folded_and_matches_onnxruntime(kiln, tmp_path):
    # One Conv with a bias and one without; each BatchNormalization folds into its Conv.
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "g1", "beta1", "mean1", "var1"], ["bn1"], epsilon=1e-3),
        helper.make_node("Relu", ["bn1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], kernel_shape=[3, 3], group=2, strides=[2, 2]),
        helper.make_node("BatchNormalization", ["c2", "g2", "beta2", "mean2", "var2"], ["bn2"]),
        helper.make_node("Relu", ["bn2"], ["y"]),
    ]
    positive = lambda name, n: numpy_helper.from_array(RNG.uniform(0.3, 2.0, n).astype(np.float32), name)
    inits = [tensor("w1", 8, 3, 3, 3), tensor("b1", 8), positive("g1", 8), tensor("beta1", 8), tensor("mean1", 8),
             positive("var1", 8), tensor("w2", 6, 4, 3, 3), positive("g2", 6), tensor("beta2", 6),
             tensor("mean2", 6), positive("var2", 6)]
    save(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 16, 16])],
         [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 6, 7, 7])], inits, tmp_path / "m.onnx")
    x = RNG.standard_normal((2, 3, 16, 16)).astype(np.float32)
    compile_and_compare(kiln, tmp_path, {"x": x})

    result = kiln("compile", tmp_path / "m.onnx", "-o", tmp_path / "m2.kiln", "--no-channels-last")
    assert result.returncode == 0, result.stderr
    match = re.search(r"(\d+) steps", result.stdout)
    assert match, result.stdout
    assert int(match.group(1)) < len(nodes)
    assert int(match.group(1)) == 4  # Conv, Relu, Conv, Relu


def test_clip_fused_into_a_conv_maps_nan_to_its_min_and_no_clip_fusion_keeps_it(kiln, tmp_path):
    # ReLU6 after a Conv: fused by default (one step; NaN -> 0, as onnxruntime's
    # fused Conv gives), a step of its own with --no-clip-fusion (NaN stays).
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("Clip", ["c", "lo", "hi"], ["y"])]
    inits = [tensor("w", 4, 3, 1, 1), numpy_helper.from_array(np.array(0, np.float32), "lo"),
             numpy_helper.from_array(np.array(6, np.float32), "hi")]
    save(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
         [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 4, 4])], inits, tmp_path / "m.onnx")
    x = RNG.standard_normal((1, 3, 4, 4)).astype(np.float32)
    x[0, :, 1, 2] = np.nan
    np.save(tmp_path / "x.npy", x)
    results = {}
    for flag in ([], ["--no-clip-fusion"]):
        out = tmp_path / ("unfused" if flag else "fused")
        compiled = kiln("compile", tmp_path / "m.onnx", "-o", out.with_suffix(".kiln"), *flag)
        assert compiled.returncode == 0, compiled.stderr
        ran = kiln("run", out.with_suffix(".kiln"), "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", out)
        assert ran.returncode == 0, ran.stderr
        results[bool(flag)] = (np.load(out / "y.npy"), int(re.search(r"(\d+) steps", compiled.stdout).group(1)))
    (fused, fused_steps), (unfused, unfused_steps) = results[False], results[True]
    assert unfused_steps == fused_steps + 1
    assert np.all(fused[0, :, 1, 2] == 0) and np.all(np.isnan(unfused[0, :, 1, 2]))
    finite = np.ones_like(fused, dtype=bool)
    finite[0, :, 1, 2] = False
    np.testing.assert_allclose(fused[finite], unfused[finite], rtol=1e-6)
