#!/usr/bin/env python3
"""Builds kiln's benchmark models as ONNX files (opset 17, IR version 8).

    python bench/models/make_models.py [OUT_DIR] [--models mlp,resnet50,...]

OUT_DIR defaults to build/bench/models. Every model is built with the onnx
helper API and numpy random weights from fixed seeds, so two runs write the
same bytes. Weights are stored inside the model file (none of these models
comes near the 2 GB protobuf limit, so no external data).

The graphs follow what real exporters emit:

- mlp: torch.nn.Linear on a 2-D input -> Gemm(transB=1); ReLU -> Relu.
- resnet50: torchvision resnet50 (v1.5: stride 2 on the 3x3 conv of the
  first bottleneck of a stage), exported with BatchNormalization kept as its
  own node (TrainingMode.PRESERVE / exporters that do not fold BN).
- mobilenetv2: torchvision mobilenet_v2; ReLU6 -> Clip(x, 0, 6) with min and
  max as initializer inputs (opset >= 11); Dropout is gone in eval mode.
- minilm: HF transformers BertModel with the all-MiniLM-L6-v2 shape; position
  ids from Shape -> Gather -> Unsqueeze -> Slice of the position_ids buffer;
  extended attention mask (1 - mask) * finfo(float32).min; Linear on 3-D
  inputs -> MatMul + Add; GELU -> Div(sqrt 2) / Erf / Add 1 / Mul x / Mul 0.5;
  LayerNorm as the fused LayerNormalization op (opset 17 exporters) in some
  places and as the decomposed ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/
  Mul/Add form (older exporters) in others.
- yolov8n: ultralytics YOLOv8n (depth 0.33, width 0.25) with Conv+BN+SiLU
  (SiLU -> Sigmoid + Mul), C2f with Split/Concat, SPPF with MaxPool(5, 1, 2),
  Upsample -> Resize(nearest, asymmetric, floor) with scales, Detect head with
  DFL (Reshape/Transpose/Softmax/Conv 1x1), dist2bbox and the final
  Concat -> output0 [batch, 84, 8400].
- chain1000: 1,000 tiny elementwise ops (Add, Mul, Relu, Sigmoid in turn) on a
  [batch, 64] input, to measure per-node dispatch cost.

Every model has a symbolic leading dimension "batch" (minilm also
"sequence"), so kiln can compile it at batch 1 and batch 8. Each model's
metadata_props carries `bench.input.<name>` JSON entries that tell
bench/compare.py which shape and value range to feed (e.g. token ids below
the vocabulary, an attention mask of 0s and 1s).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8


class Builder:
    """A small graph builder: unique names, initializers from numpy arrays."""

    def __init__(self, name: str, seed: int):
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.metadata: dict[str, str] = {}
        self._counts: collections.Counter[str] = collections.Counter()
        self._consts: dict[tuple, str] = {}
        self._used: set[str] = set()

    def fresh(self, base: str) -> str:
        name = base
        while name in self._used:
            self._counts[base] += 1
            name = f"{base}_{self._counts[base]}"
        self._used.add(name)
        return name

    def init(self, base: str, array: np.ndarray) -> str:
        name = self.fresh(base)
        self.initializers.append(numpy_helper.from_array(np.array(array, order="C", copy=True), name))
        return name

    def const(self, value, dtype=np.float32) -> str:
        """A shared small constant initializer (exporters emit these as initializers or Constant nodes)."""
        array = np.array(value, dtype=dtype)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self._consts:
            self._consts[key] = self.init("const", array)
        return self._consts[key]

    def node(self, op: str, inputs: list[str], n_out: int = 1, name: str | None = None, **attrs):
        node_name = self.fresh(name or f"/{op}")
        outs = [f"{node_name}_output_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=node_name, **attrs))
        return outs[0] if n_out == 1 else outs

    def input(self, name: str, elem_type: int, shape: list, spec: dict) -> str:
        """spec (stored as JSON in metadata_props) tells bench/compare.py how to make this input:
        dist normal | uniform (low, high) | int (low <= v < high) | mask (1s, with padding zeros in
        even rows); dims: values of symbolic dimensions other than "batch"."""
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        self.metadata[f"bench.input.{name}"] = json.dumps(spec, sort_keys=True)
        return name

    def output(self, value: str, name: str, elem_type: int, shape: list) -> None:
        # Exporters name the producing node's output after the graph output (no Identity node).
        for node in self.nodes:
            for i, out in enumerate(node.output):
                if out == value:
                    node.output[i] = name
            for i, inp in enumerate(node.input):
                if inp == value:
                    node.input[i] = name
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, shape))

    def model(self, doc: str) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.initializers)
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET)],
            ir_version=IR_VERSION,
            producer_name="kiln-bench-make_models",
            producer_version="1",
            doc_string=doc,
        )
        helper.set_model_props(model, self.metadata)
        return model

    # ---- weight helpers -------------------------------------------------

    def normal(self, shape, std: float) -> np.ndarray:
        return (self.rng.standard_normal(shape) * std).astype(np.float32)

    def uniform(self, shape, low: float, high: float) -> np.ndarray:
        return self.rng.uniform(low, high, shape).astype(np.float32)

    # ---- layers ---------------------------------------------------------

    def conv(self, x, c_in, c_out, k, stride=1, pad=None, group=1, bias=False, name="/Conv", gain=2.0):
        if pad is None:
            pad = k // 2
        fan_in = (c_in // group) * k * k
        w = self.init(f"{name}.weight", self.normal((c_out, c_in // group, k, k), math.sqrt(gain / fan_in)))
        inputs = [x, w]
        if bias:
            inputs.append(self.init(f"{name}.bias", self.normal((c_out,), 0.01)))
        return self.node("Conv", inputs, name=name, dilations=[1, 1], group=group, kernel_shape=[k, k],
                         pads=[pad, pad, pad, pad], strides=[stride, stride])

    def batchnorm(self, x, c, name="/BatchNormalization", gamma=(0.6, 1.2)):
        scale = self.init(f"{name}.weight", self.uniform((c,), *gamma))
        shift = self.init(f"{name}.bias", self.normal((c,), 0.05))
        mean = self.init(f"{name}.running_mean", self.normal((c,), 0.05))
        var = self.init(f"{name}.running_var", self.uniform((c,), 0.8, 1.2))
        return self.node("BatchNormalization", [x, scale, shift, mean, var], name=name, epsilon=1e-5, momentum=0.9)


def calibrate_batchnorm(model: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    """Sets every BatchNormalization's running mean and variance to the statistics its input has
    on one random input, as training would leave them, so that activations stay O(1) through the
    whole network instead of vanishing or exploding with random weights.

    One onnxruntime run of a copy in which each BatchNormalization is an InstanceNormalization
    (at batch 1, normalising with the input's own per-channel statistics) and each BN input is a
    graph output. Statistics are rounded to 4 significant digits so the written model does not
    depend on the last bits of one machine's float arithmetic."""
    import onnxruntime as ort

    calib = onnx.ModelProto()
    calib.CopyFrom(model)
    bn_inputs = []
    for node in calib.graph.node:
        if node.op_type == "BatchNormalization":
            eps = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-5)
            x, scale, bias = node.input[0], node.input[1], node.input[2]
            bn_inputs.append(x)
            node.op_type = "InstanceNormalization"
            del node.input[:]
            node.input.extend([x, scale, bias])
            del node.attribute[:]
            node.attribute.append(helper.make_attribute("epsilon", eps))
    del calib.graph.output[:]
    for name in bn_inputs:
        calib.graph.output.append(helper.make_empty_tensor_value_info(name))
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3  # the copy's running stats are unused: no warning per initializer
    sess = ort.InferenceSession(calib.SerializeToString(), so, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.input:
        shape = [d.dim_value if d.dim_value else 1 for d in value.type.tensor_type.shape.dim]
        spec = json.loads(dict((p.key, p.value) for p in model.metadata_props)[f"bench.input.{value.name}"])
        if spec["dist"] == "uniform":
            feeds[value.name] = rng.uniform(spec["low"], spec["high"], shape).astype(np.float32)
        else:
            feeds[value.name] = rng.standard_normal(shape).astype(np.float32)
    stats = dict(zip(bn_inputs, sess.run(bn_inputs, feeds)))

    def round4(a):
        return np.array([float(f"{v:.4g}") for v in a.ravel()], np.float32)

    inits = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "BatchNormalization":
            x = stats[node.input[0]].astype(np.float64)
            mean = round4(x.mean(axis=(0, 2, 3)))
            var = round4(np.maximum(x.var(axis=(0, 2, 3)), 1e-4))
            inits[node.input[3]].CopyFrom(numpy_helper.from_array(mean, node.input[3]))
            inits[node.input[4]].CopyFrom(numpy_helper.from_array(var, node.input[4]))
    return model


def save(model: onnx.ModelProto, path: str) -> None:
    onnx.checker.check_model(model, full_check=True)
    # Weights inside the file: refuse silently switching to external data.
    if model.ByteSize() >= 2 ** 31 - 1:
        raise RuntimeError(f"{path}: {model.ByteSize()} bytes exceeds the 2 GB protobuf limit")
    tmp = path + ".tmp"
    onnx.save_model(model, tmp)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------
# mlp
# ---------------------------------------------------------------------------

def make_mlp() -> onnx.ModelProto:
    b = Builder("mlp", seed=1)
    x = b.input("input", TensorProto.FLOAT, ["batch", 784], {"dist": "normal"})
    dims = [784, 1024, 1024, 512]
    h = x
    for i in range(3):
        w = b.init(f"fc{i}.weight", b.normal((dims[i + 1], dims[i]), math.sqrt(2.0 / dims[i])))
        bias = b.init(f"fc{i}.bias", b.normal((dims[i + 1],), 0.01))
        h = b.node("Gemm", [h, w, bias], name=f"/fc{i}/Gemm", alpha=1.0, beta=1.0, transB=1)
        h = b.node("Relu", [h], name=f"/relu{i}/Relu")
    b.output(h, "output", TensorProto.FLOAT, ["batch", dims[-1]])
    return b.model("MLP 784-1024-1024-512, three Gemm(transB=1)+Relu layers")


# ---------------------------------------------------------------------------
# resnet50 (torchvision v1.5)
# ---------------------------------------------------------------------------

def make_resnet50() -> onnx.ModelProto:
    b = Builder("resnet50", seed=2)
    x = b.input("input", TensorProto.FLOAT, ["batch", 3, 224, 224], {"dist": "normal"})

    def conv_bn(x, c_in, c_out, k, stride, name, relu=True, gamma=(0.6, 1.2)):
        y = b.conv(x, c_in, c_out, k, stride=stride, name=f"{name}/conv")
        y = b.batchnorm(y, c_out, name=f"{name}/bn", gamma=gamma)
        return b.node("Relu", [y], name=f"{name}/relu") if relu else y

    h = conv_bn(x, 3, 64, 7, 2, "/conv1")
    h = b.node("MaxPool", [h], name="/maxpool/MaxPool", ceil_mode=0, kernel_shape=[3, 3], pads=[1, 1, 1, 1],
               strides=[2, 2])
    c_in = 64
    for stage, (blocks, width) in enumerate([(3, 64), (4, 128), (6, 256), (3, 512)]):
        for i in range(blocks):
            stride = 2 if (i == 0 and stage > 0) else 1
            name = f"/layer{stage + 1}/layer{stage + 1}.{i}"
            c_out = width * 4
            y = conv_bn(h, c_in, width, 1, 1, f"{name}/conv1")
            y = conv_bn(y, width, width, 3, stride, f"{name}/conv2")  # v1.5: stride on the 3x3
            # Small last-BN scale (like zero_init_residual) keeps activations bounded over 16 blocks.
            y = conv_bn(y, width, c_out, 1, 1, f"{name}/conv3", relu=False, gamma=(0.1, 0.3))
            if i == 0:
                identity = conv_bn(h, c_in, c_out, 1, stride, f"{name}/downsample", relu=False)
            else:
                identity = h
            h = b.node("Add", [y, identity], name=f"{name}/Add")
            h = b.node("Relu", [h], name=f"{name}/relu")
            c_in = c_out
    h = b.node("GlobalAveragePool", [h], name="/avgpool/GlobalAveragePool")
    h = b.node("Flatten", [h], name="/Flatten", axis=1)
    w = b.init("fc.weight", b.normal((1000, 2048), math.sqrt(1.0 / 2048)))
    bias = b.init("fc.bias", b.normal((1000,), 0.01))
    h = b.node("Gemm", [h, w, bias], name="/fc/Gemm", alpha=1.0, beta=1.0, transB=1)
    b.output(h, "output", TensorProto.FLOAT, ["batch", 1000])
    return calibrate_batchnorm(
        b.model("ResNet-50 v1.5 (torchvision topology), Conv+BatchNormalization+Relu kept unfused"), seed=12)


# ---------------------------------------------------------------------------
# mobilenetv2 (torchvision)
# ---------------------------------------------------------------------------

def make_mobilenetv2() -> onnx.ModelProto:
    b = Builder("mobilenetv2", seed=3)
    x = b.input("input", TensorProto.FLOAT, ["batch", 3, 224, 224], {"dist": "normal"})
    zero, six = b.const(0.0), b.const(6.0)

    def conv_bn(x, c_in, c_out, k, stride, name, group=1, relu6=True, gamma=(0.6, 1.2)):
        y = b.conv(x, c_in, c_out, k, stride=stride, group=group, name=f"{name}/conv")
        y = b.batchnorm(y, c_out, name=f"{name}/bn", gamma=gamma)
        return b.node("Clip", [y, zero, six], name=f"{name}/Clip") if relu6 else y

    h = conv_bn(x, 3, 32, 3, 2, "/features/features.0")
    c_in = 32
    idx = 1
    for t, c, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                       (6, 320, 1, 1)]:
        for i in range(n):
            stride = s if i == 0 else 1
            name = f"/features/features.{idx}/conv"
            hidden = c_in * t
            y = h
            if t != 1:
                y = conv_bn(y, c_in, hidden, 1, 1, f"{name}/conv.0")
            y = conv_bn(y, hidden, hidden, 3, stride, f"{name}/dw", group=hidden)  # depthwise
            y = conv_bn(y, hidden, c, 1, 1, f"{name}/pw-linear", relu6=False, gamma=(0.3, 0.6))
            if stride == 1 and c_in == c:
                y = b.node("Add", [h, y], name=f"/features/features.{idx}/Add")
            h = y
            c_in = c
            idx += 1
    h = conv_bn(h, 320, 1280, 1, 1, f"/features/features.{idx}")
    h = b.node("GlobalAveragePool", [h], name="/GlobalAveragePool")
    h = b.node("Flatten", [h], name="/Flatten", axis=1)
    w = b.init("classifier.1.weight", b.normal((1000, 1280), math.sqrt(1.0 / 1280)))
    bias = b.init("classifier.1.bias", b.normal((1000,), 0.01))
    h = b.node("Gemm", [h, w, bias], name="/classifier/classifier.1/Gemm", alpha=1.0, beta=1.0, transB=1)
    b.output(h, "output", TensorProto.FLOAT, ["batch", 1000])
    return calibrate_batchnorm(
        b.model("MobileNetV2 (torchvision topology), depthwise Conv, Clip(0,6) as ReLU6"), seed=13)


