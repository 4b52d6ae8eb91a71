"""Attention as exporters write it, compiled by kiln into kiln.Attention
steps (src/passes/attention_fusion.h) and checked against onnxruntime on the
unfused model: the BERT export of transformers (heads split by Reshape +
Transpose, scores divided by sqrt(d), an additive padding mask), PyTorch's
dynamo/SDPA export (q and k scaled apart, keys transposed through 3-D
reshapes, Where(IsNaN) after the Softmax, fully masked rows), T5's (a
position bias, no scale, a Cast before the Softmax), and heads already
[B, H, S, D] (the 4-D form)."""

import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from test_models import compile_and_compare, save

RNG = np.random.default_rng(23)
B, S, H, D = 2, 9, 3, 8
HD = H * D


class Graph:
    def __init__(self):
        self.nodes, self.inits, self.count = [], [], 0

    def const(self, value, dtype=np.float32):
        name = f"c{self.count}"
        self.count += 1
        self.inits.append(numpy_helper.from_array(np.array(value, dtype), name))
        return name

    def node(self, op, inputs, out=None, **attrs):
        out = out or f"n{len(self.nodes)}"
        self.nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def split(self, x, perm=(0, 2, 1, 3)):
        """[B, S, H*D] -> Reshape [B, S, H, D] -> Transpose."""
        return self.node("Transpose", [self.node("Reshape", [x, self.const([B, S, H, D], np.int64)])], perm=list(perm))

    def merge(self, y4, out="y"):
        """[B, H, S, D] -> Transpose [B, S, H, D] -> Reshape [B, S, H*D]."""
        heads = self.node("Transpose", [y4], perm=[0, 2, 1, 3])
        return self.node("Reshape", [heads, self.const([B, S, HD], np.int64)], out=out)


def padding_mask(g, lengths_name="mask"):
    """(1 - mask[B, 1, 1, S]) * -10000, as transformers' BERT export computes it."""
    unsq = g.node("Unsqueeze", [lengths_name, g.const([1, 2], np.int64)])
    inverted = g.node("Sub", [g.const(1.0), g.node("Cast", [unsq], to=TensorProto.FLOAT)])
    return g.node("Mul", [inverted, g.const(-10000.0)])


def bert(g):
    q, k, v = g.split("q"), g.split("k", (0, 2, 3, 1)), g.split("v")
    scores = g.node("Div", [g.node("MatMul", [q, k]), g.const(np.sqrt(D))])
    probs = g.node("Softmax", [g.node("Add", [scores, padding_mask(g)])], axis=-1)
    g.merge(g.node("MatMul", [probs, v]))


def bert_no_mask_key_transposed_twice(g):
    q, v = g.split("q"), g.split("v")
    k = g.node("Transpose", [g.split("k")], perm=[0, 1, 3, 2])
    scores = g.node("Mul", [g.const(1 / np.sqrt(D)), g.node("MatMul", [q, k])])
    g.merge(g.node("MatMul", [g.node("Softmax", [scores], axis=3), v]))


def sdpa(g):
    """PyTorch's dynamo export of scaled_dot_product_attention with a bool mask."""
    root = float(D ** -0.25)
    q = g.node("Mul", [g.split("q"), g.const(root)])
    k4 = g.node("Reshape", [g.split("k"), g.const([B * H, S, D], np.int64)])
    kt = g.node("Reshape", [g.node("Transpose", [k4], perm=[0, 2, 1]), g.const([B, H, D, S], np.int64)])
    kt = g.node("Mul", [kt, g.const(root)])
    allowed = g.node("Cast", [g.node("Unsqueeze", ["mask", g.const([1, 2], np.int64)])], to=TensorProto.BOOL)
    bias = g.node("Where", [allowed, g.const(0.0), g.const(-np.inf)])
    probs = g.node("Softmax", [g.node("Add", [g.node("MatMul", [q, kt]), bias])], axis=-1)
    clean = g.node("Where", [g.node("IsNaN", [probs]), g.const(0.0), probs])
    g.merge(g.node("MatMul", [clean, g.split("v")]))


def t5(g):
    """No scale; a position bias [1, H, S, S] plus the padding mask; a Cast to float."""
    g.inits.append(numpy_helper.from_array(RNG.standard_normal((1, H, S, S)).astype(np.float32), "position_bias"))
    bias = g.node("Add", ["position_bias", padding_mask(g)])
    scores = g.node("Add", [g.node("MatMul", [g.split("q"), g.split("k", (0, 2, 3, 1))]), bias])
    probs = g.node("Softmax", [g.node("Cast", [scores], to=TensorProto.FLOAT)], axis=-1)
    g.merge(g.node("MatMul", [probs, g.split("v")]))


