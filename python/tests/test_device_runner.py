"""kiln.Runner(device=...): a package run on a device through a ModelRunner
(inputs copied to the device, outputs back): on sim everywhere, matching the
host executor; a cuda package takes the cuda device by default, which a
machine without a GPU refuses clearly, and which on a GPU matches the host
executor (itself checked against onnxruntime by the other tests). Needs no
onnxruntime, so that scripts/cuda-check can run it on a GPU machine with
the Python runtime scripts/cuda-bundle --python packs."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln


@pytest.fixture
def devices(monkeypatch, tmp_path):
    """One sim device, and lock files of this test's own."""
    monkeypatch.setenv("KILN_SIM_DEVICES", "1")
    monkeypatch.setenv("KILN_DEVICE_LOCK_DIR", str(tmp_path / "locks"))


@pytest.fixture
def block_onnx(tmp_path):
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "b"], ["z"]),
             helper.make_node("Gelu", ["z"], ["g"]), helper.make_node("Softmax", ["g"], ["y"], axis=-1)]
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 8
    path = tmp_path / "block.onnx"
    onnx.save(model, path)
    return path


def test_sim_runner_matches_the_host_executor(devices, block_onnx, tmp_path):
    kiln.compile(block_onnx, tmp_path / "block.kiln")
    x = np.random.default_rng(4).standard_normal((4, 8)).astype(np.float32)
    host = kiln.Runner(tmp_path / "block.kiln")
    assert host.device == "cpu"
    on_sim = kiln.Runner(tmp_path / "block.kiln", device="sim")
    assert on_sim.device == "sim" and on_sim.inputs == host.inputs and on_sim.outputs == host.outputs
    for _ in range(3):  # the same buffers again, as a serving loop would
        np.testing.assert_array_equal(on_sim.run({"x": x})["y"], host.run({"x": x})["y"])
    with pytest.raises(kiln.Error, match=r"input 'x' must have shape \(4, 8\)"):
        on_sim.run({"x": np.zeros((3, 8), np.float32)})
    with pytest.raises(kiln.Error, match="host executor"):
        on_sim.memory_stats()


def test_device_runners_take_static_packages_only(devices, block_onnx, tmp_path):
    model = onnx.load(block_onnx)  # the same block with a symbolic batch
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "n"
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "n"
    onnx.save(model, tmp_path / "dyn.onnx")
    kiln.compile(tmp_path / "dyn.onnx", tmp_path / "dyn.kiln", dynamic=True)
    kiln.compile(block_onnx, tmp_path / "block.kiln")
    # A package with run-time shapes runs on its target (here the host).
    with pytest.raises(kiln.Error, match="runs on its target, 'cpu'"):
        kiln.Runner(tmp_path / "dyn.kiln", device="sim")
    with pytest.raises(kiln.Error, match="without profile=True"):
        kiln.Runner(tmp_path / "block.kiln", device="sim", profile=True)
    with pytest.raises(kiln.Error, match="unknown device kind|device"):
        kiln.Runner(tmp_path / "block.kiln", device="tpu")


def test_a_cuda_package_runs_on_cuda(devices, block_onnx, tmp_path):
    report = kiln.compile(block_onnx, tmp_path / "block.kiln", target="cuda")
    assert report["steps"] >= 2
    x = np.random.default_rng(5).standard_normal((4, 8)).astype(np.float32)
    try:
        runner = kiln.Runner(tmp_path / "block.kiln")
    except kiln.Error as error:
        # No GPU here (or kiln built without CUDA): a clear refusal.
        assert re.search(r"no cuda device on this machine|this build of kiln has no CUDA device", str(error)), error
        pytest.skip(f"no GPU on this machine: {error}")
    assert runner.device == "cuda"
    kiln.compile(block_onnx, tmp_path / "host.kiln")
    theirs = kiln.Runner(tmp_path / "host.kiln").run({"x": x})["y"]
    for _ in range(3):  # the same buffers again: the captured CUDA graph replays
        np.testing.assert_allclose(runner.run({"x": x})["y"], theirs, rtol=1e-4, atol=1e-6)


_FAULTING_RUNS = """
import json, sys
import numpy as np
import kiln
runner = kiln.Runner(sys.argv[1])
x = np.load(sys.argv[2])
outcomes = []
for run in range(4):
    try:
        outcomes.append(runner.run({"x": x})["y"].tolist())
    except kiln.Error as error:
        outcomes.append(str(error))
print(json.dumps(outcomes))
"""


