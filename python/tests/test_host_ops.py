"""Host callback ops: Python functions registered as ops (kiln.register_host_op)
that a model calls in the middle of its program, on the host executor, with
run-time shapes and on a sim device; their errors, and a process that has not
registered them (docs/plugins.md)."""

import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import kiln

CALLS = []


def soft_clip(x):
    CALLS.append(x.shape)
    return np.tanh(x) * 2


def split_sign(x, y):
    return np.maximum(x, 0) + y, np.minimum(x, 0).astype(np.float64)


kiln.register_host_op("com.app", "SoftClip", soft_clip)
kiln.register_host_op("com.app", "SplitSign", split_sign, inputs=2, outputs=2,
                      infer=lambda types: [types[0], (np.float64, types[0][1])])
kiln.register_host_op("com.app", "Broken", lambda x: 1 / 0)


def model(path, rows=3, op="SoftClip"):
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Mul", ["x", "x"], ["sq"]),
             helper.make_node(op, ["sq"], ["c"], domain="com.app"),
             helper.make_node("Add", ["c", "x"], ["out"])]
    graph = helper.make_graph(nodes, "host", [helper.make_tensor_value_info("x", f, [rows, 4])],
                              [helper.make_tensor_value_info("out", f, None)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.app", 1)]),
              path)


def test_a_host_function_runs_in_the_middle_of_the_program(tmp_path):
    model(tmp_path / "m.onnx")
    kiln.compile(tmp_path / "m.onnx", tmp_path / "m.kiln")
    runner = kiln.Runner(tmp_path / "m.kiln")
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    CALLS.clear()
    np.testing.assert_allclose(runner.run({"x": x})["out"], np.tanh(x * x) * 2 + x, rtol=1e-6)
    assert CALLS == [(3, 4)]


def test_two_inputs_two_outputs_and_an_inferred_dtype(tmp_path):
    f = TensorProto.FLOAT
    graph = helper.make_graph([helper.make_node("SplitSign", ["x", "y"], ["p", "n"], domain="com.app")], "split",
                              [helper.make_tensor_value_info("x", f, [5]), helper.make_tensor_value_info("y", f, [5])],
                              [helper.make_tensor_value_info("p", f, None),
                               helper.make_tensor_value_info("n", TensorProto.DOUBLE, None)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.app", 1)]),
              tmp_path / "s.onnx")
    kiln.compile(tmp_path / "s.onnx", tmp_path / "s.kiln")
    x = np.array([-2, -1, 0, 1, 2], np.float32)
    y = np.arange(5, dtype=np.float32)
    out = kiln.Runner(tmp_path / "s.kiln").run({"x": x, "y": y})
    np.testing.assert_array_equal(out["p"], np.maximum(x, 0) + y)
    assert out["n"].dtype == np.float64
    np.testing.assert_array_equal(out["n"], np.minimum(x, 0))


def test_host_functions_with_run_time_shapes_and_on_sim(monkeypatch, tmp_path):
    model(tmp_path / "d.onnx", rows="rows")
    kiln.compile(tmp_path / "d.onnx", tmp_path / "d.kiln", dynamic=True)
    runner = kiln.Runner(tmp_path / "d.kiln")
    for rows in (1, 6):
        x = np.random.default_rng(rows).standard_normal((rows, 4)).astype(np.float32)
        np.testing.assert_allclose(runner.run({"x": x})["out"], np.tanh(x * x) * 2 + x, rtol=1e-6)
    monkeypatch.setenv("KILN_SIM_DEVICES", "1")
    monkeypatch.setenv("KILN_DEVICE_LOCK_DIR", str(tmp_path / "locks"))
    model(tmp_path / "s.onnx")
    kiln.compile(tmp_path / "s.onnx", tmp_path / "s.kiln")
    x = np.random.default_rng(9).standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_allclose(kiln.Runner(tmp_path / "s.kiln", device="sim").run({"x": x})["out"],
                               np.tanh(x * x) * 2 + x, rtol=1e-6)


def test_a_raising_host_function_is_an_error_naming_the_op(tmp_path):
    model(tmp_path / "b.onnx", op="Broken")
    kiln.compile(tmp_path / "b.onnx", tmp_path / "b.kiln")
    with pytest.raises(kiln.Error, match=r"com\.app\.Broken \(plugin <host>\): compute failed: .*division by zero"):
        kiln.Runner(tmp_path / "b.kiln").run({"x": np.ones((3, 4), np.float32)})


def test_registering_a_name_twice_is_refused():
    with pytest.raises(kiln.Error, match="already registered"):
        kiln.register_host_op("com.app", "SoftClip", soft_clip)


def test_a_process_without_the_function_cannot_run_the_package(tmp_path):
    model(tmp_path / "m.onnx")
    kiln.compile(tmp_path / "m.onnx", tmp_path / "m.kiln")
    code = ("import kiln, numpy as np\n"
            f"kiln.Runner({str(tmp_path / 'm.kiln')!r}).run({{'x': np.ones((3, 4), np.float32)}})\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode != 0
    assert "calls host function com.app.SoftClip, which this process has not registered" in result.stderr


@pytest.mark.parametrize("ending", ["del runner", "pass"])
def test_a_failing_host_function_on_sim_neither_hangs_nor_aborts(tmp_path, ending):
    # A runner deleted (or left alive at exit) after its host function
    # failed: its threads, which call the function, must stop without the
    # GIL the deleting thread holds, and before the interpreter finalizes.
    model(tmp_path / "b.onnx", op="Broken")
    code = f"""
import os, numpy as np, kiln
os.environ["KILN_SIM_DEVICES"] = "1"
os.environ["KILN_DEVICE_LOCK_DIR"] = {str(tmp_path / "locks")!r}
kiln.register_host_op("com.app", "Broken", lambda x: 1 / 0)
kiln.compile({str(tmp_path / "b.onnx")!r}, {str(tmp_path / "b.kiln")!r})
runner = kiln.Runner({str(tmp_path / "b.kiln")!r}, device="sim")
for _ in range(4):
    try:
        runner.run({{"x": np.ones((3, 4), np.float32)}})
    except kiln.Error as e:
        assert "ZeroDivisionError" in str(e)
{ending}
print("done")
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "done"
    assert "terminate" not in result.stderr and "leaked" not in result.stderr
