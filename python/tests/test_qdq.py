"""Quantized CNNs in integers: QLinearConv on oneDNN's int8 convolution
(kiln.NhwcQLinearConv), the QDQ fusion (passes/qdq_fusion.h) and its
kiln.QLinearAdd, and MaxPool and QuantizeLinear on 8-bit data.

The reference is onnxruntime on the same model. Both compute the i32 sums
exactly and requantize in f32; a product may round to the other neighbour,
so results may differ by one quantization step, rarely."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln

TYPES = {np.uint8: TensorProto.UINT8, np.int8: TensorProto.INT8}


def save(tmp_path, nodes, inputs, outputs, inits, opset=17):
    graph = helper.make_graph(nodes, "q", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "m.onnx")
    return tmp_path / "m.onnx"


def onnxruntime_outputs(path, feeds):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def compiled_ops(path, out):
    """Compiles; returns the package's steps per kernel."""
    return kiln.compile(path, out)["step_kernels"]


def assert_within_one_step(ours, want):
    assert ours.dtype == want.dtype and ours.shape == want.shape
    difference = np.abs(ours.astype(np.int32) - want.astype(np.int32))
    assert difference.max() <= 1, difference.max()
    assert (difference == 0).mean() >= 0.99, (difference == 0).mean()


@pytest.mark.parametrize("x_type,per_channel,bias,x_shape,w_shape,attrs", [
    (np.uint8, True, True, (1, 16, 20, 20), (32, 16, 3, 3), dict(pads=[1, 1, 1, 1])),
    (np.int8, True, True, (2, 24, 17, 15), (16, 24, 3, 3), dict(strides=[2, 2], pads=[1, 0, 1, 2])),
    (np.uint8, False, False, (1, 3, 30, 30), (8, 3, 7, 7), dict(strides=[2, 2], pads=[3, 3, 3, 3])),  # a stem
    (np.uint8, True, True, (1, 32, 14, 14), (32, 1, 3, 3), dict(group=32, pads=[1, 1, 1, 1])),  # depthwise
    (np.int8, True, False, (1, 32, 9, 9), (32, 1, 3, 3), dict(group=32, strides=[2, 2], pads=[1, 1, 1, 1])),
    (np.uint8, True, True, (1, 64, 7, 7), (48, 64, 1, 1), {}),  # pointwise
    (np.uint8, False, True, (1, 16, 11, 11), (24, 8, 3, 3), dict(group=2, dilations=[2, 2], pads=[2, 2, 2, 2])),
])
def test_qlinear_conv_matches_onnxruntime(tmp_path, x_type, per_channel, bias, x_shape, w_shape, attrs):
    check_qlinear_conv(tmp_path, x_type, per_channel, bias, x_shape, w_shape, attrs)


# Zero points of 0 (activations after a ReLU) leave oneDNN's zero-point
# arguments out, which puts 3x3 convolutions on its brgemm kernels instead
# of jit_int8: the results must still be onnxruntime's, bit for bit.
@pytest.mark.parametrize("x_type,x_zero,y_zero", [
    (np.uint8, 0, 0), (np.uint8, 0, 17), (np.uint8, 9, 0), (np.int8, 0, 0)])
def test_qlinear_conv_with_zero_zero_points_matches_onnxruntime(tmp_path, x_type, x_zero, y_zero):
    check_qlinear_conv(tmp_path, x_type, True, True, (1, 64, 14, 14), (64, 64, 3, 3), dict(pads=[1, 1, 1, 1]),
                       x_zero=x_zero, y_zero=y_zero)


def check_qlinear_conv(tmp_path, x_type, per_channel, bias, x_shape, w_shape, attrs, x_zero=None, y_zero=None):
    rng = np.random.default_rng(3)
    info = np.iinfo(x_type)
    x = rng.integers(info.min, info.max + 1, x_shape).astype(x_type)
    w = rng.integers(-127, 128, w_shape).astype(np.int8)
    channels = w_shape[0]
    w_scale = (rng.uniform(0.002, 0.02, channels) if per_channel else np.array(0.01)).astype(np.float32)
    x_zero = rng.integers(info.min, info.max + 1) if x_zero is None else x_zero
    y_zero = info.min + 100 if y_zero is None else y_zero
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "x_scale"),
             numpy_helper.from_array(np.array(x_zero, x_type), "x_zero"),
             numpy_helper.from_array(w, "w"),
             numpy_helper.from_array(w_scale, "w_scale"),
             numpy_helper.from_array(np.zeros(w_scale.shape, np.int8), "w_zero"),
             numpy_helper.from_array(np.array(0.4, np.float32), "y_scale"),
             numpy_helper.from_array(np.array(y_zero, x_type), "y_zero")]
    inputs = ["x", "x_scale", "x_zero", "w", "w_scale", "w_zero", "y_scale", "y_zero"]
    if bias:
        inits.append(numpy_helper.from_array(rng.integers(-5000, 5000, channels).astype(np.int32), "b"))
        inputs.append("b")
    node = helper.make_node("QLinearConv", inputs, ["y"], **attrs)
    x_info = helper.make_tensor_value_info("x", TYPES[x_type], list(x_shape))
    y_info = helper.make_tensor_value_info("y", TYPES[x_type], None)
    path = save(tmp_path, [node], [x_info], [y_info], inits)
    assert "kiln.NhwcQLinearConv" in compiled_ops(path, tmp_path / "m.kiln")
    ours = kiln.Runner(tmp_path / "m.kiln").run({"x": x})["y"]
    # Bit for bit: the int8 convolution rounds before it adds the output
    # zero point, as onnxruntime does (oneDNN alone adds it first, and then
    # about 1 output in 10,000 was a step off).
    np.testing.assert_array_equal(ours, onnxruntime_outputs(path, {"x": x})[0])
    # With the weights a graph input, the QLinearConv runs kiln's loop
    # kernel, which requantizes in double: the int8 path agrees with it too.
    w_info = helper.make_tensor_value_info("w", TensorProto.INT8, list(w_shape))
    path = save(tmp_path, [node], [x_info, w_info], [y_info], [i for i in inits if i.name != "w"])
    assert "kiln.NhwcQLinearConv" not in compiled_ops(path, tmp_path / "loop.kiln")
    assert_within_one_step(ours, kiln.Runner(tmp_path / "loop.kiln").run({"x": x, "w": w})["y"])


