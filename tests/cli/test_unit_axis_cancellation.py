"""Squeeze ... Unsqueeze pairs around elementwise work cancel
(passes/unit_axis_cancellation.h): tf2onnx's Keras Conv1D, a 2-D Conv over
[N, C, 1, W] with the bias Add and activation on the squeezed [N, C, W],
compiles to Convs that meet in channels-last, without a Transpose between
them. Each model is checked against onnxruntime; the step counts show what
cancelled and what did not."""

import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from test_models import compile_and_compare, save

RNG = np.random.default_rng(41)
F = TensorProto.FLOAT


def steps(compiled):
    return int(re.search(r"(\d+) steps?,", compiled.stdout).group(1))


def const(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def keras_conv1d_model(tmp_path, opset=17, axis=2, bias_shape=(1, 8, 1), extra_reader=False):
    """x [1, 6, 1, 20] -> Conv -> Squeeze(axis) -> Add(bias) -> Relu -> Unsqueeze(axis) -> Conv -> y."""
    axes_in = opset >= 13
    squeeze_axes = {"axes": [axis]} if not axes_in else {}
    squeeze_inputs = ["axes"] if axes_in else []
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], kernel_shape=[1, 3], pads=[0, 1, 0, 1]),
        helper.make_node("Squeeze", ["c1"] + squeeze_inputs, ["s1"], **squeeze_axes),
        helper.make_node("Add", ["s1", "bias"], ["a1"]),
        helper.make_node("Relu", ["a1"], ["r1"]),
        helper.make_node("Unsqueeze", ["r1"] + squeeze_inputs, ["u1"], **squeeze_axes),
        helper.make_node("Conv", ["u1", "w2", "b2"], ["y"], kernel_shape=[1, 3], pads=[0, 1, 0, 1]),
    ]
    outputs = [helper.make_tensor_value_info("y", F, [1, 4, 1, 20])]
    if extra_reader:  # the squeezed value is read elsewhere too: the Squeeze stays for it
        nodes.append(helper.make_node("Sigmoid", ["s1"], ["side"]))
        outputs.append(helper.make_tensor_value_info("side", F, [1, 8, 20]))
    inits = [const("w1", RNG.standard_normal((8, 6, 1, 3)).astype(np.float32) * 0.3),
             const("bias", RNG.standard_normal(bias_shape).astype(np.float32)),
             const("w2", RNG.standard_normal((4, 8, 1, 3)).astype(np.float32) * 0.3),
             const("b2", RNG.standard_normal(4).astype(np.float32))]
    if axes_in:
        inits.append(const("axes", np.array([axis], np.int64)))
    save(nodes, [helper.make_tensor_value_info("x", F, [1, 6, 1, 20])], outputs, inits, tmp_path / "m.onnx",
         opset=opset)


@pytest.mark.parametrize("opset,axis,bias_shape", [
    (17, 2, (1, 8, 1)),   # tf2onnx's own
    (17, -2, (8, 1)),     # a negative axis, a bias of lower rank
    (11, 2, (1, 8, 1)),   # axes as an attribute
    (17, 2, (20,)),       # a bias over W: it stays behind the unit axis
])
def test_conv1d_chain_runs_without_layout_changes(kiln, tmp_path, opset, axis, bias_shape):
    keras_conv1d_model(tmp_path, opset, axis, bias_shape)
    compiled = compile_and_compare(kiln, tmp_path, {"x": RNG.standard_normal((1, 6, 1, 20)).astype(np.float32)})
    # Transpose in, Conv, the Add (+ Relu), Conv, Transpose out; uncancelled,
    # each Conv has its own pair of Transposes and the squeezed values their
    # own steps.
    assert steps(compiled) <= 5, compiled.stdout


def test_a_squeezed_value_with_another_reader_keeps_its_squeeze(kiln, tmp_path):
    keras_conv1d_model(tmp_path, extra_reader=True)
    compile_and_compare(kiln, tmp_path, {"x": RNG.standard_normal((1, 6, 1, 20)).astype(np.float32)})


def test_pairs_that_do_not_match_are_left_alone(kiln, tmp_path):
    """Unsqueeze of another axis than the Squeeze's, and an Unsqueeze output
    that is the graph's output right after the Squeeze."""
    nodes = [helper.make_node("Squeeze", ["x", "a1"], ["s"]),
             helper.make_node("Relu", ["s"], ["r"]),
             helper.make_node("Unsqueeze", ["r", "a0"], ["y"]),
             helper.make_node("Squeeze", ["x", "a1"], ["s2"]),
             helper.make_node("Unsqueeze", ["s2", "a1"], ["z"])]
    save(nodes, [helper.make_tensor_value_info("x", F, [3, 1, 5])],
         [helper.make_tensor_value_info("y", F, [1, 3, 5]), helper.make_tensor_value_info("z", F, [3, 1, 5])],
         [const("a0", np.array([0], np.int64)), const("a1", np.array([1], np.int64))], tmp_path / "m.onnx")
    compile_and_compare(kiln, tmp_path, {"x": RNG.standard_normal((3, 1, 5)).astype(np.float32)})