# ---------------------------------------------------------------------------
# minilm (HF BertModel, all-MiniLM-L6-v2 shape)
# ---------------------------------------------------------------------------

MINILM_VOCAB = 30522
MINILM_SEQ = 128


def make_minilm() -> onnx.ModelProto:
    b = Builder("minilm", seed=4)
    vocab, max_pos, hidden, heads, inter, layers = MINILM_VOCAB, 512, 384, 12, 1536, 6
    head_dim = hidden // heads
    seq_dims = {"sequence": MINILM_SEQ}
    ids = b.input("input_ids", TensorProto.INT64, ["batch", "sequence"],
                  {"dist": "int", "low": 0, "high": vocab, "dims": seq_dims})
    mask = b.input("attention_mask", TensorProto.INT64, ["batch", "sequence"], {"dist": "mask", "dims": seq_dims})

    def fused_ln(x, name):
        gamma = b.init(f"{name}.weight", b.uniform((hidden,), 0.8, 1.2))
        beta = b.init(f"{name}.bias", b.normal((hidden,), 0.02))
        return b.node("LayerNormalization", [x, gamma, beta], name=f"{name}/LayerNormalization", axis=-1,
                      epsilon=1e-12)

    def decomposed_ln(x, name):
        # torch.onnx (opset < 17) emits F.layer_norm as this subgraph.
        gamma = b.init(f"{name}.weight", b.uniform((hidden,), 0.8, 1.2))
        beta = b.init(f"{name}.bias", b.normal((hidden,), 0.02))
        mean = b.node("ReduceMean", [x], name=f"{name}/ReduceMean", axes=[-1], keepdims=1)
        d = b.node("Sub", [x, mean], name=f"{name}/Sub")
        sq = b.node("Pow", [d, b.const(2.0)], name=f"{name}/Pow")
        var = b.node("ReduceMean", [sq], name=f"{name}/ReduceMean_1", axes=[-1], keepdims=1)
        var = b.node("Add", [var, b.const(1e-12)], name=f"{name}/Add")
        std = b.node("Sqrt", [var], name=f"{name}/Sqrt")
        y = b.node("Div", [d, std], name=f"{name}/Div")
        y = b.node("Mul", [y, gamma], name=f"{name}/Mul")
        return b.node("Add", [y, beta], name=f"{name}/Add_1")

    def linear(x, c_in, c_out, name):
        # torch exports nn.Linear on a 3-D input as MatMul with W^T stored + Add bias.
        w = b.init(f"{name}.weight_T", b.normal((c_in, c_out), math.sqrt(1.0 / c_in)))
        bias = b.init(f"{name}.bias", b.normal((c_out,), 0.02))
        y = b.node("MatMul", [x, w], name=f"{name}/MatMul")
        return b.node("Add", [bias, y], name=f"{name}/Add")

    # Embeddings.
    word = b.init("embeddings.word_embeddings.weight", b.normal((vocab, hidden), 0.05))
    pos = b.init("embeddings.position_embeddings.weight", b.normal((max_pos, hidden), 0.05))
    ttype = b.init("embeddings.token_type_embeddings.weight", b.normal((2, hidden), 0.05))
    pos_ids_buf = b.init("embeddings.position_ids", np.arange(max_pos, dtype=np.int64)[None, :])
    tt_ids_buf = b.init("embeddings.token_type_ids", np.zeros((1, max_pos), dtype=np.int64))
    shape = b.node("Shape", [ids], name="/embeddings/Shape")
    seq = b.node("Gather", [shape, b.const(1, np.int64)], name="/embeddings/Gather", axis=0)
    seq = b.node("Unsqueeze", [seq, b.const([0], np.int64)], name="/embeddings/Unsqueeze")
    zero1 = b.const([0], np.int64)
    one1 = b.const([1], np.int64)
    pos_ids = b.node("Slice", [pos_ids_buf, zero1, seq, one1, one1], name="/embeddings/Slice")
    tt_ids = b.node("Slice", [tt_ids_buf, zero1, seq, one1, one1], name="/embeddings/Slice_1")
    e = b.node("Gather", [word, ids], name="/embeddings/word_embeddings/Gather")
    t = b.node("Gather", [ttype, tt_ids], name="/embeddings/token_type_embeddings/Gather")
    e = b.node("Add", [e, t], name="/embeddings/Add")
    p = b.node("Gather", [pos, pos_ids], name="/embeddings/position_embeddings/Gather")
    e = b.node("Add", [e, p], name="/embeddings/Add_1")
    h = fused_ln(e, "/embeddings/LayerNorm")

    # Extended attention mask: mask[:, None, None, :], (1 - m) * finfo.min.
    m = b.node("Unsqueeze", [mask, b.const([1], np.int64)], name="/Unsqueeze")
    m = b.node("Unsqueeze", [m, b.const([2], np.int64)], name="/Unsqueeze_1")
    m = b.node("Cast", [m], name="/Cast", to=TensorProto.FLOAT)
    m = b.node("Sub", [b.const(1.0), m], name="/Sub")
    bias_mask = b.node("Mul", [m, b.const(float(np.finfo(np.float32).min))], name="/Mul")

    split_heads = b.const([0, 0, heads, head_dim], np.int64)
    merge_heads = b.const([0, 0, hidden], np.int64)
    scale = b.const(math.sqrt(head_dim))
    for layer in range(layers):
        name = f"/encoder/layer.{layer}"
        # LayerNorm form alternates: fused in even layers, decomposed in odd layers.
        ln = fused_ln if layer % 2 == 0 else decomposed_ln
        q = linear(h, hidden, hidden, f"{name}/attention/self/query")
        k = linear(h, hidden, hidden, f"{name}/attention/self/key")
        v = linear(h, hidden, hidden, f"{name}/attention/self/value")
        q = b.node("Reshape", [q, split_heads], name=f"{name}/attention/self/Reshape")
        q = b.node("Transpose", [q], name=f"{name}/attention/self/Transpose", perm=[0, 2, 1, 3])
        k = b.node("Reshape", [k, split_heads], name=f"{name}/attention/self/Reshape_1")
        k = b.node("Transpose", [k], name=f"{name}/attention/self/Transpose_1", perm=[0, 2, 3, 1])
        v = b.node("Reshape", [v, split_heads], name=f"{name}/attention/self/Reshape_2")
        v = b.node("Transpose", [v], name=f"{name}/attention/self/Transpose_2", perm=[0, 2, 1, 3])
        s = b.node("MatMul", [q, k], name=f"{name}/attention/self/MatMul")
        s = b.node("Div", [s, scale], name=f"{name}/attention/self/Div")
        s = b.node("Add", [s, bias_mask], name=f"{name}/attention/self/Add")
        s = b.node("Softmax", [s], name=f"{name}/attention/self/Softmax", axis=-1)
        c = b.node("MatMul", [s, v], name=f"{name}/attention/self/MatMul_1")
        c = b.node("Transpose", [c], name=f"{name}/attention/self/Transpose_3", perm=[0, 2, 1, 3])
        c = b.node("Reshape", [c, merge_heads], name=f"{name}/attention/self/Reshape_3")
        a = linear(c, hidden, hidden, f"{name}/attention/output/dense")
        a = b.node("Add", [a, h], name=f"{name}/attention/output/Add")
        h = ln(a, f"{name}/attention/output/LayerNorm")
        f = linear(h, hidden, inter, f"{name}/intermediate/dense")
        # GELU (erf form), as torch exports F.gelu: x * 0.5 * (1 + erf(x / sqrt(2))).
        g = b.node("Div", [f, b.const(1.4142135381698608)], name=f"{name}/intermediate/intermediate_act_fn/Div")
        g = b.node("Erf", [g], name=f"{name}/intermediate/intermediate_act_fn/Erf")
        g = b.node("Add", [g, b.const(1.0)], name=f"{name}/intermediate/intermediate_act_fn/Add")
        g = b.node("Mul", [f, g], name=f"{name}/intermediate/intermediate_act_fn/Mul")
        g = b.node("Mul", [g, b.const(0.5)], name=f"{name}/intermediate/intermediate_act_fn/Mul_1")
        o = linear(g, inter, hidden, f"{name}/output/dense")
        o = b.node("Add", [o, h], name=f"{name}/output/Add")
        h = ln(o, f"{name}/output/LayerNorm")
    b.output(h, "last_hidden_state", TensorProto.FLOAT, ["batch", "sequence", hidden])
    return b.model("BERT encoder of all-MiniLM-L6-v2 shape (6 layers, hidden 384, 12 heads, intermediate 1536)")