def four_d(g):
    """Q, K, V already [B, H, S, D]: a 4-D kiln.Attention, its output 4-D."""
    for name in ("q", "k", "v"):
        g.node("Reshape", [name, g.const([B, H, S, D], np.int64)], out=name + "4")
    kt = g.node("Transpose", ["k4"], perm=[0, 1, 3, 2])
    scores = g.node("Div", [g.node("MatMul", ["q4", kt]), g.const(np.sqrt(D))])
    probs = g.node("Softmax", [g.node("Add", [scores, padding_mask(g)])], axis=-1)
    g.node("MatMul", [probs, "v4"], out="y4")
    g.node("Reshape", ["y4", g.const([B, S, HD], np.int64)], out="y")


def save_form(form, path):
    """The model `form` builds, saved at `path`; returns feeds for it."""
    g = Graph()
    form(g)
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [B, S, HD]) for n in ("q", "k", "v")]
    feeds = {n: RNG.standard_normal((B, S, HD)).astype(np.float32) for n in ("q", "k", "v")}
    if any("mask" in node.input for node in g.nodes):
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.INT64, [B, S]))
        mask = np.ones((B, S), np.int64)
        mask[1, 5:] = 0  # the second sequence is padded
        if form is sdpa:
            mask[1, :] = 0  # every key masked: SDPA's Where makes the row zeros
        feeds["mask"] = mask
    save(g.nodes, inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, S, HD])], g.inits, path)
    return feeds


@pytest.mark.parametrize("form", [bert, bert_no_mask_key_transposed_twice, sdpa, t5, four_d])
def test_exported_attention_is_one_step(kiln, tmp_path, form):
    feeds = save_form(form, tmp_path / "m.onnx")
    compile_and_compare(kiln, tmp_path, feeds, rtol=1e-5, atol=1e-6)
    ir = kiln("compile", tmp_path / "m.onnx", "-o", tmp_path / "n.kiln", "--print-ir").stdout
    assert len(re.findall(r"kiln\.Attention", ir)) == 1, ir
    assert "Softmax" not in ir and "MatMul" not in ir, ir
    # The 3-D forms read q, k and v in place: no Transpose is left.
    if form is not four_d:
        assert "Transpose" not in ir, ir


def test_scores_read_elsewhere_stay_unfused(kiln, tmp_path):
    """The probabilities are a graph output too: nothing fuses, results agree."""
    g = Graph()
    q, k, v = g.split("q"), g.split("k", (0, 2, 3, 1)), g.split("v")
    probs = g.node("Softmax", [g.node("MatMul", [q, k])], out="probs", axis=-1)
    g.merge(g.node("MatMul", [probs, v]))
    save(g.nodes, [helper.make_tensor_value_info(n, TensorProto.FLOAT, [B, S, HD]) for n in ("q", "k", "v")],
         [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, S, HD]),
          helper.make_tensor_value_info("probs", TensorProto.FLOAT, [B, H, S, S])], g.inits, tmp_path / "m.onnx")
    feeds = {n: RNG.standard_normal((B, S, HD)).astype(np.float32) for n in ("q", "k", "v")}
    compile_and_compare(kiln, tmp_path, feeds)
    ir = kiln("compile", tmp_path / "m.onnx", "-o", tmp_path / "n.kiln", "--print-ir").stdout
    assert "kiln.Attention" not in ir and "Softmax" in ir, ir


def test_softmax_over_another_axis_stays_unfused(kiln, tmp_path):
    g = Graph()
    q, k, v = g.split("q"), g.split("k", (0, 2, 3, 1)), g.split("v")
    probs = g.node("Softmax", [g.node("MatMul", [q, k])], axis=2)
    g.merge(g.node("MatMul", [probs, v]))
    save(g.nodes, [helper.make_tensor_value_info(n, TensorProto.FLOAT, [B, S, HD]) for n in ("q", "k", "v")],
         [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, S, HD])], g.inits, tmp_path / "m.onnx")
    feeds = {n: RNG.standard_normal((B, S, HD)).astype(np.float32) for n in ("q", "k", "v")}
    compile_and_compare(kiln, tmp_path, feeds)
    ir = kiln("compile", tmp_path / "m.onnx", "-o", tmp_path / "n.kiln", "--print-ir").stdout
    assert "kiln.Attention" not in ir, ir
