"""Elementwise fusion end to end: each pattern that src/passes/
elementwise_fusion.h fuses is compiled by `kiln compile`, which must report
the expected (fewer) steps, run by `kiln run` on random inputs and compared
with onnxruntime on the unfused model; and patterns where fusion must stop
(a graph output or a value read twice in the middle) stay correct."""

import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from test_models import compile_and_compare, save

RNG = np.random.default_rng(11)


def const(name, value):
    return numpy_helper.from_array(np.asarray(value, np.float32), name)


def info(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def steps(compiled):
    match = re.search(r"(\d+) steps?,", compiled.stdout)
    assert match, compiled.stdout
    return int(match.group(1))


def node(op, inputs, output, **attrs):
    return helper.make_node(op, inputs, [output], **attrs)


def erf_gelu(x, y):
    return [node("Div", [x, "sqrt2"], "g_d"), node("Erf", ["g_d"], "g_e"), node("Add", ["g_e", "one"], "g_p"),
            node("Mul", [x, "g_p"], "g_m"), node("Mul", ["g_m", "half"], y)]


def tanh_gelu(x, y):
    # 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), x^3 as x * x * x.
    return [node("Mul", [x, x], "t_sq"), node("Mul", ["t_sq", x], "t_cube"), node("Mul", ["t_cube", "k"], "t_k"),
            node("Add", [x, "t_k"], "t_in"), node("Mul", ["t_in", "s2pi"], "t_u"), node("Tanh", ["t_u"], "t_t"),
            node("Add", ["t_t", "one"], "t_p"), node("Mul", [x, "half"], "t_h"), node("Mul", ["t_h", "t_p"], y)]


def pow_gelu(x, y):
    # The same with x^3 as Pow(x, 3) (transformers' gelu_new, T5's FFN): two instructions.
    return [node("Pow", [x, "three"], "t_cube"), node("Mul", ["k", "t_cube"], "t_k"),
            node("Add", [x, "t_k"], "t_in"), node("Mul", ["t_in", "s2pi"], "t_u"), node("Tanh", ["t_u"], "t_t"),
            node("Add", ["t_t", "one"], "t_p"), node("Mul", [x, "half"], "t_h"), node("Mul", ["t_h", "t_p"], y)]


def activations(x, y):
    # Clip (opset-11 inputs), a scale, then one of each parametrised activation.
    return [node("Clip", [x, "lo", "hi"], "a_c"), node("Mul", ["a_c", "sixth"], "a_s"),
            node("HardSigmoid", ["a_s"], "a_hs", alpha=0.3, beta=0.4), node("Softplus", ["a_hs"], "a_sp"),
            node("Sub", ["a_sp", x], "a_d"), node("LeakyRelu", ["a_d"], "a_l", alpha=0.2),
            node("Elu", ["a_l"], "a_e", alpha=0.7), node("HardSwish", ["a_e"], y)]


def kitchen_sink(x, y):
    # Every other op the pass takes; Log and Sqrt read positive values.
    return [node("Abs", [x], "k_a"), node("Add", ["k_a", "one"], "k_p"), node("Log", ["k_p"], "k_l"),
            node("Sqrt", ["k_p"], "k_s"), node("Pow", ["k_p", "half"], "k_h"), node("Pow", [x, "two"], "k_sq"),
            node("Max", ["k_l", "k_s"], "k_mx"), node("Min", ["k_h", "k_sq"], "k_mn"),
            node("Reciprocal", ["k_p"], "k_r"), node("Neg", ["k_r"], "k_n"), node("Exp", ["k_n"], "k_e"),
            node("Mul", [x, "four"], "k_4"), node("Floor", ["k_4"], "k_f"), node("Ceil", ["k_4"], "k_c"),
            node("Sub", ["k_c", "k_f"], "k_fc"), node("Sigmoid", ["k_fc"], "k_sg"), node("Erf", ["k_e"], "k_er"),
            node("Add", ["k_mx", "k_mn"], "k_1"), node("Mul", ["k_1", "k_sg"], "k_2"), node("Div", ["k_2", "k_p"], "k_3"),
            node("Add", ["k_3", "k_er"], y)]


CONSTANTS = [const("sqrt2", np.sqrt(2)), const("one", 1), const("half", 0.5), const("two", 2), const("four", 4),
             const("three", 3),
             const("k", 0.044715), const("s2pi", np.sqrt(2 / np.pi)), const("lo", -2), const("hi", 6),
             const("sixth", 1 / 6)]

# name -> (nodes from "x" to "y", steps after fusion)
CHAINS = {
    "swish": ([node("Sigmoid", ["x"], "s"), node("Mul", ["x", "s"], "y")], 1),
    "erf_gelu": (erf_gelu("x", "y"), 1),
    "tanh_gelu": (tanh_gelu("x", "y"), 1),
    "pow_gelu": (pow_gelu("x", "y"), 1),
    "activations": (activations("x", "y"), 1),
    "kitchen_sink": (kitchen_sink("x", "y"), 1),
}


@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_chain_is_one_step(kiln, tmp_path, chain):
    nodes, expected_steps = CHAINS[chain]
    shape = [3, 5, 67]
    save(nodes, [info("x", shape)], [info("y", shape)], CONSTANTS, tmp_path / "m.onnx")
    compiled = compile_and_compare(kiln, tmp_path, {"x": (RNG.standard_normal(shape) * 2).astype(np.float32)})
    assert steps(compiled) == expected_steps


def test_long_chain_like_the_benchmark_is_one_step(kiln, tmp_path):
    # (h + w_i) * w_i -> Relu -> Sigmoid, 50 times, with per-column weights.
    nodes, inits, h = [], [], "x"
    for i in range(50):
        inits.append(numpy_helper.from_array(RNG.uniform(0.5, 1.5, 64).astype(np.float32), f"w{i}"))
        nodes += [node("Add", [h, f"w{i}"], f"a{i}"), node("Mul", [f"a{i}", f"w{i}"], f"m{i}"),
                  node("Relu", [f"m{i}"], f"r{i}"), node("Sigmoid", [f"r{i}"], "y" if i == 49 else f"s{i}")]
        h = f"s{i}"
    save(nodes, [info("x", [4, 64])], [info("y", [4, 64])], inits, tmp_path / "m.onnx")
    compiled = compile_and_compare(kiln, tmp_path, {"x": RNG.standard_normal((4, 64)).astype(np.float32)})
    assert steps(compiled) == 1


def test_attention_scale_and_mask_are_one_step(kiln, tmp_path):
    # scores / sqrt(d) + mask, the mask broadcast over heads and query rows.
    nodes = [node("Div", ["scores", "scale"], "d"), node("Add", ["d", "mask"], "y")]
    save(nodes, [info("scores", [2, 4, 8, 8]), info("mask", [2, 1, 1, 8])], [info("y", [2, 4, 8, 8])],
         [const("scale", np.sqrt(32))], tmp_path / "m.onnx")
    mask = np.where(RNG.random((2, 1, 1, 8)) < 0.3, -1e4, 0).astype(np.float32)
    compiled = compile_and_compare(kiln, tmp_path,
                                   {"scores": RNG.standard_normal((2, 4, 8, 8)).astype(np.float32), "mask": mask})
    assert steps(compiled) == 1


def test_per_channel_normalisation_is_one_step(kiln, tmp_path):
    # (x - mean) / std * gamma + beta with [C, 1, 1] parameters on NCHW.
    c = 6
    nodes = [node("Sub", ["x", "mean"], "c"), node("Div", ["c", "std"], "n"), node("Mul", ["n", "gamma"], "g"),
             node("Add", ["g", "beta"], "y")]
    inits = [numpy_helper.from_array(RNG.standard_normal((c, 1, 1)).astype(np.float32), "mean"),
             numpy_helper.from_array(RNG.uniform(0.5, 2, (c, 1, 1)).astype(np.float32), "std"),
             numpy_helper.from_array(RNG.standard_normal((c, 1, 1)).astype(np.float32), "gamma"),
             numpy_helper.from_array(RNG.standard_normal((c, 1, 1)).astype(np.float32), "beta")]
    shape = [2, c, 9, 11]
    save(nodes, [info("x", shape)], [info("y", shape)], inits, tmp_path / "m.onnx")
    compiled = compile_and_compare(kiln, tmp_path, {"x": RNG.standard_normal(shape).astype(np.float32)})
    assert steps(compiled) == 1


def test_rms_norm_is_one_step(kiln, tmp_path):
    # x / sqrt(mean(x * x) + eps) * gamma: the RMS norm fusion
    # (passes/layernorm_fusion.h) takes all of it before the elementwise
    # fusion could take the Add + Sqrt and the Div + Mul around the reduction.
    nodes = [node("Mul", ["x", "x"], "sq"), node("ReduceMean", ["sq"], "ms", axes=[-1]),
             node("Add", ["ms", "eps"], "me"), node("Sqrt", ["me"], "rms"), node("Div", ["x", "rms"], "n"),
             node("Mul", ["n", "gamma"], "y")]
    inits = [const("eps", 1e-5), numpy_helper.from_array(RNG.standard_normal(32).astype(np.float32), "gamma")]
    shape = [2, 16, 32]
    save(nodes, [info("x", shape)], [info("y", shape)], inits, tmp_path / "m.onnx")
    compiled = compile_and_compare(kiln, tmp_path, {"x": RNG.standard_normal(shape).astype(np.float32)})
    assert steps(compiled) == 1


def test_clip_with_attribute_bounds_fuses(kiln, tmp_path):
    # Opset 10: Clip's bounds are attributes.
    nodes = [node("Clip", ["x"], "c", min=-0.5, max=0.75), node("Tanh", ["c"], "y")]
    save(nodes, [info("x", [4, 9])], [info("y", [4, 9])], [], tmp_path / "m.onnx", opset=10)
    compiled = compile_and_compare(kiln, tmp_path, {"x": RNG.standard_normal((4, 9)).astype(np.float32)})
    assert steps(compiled) == 1


def test_graph_outputs_and_shared_values_end_groups(kiln, tmp_path):
    # r is a graph output (its group ends there); e is read by two groups
    # (it stays a step of its own): {Add, Relu}, {Mul, Sigmoid}, Exp,
    # {Neg, Abs}, {Floor, Ceil} = 5 steps for 9 nodes.
    nodes = [node("Add", ["x", "b"], "a"), node("Relu", ["a"], "r"), node("Mul", ["r", "x"], "m"),
             node("Sigmoid", ["m"], "y"), node("Exp", ["x"], "e"), node("Neg", ["e"], "n"), node("Abs", ["n"], "z"),
             node("Floor", ["e"], "f"), node("Ceil", ["f"], "w")]
    shape = [3, 17]
    save(nodes, [info("x", shape)], [info(name, shape) for name in ("y", "r", "z", "w")],
         [numpy_helper.from_array(RNG.standard_normal(17).astype(np.float32), "b")], tmp_path / "m.onnx")
    compiled = compile_and_compare(kiln, tmp_path, {"x": RNG.standard_normal(shape).astype(np.float32)})
    assert steps(compiled) == 5
