"""Plugin libraries from Python: kiln.load_plugin, kiln.compile(...,
plugins=[...]), and kiln.Runner on the host, with run-time shapes and on a
sim device, against numpy references (docs/plugins.md)."""

import pathlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import kiln

BUILD = pathlib.Path(kiln.__file__).resolve().parents[2]
EXAMPLE = BUILD / "examples" / "libkiln_example_ops.so"
FUTURE = BUILD / "tests" / "plugins" / "libkiln_test_plugin_future.so"


def model(path, rows):
    """out = SerializedMatMul(BlockScale(swish(relu(x')) + y'), w) with (x', y') = Rotate(x, y, a); BlockScale
    multiplies by 0.5 with its input laid out by its allocator hook (1024-byte aligned, padded to blocks of 16)."""
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Rotate", ["x", "y", "a"], ["xr", "yr"], domain="com.example"),
             helper.make_node("Relu", ["xr"], ["relu0"]),
             helper.make_node("Swish", ["relu0"], ["relu"], domain="com.example", beta=2.0),
             helper.make_node("AddInPlace", ["relu", "yr"], ["sum"], domain="com.example"),
             helper.make_node("BlockScale", ["sum"], ["half"], domain="com.example", factor=0.5, alignment=1024),
             helper.make_node("SerializedMatMul", ["half", "w"], ["out"], domain="com.example",
                              serialization_factor=3)]
    graph = helper.make_graph(
        nodes, "plugins",
        [helper.make_tensor_value_info(n, f, [rows, 6]) for n in ("x", "y", "a")] +
        [helper.make_tensor_value_info("w", f, [6, 5])],
        [helper.make_tensor_value_info("out", f, None)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                      helper.make_opsetid("com.example", 1)]), path)


def feeds(rows, seed):
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((rows, 6), np.float32), "y": rng.standard_normal((rows, 6), np.float32),
            "a": rng.standard_normal((rows, 6), np.float32), "w": rng.standard_normal((6, 5), np.float32)}


def reference(f):
    c, s = np.cos(f["a"]), np.sin(f["a"])
    xr, yr = f["x"] * c - f["y"] * s, f["x"] * s + f["y"] * c
    relu = np.maximum(xr, 0)
    return (0.5 * (relu / (1 + np.exp(-2.0 * relu)) + yr)) @ f["w"]


def test_load_plugin_describes_the_library():
    plugin = kiln.load_plugin(EXAMPLE)
    assert plugin["name"] == "libkiln_example_ops.so"
    assert plugin["api_level"] == 2 and len(plugin["hash"]) == 16
    assert plugin["ops"] == ["com.example.Rotate", "com.example.RotateGrad", "com.example.AddInPlace",
                             "com.example.SerializedMatMul", "com.example.SerializedMatMulGrad",
                             "com.example.BlockScale", "com.example.BlockScaleInPlace", "com.example.Swish"]


def test_load_plugin_errors():
    with pytest.raises(kiln.Error, match="not found"):
        kiln.load_plugin("/nonexistent/libnothing.so")
    if FUTURE.exists():
        with pytest.raises(kiln.Error, match="needs plugin API level 3; this kiln has level 2"):
            kiln.load_plugin(FUTURE)


def test_compiled_plugin_model_matches_numpy(tmp_path):
    model(tmp_path / "m.onnx", 4)
    report = kiln.compile(tmp_path / "m.onnx", tmp_path / "m.kiln", plugins=[EXAMPLE])
    assert report["step_kernels"]["kiln.Plugin"] == 4
    runner = kiln.Runner(tmp_path / "m.kiln")
    for seed in range(3):
        f = feeds(4, seed)
        np.testing.assert_allclose(runner.run(f)["out"], reference(f), rtol=1e-5, atol=1e-5)


def test_plugin_model_with_run_time_shapes(tmp_path):
    model(tmp_path / "m.onnx", "rows")
    report = kiln.compile(tmp_path / "m.onnx", tmp_path / "m.kiln", dynamic=True, plugins=[EXAMPLE])
    assert report["runtime_shapes"]
    runner = kiln.Runner(tmp_path / "m.kiln")
    for rows in (1, 5, 9):
        f = feeds(rows, rows)
        np.testing.assert_allclose(runner.run(f)["out"], reference(f), rtol=1e-5, atol=1e-5)


def test_plugin_model_on_a_sim_device(monkeypatch, tmp_path):
    monkeypatch.setenv("KILN_SIM_DEVICES", "1")
    monkeypatch.setenv("KILN_DEVICE_LOCK_DIR", str(tmp_path / "locks"))
    model(tmp_path / "m.onnx", 4)
    kiln.compile(tmp_path / "m.onnx", tmp_path / "m.kiln", plugins=[EXAMPLE])
    runner = kiln.Runner(tmp_path / "m.kiln", device="sim")
    f = feeds(4, 11)
    np.testing.assert_allclose(runner.run(f)["out"], reference(f), rtol=1e-5, atol=1e-5)


def test_allocator_hook_inside_a_loop_body(tmp_path):
    """BlockScale in a Loop's body: the body's values are planned in the loop step's workspace, which is then
    aligned for the most aligned of them (2048 bytes here); three rounds scale the carried value by 2^3."""
    f = TensorProto.FLOAT
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Relu", ["v_in"], ["r"]),
         helper.make_node("BlockScale", ["r"], ["v_out"], domain="com.example", alignment=2048, block=8)],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", f, [3, 5])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", f, [3, 5])])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["n", "cond", "x"], ["y"], body=body)], "loop",
        [helper.make_tensor_value_info("x", f, [3, 5])], [helper.make_tensor_value_info("y", f, [3, 5])],
        [helper.make_tensor("n", TensorProto.INT64, [], [3]), helper.make_tensor("cond", TensorProto.BOOL, [], [True])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                      helper.make_opsetid("com.example", 1)]), tmp_path / "l.onnx")
    kiln.compile(tmp_path / "l.onnx", tmp_path / "l.kiln", plugins=[EXAMPLE])
    x = np.random.default_rng(3).standard_normal((3, 5), np.float32)
    np.testing.assert_allclose(kiln.Runner(tmp_path / "l.kiln").run({"x": x})["y"], 8 * np.maximum(x, 0), rtol=1e-6)