def test_an_illegal_address_leaves_the_gpu_to_a_new_process(devices, tmp_path):
    """A real illegal address (a kernel writing through a wild pointer after
    the third run's kernels: KILN_CUDA_ILLEGAL_ADDRESS) corrupts the CUDA
    context, which no reset in the process can bring back: that run and
    every later one fail with the restart-the-process action. A new process
    runs the model on the GPU at once (this one: the runs that fault are in
    a child, so that the later tests keep the GPU)."""
    rng = np.random.default_rng(6)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "c"),
             numpy_helper.from_array(rng.standard_normal((8, 5)).astype(np.float32), "m")]
    nodes = [helper.make_node("Conv", ["x", "w", "c"], ["h"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["h"], ["s"]), helper.make_node("Mul", ["h", "s"], ["a"]),
             helper.make_node("GlobalAveragePool", ["a"], ["p"]), helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("MatMul", ["f", "m"], ["y"])]
    graph = helper.make_graph(nodes, "convnet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "convnet.onnx")
    kiln.compile(tmp_path / "convnet.onnx", tmp_path / "convnet.kiln", target="cuda")
    kiln.compile(tmp_path / "convnet.onnx", tmp_path / "host.kiln")
    try:
        runner = kiln.Runner(tmp_path / "convnet.kiln")
    except kiln.Error as error:
        assert re.search(r"no cuda device on this machine|this build of kiln has no CUDA device", str(error)), error
        pytest.skip(f"no GPU on this machine: {error}")
    del runner  # the child attaches the GPU
    x = rng.standard_normal((2, 3, 16, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    theirs = kiln.Runner(tmp_path / "host.kiln").run({"x": x})["y"]
    child = subprocess.run([sys.executable, "-c", _FAULTING_RUNS, str(tmp_path / "convnet.kiln"), str(tmp_path / "x.npy")],
                           env=dict(os.environ, KILN_CUDA_ILLEGAL_ADDRESS="2"), capture_output=True, text=True,
                           timeout=120)
    assert child.returncode == 0, child.stderr
    outcomes = json.loads(child.stdout.strip().splitlines()[-1])
    for run in (0, 1):
        np.testing.assert_allclose(np.array(outcomes[run], np.float32), theirs, rtol=1e-4, atol=1e-5)
    # The stopped runner answers the later run with the same error.
    for run in (2, 3):
        assert "illegal memory access" in outcomes[run] and "restart the process" in outcomes[run], outcomes[run]
    # A new process (this one) uses the GPU at once.
    np.testing.assert_allclose(kiln.Runner(tmp_path / "convnet.kiln").run({"x": x})["y"], theirs, rtol=1e-4, atol=1e-5)


def test_a_cuda_package_with_run_time_shapes_runs_on_cuda(devices, block_onnx, tmp_path):
    model = onnx.load(block_onnx)  # the same block with a symbolic batch
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "n"
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "n"
    onnx.save(model, tmp_path / "dyn.onnx")
    kiln.compile(tmp_path / "dyn.onnx", tmp_path / "dyn.kiln", dynamic=True, target="cuda")
    try:
        runner = kiln.Runner(tmp_path / "dyn.kiln")
    except kiln.Error as error:
        assert re.search(r"no cuda device on this machine|this build of kiln has no CUDA device", str(error)), error
        pytest.skip(f"no GPU on this machine: {error}")
    assert runner.device == "cuda" and runner.dynamic
    kiln.compile(tmp_path / "dyn.onnx", tmp_path / "host.kiln", dynamic=True)
    host = kiln.Runner(tmp_path / "host.kiln")
    for batch in (1, 7, 1):
        x = np.random.default_rng(batch).standard_normal((batch, 8)).astype(np.float32)
        theirs = host.run({"x": x})["y"]
        np.testing.assert_allclose(runner.run({"x": x})["y"], theirs, rtol=1e-4, atol=1e-6)
    assert runner.memory_stats()["plan_cache_misses"] == 2


def test_fp16_is_a_cuda_compile_option(block_onnx, tmp_path):
    # f16 storage is for the cuda target; the package compiles without a GPU.
    plain = kiln.compile(block_onnx, tmp_path / "plain.kiln", target="cuda")
    half = kiln.compile(block_onnx, tmp_path / "half.kiln", target="cuda", fp16=True)
    # The weights travel as f16: half the constant bytes.
    assert half["constant_bytes"] < plain["constant_bytes"]
    with pytest.raises(kiln.Error, match=r"fp16 \(--fp16\) is for the cuda target"):
        kiln.compile(block_onnx, tmp_path / "cpu.kiln", fp16=True)
    brain = kiln.compile(block_onnx, tmp_path / "brain.kiln", target="cuda", bf16=True)
    assert brain["constant_bytes"] == half["constant_bytes"]
    # On the cpu target bf16 means bf16 products (test_bf16_cpu.py).
    kiln.compile(block_onnx, tmp_path / "cpu.kiln", bf16=True)
    with pytest.raises(kiln.Error, match="exclude each other"):
        kiln.compile(block_onnx, tmp_path / "both.kiln", target="cuda", fp16=True, bf16=True)