def qdq_block_model(tmp_path, x_type, relu_zero_is_lowest):
    """x -> Q -> DQ -> Conv(DQ(w), DQ(b)) [-> Relu] -> Q -> DQ -> MaxPool -> Q -> DQ
       -> Add with the same block's other branch, the QDQ way; then a float output."""
    rng = np.random.default_rng(7)
    info = np.iinfo(x_type)
    lowest = info.min
    c = 16
    w1 = rng.integers(-127, 128, (c, 8, 3, 3)).astype(np.int8)
    w2 = rng.integers(-127, 128, (c, 8, 1, 1)).astype(np.int8)
    s1 = rng.uniform(0.002, 0.01, c).astype(np.float32)
    s2 = rng.uniform(0.002, 0.01, c).astype(np.float32)
    x_scale = np.float32(0.03)
    inits = [
        numpy_helper.from_array(np.array(x_scale), "xs"), numpy_helper.from_array(np.array(lowest + 128, x_type), "xz"),
        numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(s1, "w1s"),
        numpy_helper.from_array(np.zeros(c, np.int8), "w1z"),
        numpy_helper.from_array(w2, "w2"), numpy_helper.from_array(s2, "w2s"),
        numpy_helper.from_array(np.zeros(c, np.int8), "w2z"),
        # biases quantized at x_scale * w_scale, as onnxruntime's quantizer does
        numpy_helper.from_array(rng.integers(-3000, 3000, c).astype(np.int32), "b1"),
        numpy_helper.from_array((x_scale * s1).astype(np.float32), "b1s"),
        numpy_helper.from_array(np.zeros(c, np.int32), "b1z"),
        numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "b2f"),  # a float bias
        numpy_helper.from_array(np.array(0.05, np.float32), "ys"),
        numpy_helper.from_array(np.array(lowest if relu_zero_is_lowest else lowest + 20, x_type), "yz"),
        numpy_helper.from_array(np.array(0.07, np.float32), "zs"),
        numpy_helper.from_array(np.array(lowest + 128, x_type), "zz"),
        numpy_helper.from_array(np.array(0.09, np.float32), "as"),
        numpy_helper.from_array(np.array(lowest + 100, x_type), "az"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w1", "w1s", "w1z"], ["w1d"], axis=0),
        helper.make_node("DequantizeLinear", ["w2", "w2s", "w2z"], ["w2d"], axis=0),
        helper.make_node("DequantizeLinear", ["b1", "b1s", "b1z"], ["b1d"], axis=0),
        helper.make_node("Conv", ["xd", "w1d", "b1d"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("QuantizeLinear", ["r1", "ys", "yz"], ["r1q"]),
        helper.make_node("DequantizeLinear", ["r1q", "ys", "yz"], ["r1d"]),
        helper.make_node("MaxPool", ["r1d"], ["p1"], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1]),
        helper.make_node("QuantizeLinear", ["p1", "ys", "yz"], ["p1q"]),
        helper.make_node("DequantizeLinear", ["p1q", "ys", "yz"], ["p1d"]),
        helper.make_node("Conv", ["xd", "w2d", "b2f"], ["c2"]),
        helper.make_node("QuantizeLinear", ["c2", "zs", "zz"], ["c2q"]),
        helper.make_node("DequantizeLinear", ["c2q", "zs", "zz"], ["c2d"]),
        helper.make_node("Add", ["p1d", "c2d"], ["sum"]),
        helper.make_node("QuantizeLinear", ["sum", "as", "az"], ["sumq"]),
        helper.make_node("DequantizeLinear", ["sumq", "as", "az"], ["y"]),
    ]
    return save(tmp_path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 12, 12])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, 12, 12])], inits)


@pytest.mark.parametrize("x_type", [np.uint8, np.int8])
def test_qdq_block_runs_in_integers(tmp_path, x_type):
    path = qdq_block_model(tmp_path, x_type, relu_zero_is_lowest=True)
    ops = compiled_ops(path, tmp_path / "m.kiln")
    x = np.random.default_rng(1).standard_normal((1, 8, 12, 12)).astype(np.float32) * 2
    assert ops.get("kiln.NhwcQLinearConv") == 2, ops
    # The residual Add is the second convolution's sum post-op (conv_fusion.h).
    assert "kiln.QLinearAdd" not in ops and "kiln.NhwcMaxPool" in ops, ops
    assert not {"Conv", "kiln.NhwcConv", "Add", "Relu"} & set(ops), ops
    ours = kiln.Runner(tmp_path / "m.kiln").run({"x": x})["y"]
    want = onnxruntime_outputs(path, {"x": x})[0]
    steps = np.abs(ours - want) / 0.09
    assert steps.max() <= 2.01, steps.max()  # one step in a layer, carried into the next at most
    # The sum post-op rounds once where onnxruntime rounds the Conv's output
    # first: a step apart on a fifth of the values.
    assert (steps < 0.5).mean() >= 0.75


