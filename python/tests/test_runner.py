"""The kiln Python package: compile, Runner.run, errors; outputs checked
against onnxruntime on the same model and inputs."""

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln


@pytest.fixture
def mlp_onnx(tmp_path):
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((6, 5)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal(5).astype(np.float32), "b")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "b"], ["z"]),
             helper.make_node("Sigmoid", ["z"], ["y"]), helper.make_node("Relu", ["z"], ["r"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 5]),
                               helper.make_tensor_value_info("r", TensorProto.FLOAT, ["n", 5])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "mlp.onnx"
    onnx.save(model, path)
    return path


def test_compile_and_run_match_onnxruntime(mlp_onnx, tmp_path):
    report = kiln.compile(mlp_onnx, tmp_path / "mlp.kiln", batch=4)
    # MatMul and its bias Add are one fused step; Sigmoid and Relu read it.
    assert report["steps"] == 3 and report["arena_bytes"] >= report["lower_bound_bytes"]
    runner = kiln.Runner(tmp_path / "mlp.kiln")
    assert runner.inputs == [("x", (4, 6), "f32")]
    assert [name for name, _, _ in runner.outputs] == ["y", "r"]
    x = np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32)
    ours = runner.run({"x": x})
    theirs = ort.InferenceSession(str(mlp_onnx)).run(None, {"x": x})
    np.testing.assert_allclose(ours["y"], theirs[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ours["r"], theirs[1], rtol=1e-5, atol=1e-6)
    # A strided view is accepted (copied once); results are the same.
    wide = np.zeros((4, 12), np.float32)
    wide[:, ::2] = x
    np.testing.assert_array_equal(runner.run({"x": wide[:, ::2]})["y"], ours["y"])


def test_shapes_option(mlp_onnx, tmp_path):
    kiln.compile(mlp_onnx, tmp_path / "m.kiln", shapes={"x": [2, 6]})
    assert kiln.Runner(tmp_path / "m.kiln").inputs == [("x", (2, 6), "f32")]


def test_bad_inputs_raise_clear_errors(mlp_onnx, tmp_path):
    kiln.compile(mlp_onnx, tmp_path / "m.kiln", batch=2)
    runner = kiln.Runner(tmp_path / "m.kiln")
    with pytest.raises(kiln.Error, match=r"input 'x' must be float32, got float64"):
        runner.run({"x": np.zeros((2, 6))})
    with pytest.raises(kiln.Error, match=r"input 'x' must have shape \(2, 6\), got \(3, 6\)"):
        runner.run({"x": np.zeros((3, 6), np.float32)})
    with pytest.raises(kiln.Error, match=r"unknown \['y'\], missing \['x'\]"):
        runner.run({"y": np.zeros((2, 6), np.float32)})


def test_compile_errors_are_kiln_errors(mlp_onnx, tmp_path):
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    with pytest.raises(kiln.Error, match="not a valid ONNX model"):
        kiln.compile(tmp_path / "junk.onnx", tmp_path / "m.kiln")
    with pytest.raises(kiln.Error):
        kiln.Runner(tmp_path / "does-not-exist.kiln")


def test_an_unfixed_dimension_is_fixed_at_run_time_with_a_warning(mlp_onnx, tmp_path):
    with pytest.warns(UserWarning, match="input 'x' dimension 0 \\('n'\\) is not fixed: shapes are fixed at run time"):
        report = kiln.compile(mlp_onnx, tmp_path / "m.kiln")
    assert report["runtime_shapes"] and report["unfixed_input"] == "input 'x' dimension 0 ('n')"
    runner = kiln.Runner(tmp_path / "m.kiln")
    session = ort.InferenceSession(str(mlp_onnx))
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 6)).astype(np.float32)
        ours = runner.run({"x": x})
        for name, theirs in zip(("y", "r"), session.run(None, {"x": x})):
            np.testing.assert_allclose(ours[name], theirs, rtol=1e-5, atol=1e-6)
    # dynamic=True asks for it: no warning; shapes= makes a static package.
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert kiln.compile(mlp_onnx, tmp_path / "m.kiln", dynamic=True)["unfixed_input"] == ""
        assert not kiln.compile(mlp_onnx, tmp_path / "m.kiln", shapes={"x": [2, 6]})["runtime_shapes"]


THREAD_PROBE = """
import os, sys
import os

import numpy as np
import kiln
before = len(os.listdir("/proc/self/task"))
runner = kiln.Runner(sys.argv[1], threads=int(sys.argv[2]))
x = np.ones((64, 6), np.float32)
for _ in range(3):
    runner.run({"x": x})
print(len(os.listdir("/proc/self/task")) - before)
"""


@pytest.mark.parametrize("threads", [1, 3])
def test_runner_threads_sets_the_kernel_thread_count(mlp_onnx, tmp_path, threads):
    # A fresh process per count: OpenMP starts its worker threads on the
    # first parallel run, as many as the Runner asks for less the calling
    # thread, and keeps them.
    import subprocess
    import sys
    kiln.compile(mlp_onnx, tmp_path / "mlp.kiln", batch=64)
    env = dict(os.environ, OMP_NUM_THREADS="2")
    result = subprocess.run([sys.executable, "-c", THREAD_PROBE, str(tmp_path / "mlp.kiln"), str(threads)],
                            capture_output=True, text=True, env=env, check=True)
    assert int(result.stdout.strip()) == threads - 1


def test_runner_refuses_negative_threads(mlp_onnx, tmp_path):
    kiln.compile(mlp_onnx, tmp_path / "mlp.kiln", batch=2)
    with pytest.raises(kiln.Error, match="threads"):
        kiln.Runner(tmp_path / "mlp.kiln", threads=-1)


def test_float8_inputs_and_outputs_travel_as_ml_dtypes(tmp_path):
    # x (f8e4m3) -> DequantizeLinear -> f32, and f32 -> QuantizeLinear -> f8e5m2.
    ml_dtypes = pytest.importorskip("ml_dtypes")
    nodes = [helper.make_node("DequantizeLinear", ["x", "scale"], ["y"]),
             helper.make_node("QuantizeLinear", ["y", "scale", "zero"], ["q"])]
    inits = [numpy_helper.from_array(np.array(0.5, np.float32), "scale"),
             numpy_helper.from_array(np.zeros(1, ml_dtypes.float8_e5m2), "zero")]
    graph = helper.make_graph(nodes, "f8", [helper.make_tensor_value_info("x", TensorProto.FLOAT8E4M3FN, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4]),
                               helper.make_tensor_value_info("q", TensorProto.FLOAT8E5M2, [4])], inits)
    path = tmp_path / "f8.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), path)
    kiln.compile(path, tmp_path / "f8.kiln")
    x = np.array([1.0, -3.0, 448.0, 0.0625], ml_dtypes.float8_e4m3fn)
    outputs = kiln.Runner(tmp_path / "f8.kiln").run({"x": x})
    np.testing.assert_array_equal(outputs["y"], x.astype(np.float32) * 0.5)
    assert outputs["q"].dtype == ml_dtypes.float8_e5m2
    np.testing.assert_array_equal(outputs["q"].astype(np.float32), x.astype(np.float32))