# ---------------------------------------------------------------------------
# yolov8n (ultralytics)
# ---------------------------------------------------------------------------

def make_yolov8n() -> onnx.ModelProto:
    b = Builder("yolov8n", seed=5)
    size = 640
    x = b.input("images", TensorProto.FLOAT, ["batch", 3, size, size],
                {"dist": "uniform", "low": 0.0, "high": 1.0})

    def conv(x, c_in, c_out, k, s, name):
        y = b.conv(x, c_in, c_out, k, stride=s, name=f"{name}/conv/Conv")
        y = b.batchnorm(y, c_out, name=f"{name}/bn/BatchNormalization", gamma=(0.8, 1.2))
        sig = b.node("Sigmoid", [y], name=f"{name}/act/Sigmoid")
        return b.node("Mul", [y, sig], name=f"{name}/act/Mul")

    def c2f(x, c_in, c_out, n, shortcut, name):
        c = c_out // 2
        y = conv(x, c_in, 2 * c, 1, 1, f"{name}/cv1")
        parts = b.node("Split", [y, b.const([c, c], np.int64)], n_out=2, name=f"{name}/Split", axis=1)
        ys = list(parts)
        for i in range(n):
            z = conv(ys[-1], c, c, 3, 1, f"{name}/m.{i}/cv1")
            z = conv(z, c, c, 3, 1, f"{name}/m.{i}/cv2")
            if shortcut:
                z = b.node("Add", [ys[-1], z], name=f"{name}/m.{i}/Add")
            ys.append(z)
        cat = b.node("Concat", ys, name=f"{name}/Concat", axis=1)
        return conv(cat, (2 + n) * c, c_out, 1, 1, f"{name}/cv2")

    def sppf(x, c_in, c_out, name):
        c = c_in // 2
        y = conv(x, c_in, c, 1, 1, f"{name}/cv1")
        ys = [y]
        for i in range(3):
            ys.append(b.node("MaxPool", [ys[-1]], name=f"{name}/m/MaxPool", ceil_mode=0, dilations=[1, 1],
                             kernel_shape=[5, 5], pads=[2, 2, 2, 2], strides=[1, 1]))
        cat = b.node("Concat", ys, name=f"{name}/Concat", axis=1)
        return conv(cat, 4 * c, c_out, 1, 1, f"{name}/cv2")

    def upsample(x, name):
        return b.node("Resize", [x, "", b.const([1.0, 1.0, 2.0, 2.0])], name=f"{name}/Resize",
                      coordinate_transformation_mode="asymmetric", cubic_coeff_a=-0.75, mode="nearest",
                      nearest_mode="floor")

    # Backbone.
    h0 = conv(x, 3, 16, 3, 2, "/model.0")
    h1 = conv(h0, 16, 32, 3, 2, "/model.1")
    h2 = c2f(h1, 32, 32, 1, True, "/model.2")
    h3 = conv(h2, 32, 64, 3, 2, "/model.3")
    h4 = c2f(h3, 64, 64, 2, True, "/model.4")
    h5 = conv(h4, 64, 128, 3, 2, "/model.5")
    h6 = c2f(h5, 128, 128, 2, True, "/model.6")
    h7 = conv(h6, 128, 256, 3, 2, "/model.7")
    h8 = c2f(h7, 256, 256, 1, True, "/model.8")
    h9 = sppf(h8, 256, 256, "/model.9")
    # Head (PAN).
    h10 = upsample(h9, "/model.10")
    h11 = b.node("Concat", [h10, h6], name="/model.11/Concat", axis=1)
    h12 = c2f(h11, 384, 128, 1, False, "/model.12")
    h13 = upsample(h12, "/model.13")
    h14 = b.node("Concat", [h13, h4], name="/model.14/Concat", axis=1)
    h15 = c2f(h14, 192, 64, 1, False, "/model.15")
    h16 = conv(h15, 64, 64, 3, 2, "/model.16")
    h17 = b.node("Concat", [h16, h12], name="/model.17/Concat", axis=1)
    h18 = c2f(h17, 192, 128, 1, False, "/model.18")
    h19 = conv(h18, 128, 128, 3, 2, "/model.19")
    h20 = b.node("Concat", [h19, h9], name="/model.20/Concat", axis=1)
    h21 = c2f(h20, 384, 256, 1, False, "/model.21")

    # Detect head: nc=80, reg_max=16, c2=64, c3=80.
    nc, reg_max = 80, 16
    no = nc + 4 * reg_max
    c2, c3 = 64, 80
    flat = []
    for i, (feat, ch) in enumerate([(h15, 64), (h18, 128), (h21, 256)]):
        name = "/model.22"
        box = conv(feat, ch, c2, 3, 1, f"{name}/cv2.{i}/cv2.{i}.0")
        box = conv(box, c2, c2, 3, 1, f"{name}/cv2.{i}/cv2.{i}.1")
        box = b.conv(box, c2, 4 * reg_max, 1, bias=True, name=f"{name}/cv2.{i}/cv2.{i}.2/Conv", gain=1.0)
        cls = conv(feat, ch, c3, 3, 1, f"{name}/cv3.{i}/cv3.{i}.0")
        cls = conv(cls, c3, c3, 3, 1, f"{name}/cv3.{i}/cv3.{i}.1")
        cls = b.conv(cls, c3, nc, 1, bias=True, name=f"{name}/cv3.{i}/cv3.{i}.2/Conv", gain=1.0)
        cat = b.node("Concat", [box, cls], name=f"{name}/Concat", axis=1)
        flat.append(b.node("Reshape", [cat, b.const([0, no, -1], np.int64)], name=f"{name}/Reshape"))
    x_cat = b.node("Concat", flat, name="/model.22/Concat_3", axis=2)  # [b, 144, 8400]
    box, cls = b.node("Split", [x_cat, b.const([4 * reg_max, nc], np.int64)], n_out=2, name="/model.22/Split",
                      axis=1)
    # DFL.
    d = b.node("Reshape", [box, b.const([0, 4, reg_max, -1], np.int64)], name="/model.22/dfl/Reshape")
    d = b.node("Transpose", [d], name="/model.22/dfl/Transpose", perm=[0, 2, 1, 3])
    d = b.node("Softmax", [d], name="/model.22/dfl/Softmax", axis=1)
    dfl_w = b.init("model.22.dfl.conv.weight", np.arange(reg_max, dtype=np.float32).reshape(1, reg_max, 1, 1))
    d = b.node("Conv", [d, dfl_w], name="/model.22/dfl/conv/Conv", dilations=[1, 1], group=1, kernel_shape=[1, 1],
               pads=[0, 0, 0, 0], strides=[1, 1])
    d = b.node("Reshape", [d, b.const([0, 4, -1], np.int64)], name="/model.22/dfl/Reshape_1")
    # dist2bbox (xywh) with the anchors and strides folded to constants, as the exporter does.
    anchors, strides = [], []
    for stride in (8, 16, 32):
        n = size // stride
        sy, sx = np.meshgrid(np.arange(n, dtype=np.float32) + 0.5, np.arange(n, dtype=np.float32) + 0.5,
                             indexing="ij")
        anchors.append(np.stack([sx.ravel(), sy.ravel()], 0))
        strides.append(np.full((1, n * n), stride, np.float32))
    anchor_points = b.init("/model.22/Constant_anchors", np.concatenate(anchors, 1)[None])  # [1, 2, 8400]
    stride_t = b.init("/model.22/Constant_strides", np.concatenate(strides, 1))  # [1, 8400]
    lt, rb = b.node("Split", [d, b.const([2, 2], np.int64)], n_out=2, name="/model.22/Split_1", axis=1)
    x1y1 = b.node("Sub", [anchor_points, lt], name="/model.22/Sub")
    x2y2 = b.node("Add", [anchor_points, rb], name="/model.22/Add")
    c_xy = b.node("Add", [x1y1, x2y2], name="/model.22/Add_1")
    c_xy = b.node("Div", [c_xy, b.const(2.0)], name="/model.22/Div")
    wh = b.node("Sub", [x2y2, x1y1], name="/model.22/Sub_1")
    dbox = b.node("Concat", [c_xy, wh], name="/model.22/Concat_4", axis=1)
    dbox = b.node("Mul", [dbox, stride_t], name="/model.22/Mul")
    cls = b.node("Sigmoid", [cls], name="/model.22/Sigmoid")
    y = b.node("Concat", [dbox, cls], name="/model.22/Concat_5", axis=1)
    b.output(y, "output0", TensorProto.FLOAT, ["batch", 84, 8400])
    return calibrate_batchnorm(
        b.model("YOLOv8n-like detector at 640x640 (ultralytics topology, BN kept unfused)"), seed=15)