@pytest.mark.parametrize("op", ["Add", "Mul"])
@pytest.mark.parametrize("q_type", [np.uint8, np.int8])
def test_add_or_mul_of_two_tensors_is_quantized(tmp_path, q_type, op):
    """Q(Add(DQ(a), DQ(b))) of two computed tensors that no convolution makes
    is kiln.QLinearAdd, Q(Mul(...)) kiln.QLinearMul (a hard-swish written as
    x * HardSigmoid(x), a gate): within a step of onnxruntime, saturating at
    both ends, a Relu after it absorbed by the output's saturation."""
    info = np.iinfo(q_type)
    rng = np.random.default_rng(16)
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "as"),
             numpy_helper.from_array(np.array(info.min + 100, q_type), "az"),
             numpy_helper.from_array(np.array(0.11, np.float32), "bs"),
             numpy_helper.from_array(np.array(info.min + 140, q_type), "bz"),
             numpy_helper.from_array(np.array(0.06, np.float32), "ys"),
             numpy_helper.from_array(np.array(info.min, q_type), "yz")]
    nodes = [helper.make_node("QuantizeLinear", ["a", "as", "az"], ["aq"]),
             helper.make_node("QuantizeLinear", ["b", "bs", "bz"], ["bq"]),
             helper.make_node("DequantizeLinear", ["aq", "as", "az"], ["ad"]),
             helper.make_node("DequantizeLinear", ["bq", "bs", "bz"], ["bd"]),
             helper.make_node(op, ["ad", "bd"], ["s"]), helper.make_node("Relu", ["s"], ["r"]),
             helper.make_node("QuantizeLinear", ["r", "ys", "yz"], ["rq"]),
             helper.make_node("DequantizeLinear", ["rq", "ys", "yz"], ["y"])]
    shape = [2, 3, 50]
    path = save(tmp_path, nodes, [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in "ab"],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits)
    ops = compiled_ops(path, tmp_path / "m.kiln")
    assert ops.get(f"kiln.QLinear{op}") == 1 and "Relu" not in ops and op not in ops, ops
    feeds = {"a": rng.standard_normal(shape).astype(np.float32) * 6, "b": rng.standard_normal(shape).astype(np.float32) * 9}
    ours = kiln.Runner(tmp_path / "m.kiln").run(feeds)["y"]
    want = onnxruntime_outputs(path, feeds)[0]
    steps = np.abs(ours - want) / 0.06
    # onnxruntime leaves this Add unfused (the Relu between) and rounds the
    # float sum; the ratios of QLinearAdd (onnxruntime's fused form too)
    # land on the other side of a half now and then.
    assert steps.max() <= 1.01 and (steps < 0.5).mean() >= 0.9, (steps.max(), (steps < 0.5).mean())
    assert want.min() == 0 and want.max() == pytest.approx(0.06 * 255)  # both ends saturate


@pytest.mark.parametrize("q_type,conv_zero,conv_first", [
    (np.uint8, 0, True),      # the Conv's zero point the lowest value: its saturation is a ReLU, kept as a clip
    (np.uint8, 110, False),   # the residual first
    (np.int8, -20, True),
])
def test_residual_add_is_the_convolutions_sum_post_op(tmp_path, q_type, conv_zero, conv_first):
    """Q(Add(DQ(QLinearConv), DQ(r))) becomes the convolution's oneDNN sum
    post-op (passes/conv_fusion.h): the Conv's result clipped to the range
    its own quantization saturated to, then the residual added, rounded
    once. Within a step of onnxruntime, which rounds twice."""
    info = np.iinfo(q_type)
    rng = np.random.default_rng(17)
    c = 16
    w = rng.integers(-127, 128, (c, 8, 3, 3)).astype(np.int8)
    inits = [numpy_helper.from_array(np.array(0.03, np.float32), "xs"),
             numpy_helper.from_array(np.array(info.min + 128, q_type), "xz"),
             numpy_helper.from_array(w, "w"), numpy_helper.from_array(rng.uniform(0.002, 0.01, c).astype(np.float32), "ws"),
             numpy_helper.from_array(np.zeros(c, np.int8), "wz"),
             numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "b"),
             numpy_helper.from_array(np.array(0.04, np.float32), "cs"),
             numpy_helper.from_array(np.array(conv_zero, q_type), "cz"),
             numpy_helper.from_array(np.array(0.05, np.float32), "rs"),
             numpy_helper.from_array(np.array(info.min + 100, q_type), "rz"),
             numpy_helper.from_array(np.array(0.09, np.float32), "ys"),
             numpy_helper.from_array(np.array(info.min + 60, q_type), "yz")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("QuantizeLinear", ["c", "cs", "cz"], ["cq"]),
             helper.make_node("DequantizeLinear", ["cq", "cs", "cz"], ["cd"]),
             helper.make_node("Conv", ["xd", "wd"], ["r"], pads=[1, 1, 1, 1], dilations=[1, 1]),
             helper.make_node("QuantizeLinear", ["r", "rs", "rz"], ["rq"]),
             helper.make_node("DequantizeLinear", ["rq", "rs", "rz"], ["rd"]),
             helper.make_node("Add", ["cd", "rd"] if conv_first else ["rd", "cd"], ["s"]),
             helper.make_node("QuantizeLinear", ["s", "ys", "yz"], ["sq"]),
             helper.make_node("DequantizeLinear", ["sq", "ys", "yz"], ["y"])]
    path = save(tmp_path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 9, 9])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, 9, 9])], inits)
    ops = compiled_ops(path, tmp_path / "m.kiln")
    assert ops.get("kiln.NhwcQLinearConv") == 2 and "kiln.QLinearAdd" not in ops, ops
    x = rng.standard_normal((1, 8, 9, 9)).astype(np.float32) * 2
    ours = kiln.Runner(tmp_path / "m.kiln").run({"x": x})["y"]
    want = onnxruntime_outputs(path, {"x": x})[0]
    steps = np.abs(ours - want) / 0.09
    assert steps.max() <= 1.01 and (steps < 0.5).mean() >= 0.8, (steps.max(), (steps < 0.5).mean())


def test_relu_that_changes_values_is_kept(tmp_path):
    # With the output zero point above the lowest value, Relu clamps values
    # the quantization would keep: the Conv stays a float one, and results
    # stay right.
    path = qdq_block_model(tmp_path, np.uint8, relu_zero_is_lowest=False)
    ops = compiled_ops(path, tmp_path / "m.kiln")
    x = np.random.default_rng(2).standard_normal((1, 8, 12, 12)).astype(np.float32) * 2
    assert ops.get("kiln.NhwcQLinearConv") == 1, ops
    ours = kiln.Runner(tmp_path / "m.kiln").run({"x": x})["y"]
    want = onnxruntime_outputs(path, {"x": x})[0]
    assert np.abs(ours - want).max() / 0.09 <= 2.01


