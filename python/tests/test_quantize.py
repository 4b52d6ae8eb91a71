"""kiln.quantize: post-training quantization with kiln's own calibration
(python/kiln/quantize.py). A small CNN (3x3 and depthwise convolutions,
ReLU and ReLU6, a residual Add, a classifier MatMul) is quantized from
calibration samples by each method; the QDQ model runs in int8 through
kiln (every Conv an int8 step), agrees with the f32 model, and the report
names every quantized value with its error."""

import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.quantize import load_calibration, quantize

SHAPE = (1, 3, 24, 24)


def cnn(path):
    rng = np.random.default_rng(0)

    def weights(name, shape, gain=2.0):
        fan_in = int(np.prod(shape[1:]))
        return numpy_helper.from_array((rng.standard_normal(shape) * np.sqrt(gain / fan_in)).astype(np.float32), name)

    def bias(name, n):
        return numpy_helper.from_array((rng.standard_normal(n) * 0.1).astype(np.float32), name)

    inits = [weights("w1", (16, 3, 3, 3)), bias("b1", 16), weights("w2", (16, 1, 3, 3)), bias("b2", 16),
             weights("w3", (16, 16, 1, 1)), bias("b3", 16), weights("fc", (16, 10), 1.0),
             numpy_helper.from_array(np.array(0, np.float32), "zero"),
             numpy_helper.from_array(np.array(6, np.float32), "six"),
             numpy_helper.from_array(np.array([1, 16], np.int64), "flat")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], group=16, name="conv2"),
             helper.make_node("Clip", ["c2", "zero", "six"], ["r2"], name="relu6"),
             helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"], name="conv3"),
             helper.make_node("Add", ["c3", "r1"], ["res"], name="residual"),
             helper.make_node("GlobalAveragePool", ["res"], ["g"], name="pool"),
             helper.make_node("Reshape", ["g", "flat"], ["f"], name="flatten"),
             helper.make_node("MatMul", ["f", "fc"], ["y"], name="classifier")]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(SHAPE))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)


@pytest.fixture
def model_and_data(tmp_path):
    cnn(tmp_path / "f32.onnx")
    calibration = tmp_path / "calibration"
    calibration.mkdir()
    rng = np.random.default_rng(1)
    for i in range(16):
        np.save(calibration / f"{i:02d}.npy", rng.standard_normal(SHAPE).astype(np.float32))
    return tmp_path / "f32.onnx", calibration


def agreement(tmp_path, f32_path, int8_path, count=40):
    kiln.compile(f32_path, tmp_path / "f32.kiln")
    report = kiln.compile(int8_path, tmp_path / "int8.kiln")
    f32, int8 = kiln.Runner(tmp_path / "f32.kiln"), kiln.Runner(tmp_path / "int8.kiln")
    rng = np.random.default_rng(99)  # held out: not the calibration samples
    same, errors = 0, []
    for _ in range(count):
        x = rng.standard_normal(SHAPE).astype(np.float32)
        a, b = f32.run({"x": x})["y"], int8.run({"x": x})["y"]
        same += int(a.argmax() == b.argmax())
        errors.append(np.abs(a - b).max() / np.abs(a).max())
    return same / count, max(errors), report["step_kernels"]


@pytest.mark.parametrize("method", ["minmax", "percentile", "entropy"])
def test_every_method_quantizes_the_cnn(tmp_path, model_and_data, method):
    f32_path, calibration = model_and_data
    report = quantize(f32_path, calibration, tmp_path / "int8.onnx", method=method)
    assert report.quantized_nodes == ["conv1", "conv2", "conv3", "residual", "classifier"]
    top1, error, kernels = agreement(tmp_path, f32_path, tmp_path / "int8.onnx")
    # Every Conv runs in int8: the Relu and the ReLU6 fold into them.
    assert kernels.get("kiln.NhwcQLinearConv") == 3, kernels
    # The residual Add is conv3's sum post-op (passes/conv_fusion.h).
    assert kernels.get("QLinearMatMul") == 1 and "kiln.QLinearAdd" not in kernels, kernels
    assert top1 >= 0.95, top1
    assert error < 0.1, error
    values = [layer.value for layer in report.layers]
    assert values == ["x", "r1", "r2", "c3", "res", "f", "y"], values
    # (entropy once fell to 0.13 here: the zeros of a ReLU's output pulled its threshold down)
    bound = 0.05
    assert all(np.isfinite(layer.relative_error) and layer.relative_error < bound for layer in report.layers), \
        report.table()
    assert 0 < report.outputs["y"] < 0.1
    assert "relu6" in report.table() and "output y" in report.table()