# ---------------------------------------------------------------------------
# chain1000
# ---------------------------------------------------------------------------

def make_chain1000() -> onnx.ModelProto:
    b = Builder("chain1000", seed=6)
    width = 64
    h = b.input("input", TensorProto.FLOAT, ["batch", width], {"dist": "normal"})
    for i in range(1000):
        kind = i % 4
        if kind == 0:
            h = b.node("Add", [h, b.init(f"add{i}.c", b.uniform((width,), -0.5, 0.5))], name=f"/chain/Add_{i}")
        elif kind == 1:
            h = b.node("Mul", [h, b.init(f"mul{i}.c", b.uniform((width,), 0.5, 1.5))], name=f"/chain/Mul_{i}")
        elif kind == 2:
            h = b.node("Relu", [h], name=f"/chain/Relu_{i}")
        else:
            h = b.node("Sigmoid", [h], name=f"/chain/Sigmoid_{i}")
    b.output(h, "output", TensorProto.FLOAT, ["batch", width])
    return b.model("1,000 tiny elementwise ops (Add, Mul, Relu, Sigmoid in turn) on [batch, 64]")


MODELS = {
    "mlp": make_mlp,
    "resnet50": make_resnet50,
    "mobilenetv2": make_mobilenetv2,
    "minilm": make_minilm,
    "yolov8n": make_yolov8n,
    "chain1000": make_chain1000,
}


def op_counts(model: onnx.ModelProto) -> collections.Counter:
    return collections.Counter(n.op_type for n in model.graph.node)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", nargs="?", default="build/bench/models")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated subset of " + ",".join(MODELS))
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    names = [m for m in args.models.split(",") if m]
    for name in names:
        if name not in MODELS:
            parser.error(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    os.makedirs(args.out_dir, exist_ok=True)
    for name in names:
        model = MODELS[name]()
        path = os.path.join(args.out_dir, f"{name}.onnx")
        save(model, path)
        if not args.quiet:
            counts = op_counts(model)
            params = sum(int(np.prod(t.dims)) for t in model.graph.initializer)
            ops = ", ".join(f"{op} {n}" for op, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
            print(f"{path}: {len(model.graph.node)} nodes, {params / 1e6:.2f} M parameters, "
                  f"{os.path.getsize(path) / 2 ** 20:.1f} MiB; {ops}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