@pytest.mark.parametrize("y_type", [np.uint8, np.int8])
def test_quantize_linear_per_tensor(tmp_path, y_type):
    # The vector path: rounding half to even, saturation at both ends, the
    # zero point, and i8 through the u8 loop shifted by 128.
    info = np.iinfo(y_type)
    inits = [numpy_helper.from_array(np.array(0.5, np.float32), "s"),
             numpy_helper.from_array(np.array(info.min + 7, y_type), "z")]
    node = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"])
    path = save(tmp_path, [node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1000])],
                [helper.make_tensor_value_info("y", TYPES[y_type], None)], inits)
    kiln.compile(path, tmp_path / "m.kiln")
    x = np.concatenate([np.arange(-20, 20, 0.25), [-1e30, 1e30, 0.25, 0.75, -0.25, -0.75],
                        np.random.default_rng(0).uniform(-200, 200, 834)]).astype(np.float32)
    ours = kiln.Runner(tmp_path / "m.kiln").run({"x": x})["y"]
    np.testing.assert_array_equal(ours, onnxruntime_outputs(path, {"x": x})[0])


@pytest.mark.parametrize("quant_format", ["QDQ", "QOperator"])
def test_quantize_static_cnn(tmp_path, quant_format):
    """A CNN quantized by onnxruntime's own quantizer, per-channel weights,
    in both its formats: QDQ, and QOperator (QLinearConv with com.microsoft
    QLinearAdd, QLinearGlobalAveragePool and QGemm, which import as their QDQ
    groups). Every Conv runs in int8, and the output stays within a few of
    its quantization steps of onnxruntime's."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    rng = np.random.default_rng(4)

    def conv(name, c_in, c_out, k, stride=1, group=1):
        w = (rng.standard_normal((c_out, c_in // group, k, k)) * np.sqrt(2 / (c_in // group * k * k)))
        return [numpy_helper.from_array(w.astype(np.float32), name + "_w"),
                numpy_helper.from_array((rng.standard_normal(c_out) * 0.1).astype(np.float32), name + "_b")]

    inits = conv("a", 3, 16, 3) + conv("b", 16, 16, 3, group=16) + conv("c", 16, 16, 1) + conv("d", 16, 32, 3, 2)
    inits += [numpy_helper.from_array((rng.standard_normal((10, 32)) * 0.2).astype(np.float32), "fc_w"),
              numpy_helper.from_array(np.zeros(10, np.float32), "fc_b")]
    nodes = [helper.make_node("Conv", ["x", "a_w", "a_b"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["ar"]),
             helper.make_node("Conv", ["ar", "b_w", "b_b"], ["b"], pads=[1, 1, 1, 1], group=16),
             helper.make_node("Relu", ["b"], ["br"]),
             helper.make_node("Conv", ["br", "c_w", "c_b"], ["c"]),
             helper.make_node("Add", ["c", "ar"], ["res"]),
             helper.make_node("MaxPool", ["res"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p", "d_w", "d_b"], ["d"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["d"], ["dr"]),
             helper.make_node("GlobalAveragePool", ["dr"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["y"], transB=1)]
    path = save(tmp_path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits, opset=13)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.data = iter([{"x": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)} for _ in range(8)])

        def get_next(self):
            return next(self.data, None)

    quantized = tmp_path / "q.onnx"
    quantize_static(str(path), str(quantized), Reader(), quant_format=getattr(QuantFormat, quant_format),
                    per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    model = onnx.load(quantized)
    if quant_format == "QOperator":
        assert {"QLinearAdd", "QLinearGlobalAveragePool", "QGemm"} <= {n.op_type for n in model.graph.node}
    ops = compiled_ops(quantized, tmp_path / "q.kiln")
    assert ops.get("kiln.NhwcQLinearConv") == 4 and "kiln.QLinearAdd" not in ops, ops  # the Add: a sum post-op
    output_dq = next(n for n in model.graph.node if n.output[0] == "y")
    step = float(numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == output_dq.input[1])))
    runner = kiln.Runner(tmp_path / "q.kiln")
    for _ in range(5):
        x = rng.standard_normal((1, 3, 32, 32)).astype(np.float32)
        ours = runner.run({"x": x})["y"]
        want = onnxruntime_outputs(quantized, {"x": x})[0]
        assert np.abs(ours - want).max() / step <= 3.01


def test_data_movement_stays_in_integers(tmp_path):
    """Concat, Reshape, Transpose, Slice and Flatten between Q and DQ of one
    scale and zero point run on the 8-bit data: one DequantizeLinear is left,
    the output's."""
    rng = np.random.default_rng(9)
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "s"),
             numpy_helper.from_array(np.array(128, np.uint8), "z"),
             numpy_helper.from_array(rng.integers(-127, 128, (8, 4, 3, 3)).astype(np.int8), "wa"),
             numpy_helper.from_array(rng.integers(-127, 128, (8, 4, 1, 1)).astype(np.int8), "wb"),
             numpy_helper.from_array(np.array(0.003, np.float32), "ws"),
             numpy_helper.from_array(np.array(0, np.int8), "wz"),
             numpy_helper.from_array(np.array([1, 16, 36], np.int64), "shape"),
             numpy_helper.from_array(np.array([4], np.int64), "start"),
             numpy_helper.from_array(np.array([30], np.int64), "end"),
             numpy_helper.from_array(np.array([2], np.int64), "axis")]

    def qdq(x, name):
        return [helper.make_node("QuantizeLinear", [x, "s", "z"], [name + "_q"]),
                helper.make_node("DequantizeLinear", [name + "_q", "s", "z"], [name])]

    nodes = qdq("x", "xd") + [
        helper.make_node("DequantizeLinear", ["wa", "ws", "wz"], ["wad"]),
        helper.make_node("DequantizeLinear", ["wb", "ws", "wz"], ["wbd"]),
        helper.make_node("Conv", ["xd", "wad"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["xd", "wbd"], ["b"])] + qdq("a", "ad") + qdq("b", "bd") + [
        helper.make_node("Concat", ["ad", "bd"], ["c"], axis=1)] + qdq("c", "cd") + [
        helper.make_node("Reshape", ["cd", "shape"], ["r"])] + qdq("r", "rd") + [
        helper.make_node("Transpose", ["rd"], ["t"], perm=[0, 2, 1])] + qdq("t", "td") + [
        helper.make_node("Slice", ["td", "start", "end", "axis"], ["sl"])] + qdq("sl", "sld") + [
        helper.make_node("Flatten", ["sld"], ["f"])] + qdq("f", "y")
    path = save(tmp_path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 936])], inits)
    ops = compiled_ops(path, tmp_path / "m.kiln")
    assert ops.get("DequantizeLinear") == 1 and ops.get("kiln.NhwcQLinearConv") == 2, ops
    assert ops.get("Concat") == 1, ops
    x = rng.standard_normal((1, 4, 6, 6)).astype(np.float32) * 2
    ours = kiln.Runner(tmp_path / "m.kiln").run({"x": x})["y"]
    want = onnxruntime_outputs(path, {"x": x})[0]
    assert np.abs(ours - want).max() / 0.05 <= 1.01


