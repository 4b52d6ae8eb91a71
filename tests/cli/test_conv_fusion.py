"""Convolutions with the activations and residual Adds that kiln fuses into
them as oneDNN post-ops (src/passes/conv_fusion.h), each compiled and run
beside onnxruntime; and the same with fusion impossible (a fused value read
twice), which must stay correct."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from test_models import compile_and_compare, save, tensor

RNG = np.random.default_rng(7)

# name -> nodes reading "c" (the Conv's output) and writing "y"
TAILS = {
    "relu": [helper.make_node("Relu", ["c"], ["y"])],
    "leaky_relu": [helper.make_node("LeakyRelu", ["c"], ["y"], alpha=0.1)],
    "clip": [helper.make_node("Clip", ["c", "lo", "hi"], ["y"])],
    "sigmoid": [helper.make_node("Sigmoid", ["c"], ["y"])],
    "tanh": [helper.make_node("Tanh", ["c"], ["y"])],
    "hard_swish": [helper.make_node("HardSwish", ["c"], ["y"])],
    "hard_sigmoid": [helper.make_node("HardSigmoid", ["c"], ["y"], alpha=0.3, beta=0.4)],
    "elu": [helper.make_node("Elu", ["c"], ["y"], alpha=0.7)],
    "silu": [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["s", "c"], ["y"])],
    "residual_relu": [helper.make_node("Add", ["c", "x"], ["a"]), helper.make_node("Relu", ["a"], ["y"])],
    "silu_residual": [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["m"]),
                      helper.make_node("Add", ["x", "m"], ["y"])],
    "gelu_erf": [helper.make_node("Div", ["c", "sqrt2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
                 helper.make_node("Add", ["e", "one"], ["p"]), helper.make_node("Mul", ["c", "p"], ["q"]),
                 helper.make_node("Mul", ["q", "half"], ["y"])],
    "clip_then_scale": [helper.make_node("Clip", ["c", "lo", "hi"], ["k"]), helper.make_node("Mul", ["k", "k"], ["y"])],
    # HardSwish written out, as Paddle and older PyTorch exports do.
    "hard_swish_divided": [helper.make_node("Add", ["c", "three"], ["t"]),
                           helper.make_node("Clip", ["t", "zero", "six"], ["k"]),
                           helper.make_node("Mul", ["c", "k"], ["m"]), helper.make_node("Div", ["m", "six"], ["y"])],
    "hard_swish_scaled_gate": [helper.make_node("Add", ["three", "c"], ["t"]),
                               helper.make_node("Clip", ["t", "zero", "six"], ["k"]),
                               helper.make_node("Mul", ["k", "sixth"], ["g"]), helper.make_node("Mul", ["g", "c"], ["y"])],
    # Scalar scales and shifts around an activation (PP-LCNetV3's learnable affine blocks).
    "scale_shift_around_hard_swish": [helper.make_node("Mul", ["sixth", "c"], ["s1"]),
                                      helper.make_node("Add", ["s1", "half"], ["s2"]),
                                      helper.make_node("HardSwish", ["s2"], ["h"]),
                                      helper.make_node("Sub", ["h", "three"], ["s3"]),
                                      helper.make_node("Div", ["s3", "six"], ["y"])],
    # Per-channel constants fold into the weights and bias (tf2onnx's BiasAdd
    # apart from its Conv); a constant along W does not.
    "channel_bias_relu": [helper.make_node("Add", ["c", "cb"], ["a"]), helper.make_node("Relu", ["a"], ["y"])],
    "channel_scale_shift_relu": [helper.make_node("Mul", ["cs", "c"], ["m"]), helper.make_node("Sub", ["m", "cb"], ["a"]),
                                 helper.make_node("Relu", ["a"], ["y"])],
    "row_bias": [helper.make_node("Add", ["c", "rb"], ["y"])],
    # Paddle2ONNX's newer exports put an Identity after every operator
    # (passes/identity_removal.h): they must not stop the folds and fusion.
    "identities_between": [helper.make_node("Identity", ["c"], ["i1"]), helper.make_node("Mul", ["sixth", "i1"], ["m"]),
                           helper.make_node("Identity", ["m"], ["i2"]), helper.make_node("Add", ["i2", "half"], ["a"]),
                           helper.make_node("Identity", ["a"], ["i3"]), helper.make_node("Relu", ["i3"], ["r"]),
                           helper.make_node("Identity", ["r"], ["y"])],
    "hard_swish_hard_sigmoid": [helper.make_node("HardSigmoid", ["c"], ["g"], alpha=1 / 6, beta=0.5),
                                helper.make_node("Mul", ["c", "g"], ["y"])],
}


@pytest.mark.parametrize("tail", sorted(TAILS))
@pytest.mark.parametrize("bias", [True, False])
def test_fused_conv_matches_onnxruntime(kiln, tmp_path, tail, bias):
    channels = 16
    conv_inputs = ["x", "w", "b"] if bias else ["x", "w"]
    nodes = [helper.make_node("Conv", conv_inputs, ["c"], pads=[1, 1, 1, 1])] + TAILS[tail]
    inits = [tensor("w", channels, channels, 3, 3), tensor("b", channels),
             numpy_helper.from_array(np.array(-0.5, np.float32), "lo"),
             numpy_helper.from_array(np.array(0.8, np.float32), "hi"),
             numpy_helper.from_array(np.array(np.sqrt(2), np.float32), "sqrt2"),
             numpy_helper.from_array(np.array(1, np.float32), "one"),
             numpy_helper.from_array(np.array(0.5, np.float32), "half"),
             numpy_helper.from_array(np.array(3, np.float32), "three"),
             numpy_helper.from_array(np.array(0, np.float32), "zero"),
             numpy_helper.from_array(np.array(6, np.float32), "six"),
             numpy_helper.from_array(np.array(1 / 6, np.float32), "sixth"),
             numpy_helper.from_array(RNG.standard_normal((1, channels, 1, 1)).astype(np.float32), "cb"),
             numpy_helper.from_array(RNG.standard_normal((channels, 1, 1)).astype(np.float32), "cs"),
             numpy_helper.from_array(RNG.standard_normal(12).astype(np.float32), "rb")]
    shape = [1, channels, 10, 12]
    save(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
         [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits, tmp_path / "m.onnx")
    compile_and_compare(kiln, tmp_path, {"x": RNG.standard_normal(shape).astype(np.float32)})
    # Everything after the Conv is fused: x to NHWC, the Conv, y back to NCHW.
    # Not fused, one more step: clip_then_scale's Mul (no activation), Elu and
    # HardSigmoid (no oneDNN post-op in kiln's list), row_bias's Add along W.
    result = kiln("compile", tmp_path / "m.onnx", "-o", tmp_path / "steps.kiln")
    assert result.returncode == 0, result.stderr
    unfused = tail in ("clip_then_scale", "elu", "hard_sigmoid", "row_bias")
    # A 3x3 conv of 16 channels stays in NHWC (too narrow for Winograd's
    # blocked layout, passes/blocked_conv.h).
    assert f"{3 + unfused} steps" in result.stdout


def test_activation_read_twice_is_not_fused(kiln, tmp_path):
    # "r" is a graph output and feeds the Add: the Relu must stay its own step.
    shape = [1, 8, 6, 6]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Add", ["r", "x"], ["y"])]
    save(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
         [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape),
          helper.make_tensor_value_info("r", TensorProto.FLOAT, shape)],
         [tensor("w", 8, 8, 3, 3)], tmp_path / "m.onnx")
    compile_and_compare(kiln, tmp_path, {"x": RNG.standard_normal(shape).astype(np.float32)})


@pytest.mark.parametrize("channels,width,size,steps", [(64, 64, 14, 7), (128, 64, 9, 7), (32, 32, 28, 5)])
def test_winograd_convs_match_onnxruntime(kiln, tmp_path, channels, width, size, steps):
    # Two 3x3 stride-1 convolutions with Relu, then a 1x1 convolution. From
    # 64 channels in and out both run blocked (src/passes/blocked_conv.h),
    # the second reading the first's blocked output directly: x to NHWC, to
    # blocked; two blocked convs; back to NHWC; the 1x1 conv; y to NCHW, 7
    # steps. Narrower ones stay in NHWC (oneDNN's direct kernel is faster
    # there): x to NHWC, three convs, y to NCHW, 5 steps.
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Conv", ["r2", "w3"], ["y"])]
    inits = [tensor("w1", width, channels, 3, 3), tensor("b1", width), tensor("w2", width, width, 3, 3),
             tensor("b2", width), tensor("w3", 16, width, 1, 1)]
    shape = [1, channels, size, size]
    save(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
         [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, size, size])], inits, tmp_path / "m.onnx")
    # Winograd's transforms round differently from a direct sum: an output
    # near zero after cancelling terms of size ~10 is off by ~2e-5.
    compile_and_compare(kiln, tmp_path, {"x": RNG.standard_normal(shape).astype(np.float32)}, atol=1e-4)
    result = kiln("compile", tmp_path / "m.onnx", "-o", tmp_path / "steps.kiln")
    assert f"{steps} steps" in result.stdout, result.stdout
