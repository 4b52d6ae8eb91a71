"""ConvInteger with constant weights (kernels/cpu/integer_conv_gemm.h): exact
i32 results for u8 and i8 activations and weights, zero points of one value
or one per output channel, depths past the 256-deep blocks that keep the f32
route exact, more output positions than one GEMM chunk, strides, padding,
dilations, groups, 1-D and 3-D convolutions, a batch of images, and the
activation's zero point computed per call by DynamicQuantizeLinear (as
dynamically quantized CNNs do). The reference is onnxruntime: its ConvInteger
where it has the case (one zero point for the weights); and always an int64 convolution in numpy."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln

TYPES = {np.uint8: TensorProto.UINT8, np.int8: TensorProto.INT8}


def limits(dtype):
    info = np.iinfo(dtype)
    return int(info.min), int(info.max) + 1


def compile_and_run(tmp_path, nodes, inputs, inits, feeds, y_type, run_reference=True):
    graph = helper.make_graph(nodes, "conv_integer", inputs, [helper.make_tensor_value_info("y", y_type, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "m.onnx")
    kiln.compile(tmp_path / "m.onnx", tmp_path / "m.kiln")
    ours = kiln.Runner(tmp_path / "m.kiln").run(feeds)["y"]
    if not run_reference:  # onnxruntime's ConvInteger takes one weight zero point only
        return ours, None
    want = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    return ours, want


@pytest.mark.parametrize("x_type,w_type,w_zero_kind,x_shape,w_shape,attrs", [
    # depth 40 * 9 = 360 (two blocks), 40 x 40 = 1600 positions (two chunks)
    (np.uint8, np.uint8, "one", (1, 40, 40, 40), (24, 40, 3, 3), dict(pads=[1, 1, 1, 1])),
    (np.uint8, np.int8, "channel", (2, 16, 21, 17), (8, 16, 3, 3), dict(strides=[2, 1], pads=[1, 0, 2, 1])),
    (np.int8, np.int8, "none", (1, 12, 15, 15), (6, 12, 3, 3), dict(dilations=[2, 2], pads=[2, 2, 2, 2])),
    (np.uint8, np.uint8, "one", (1, 8, 19, 19), (12, 4, 3, 3), dict(group=2, strides=[2, 2])),
    (np.uint8, np.uint8, "channel", (1, 6, 9, 9), (6, 1, 3, 3), dict(group=6, pads=[1, 1, 1, 1])),  # depthwise
    (np.uint8, np.uint8, "one", (1, 300, 50), (5, 300, 1), {}),  # 1-D, pointwise, depth 300
    (np.uint8, np.uint8, "one", (1, 3, 5, 6, 7), (4, 3, 2, 3, 3), dict(pads=[1, 0, 1, 0, 1, 1])),  # 3-D
    # rows of 37 and 50 positions: whole 16-wide blocks, remainders, and
    # padding wider than the kernel's reach at both ends of a row
    (np.uint8, np.uint8, "one", (1, 4, 7, 37), (5, 4, 3, 3), dict(strides=[1, 3], pads=[1, 4, 0, 5])),
    (np.int8, np.int8, "one", (1, 4, 5, 50), (3, 4, 1, 5), dict(pads=[0, 6, 0, 6], dilations=[1, 3])),
])
def test_constant_weights_are_exact(tmp_path, x_type, w_type, w_zero_kind, x_shape, w_shape, attrs):
    rng = np.random.default_rng(11)
    x = rng.integers(*limits(x_type), x_shape).astype(x_type)
    w = rng.integers(*limits(w_type), w_shape).astype(w_type)
    inits = [numpy_helper.from_array(w, "W"),
             numpy_helper.from_array(np.array(rng.integers(*limits(x_type)), x_type), "x_zero")]
    inputs = ["x", "W", "x_zero"]
    if w_zero_kind != "none":
        shape = () if w_zero_kind == "one" else (w_shape[0],)
        inits.append(numpy_helper.from_array(np.array(rng.integers(*limits(w_type), shape), w_type), "w_zero"))
        inputs.append("w_zero")
    node = helper.make_node("ConvInteger", inputs, ["y"], **attrs)
    ours, want = compile_and_run(tmp_path, [node], [helper.make_tensor_value_info("x", TYPES[x_type], list(x_shape))],
                                 inits, {"x": x}, TensorProto.INT32, run_reference=w_zero_kind != "channel")
    assert ours.dtype == np.int32
    w_zero = numpy_helper.to_array(inits[2]) if w_zero_kind != "none" else np.zeros(())
    x_zero = numpy_helper.to_array(inits[1])
    exact = exact_conv(x.astype(np.int64) - int(x_zero),
                       w.astype(np.int64) - w_zero.astype(np.int64).reshape(-1, *([1] * (w.ndim - 1))), attrs)
    np.testing.assert_array_equal(ours, exact)
    if want is not None:
        np.testing.assert_array_equal(ours, want)


def exact_conv(x, w, attrs):
    """ONNX Conv in int64 with numpy: sliding windows, one einsum per group."""
    spatial = x.ndim - 2
    strides = attrs.get("strides", [1] * spatial)
    dilations = attrs.get("dilations", [1] * spatial)
    pads = attrs.get("pads", [0] * 2 * spatial)
    group = attrs.get("group", 1)
    x = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[i + spatial]) for i in range(spatial)])
    kernel = w.shape[2:]
    spans = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    windows = np.lib.stride_tricks.sliding_window_view(x, spans, axis=tuple(range(2, x.ndim)))
    windows = windows[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in strides)
                      + tuple(slice(None, None, d) for d in dilations)]
    c_in, m_out = x.shape[1] // group, w.shape[0] // group
    kernel_axes = "xyz"[:spatial]
    out_axes = kernel_axes.upper()
    parts = [np.einsum(f"nc{out_axes}{kernel_axes},mc{kernel_axes}->nm{out_axes}",
                       windows[:, g * c_in:(g + 1) * c_in], w[g * m_out:(g + 1) * m_out]) for g in range(group)]
    return np.concatenate(parts, axis=1)


def test_dynamically_quantized_conv_layer(tmp_path):
    rng = np.random.default_rng(12)
    w = rng.integers(0, 256, (32, 16, 3, 3)).astype(np.uint8)
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             helper.make_node("ConvInteger", ["xq", "W", "xz", "wz"], ["acc"], pads=[1, 1, 1, 1]),
             helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["accf", "xs"], ["y"])]
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.array(131, np.uint8), "wz")]
    x = rng.standard_normal((1, 16, 32, 48)).astype(np.float32)
    ours, want = compile_and_run(tmp_path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                                 inits, {"x": x}, TensorProto.FLOAT)
    np.testing.assert_array_equal(ours, want)  # the same quantization, exact sums