def test_split_and_nearest_resize_stay_in_integers(tmp_path):
    """Split (every output quantized alike) and Resize in nearest mode (it
    copies elements) between Q and DQ of one scale and zero point run on the
    8-bit data, as a YOLO's C2f split and its upsampling do."""
    rng = np.random.default_rng(14)
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "s"),
             numpy_helper.from_array(np.array(128, np.uint8), "z"),
             numpy_helper.from_array(rng.integers(-127, 128, (8, 4, 3, 3)).astype(np.int8), "w"),
             numpy_helper.from_array(np.array(0.003, np.float32), "ws"),
             numpy_helper.from_array(np.array(0, np.int8), "wz"),
             numpy_helper.from_array(np.array([3, 5], np.int64), "sizes"),
             numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")]

    def qdq(x, name):
        return [helper.make_node("QuantizeLinear", [x, "s", "z"], [name + "_q"]),
                helper.make_node("DequantizeLinear", [name + "_q", "s", "z"], [name])]

    nodes = qdq("x", "xd") + [
        helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"]),
        helper.make_node("Conv", ["xd", "wd"], ["c"], pads=[1, 1, 1, 1])] + qdq("c", "cd") + [
        helper.make_node("Split", ["cd", "sizes"], ["a", "b"], axis=1)] + qdq("a", "ad") + qdq("b", "bd") + [
        helper.make_node("Resize", ["ad", "", "scales"], ["ra"], mode="nearest"),
        helper.make_node("Resize", ["bd", "", "scales"], ["rb"], mode="nearest",
                         coordinate_transformation_mode="asymmetric", nearest_mode="floor")] + \
        qdq("ra", "rad") + qdq("rb", "rbd") + [
        helper.make_node("Concat", ["rbd", "rad"], ["cat"], axis=1)] + qdq("cat", "y")
    path = save(tmp_path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 5])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 12, 10])], inits)
    ops = compiled_ops(path, tmp_path / "m.kiln")
    assert ops.get("QuantizeLinear") == 1 and ops.get("DequantizeLinear") == 1, ops  # the model's ends
    assert ops.get("kiln.NhwcResize") == 2 and "Resize" not in ops, ops  # channels-last, as the convolution
    x = rng.standard_normal((1, 4, 6, 5)).astype(np.float32) * 2
    ours = kiln.Runner(tmp_path / "m.kiln").run({"x": x})["y"]
    want = onnxruntime_outputs(path, {"x": x})[0]
    assert np.abs(ours - want).max() / 0.05 <= 1.01


@pytest.mark.parametrize("q_type", [np.uint8, np.int8])
def test_concat_of_different_quantizations_requantizes(tmp_path, q_type):
    """A Concat whose inputs are quantized differently from its output (a
    YOLO's, a CSP block's) becomes kiln.QLinearConcat: each input requantized
    by a table as it is copied, no float step between. Two convolutions'
    outputs, channels-last, and a third input of the output's own parameters
    (copied as it is); the model's input and output conversions stay."""
    info = np.iinfo(q_type)
    rng = np.random.default_rng(12)
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "s"),
             numpy_helper.from_array(np.array(info.min + 128, q_type), "z"),
             numpy_helper.from_array(np.array(0.11, np.float32), "as"),
             numpy_helper.from_array(np.array(info.min + 90, q_type), "az"),
             numpy_helper.from_array(np.array(0.027, np.float32), "bs"),
             numpy_helper.from_array(np.array(info.min + 140, q_type), "bz"),
             numpy_helper.from_array(np.array(0.07, np.float32), "ys"),
             numpy_helper.from_array(np.array(info.min + 120, q_type), "yz"),
             numpy_helper.from_array(rng.integers(-127, 128, (8, 4, 3, 3)).astype(np.int8), "wa"),
             numpy_helper.from_array(rng.integers(-127, 128, (16, 4, 1, 1)).astype(np.int8), "wb"),
             numpy_helper.from_array(np.array(0.004, np.float32), "ws"),
             numpy_helper.from_array(np.array(0, np.int8), "wz")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wa", "ws", "wz"], ["wad"]),
             helper.make_node("DequantizeLinear", ["wb", "ws", "wz"], ["wbd"]),
             helper.make_node("Conv", ["xd", "wad"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["xd", "wbd"], ["b"]),
             helper.make_node("Conv", ["xd", "wbd"], ["c"]),
             helper.make_node("QuantizeLinear", ["a", "as", "az"], ["aq"]),
             helper.make_node("QuantizeLinear", ["b", "bs", "bz"], ["bq"]),
             helper.make_node("QuantizeLinear", ["c", "ys", "yz"], ["cq"]),
             helper.make_node("DequantizeLinear", ["aq", "as", "az"], ["ad"]),
             helper.make_node("DequantizeLinear", ["bq", "bs", "bz"], ["bd"]),
             helper.make_node("DequantizeLinear", ["cq", "ys", "yz"], ["cd"]),
             helper.make_node("Concat", ["ad", "bd", "cd"], ["cat"], axis=1),
             helper.make_node("QuantizeLinear", ["cat", "ys", "yz"], ["catq"]),
             helper.make_node("DequantizeLinear", ["catq", "ys", "yz"], ["y"])]
    path = save(tmp_path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 9, 7])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 40, 9, 7])], inits)
    ops = compiled_ops(path, tmp_path / "m.kiln")
    assert ops.get("kiln.QLinearConcat") == 1 and "Concat" not in ops, ops
    assert ops.get("QuantizeLinear") == 1 and ops.get("DequantizeLinear") == 1, ops
    x = rng.standard_normal((2, 4, 9, 7)).astype(np.float32) * 2
    ours = kiln.Runner(tmp_path / "m.kiln").run({"x": x})["y"]
    want = onnxruntime_outputs(path, {"x": x})[0]
    steps = np.abs(ours - want) / 0.07
    assert steps.max() <= 1.01 and (steps < 0.5).mean() >= 0.99, (steps.max(), (steps < 0.5).mean())
    levels = np.rint(want / 0.07) + (info.min + 120)
    assert levels.min() == info.min and levels.max() == info.max  # the inputs' wider range saturates


