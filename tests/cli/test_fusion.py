"""MatMul/Gemm fusion end to end: each pattern that passes/matmul_fusion.cc
fuses is compiled by `kiln compile` into one step, run by `kiln run` on random
inputs and checked against onnxruntime on the unfused ONNX model, within the
benchmark's bound: max|kiln - ort| / max|ort| <= 1e-4."""

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

REL_TOLERANCE = 1e-4
IN, OUT = 48, 40
SHAPE = [2, 7, IN]  # a 3-D input, as transformers have


class Model:
    """A graph under construction: x [2, 7, 48] -> MatMul -> Add bias -> what the test adds."""

    def __init__(self, opset=17):
        rng = np.random.default_rng(7)
        self.opset = opset
        self.initializers = [
            numpy_helper.from_array((rng.standard_normal((IN, OUT)) / np.sqrt(IN)).astype(np.float32), "W"),
            numpy_helper.from_array(rng.standard_normal(OUT).astype(np.float32), "bias"),
        ]
        self.inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)]
        self.nodes = [helper.make_node("MatMul", ["x", "W"], ["mm"]), helper.make_node("Add", ["bias", "mm"], ["h"])]
        self.count = 0

    def const(self, value):
        name = f"c{self.count}"
        self.count += 1
        self.initializers.append(numpy_helper.from_array(np.array(value, np.float32), name))
        return name

    def node(self, op, inputs, **attrs):
        out = f"n{len(self.nodes)}"
        self.nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def build(self, output, shape=None):
        self.nodes[-1].output[0] = "y"  # exporters name the last node's output after the graph output
        for node in self.nodes:
            for i, name in enumerate(node.input):
                if name == output:
                    node.input[i] = "y"
        graph = helper.make_graph(self.nodes, "fusion", self.inputs,
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape or SHAPE[:-1] + [OUT])],
                                  self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
        model.ir_version = 8
        onnx.checker.check_model(model)
        return model


def erf_gelu(m, x, form):
    """x * 0.5 * (1 + erf(x / sqrt 2)) in the groupings exporters write."""
    scaled = m.node("Div", [x, m.const(1.4142135)]) if form != 1 else m.node("Mul", [m.const(0.70710678), x])
    one_plus_erf = m.node("Add", [m.node("Erf", [scaled]), m.const(1.0)])
    if form in (0, 1):
        return m.node("Mul", [m.node("Mul", [x, one_plus_erf]), m.const(0.5)])
    if form == 2:
        return m.node("Mul", [m.node("Mul", [x, m.const(0.5)]), one_plus_erf])
    return m.node("Mul", [x, m.node("Mul", [one_plus_erf, m.const(0.5)])])


def activations():
    """(id, opset, function adding the activation to value h of model m)."""
    return [
        ("bias-only", 17, lambda m, h: h),
        ("relu", 17, lambda m, h: m.node("Relu", [h])),
        ("leaky-relu", 17, lambda m, h: m.node("LeakyRelu", [h], alpha=0.2)),
        ("sigmoid", 17, lambda m, h: m.node("Sigmoid", [h])),
        ("tanh", 17, lambda m, h: m.node("Tanh", [h])),
        ("clip", 17, lambda m, h: m.node("Clip", [h, m.const(0.0), m.const(6.0)])),
        ("clip-max-only", 17, lambda m, h: m.node("Clip", [h, "", m.const(0.5)])),
        ("hard-swish", 17, lambda m, h: m.node("HardSwish", [h])),
        ("swish", 17, lambda m, h: m.node("Mul", [m.node("Sigmoid", [h]), h])),
        ("gelu-op", 20, lambda m, h: m.node("Gelu", [h])),
        ("gelu-op-tanh", 20, lambda m, h: m.node("Gelu", [h], approximate="tanh")),
    ] + [(f"erf-gelu-{form}", 17, lambda m, h, form=form: erf_gelu(m, h, form)) for form in range(4)]


def compile_and_compare(kiln, tmp_path, model, inputs, steps):
    onnx.save(model, tmp_path / "m.onnx")
    result = kiln("compile", tmp_path / "m.onnx", "-o", tmp_path / "m.kiln")
    assert result.returncode == 0, result.stderr
    assert re.search(rf"compiled .*: {steps} steps?,", result.stdout), result.stdout
    args = []
    for name, value in inputs.items():
        np.save(tmp_path / f"{name}.npy", value)
        args += ["--input", f"{name}={tmp_path / f'{name}.npy'}"]
    result = kiln("run", tmp_path / "m.kiln", *args, "--output-dir", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    ours = np.load(tmp_path / "out" / "y.npy")
    (theirs,) = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"]).run(None, inputs)
    assert ours.shape == theirs.shape
    assert np.abs(ours - theirs).max() <= REL_TOLERANCE * np.abs(theirs).max()


def random_input(shape, seed=1):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("name,opset,activation", activations(), ids=[a[0] for a in activations()])
def test_matmul_bias_activation_is_one_step(kiln, tmp_path, name, opset, activation):
    m = Model(opset)
    output = activation(m, "h")
    compile_and_compare(kiln, tmp_path, m.build(output), {"x": random_input(SHAPE)}, steps=1)


def test_residual_then_activation(kiln, tmp_path):
    m = Model()
    m.inputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, SHAPE[:-1] + [OUT]))
    output = m.node("Relu", [m.node("Add", ["r", "h"])])
    compile_and_compare(kiln, tmp_path, m.build(output),
                        {"x": random_input(SHAPE), "r": random_input(SHAPE[:-1] + [OUT], 2)}, steps=1)


def test_transformer_block_fuses_each_linear_layer(kiln, tmp_path):
    # h = x W1 + b; f = gelu(h W2 + b2); y = f W3 + b3 + h: three fused steps.
    m = Model()
    rng = np.random.default_rng(3)
    for name, shape in [("W2", (OUT, 64)), ("b2", (64,)), ("W3", (64, OUT)), ("b3", (OUT,))]:
        m.initializers.append(numpy_helper.from_array((rng.standard_normal(shape) / 8).astype(np.float32), name))
    f = erf_gelu(m, m.node("Add", [m.node("MatMul", ["h", "W2"]), "b2"]), 0)
    output = m.node("Add", ["h", m.node("Add", [m.node("MatMul", [f, "W3"]), "b3"])])
    compile_and_compare(kiln, tmp_path, m.build(output), {"x": random_input(SHAPE)}, steps=3)


@pytest.mark.parametrize("c_shape,alpha,beta,activation", [
    ((OUT,), 1.0, 1.0, "Relu"),
    ((5, OUT), 2.0, 0.5, "Sigmoid"),
    (None, 1.0, 1.0, "Tanh"),
])
def test_gemm_activation_is_one_step(kiln, tmp_path, c_shape, alpha, beta, activation):
    rng = np.random.default_rng(4)
    initializers = [numpy_helper.from_array(rng.standard_normal((OUT, IN)).astype(np.float32), "W")]
    inputs = ["x", "W"]
    if c_shape:
        initializers.append(numpy_helper.from_array(rng.standard_normal(c_shape).astype(np.float32), "C"))
        inputs.append("C")
    nodes = [helper.make_node("Gemm", inputs, ["g"], transB=1, alpha=alpha, beta=beta),
             helper.make_node(activation, ["g"], ["y"])]
    graph = helper.make_graph(nodes, "gemm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, IN])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, OUT])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    compile_and_compare(kiln, tmp_path, model, {"x": random_input([5, IN])}, steps=1)
