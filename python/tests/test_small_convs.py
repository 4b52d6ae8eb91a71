"""Convolutions with few output positions (kernels/cpu/small_conv.h): the
1-D front end of a voice-activity model and the 1x1 maps of squeeze-excite
blocks, with padding, strides, dilations, a batch, fused activations and a
residual Add, against onnxruntime; and one size past the bound, which takes
oneDNN's path. Bound: max|kiln - ort| / max|ort| <= 1e-5."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln

F = TensorProto.FLOAT


def run_both(tmp_path, nodes, x_shape, initializers):
    graph = helper.make_graph(nodes, "convs", [helper.make_tensor_value_info("x", F, x_shape)],
                              [helper.make_tensor_value_info("y", F, None)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "m.onnx")
    kiln.compile(tmp_path / "m.onnx", tmp_path / "m.kiln")
    x = np.random.default_rng(5).standard_normal(x_shape).astype(np.float32)
    ours = kiln.Runner(tmp_path / "m.kiln").run({"x": x})["y"]
    want = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert ours.shape == want.shape
    error = np.max(np.abs(ours - want)) / np.max(np.abs(want))
    assert error <= 1e-5, error


def weights(name, shape, seed):
    return numpy_helper.from_array(np.random.default_rng(seed).uniform(-0.3, 0.3, shape).astype(np.float32), name)


@pytest.mark.parametrize("in_width,kernel,stride,pad,dilation", [
    (576, 256, 128, 0, 1),  # silero's STFT as a strided Conv: 3 positions
    (3, 3, 1, 1, 1),        # an encoder layer on 3 frames
    (5, 3, 2, 2, 2),        # padding, stride and dilation together
    (10, 3, 1, 0, 1),       # 8 positions: the last size the small path takes
    (11, 3, 1, 0, 1),       # 9 positions: oneDNN's path
])
def test_one_dimensional_convs(tmp_path, in_width, kernel, stride, pad, dilation):
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], strides=[stride], pads=[pad, pad],
                              dilations=[dilation]),
             helper.make_node("Relu", ["c"], ["y"])]
    run_both(tmp_path, nodes, [1, 24, in_width], [weights("W", (40, 24, kernel), 1), weights("B", (40,), 2)])


@pytest.mark.parametrize("batch", [1, 2])
def test_squeeze_excite_block(tmp_path, batch):
    """GlobalAveragePool -> 1x1 Conv -> Relu -> 1x1 Conv -> HardSigmoid -> Mul,
    as MobileNetV3 and PP-LCNet have, then a 3x3 Conv with a residual Add on a
    2x2 map (4 positions per image)."""
    nodes = [
        helper.make_node("GlobalAveragePool", ["x"], ["pooled"]),
        helper.make_node("Conv", ["pooled", "W1", "B1"], ["squeezed"]),
        helper.make_node("Relu", ["squeezed"], ["squeezed_relu"]),
        helper.make_node("Conv", ["squeezed_relu", "W2", "B2"], ["excited"]),
        helper.make_node("HardSigmoid", ["excited"], ["gate"], alpha=0.2, beta=0.5),
        helper.make_node("Mul", ["x", "gate"], ["scaled"]),
        helper.make_node("Conv", ["scaled", "W3"], ["mixed"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["mixed", "scaled"], ["sum"]),
        helper.make_node("Relu", ["sum"], ["y"]),
    ]
    initializers = [weights("W1", (8, 48, 1, 1), 3), weights("B1", (8,), 4), weights("W2", (48, 8, 1, 1), 5),
                    weights("B2", (48,), 6), weights("W3", (48, 48, 3, 3), 7)]
    run_both(tmp_path, nodes, [batch, 48, 2, 2], initializers)


@pytest.mark.parametrize("batch,height,kernel,stride,pad,dilation", [
    (1, 64, 5, 1, 0, 1),   # Magika's Conv1D as TensorFlow exports it: [N, C, H, 1], kernel [5, 1]
    (2, 50, 3, 2, 1, 2),   # stride, padding and dilation along H
    (1, 33, 4, 1, 3, 1),   # padding wider than the kernel's reach on one side
])
def test_height_only_convs(tmp_path, batch, height, kernel, stride, pad, dilation):
    """Convs over [H, 1] with [k, 1] kernels, which kiln hands to oneDNN as
    convs over [1, H] (conv.cc, preferWidth); two in a row, so that the
    channels-last form runs too."""
    nodes = [helper.make_node("Conv", ["x", "W1", "B1"], ["c1"], strides=[stride, 1], pads=[pad, 0, pad, 0],
                              dilations=[dilation, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "W2"], ["y"], pads=[1, 0, 1, 0], kernel_shape=[3, 1])]
    run_both(tmp_path, nodes, [batch, 48, height, 1],
             [weights("W1", (64, 48, kernel, 1), 3), weights("B1", (64,), 4), weights("W2", (32, 64, 3, 1), 5)])


def test_squeeze_excite_with_reshaped_biases_stays_channels_last(tmp_path):
    """Paddle's exporter adds each SE Conv's bias through Reshape(bias, [1, C,
    1, 1]): constant folding turns those Reshapes of constants into
    constants (passes/constant_folding.cc, foldView), so the channels-last
    pass can store them permuted, and the block runs without a Transpose
    in the middle (two in all: the input in, the output out)."""
    shape_c = numpy_helper.from_array(np.array([1, 4, 1, 1], np.int64), "shape_c")
    shape_e = numpy_helper.from_array(np.array([1, 16, 1, 1], np.int64), "shape_e")
    nodes = [helper.make_node("Conv", ["x", "W0"], ["features"]),  # 1x1: no Winograd layout
             helper.make_node("GlobalAveragePool", ["features"], ["pooled"]),
             helper.make_node("Conv", ["pooled", "W1"], ["squeezed"]),
             helper.make_node("Reshape", ["B1", "shape_c"], ["b1"]),
             helper.make_node("Add", ["squeezed", "b1"], ["squeezed_b"]),
             helper.make_node("Relu", ["squeezed_b"], ["squeezed_relu"]),
             helper.make_node("Conv", ["squeezed_relu", "W2"], ["excited"]),
             helper.make_node("Reshape", ["B2", "shape_e"], ["b2"]),
             helper.make_node("Add", ["excited", "b2"], ["excited_b"]),
             helper.make_node("HardSigmoid", ["excited_b"], ["gate"], alpha=0.2, beta=0.5),
             helper.make_node("Mul", ["features", "gate"], ["scaled"]),
             helper.make_node("Conv", ["scaled", "W3"], ["y"])]
    inits = [weights("W0", (16, 16, 1, 1), 10), weights("W1", (4, 16, 1, 1), 11), weights("B1", (4,), 12),
             weights("W2", (16, 4, 1, 1), 13), weights("B2", (16,), 14), weights("W3", (8, 16, 1, 1), 15),
             shape_c, shape_e]
    run_both(tmp_path, nodes, [1, 16, 12, 12], inits)
    runner = kiln.Runner(tmp_path / "m.kiln", profile=True)
    runner.run({"x": np.zeros((1, 16, 12, 12), np.float32)})
    events = runner.trace()["traceEvents"]
    transposes = [e for e in events if e.get("cat") == "step" and e["args"].get("op") == "Transpose"]
    assert len(transposes) == 2, [e["args"].get("output") for e in transposes]