@pytest.mark.parametrize("a_type,per_column,a_shape", [
    (np.uint8, True, (2, 5, 48)),   # batched rows, per-column scales
    (np.int8, False, (7, 48)),
    (np.uint8, False, (48,)),       # a vector
])
def test_qlinear_matmul_matches_onnxruntime(tmp_path, a_type, per_column, a_shape):
    """Constant i8 weights: oneDNN's int8 matmul (int8_matmul.h); with the
    weights a graph input, kiln's loop kernel. Both within one step of
    onnxruntime."""
    rng = np.random.default_rng(12)
    info = np.iinfo(a_type)
    a = rng.integers(info.min, info.max + 1, a_shape).astype(a_type)
    b = rng.integers(-127, 128, (48, 24)).astype(np.int8)
    b_scale = (rng.uniform(0.002, 0.02, 24) if per_column else np.array(0.01)).astype(np.float32)
    inits = [numpy_helper.from_array(np.array(0.03, np.float32), "a_scale"),
             numpy_helper.from_array(np.array(info.min + 110, a_type), "a_zero"),
             numpy_helper.from_array(b, "b"),
             numpy_helper.from_array(b_scale, "b_scale"),
             numpy_helper.from_array(np.zeros(b_scale.shape, np.int8), "b_zero"),
             numpy_helper.from_array(np.array(0.5, np.float32), "y_scale"),
             numpy_helper.from_array(np.array(info.min + 90, a_type), "y_zero")]
    node = helper.make_node("QLinearMatMul", ["a", "a_scale", "a_zero", "b", "b_scale", "b_zero", "y_scale",
                                              "y_zero"], ["y"])
    a_info = helper.make_tensor_value_info("a", TYPES[a_type], list(a_shape))
    y_info = helper.make_tensor_value_info("y", TYPES[a_type], None)
    path = save(tmp_path, [node], [a_info], [y_info], inits)
    kiln.compile(path, tmp_path / "m.kiln")
    ours = kiln.Runner(tmp_path / "m.kiln").run({"a": a})["y"]
    assert_within_one_step(ours, onnxruntime_outputs(path, {"a": a})[0])
    b_info = helper.make_tensor_value_info("b", TensorProto.INT8, [48, 24])
    path = save(tmp_path, [node], [a_info, b_info], [y_info], [i for i in inits if i.name != "b"])
    kiln.compile(path, tmp_path / "loop.kiln")
    assert_within_one_step(ours, kiln.Runner(tmp_path / "loop.kiln").run({"a": a, "b": b})["y"])


def test_qdq_matmul_becomes_qlinear_matmul(tmp_path):
    rng = np.random.default_rng(13)
    inits = [numpy_helper.from_array(np.array(0.04, np.float32), "s"),
             numpy_helper.from_array(np.array(128, np.uint8), "z"),
             numpy_helper.from_array(rng.integers(-127, 128, (32, 16)).astype(np.int8), "w"),
             numpy_helper.from_array(rng.uniform(0.001, 0.01, 16).astype(np.float32), "ws"),
             numpy_helper.from_array(np.zeros(16, np.int8), "wz"),
             numpy_helper.from_array(np.array(0.3, np.float32), "ys"),
             numpy_helper.from_array(np.array(120, np.uint8), "yz")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=1),
             helper.make_node("MatMul", ["xd", "wd"], ["m"]),
             helper.make_node("QuantizeLinear", ["m", "ys", "yz"], ["mq"]),
             helper.make_node("DequantizeLinear", ["mq", "ys", "yz"], ["y"])]
    path = save(tmp_path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 10, 32])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 10, 16])], inits)
    ops = compiled_ops(path, tmp_path / "m.kiln")
    assert ops.get("QLinearMatMul") == 1 and "MatMul" not in ops, ops
    x = rng.standard_normal((3, 10, 32)).astype(np.float32) * 3
    ours = kiln.Runner(tmp_path / "m.kiln").run({"x": x})["y"]
    assert np.abs(ours - onnxruntime_outputs(path, {"x": x})[0]).max() / 0.3 <= 1.01


