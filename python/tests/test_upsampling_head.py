"""A DBNet-style upsampling head (PP-OCR's text detector): ConvTranspose,
a per-channel bias Add, BatchNormalization, Relu, a second ConvTranspose and
a Sigmoid, against onnxruntime. The ConvTransposes run channels-last
(kiln.NhwcConvTranspose), the BatchNormalization (after an Add, so not folded
into a Conv) becomes a per-channel Mul and Add fused with its neighbours, and
the fused step reads its per-channel constants tiled along W
(fused_elementwise.cc). Also BatchNormalization on a rank-3 tensor and as a
graph output. Bound: max|kiln - ort| / max|ort| <= 1e-5."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln

F = TensorProto.FLOAT


def constant(name, shape, seed, low=-0.5, high=0.5):
    return numpy_helper.from_array(np.random.default_rng(seed).uniform(low, high, shape).astype(np.float32), name)


def batch_norm_params(prefix, channels, seed):
    return [constant(prefix + "_scale", (channels,), seed), constant(prefix + "_bias", (channels,), seed + 1),
            constant(prefix + "_mean", (channels,), seed + 2), constant(prefix + "_var", (channels,), seed + 3, 0.2, 1.5)]


def run_both(tmp_path, nodes, x_shape, initializers, outputs=("y",)):
    graph = helper.make_graph(nodes, "head", [helper.make_tensor_value_info("x", F, x_shape)],
                              [helper.make_tensor_value_info(name, F, None) for name in outputs], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "m.onnx")
    kiln.compile(tmp_path / "m.onnx", tmp_path / "m.kiln")
    x = np.random.default_rng(6).standard_normal(x_shape).astype(np.float32)
    ours = kiln.Runner(tmp_path / "m.kiln").run({"x": x})
    want = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for name, expected in zip(outputs, want):
        assert ours[name].shape == expected.shape
        error = np.max(np.abs(ours[name] - expected)) / np.max(np.abs(expected))
        assert error <= 1e-5, (name, error)


@pytest.mark.parametrize("channels,size", [(24, 40), (96, 9)])
def test_dbnet_head(tmp_path, channels, size):
    nodes = [helper.make_node("ConvTranspose", ["x", "W1"], ["up1"], strides=[2, 2]),
             helper.make_node("Add", ["up1", "B1"], ["biased"]),
             helper.make_node("BatchNormalization", ["biased", "bn_scale", "bn_bias", "bn_mean", "bn_var"], ["normed"]),
             helper.make_node("Relu", ["normed"], ["relu"]),
             helper.make_node("ConvTranspose", ["relu", "W2", "B2"], ["up2"], strides=[2, 2]),
             helper.make_node("Sigmoid", ["up2"], ["y"])]
    inits = [constant("W1", (channels, channels, 2, 2), 1), constant("B1", (1, channels, 1, 1), 2),
             constant("W2", (channels, 1, 2, 2), 3), constant("B2", (1,), 4)] + batch_norm_params("bn", channels, 10)
    run_both(tmp_path, nodes, [1, channels, size, size], inits)


def test_batch_norm_on_rank_3_and_as_an_output(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("BatchNormalization", ["r", "bn_scale", "bn_bias", "bn_mean", "bn_var"], ["y"],
                              epsilon=1e-3),
             helper.make_node("Mul", ["y", "y"], ["z"])]
    run_both(tmp_path, nodes, [2, 7, 33], batch_norm_params("bn", 7, 20), outputs=("y", "z"))


# A channels-last ConvTranspose adds its own bias after oneDNN's primitive
# (conv.cc, addChannelBias): output channels that fill the bias tile with
# whole rows, leave part of it, or exceed it; two images.
@pytest.mark.parametrize("channels_out,batch", [(24, 2), (600, 1), (3, 1)])
def test_conv_transpose_bias(tmp_path, channels_out, batch):
    nodes = [helper.make_node("ConvTranspose", ["x", "W", "B"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1],
                              output_padding=[1, 1])]
    inits = [constant("W", (8, channels_out, 3, 3), 31), constant("B", (channels_out,), 32, -2, 2)]
    run_both(tmp_path, nodes, [batch, 8, 13, 11], inits)