def test_methods_differ_where_outliers_are(tmp_path, model_and_data):
    f32_path, calibration = model_and_data
    outlier = np.random.default_rng(5).standard_normal(SHAPE).astype(np.float32)
    outlier[0, 0, 0, :2] = 40.0  # two extreme values among 29,000
    np.save(calibration / "99_outlier.npy", outlier)
    ranges = {}
    for method in ("minmax", "percentile", "entropy"):
        quantize(f32_path, calibration, tmp_path / f"{method}.onnx", method=method, report=False)
        model = onnx.load(tmp_path / f"{method}.onnx")
        scale = next(i for i in model.graph.initializer if i.name == "x/scale")
        ranges[method] = float(numpy_helper.to_array(scale)) * 255
    # minmax covers the outlier (40 against values of a few units); the other two clip it.
    assert ranges["minmax"] >= 40, ranges
    assert ranges["percentile"] < ranges["minmax"] / 2, ranges
    assert ranges["entropy"] < ranges["minmax"] / 2, ranges


def test_constant_nodes_are_weights_and_the_logits_keep_their_range(tmp_path):
    """Exporters such as paddle2onnx give weights and a hard-swish's 3 and 6
    as Constant nodes: they become initializers (the Conv is quantized with
    int8 weights, the constants are not calibrated as activations: entropy
    once clipped the scalar 3 to 0.19 and broke every hard-swish of a
    PP-LCNet). The logits, which reach the output with no quantized node
    between, keep their whole range under entropy calibration."""
    rng = np.random.default_rng(3)

    def constant(name, array):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array.astype(np.float32), name))

    nodes = [constant("w", rng.standard_normal((8, 3, 3, 3)) * 0.4), constant("three", np.array(3.0)),
             constant("six", np.array(6.0)), constant("fc", rng.standard_normal((8, 2)) * 4),
             helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Add", ["c", "three"], ["c3"]),
             helper.make_node("Clip", ["c3"], ["clipped"], min=0.0, max=6.0),
             helper.make_node("Mul", ["c", "clipped"], ["m"]),
             helper.make_node("Div", ["m", "six"], ["hs"]),
             helper.make_node("GlobalAveragePool", ["hs"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("MatMul", ["f", "fc"], ["y"], name="logits")]
    graph = helper.make_graph(nodes, "hs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "f32.onnx")
    calibration = tmp_path / "calibration"
    calibration.mkdir()
    for i in range(16):
        np.save(calibration / f"{i:02d}.npy", rng.standard_normal((1, 3, 12, 12)).astype(np.float32) * (1 + i % 4))
    report = quantize(tmp_path / "f32.onnx", calibration, tmp_path / "int8.onnx", method="entropy")
    assert report.quantized_nodes == ["conv", "logits"], report.quantized_nodes
    quantized = onnx.load(tmp_path / "int8.onnx")
    assert not [n for n in quantized.graph.node if n.op_type == "Constant"]
    assert all(layer.value not in ("three", "six") for layer in report.layers)
    kiln.compile(tmp_path / "f32.onnx", tmp_path / "f32.kiln")
    kiln.compile(tmp_path / "int8.onnx", tmp_path / "int8.kiln")
    f32, int8 = kiln.Runner(tmp_path / "f32.kiln"), kiln.Runner(tmp_path / "int8.kiln")
    largest = max(np.abs(f32.run({"x": np.load(p)})["y"]).max() for p in sorted(calibration.iterdir()))
    scale = next(i for i in quantized.graph.initializer if i.name == "y/scale")
    assert float(numpy_helper.to_array(scale)) * 255 >= largest * 0.999  # the logits' range, unclipped
    # Which values count as the head: the logits, not the convolution's output.
    from kiln.quantize import _head_values, _plan, constants_to_initializers
    model = onnx.load(tmp_path / "f32.onnx")
    constants_to_initializers(model)
    assert _head_values(model, _plan(model, set(), set()), ["x", "c", "f", "y"]) == {"y"}
    held_out = [rng.standard_normal((1, 3, 12, 12)).astype(np.float32) * 2 for _ in range(40)]
    same = sum(int(f32.run({"x": x})["y"].argmax() == int8.run({"x": x})["y"].argmax()) for x in held_out)
    assert same >= 38, same


def test_entropy_never_clips_inside_the_99_9th_percentile():
    """A hard-swish's output: most values small, 0.5% spread up to 8. The
    divergence alone puts the threshold near the bulk (it cut PP-OCR's
    recognizer to 41% top-1 agreement); the floor keeps the 99.9th
    percentile inside the range, and the rarest outliers still outside."""
    from kiln.quantize import _Histogram, _entropy_threshold, activation_range
    rng = np.random.default_rng(8)
    values = np.concatenate([rng.uniform(-0.03, 0.5, 99_500), rng.uniform(0.5, 8.0, 500)]).astype(np.float32)
    histogram = _Histogram()
    histogram.add(values)
    unfloored = _entropy_threshold(histogram.counts, histogram.edge, 128)
    low, high = activation_range(histogram, "entropy", 99.99)
    floor = float(np.percentile(np.abs(values), 99.9))
    assert unfloored < floor  # what the floor is for
    assert floor <= high < values.max() and low == pytest.approx(values.min())


def test_excluded_nodes_and_op_types_stay_float(tmp_path, model_and_data):
    f32_path, calibration = model_and_data
    report = quantize(f32_path, calibration, tmp_path / "int8.onnx", exclude_nodes=["conv2"], exclude_op_types=["Add"],
                      report=False)
    assert report.quantized_nodes == ["conv1", "conv3", "classifier"]
    _, error, kernels = agreement(tmp_path, f32_path, tmp_path / "int8.onnx", count=5)
    assert kernels.get("kiln.NhwcQLinearConv") == 2 and "kiln.QLinearAdd" not in kernels, kernels
    assert error < 0.1


def test_bad_calibration_data_is_refused(tmp_path, model_and_data):
    f32_path, calibration = model_and_data
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no .npy or .npz files"):
        quantize(f32_path, empty, tmp_path / "out.onnx")
    np.save(calibration / "zz.npy", np.zeros((1, 3, 8, 8), np.float32))
    with pytest.raises(ValueError, match="every sample must have the same shapes"):
        load_calibration(str(calibration), ["x"])
    with pytest.raises(ValueError, match="use .npz files"):
        load_calibration(str(calibration), ["x", "mask"])
    with pytest.raises(ValueError, match="method 'kl'"):
        quantize(f32_path, calibration, tmp_path / "out.onnx", method="kl")
    assert not (tmp_path / "out.onnx").exists()


def test_command_line(tmp_path, model_and_data):
    f32_path, calibration = model_and_data
    done = subprocess.run([sys.executable, "-m", "kiln.quantize", str(f32_path), "--calibration", str(calibration),
                           "-o", str(tmp_path / "cli.onnx"), "--method", "percentile"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "quantized 5 nodes (percentile calibration)" in done.stdout and (tmp_path / "cli.onnx").exists()
    refused = subprocess.run([sys.executable, "-m", "kiln.quantize", str(f32_path), "--calibration",
                              str(tmp_path / "nowhere"), "-o", str(tmp_path / "x.onnx")],
                             capture_output=True, text=True, timeout=300)
    assert refused.returncode == 1 and "kiln.quantize: error:" in refused.stderr