@pytest.mark.parametrize("q_type,transposed,bias,per_column,relu", [
    (np.uint8, True, "f32", True, False),   # a classifier's head, as onnxruntime's quantizer leaves it
    (np.int8, False, "i32", False, False),
    (np.uint8, False, None, True, True),
    (np.int8, True, "f32", True, True),
])
def test_qdq_gemm_becomes_biased_qlinear_matmul(tmp_path, q_type, transposed, bias, per_column, relu):
    """Q(Gemm(DQ(a), DQ(w), bias)) becomes kiln.QLinearMatMul: w as [k, n]
    (transposed at compile time under transB), the bias in i32 at a_scale *
    w_scale added to the sums, a Relu absorbed by the output's saturation.
    Within one output step of onnxruntime; the output saturates at both ends
    somewhere, so the bias and requantization are exercised throughout."""
    info = np.iinfo(q_type)
    rng = np.random.default_rng(15)
    k, n = 48, 20
    w = rng.integers(-127, 128, (n, k) if transposed else (k, n)).astype(np.int8)
    ws = rng.uniform(0.002, 0.01, n).astype(np.float32) if per_column else np.array(0.005, np.float32)
    inits = [numpy_helper.from_array(np.array(0.04, np.float32), "s"),
             numpy_helper.from_array(np.array(info.min + 128, q_type), "z"),
             numpy_helper.from_array(w, "w"), numpy_helper.from_array(ws, "ws"),
             numpy_helper.from_array(np.zeros(ws.shape, np.int8), "wz"),
             numpy_helper.from_array(np.array(0.08, np.float32), "ys"),
             numpy_helper.from_array(np.array(info.min + (0 if relu else 100), q_type), "yz")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0 if transposed else 1)]
    gemm_inputs = ["xd", "wd"]
    if bias == "f32":
        inits.append(numpy_helper.from_array(rng.standard_normal(n).astype(np.float32) * 3, "b"))
        gemm_inputs.append("b")
    elif bias == "i32":
        inits += [numpy_helper.from_array(rng.integers(-20000, 20000, (1, n)).astype(np.int32), "bq"),
                  numpy_helper.from_array(np.array(0.04 * 0.005, np.float32), "bs")]
        nodes.append(helper.make_node("DequantizeLinear", ["bq", "bs"], ["b"]))
        gemm_inputs.append("b")
    nodes.append(helper.make_node("Gemm", gemm_inputs, ["g"], transB=int(transposed)))
    if relu:
        nodes.append(helper.make_node("Relu", ["g"], ["gr"]))
    nodes += [helper.make_node("QuantizeLinear", ["gr" if relu else "g", "ys", "yz"], ["gq"]),
              helper.make_node("DequantizeLinear", ["gq", "ys", "yz"], ["y"])]
    path = save(tmp_path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [7, k])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [7, n])], inits)
    ops = compiled_ops(path, tmp_path / "m.kiln")
    assert ops.get("kiln.QLinearMatMul") == 1 and "Gemm" not in ops and "Relu" not in ops, ops
    x = rng.standard_normal((7, k)).astype(np.float32) * 3
    ours = kiln.Runner(tmp_path / "m.kiln").run({"x": x})["y"]
    want = onnxruntime_outputs(path, {"x": x})[0]
    steps = np.abs(ours - want) / 0.08
    assert steps.max() <= 1.01 and (steps < 0.5).mean() >= 0.97, (steps.max(), (steps < 0.5).mean())
    levels = np.rint(want / 0.08) + (info.min + (0 if relu else 100))
    assert levels.min() == info.min and levels.max() == info.max


def steps_within_one(package, path, x, step, exact_share):
    """Runs the package on x; checks its y within one quantization step of
    onnxruntime's, and equal on at least `exact_share` of the values."""
    ours = kiln.Runner(package).run({"x": x})["y"]
    steps = np.abs(ours - onnxruntime_outputs(path, {"x": x})[0]) / step
    assert steps.max() <= 1.01 and (steps < 0.5).mean() >= exact_share, (steps.max(), (steps < 0.5).mean())
    return ours


def with_output(path, name, q_type, shape, to):
    """The model at `path` with the 8-bit value `name` also an output, saved to `to`."""
    model = onnx.load(path)
    model.graph.output.append(helper.make_tensor_value_info(name, TYPES[q_type], shape))
    onnx.save(model, to)


@pytest.mark.parametrize("q_type", [np.uint8, np.int8])
def test_chains_of_8_bit_table_steps_are_one_lookup(tmp_path, q_type):
    """A quantized model quantizes after every operator: a HardSigmoid, a
    scaling and a shift, each between its own QuantizeLinear and
    DequantizeLinear, are three 8-bit steps that each compute a function of
    256 values. passes/byte_tables.h makes the chain one kiln.Lookup8 whose
    table is theirs composed; a branch that reads the middle of a chain
    keeps the chain from joining there. Within one step of onnxruntime."""
    info = np.iinfo(q_type)
    rng = np.random.default_rng(18)
    inits = [numpy_helper.from_array(np.array(0.04, np.float32), "s"),
             numpy_helper.from_array(np.array(info.min + 128, q_type), "z"),
             numpy_helper.from_array(np.array(1.0 / 255, np.float32), "hs"),
             numpy_helper.from_array(np.array(info.min, q_type), "hz"),
             numpy_helper.from_array(np.array(0.01, np.float32), "ms"),
             numpy_helper.from_array(np.array(info.min + 5, q_type), "mz"),
             numpy_helper.from_array(np.array(0.02, np.float32), "as"),
             numpy_helper.from_array(np.array(info.min + 30, q_type), "az"),
             numpy_helper.from_array(np.array(2.5, np.float32), "scale"),
             numpy_helper.from_array(np.array(-0.7, np.float32), "shift")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             helper.make_node("HardSigmoid", ["xd"], ["h"]),
             helper.make_node("QuantizeLinear", ["h", "hs", "hz"], ["hq"]),
             helper.make_node("DequantizeLinear", ["hq", "hs", "hz"], ["hd"]),
             helper.make_node("Mul", ["hd", "scale"], ["m"]),
             helper.make_node("QuantizeLinear", ["m", "ms", "mz"], ["mq"]),
             helper.make_node("DequantizeLinear", ["mq", "ms", "mz"], ["md"]),
             helper.make_node("Add", ["md", "shift"], ["a"]),
             helper.make_node("QuantizeLinear", ["a", "as", "az"], ["aq"]),
             helper.make_node("DequantizeLinear", ["aq", "as", "az"], ["y"])]
    shape = [1, 4, 30, 30]
    path = save(tmp_path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits)
    ops = compiled_ops(path, tmp_path / "m.kiln")
    assert ops.get("kiln.Lookup8") == 1 and "kiln.FusedElementwise" not in ops, ops
    x = rng.standard_normal(shape).astype(np.float32) * 3
    ours = steps_within_one(tmp_path / "m.kiln", path, x, step=0.02, exact_share=0.99)

    # The same chain with the middle value also a model output: two steps.
    with_output(path, "mq", q_type, shape, tmp_path / "branch.onnx")
    ops = compiled_ops(tmp_path / "branch.onnx", tmp_path / "branch.kiln")
    assert ops.get("kiln.Lookup8", 0) + ops.get("kiln.FusedElementwise", 0) == 2, ops
    outputs = kiln.Runner(tmp_path / "branch.kiln").run({"x": x})
    np.testing.assert_array_equal(outputs["y"], ours)
    assert np.abs(outputs["mq"].astype(np.int32) - onnxruntime_outputs(tmp_path / "branch.onnx", {"x": x})[1]).max() <= 1


