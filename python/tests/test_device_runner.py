"""kiln.Runner(device=...): a package run on a device through a ModelRunner
(inputs copied to the device, outputs back): on sim everywhere, matching the
host executor; a cuda package takes the cuda device by default, which a
machine without a GPU refuses clearly, and which on a GPU matches the host
executor (itself checked against onnxruntime by the other tests). Needs no
onnxruntime, so that scripts/cuda-check can run it on a GPU machine with
the Python runtime scripts/cuda-bundle --python packs."""

import re

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
    with pytest.raises(kiln.Error, match=r"bf16 \(--bf16\) is for the cuda target"):
        kiln.compile(block_onnx, tmp_path / "cpu.kiln", bf16=True)
    with pytest.raises(kiln.Error, match="exclude each other"):
        kiln.compile(block_onnx, tmp_path / "both.kiln", target="cuda", fp16=True, bf16=True)
