"""onnxruntime's contrib operators (com.microsoft), as its transformer
optimizer and quantizer write them, rewritten on import
(frontend/onnx/contrib_expansion.h) and checked against onnxruntime itself,
which runs them natively."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln

RNG = np.random.default_rng(41)
B, S, H, D = 2, 7, 3, 8
HIDDEN = H * D


def run_both(tmp_path, nodes, inputs, outputs, inits, feeds, opset=14):
    graph = helper.make_graph(nodes, "contrib", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "m.onnx")
    report = kiln.compile(tmp_path / "m.onnx", tmp_path / "m.kiln")
    ours = kiln.Runner(tmp_path / "m.kiln").run(feeds)
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    return ours, want, report


def f32(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def check(ours, want, rtol=1e-5, atol=1e-5):
    for name, value in want.items():
        np.testing.assert_allclose(ours[name], value, rtol=rtol, atol=atol, err_msg=name)


@pytest.mark.parametrize("op,extra_inputs,attrs", [
    ("Gelu", [], {}),
    ("BiasGelu", ["bias"], {}),
    ("FastGelu", [], {}),
    ("FastGelu", ["bias"], {}),
    ("QuickGelu", [], {"alpha": 1.5}),
])
def test_activations(tmp_path, op, extra_inputs, attrs):
    x = RNG.standard_normal((B, S, HIDDEN)).astype(np.float32) * 2
    inits = [numpy_helper.from_array(RNG.standard_normal(HIDDEN).astype(np.float32), "bias")]
    feeds = {"x": x}
    inputs = [f32("x", [B, S, HIDDEN])]
    if "skip" in extra_inputs:
        inputs.append(f32("skip", [B, S, HIDDEN]))
        feeds["skip"] = RNG.standard_normal((B, S, HIDDEN)).astype(np.float32)
    node = helper.make_node(op, ["x"] + extra_inputs, ["y"], domain="com.microsoft", **attrs)
    ours, want, _ = run_both(tmp_path, [node], inputs, [f32("y", None)], inits, feeds)
    check(ours, want)


@pytest.mark.parametrize("simplified", [False, True])
def test_skip_layer_norm_with_its_sum_output(tmp_path, simplified):
    op = "SkipSimplifiedLayerNormalization" if simplified else "SkipLayerNormalization"
    inits = [numpy_helper.from_array(RNG.standard_normal(HIDDEN).astype(np.float32), n) for n in ("gamma", "beta", "bias")]
    names = ["x", "skip", "gamma", "bias"] if simplified else ["x", "skip", "gamma", "beta", "bias"]
    node = helper.make_node(op, names, ["y", "", "", "sum"], domain="com.microsoft", epsilon=1e-6)
    feeds = {n: RNG.standard_normal((B, S, HIDDEN)).astype(np.float32) for n in ("x", "skip")}
    ours, want, _ = run_both(tmp_path, [node], [f32("x", [B, S, HIDDEN]), f32("skip", [B, S, HIDDEN])],
                             [f32("y", None), f32("sum", None)], inits, feeds)
    check(ours, want)


def test_layer_norms_of_onnxruntime_before_opset_17(tmp_path):
    inits = [numpy_helper.from_array(RNG.standard_normal(HIDDEN).astype(np.float32), n) for n in ("scale", "bias")]
    # onnxruntime registers both in the default domain from version 1 (ONNX's
    # own LayerNormalization came with opset 17): opset 14 here.
    nodes = [helper.make_node("SimplifiedLayerNormalization", ["x", "scale"], ["r"], axis=-1, epsilon=1e-6),
             helper.make_node("LayerNormalization", ["r", "scale", "bias"], ["y"], axis=-1, epsilon=1e-5)]
    feeds = {"x": RNG.standard_normal((B, S, HIDDEN)).astype(np.float32)}
    ours, want, _ = run_both(tmp_path, nodes, [f32("x", [B, S, HIDDEN])], [f32("y", None)], inits, feeds)
    check(ours, want)


@pytest.mark.parametrize("trans_a,trans_b,alpha", [(0, 0, 1.0), (1, 1, 0.5), (0, 1, 2.0)])
def test_fused_matmul(tmp_path, trans_a, trans_b, alpha):
    a_shape = [B, 5, 6] if not trans_a else [B, 6, 5]
    b_shape = [6, 4] if not trans_b else [4, 6]
    inits = [numpy_helper.from_array(RNG.standard_normal(b_shape).astype(np.float32), "w")]
    node = helper.make_node("FusedMatMul", ["a", "w"], ["y"], domain="com.microsoft", transA=trans_a,
                            transB=trans_b, alpha=alpha)
    feeds = {"a": RNG.standard_normal(a_shape).astype(np.float32)}
    ours, want, _ = run_both(tmp_path, [node], [f32("a", a_shape)], [f32("y", None)], inits, feeds)
    check(ours, want)


@pytest.mark.parametrize("op", ["MatMulIntegerToFloat", "DynamicQuantizeMatMul"])
def test_quantized_matmuls(tmp_path, op):
    k, n = 40, 12
    x = RNG.standard_normal((B, S, k)).astype(np.float32)
    inits = [numpy_helper.from_array(RNG.integers(-128, 128, (k, n)).astype(np.int8), "w"),
             numpy_helper.from_array((RNG.random(n) * 0.02 + 0.01).astype(np.float32), "w_scale"),
             numpy_helper.from_array(np.zeros(n, np.int8), "w_zero"),
             numpy_helper.from_array(RNG.standard_normal(n).astype(np.float32), "bias")]
    if op == "DynamicQuantizeMatMul":
        nodes = [helper.make_node(op, ["x", "w", "w_scale", "w_zero", "bias"], ["y"], domain="com.microsoft")]
    else:
        nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "x_scale", "x_zero"]),
                 helper.make_node(op, ["xq", "w", "x_scale", "w_scale", "x_zero", "w_zero", "bias"], ["y"],
                                  domain="com.microsoft")]
    ours, want, report = run_both(tmp_path, nodes, [f32("x", [B, S, k])], [f32("y", None)], inits, {"x": x})
    assert report["step_kernels"].get("kiln.MatMulIntegerToFloat") == 1, report["step_kernels"]
    check(ours, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mask,unidirectional,bias", [(True, 0, False), (False, 1, False), (True, 0, True)])
def test_attention(tmp_path, mask, unidirectional, bias):
    x = RNG.standard_normal((B, S, HIDDEN)).astype(np.float32)
    inits = [numpy_helper.from_array((RNG.standard_normal((HIDDEN, 3 * HIDDEN)) / 4).astype(np.float32), "w"),
             numpy_helper.from_array(RNG.standard_normal(3 * HIDDEN).astype(np.float32), "b")]
    inputs = [f32("x", [B, S, HIDDEN])]
    feeds = {"x": x}
    names = ["x", "w", "b"]
    if mask:
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.INT32, [B, S]))
        m = np.ones((B, S), np.int32)
        m[1, 4:] = 0
        feeds["mask"] = m
        names.append("mask")
    if bias:
        names += [""] * (5 - len(names)) + ["attention_bias"]  # past (4) absent
        inits.append(numpy_helper.from_array(RNG.standard_normal((1, H, S, S)).astype(np.float32), "attention_bias"))
    node = helper.make_node("Attention", names, ["y"], domain="com.microsoft", num_heads=H,
                            unidirectional=unidirectional)
    ours, want, report = run_both(tmp_path, [node], inputs, [f32("y", None)], inits, feeds)
    assert report["step_kernels"].get("kiln.Attention") == 1, report["step_kernels"]
    check(ours, want)


def test_attention_with_past_state_is_refused(tmp_path):
    inits = [numpy_helper.from_array(np.zeros((HIDDEN, 3 * HIDDEN), np.float32), "w"),
             numpy_helper.from_array(np.zeros((2, B, H, 1, D), np.float32), "past")]
    node = helper.make_node("Attention", ["x", "w", "", "", "past"], ["y"], domain="com.microsoft", num_heads=H)
    graph = helper.make_graph([node], "g", [f32("x", [B, S, HIDDEN])], [f32("y", None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "m.onnx")
    with pytest.raises(Exception, match="past state"):
        kiln.compile(tmp_path / "m.onnx", tmp_path / "m.kiln")


@pytest.mark.parametrize("segments", [True, False])
def test_embed_layer_norm_feeding_attention(tmp_path, segments):
    """The head of every BERT that onnxruntime's optimizer rewrote: the
    embeddings' EmbedLayerNormalization and its mask_index (the count of
    ones per mask row) read by Attention."""
    vocab, max_pos = 50, 16
    inits = [numpy_helper.from_array(RNG.standard_normal((vocab, HIDDEN)).astype(np.float32), "word"),
             numpy_helper.from_array(RNG.standard_normal((max_pos, HIDDEN)).astype(np.float32), "pos"),
             numpy_helper.from_array(RNG.standard_normal((2, HIDDEN)).astype(np.float32), "seg"),
             numpy_helper.from_array(RNG.standard_normal(HIDDEN).astype(np.float32), "gamma"),
             numpy_helper.from_array(RNG.standard_normal(HIDDEN).astype(np.float32), "beta"),
             numpy_helper.from_array((RNG.standard_normal((HIDDEN, 3 * HIDDEN)) / 4).astype(np.float32), "w"),
             numpy_helper.from_array(RNG.standard_normal(3 * HIDDEN).astype(np.float32), "b")]
    int32 = lambda name: helper.make_tensor_value_info(name, TensorProto.INT32, [B, S])  # noqa: E731
    inputs = [int32("ids"), int32("mask")] + ([int32("segment")] if segments else [])
    embed_inputs = ["ids", "segment" if segments else "", "word", "pos", "seg" if segments else "", "gamma", "beta",
                    "mask"]
    nodes = [helper.make_node("EmbedLayerNormalization", embed_inputs, ["e", "mask_index"], domain="com.microsoft",
                              epsilon=1e-12),
             helper.make_node("Attention", ["e", "w", "b", "mask_index"], ["y"], domain="com.microsoft", num_heads=H)]
    mask = np.ones((B, S), np.int32)
    mask[1, 5:] = 0  # right padding, which the lengths describe
    feeds = {"ids": RNG.integers(0, vocab, (B, S)).astype(np.int32), "mask": mask}
    if segments:
        feeds["segment"] = RNG.integers(0, 2, (B, S)).astype(np.int32)
    ours, want, report = run_both(tmp_path, nodes, inputs, [f32("y", None), f32("e", None)], inits, feeds)
    assert report["step_kernels"].get("kiln.Attention") == 1, report["step_kernels"]
    check(ours, want)


@pytest.mark.parametrize("per_column", [False, True])
def test_quantized_attention(tmp_path, per_column):
    """QAttention, what onnxruntime's quantizer makes of an optimized BERT's
    Attention: the input quantized by DynamicQuantizeLinear, int8 weights."""
    x = RNG.standard_normal((B, S, HIDDEN)).astype(np.float32)
    width = 3 * HIDDEN
    w_scale = (RNG.random(width) * 0.01 + 0.005).astype(np.float32) if per_column else np.array(0.01, np.float32)
    w_zero = np.zeros(width, np.int8) if per_column else np.array(0, np.int8)
    inits = [numpy_helper.from_array(RNG.integers(-127, 128, (HIDDEN, width)).astype(np.int8), "w"),
             numpy_helper.from_array(RNG.standard_normal(width).astype(np.float32), "b"),
             numpy_helper.from_array(w_scale, "w_scale"), numpy_helper.from_array(w_zero, "w_zero")]
    mask = np.ones((B, S), np.int32)
    mask[0, 6:] = 0
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "x_scale", "x_zero"]),
             helper.make_node("QAttention", ["xq", "w", "b", "x_scale", "w_scale", "mask", "x_zero", "w_zero"], ["y"],
                              domain="com.microsoft", num_heads=H)]
    ours, want, report = run_both(tmp_path, nodes,
                                  [f32("x", [B, S, HIDDEN]), helper.make_tensor_value_info("mask", TensorProto.INT32,
                                                                                         [B, S])],
                                  [f32("y", None)], inits, {"x": x, "mask": mask})
    assert report["step_kernels"].get("kiln.Attention") == 1, report["step_kernels"]
    assert report["step_kernels"].get("kiln.MatMulIntegerToFloat") == 3, report["step_kernels"]
    check(ours, want, rtol=1e-4, atol=1e-4)


def test_attention_with_lengths_as_mask_index(tmp_path):
    """mask_index as [batch] lengths of right-padded rows."""
    x = RNG.standard_normal((B, S, HIDDEN)).astype(np.float32)
    inits = [numpy_helper.from_array((RNG.standard_normal((HIDDEN, 3 * HIDDEN)) / 4).astype(np.float32), "w"),
             numpy_helper.from_array(RNG.standard_normal(3 * HIDDEN).astype(np.float32), "b")]
    node = helper.make_node("Attention", ["x", "w", "b", "lengths"], ["y"], domain="com.microsoft", num_heads=H)
    inputs = [f32("x", [B, S, HIDDEN]), helper.make_tensor_value_info("lengths", TensorProto.INT32, [B])]
    ours, want, report = run_both(tmp_path, [node], inputs, [f32("y", None)], inits,
                                  {"x": x, "lengths": np.array([S, 4], np.int32)})
    assert report["step_kernels"].get("kiln.Attention") == 1, report["step_kernels"]
    check(ours, want)


def test_quantized_embed_layer_norm(tmp_path):
    """QEmbedLayerNormalization (onnxruntime's quantizer on an optimized BERT):
    u8 tables, gamma and beta, each with its scale and zero point."""
    vocab, max_pos = 50, 16

    def quantized(name, shape):
        values = RNG.integers(0, 256, shape).astype(np.uint8)
        return [numpy_helper.from_array(values, name),
                numpy_helper.from_array(np.array(RNG.random() * 0.02 + 0.01, np.float32), name + "_scale"),
                numpy_helper.from_array(np.array(RNG.integers(100, 156), np.uint8), name + "_zero")]
    tables = [("word", (vocab, HIDDEN)), ("pos", (max_pos, HIDDEN)), ("seg", (2, HIDDEN)), ("gamma", (HIDDEN,)),
              ("beta", (HIDDEN,))]
    inits = [t for name, shape in tables for t in quantized(name, shape)]
    names = ["ids", "segment", "word", "pos", "seg", "gamma", "beta", "mask"] + \
            [n + "_scale" for n, _ in tables] + [n + "_zero" for n, _ in tables]
    node = helper.make_node("QEmbedLayerNormalization", names, ["e", "mask_index"], domain="com.microsoft",
                            epsilon=1e-12)
    int32 = lambda name: helper.make_tensor_value_info(name, TensorProto.INT32, [B, S])  # noqa: E731
    mask = np.ones((B, S), np.int32)
    mask[1, 3:] = 0
    feeds = {"ids": RNG.integers(0, vocab, (B, S)).astype(np.int32), "segment": RNG.integers(0, 2, (B, S)).astype(np.int32),
             "mask": mask}
    ours, want, _ = run_both(tmp_path, [node], [int32("ids"), int32("segment"), int32("mask")],
                             [f32("e", None), helper.make_tensor_value_info("mask_index", TensorProto.INT32, None)],
                             inits, feeds)
    check(ours, want, rtol=1e-4, atol=1e-4)