@pytest.mark.parametrize("activation", ["Sigmoid", "HardSigmoid"])
@pytest.mark.parametrize("q_type", [np.uint8, np.int8])
def test_x_times_a_table_of_x_is_one_lookup(tmp_path, q_type, activation):
    """SiLU and hard-swish as onnxruntime's quantizer leaves them:
    Q(Mul(DQ(x), DQ(Q(Sigmoid(DQ(x)))))). Both operands are functions of x's
    byte, so the whole is one kiln.Lookup8 (passes/byte_tables.h), the same
    bits as the unfused steps (the sigmoid also an output keeps them apart)
    and within one step of onnxruntime."""
    info = np.iinfo(q_type)
    rng = np.random.default_rng(19)
    inits = [numpy_helper.from_array(np.array(0.04, np.float32), "s"),
             numpy_helper.from_array(np.array(info.min + 128, q_type), "z"),
             numpy_helper.from_array(np.array(1.0 / 255, np.float32), "gs"),
             numpy_helper.from_array(np.array(info.min, q_type), "gz"),
             numpy_helper.from_array(np.array(0.03, np.float32), "ys"),
             numpy_helper.from_array(np.array(info.min + 20, q_type), "yz")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             helper.make_node(activation, ["xd"], ["g"]),
             helper.make_node("QuantizeLinear", ["g", "gs", "gz"], ["gq"]),
             helper.make_node("DequantizeLinear", ["gq", "gs", "gz"], ["gd"]),
             helper.make_node("Mul", ["xd", "gd"], ["m"]),
             helper.make_node("QuantizeLinear", ["m", "ys", "yz"], ["mq"]),
             helper.make_node("DequantizeLinear", ["mq", "ys", "yz"], ["y"])]
    shape = [1, 8, 20, 20]
    path = save(tmp_path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits)
    ops = compiled_ops(path, tmp_path / "m.kiln")
    assert ops.get("kiln.Lookup8") == 1 and "kiln.QLinearMul" not in ops and "kiln.FusedElementwise" not in ops, ops
    x = rng.standard_normal(shape).astype(np.float32) * 3
    ours = steps_within_one(tmp_path / "m.kiln", path, x, step=0.03, exact_share=0.97)

    with_output(path, "gq", q_type, shape, tmp_path / "apart.onnx")
    ops = compiled_ops(tmp_path / "apart.onnx", tmp_path / "apart.kiln")
    assert ops.get("kiln.QLinearMul") == 1, ops
    np.testing.assert_array_equal(kiln.Runner(tmp_path / "apart.kiln").run({"x": x})["y"], ours)


@pytest.mark.parametrize("q_type", [np.uint8, np.int8])
def test_elementwise_work_reads_and_writes_8_bits(tmp_path, q_type):
    """DequantizeLinear and QuantizeLinear around float elementwise work fold
    into its fused step (passes/elementwise_fusion.h, quantized I/O): a SiLU
    gated by a per-channel 8-bit tensor (broadcast), and a lone Add of a
    float constant. No QuantizeLinear or DequantizeLinear step is left but
    the model's input and output ones."""
    info = np.iinfo(q_type)
    rng = np.random.default_rng(21)
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "s"),
             numpy_helper.from_array(np.array(info.min + 128, q_type), "z"),
             numpy_helper.from_array(np.array(0.02, np.float32), "gs"),
             numpy_helper.from_array(np.array(info.min + 3, q_type), "gz"),
             numpy_helper.from_array(np.array(0.04, np.float32), "ys"),
             numpy_helper.from_array(np.array(info.min + 100, q_type), "yz"),
             numpy_helper.from_array(rng.standard_normal((8, 1, 1)).astype(np.float32), "shift")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("QuantizeLinear", ["g", "gs", "gz"], ["gq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             helper.make_node("DequantizeLinear", ["gq", "gs", "gz"], ["gd"]),
             helper.make_node("Sigmoid", ["xd"], ["sig"]),
             helper.make_node("Mul", ["xd", "sig"], ["silu"]),
             helper.make_node("Mul", ["silu", "gd"], ["gated"]),
             helper.make_node("QuantizeLinear", ["gated", "ys", "yz"], ["gq2"]),
             helper.make_node("DequantizeLinear", ["gq2", "ys", "yz"], ["gd2"]),
             helper.make_node("Add", ["gd2", "shift"], ["added"]),
             helper.make_node("QuantizeLinear", ["added", "ys", "yz"], ["aq"]),
             helper.make_node("DequantizeLinear", ["aq", "ys", "yz"], ["y"])]
    path = save(tmp_path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 6, 6]),
                                  helper.make_tensor_value_info("g", TensorProto.FLOAT, [1, 8, 1, 1])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 6, 6])], inits)
    ops = compiled_ops(path, tmp_path / "m.kiln")
    assert ops.get("kiln.FusedElementwise") == 2, ops
    assert ops.get("QuantizeLinear") == 2 and ops.get("DequantizeLinear") == 1, ops  # the model's own ends
    feeds = {"x": rng.standard_normal((1, 8, 6, 6)).astype(np.float32) * 3,
             "g": rng.uniform(0, 2, (1, 8, 1, 1)).astype(np.float32)}
    ours = kiln.Runner(tmp_path / "m.kiln").run(feeds)["y"]
    want = onnxruntime_outputs(path, feeds)[0]
    steps = np.abs(ours - want) / 0.04
    assert steps.max() <= 1.01 and (steps < 0.5).mean() >= 0.99, (steps.max(), (steps < 0.5).mean())
