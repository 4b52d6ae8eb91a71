"""What real exported models do that hand-written ones rarely do: If
branches that give different shapes (chosen by a configuration input such as
a sample rate), values typed with an empty type, and shapes unknown until
run time. kiln must compile them without --dynamic and match onnxruntime."""

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import kiln

F = TensorProto.FLOAT


def sample_rate_switch(path):
    """y = x framed in windows of 4 (sr == 16000) or 2 (otherwise): the two
    branches give [2, 4] and [4, 2] from an [8] input."""
    def branch(name, window):
        shape = numpy_helper.from_array(np.array([-1, window], np.int64), f"{name}_shape")
        scale = numpy_helper.from_array(np.array(float(window), np.float32), f"{name}_scale")
        nodes = [helper.make_node("Reshape", ["x", f"{name}_shape"], [f"{name}_framed"]),
                 helper.make_node("Mul", [f"{name}_framed", f"{name}_scale"], [f"{name}_out"])]
        # The exporter's habit: an output typed with an empty TypeProto.
        out = onnx.ValueInfoProto(name=f"{name}_out")
        out.type.SetInParent()
        return helper.make_graph(nodes, name, [], [out], [shape, scale])

    rate = numpy_helper.from_array(np.array(16000, np.int64), "rate16k")
    nodes = [helper.make_node("Equal", ["sr", "rate16k"], ["is16k"]),
             helper.make_node("If", ["is16k"], ["framed"], then_branch=branch("wide", 4),
                              else_branch=branch("narrow", 2)),
             helper.make_node("Relu", ["framed"], ["y"])]
    graph = helper.make_graph(nodes, "switch", [helper.make_tensor_value_info("x", F, [8]),
                                                helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
                              [helper.make_tensor_value_info("y", F, None)], [rate])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_if_branches_of_different_shapes_follow_the_condition(tmp_path):
    path = sample_rate_switch(tmp_path / "switch.onnx")
    report = kiln.compile(path, tmp_path / "switch.kiln")  # no dynamic=True: kiln finds out by itself
    assert report["runtime_shapes"]
    assert "If" in report["runtime_shapes_reason"]
    runner = kiln.Runner(tmp_path / "switch.kiln")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = np.linspace(-1, 1, 8, dtype=np.float32)
    for sr, shape in ((16000, (2, 4)), (8000, (4, 2)), (16000, (2, 4))):
        feeds = {"x": x, "sr": np.array(sr, np.int64)}
        ours = runner.run(feeds)["y"]
        expected = session.run(None, feeds)[0]
        assert ours.shape == shape
        np.testing.assert_allclose(ours, expected, rtol=1e-6)
    # The sample rate is part of the signature: one plan per rate, reused.
    stats = runner.memory_stats()
    assert stats["plan_cache_misses"] == 2 and stats["plan_cache_hits"] == 1


def test_constant_condition_is_inlined_into_a_static_program(tmp_path):
    """With the condition an initializer, the If disappears: the package is
    a static step program whatever the other branch's shape."""
    path = sample_rate_switch(tmp_path / "switch.onnx")
    model = onnx.load(path)
    model.graph.input.pop()  # sr becomes a constant
    model.graph.initializer.append(numpy_helper.from_array(np.array(8000, np.int64), "sr"))
    onnx.save(model, tmp_path / "fixed.onnx")
    report = kiln.compile(tmp_path / "fixed.onnx", tmp_path / "fixed.kiln")
    assert not report["runtime_shapes"]
    runner = kiln.Runner(tmp_path / "fixed.kiln")
    assert runner.outputs[0][1] == (4, 2)
    x = np.linspace(-1, 1, 8, dtype=np.float32)
    expected = ort.InferenceSession(str(tmp_path / "fixed.onnx"), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    np.testing.assert_allclose(runner.run({"x": x})["y"], expected, rtol=1e-6)


def count_then_slice(path):
    """y = x[:count] * 2 with count = the number of positive elements of x: a
    shape that depends on a value the model computes, which no input
    signature fixes (as a Loop's step count does after the Loop)."""
    nodes = [helper.make_node("Greater", ["x", "zero"], ["positive"]),
             helper.make_node("Cast", ["positive"], ["ones"], to=TensorProto.INT64),
             helper.make_node("ReduceSum", ["ones", "axes"], ["count"], keepdims=1),
             helper.make_node("Slice", ["x", "start", "count"], ["head"]),
             helper.make_node("Mul", ["head", "two"], ["y"]),
             helper.make_node("Relu", ["x"], ["r"])]
    inits = [numpy_helper.from_array(np.array(0, np.float32), "zero"),
             numpy_helper.from_array(np.array([0], np.int64), "axes"),
             numpy_helper.from_array(np.array([0], np.int64), "start"),
             numpy_helper.from_array(np.array(2, np.float32), "two")]
    # 100 elements: data, not a shape input (those hold at most 64).
    graph = helper.make_graph(nodes, "count", [helper.make_tensor_value_info("x", F, [100])],
                              [helper.make_tensor_value_info("y", F, None), helper.make_tensor_value_info("r", F, [100])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_shapes_computed_from_values_run_in_stages(tmp_path):
    path = count_then_slice(tmp_path / "count.onnx")
    report = kiln.compile(path, tmp_path / "count.kiln")
    assert report["runtime_shapes"] and "Slice" in report["runtime_shapes_reason"]
    runner = kiln.Runner(tmp_path / "count.kiln")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    for shift in (0.0, -9.0, 9.0, 0.0, 0.5):
        x = (rng.standard_normal(100) + shift).astype(np.float32)  # about 50, 0, 100, 50, 70 positive
        ours = runner.run({"x": x})
        y, r = session.run(None, {"x": x})
        assert ours["y"].shape == y.shape
        np.testing.assert_array_equal(ours["y"], y)
        np.testing.assert_array_equal(ours["r"], r)
    # One plan for the first stage; the rest is specialized per count.
    assert runner.memory_stats()["plan_cache_misses"] == 1


def test_staged_model_from_the_command_line(tmp_path):
    import pathlib
    import subprocess
    root = pathlib.Path(__file__).resolve().parents[2]
    binary = root / "build" / "release" / "tools" / "kiln"
    path = count_then_slice(tmp_path / "count.onnx")
    subprocess.run([binary, "compile", path, "-o", tmp_path / "count.kiln"], check=True, capture_output=True)
    x = np.linspace(-1, 1, 100, dtype=np.float32)[::-1].copy()  # 50 positive, first
    np.save(tmp_path / "x.npy", x)
    subprocess.run([binary, "run", tmp_path / "count.kiln", "--input", f"x={tmp_path / 'x.npy'}", "--output-dir",
                    tmp_path / "out"], check=True, capture_output=True)
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "y.npy"), x[:50] * 2)
    bench = subprocess.run([binary, "bench", tmp_path / "count.kiln", "--input", f"x={tmp_path / 'x.npy'}",
                            "--iterations", "5"], capture_output=True, text=True)
    assert bench.returncode == 0, bench.stderr
