"""Chrome traces: Runner(profile=True) records one event per step and per
run, in the trace event format that chrome://tracing and Perfetto open; so
does `kiln bench --trace` (tests/cli). A zoo model is traced when the zoo
cache has it (bench/zoo)."""

import json
import os
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench", "zoo"))

import zoo  # noqa: E402


def check_trace(trace, runs):
    """Every event is a complete event with the fields the format needs; one
    'run' event per run encloses its steps."""
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert all({"name", "cat", "ts", "dur", "pid", "tid"} <= e.keys() for e in events)
    run_events = [e for e in events if e["cat"] == "run"]
    steps = [e for e in events if e["cat"] == "step"]
    assert len(run_events) == runs
    assert len(steps) == runs * run_events[0]["args"]["steps"]
    for run in run_events:
        inside = [s for s in steps if run["ts"] <= s["ts"] and s["ts"] + s["dur"] <= run["ts"] + run["dur"] + 1e-3]
        assert len(inside) == run["args"]["steps"]
    for step in steps:
        assert step["dur"] >= 0 and step["args"]["op"] == step["name"]
        assert all(isinstance(shape, str) for shape in step["args"]["inputs"] + step["args"]["outputs"])
    return steps


def test_runner_profile_gives_a_chrome_trace(tmp_path):
    w = numpy_helper.from_array(np.ones((4, 8), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Softmax", ["m"], ["y"])],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    kiln.compile(tmp_path / "m.onnx", tmp_path / "m.kiln")
    runner = kiln.Runner(tmp_path / "m.kiln", profile=True)
    for _ in range(3):
        runner.run({"x": np.ones((2, 4), np.float32)})
    steps = check_trace(runner.trace(), 3)
    assert {s["args"]["outputs"][0] for s in steps} == {"f32[2,8]"}
    runner.save_trace(tmp_path / "trace.json")
    assert json.load(open(tmp_path / "trace.json")) == runner.trace()
    runner.clear_trace()
    assert [e for e in runner.trace()["traceEvents"] if e["ph"] == "X"] == []
    with pytest.raises(kiln.Error, match="profile=True"):
        kiln.Runner(tmp_path / "m.kiln").trace()


@pytest.mark.parametrize("model_id", ["ppocr_cls", "silero_vad"])
def test_trace_of_a_zoo_model(tmp_path, model_id):
    entry = next(e for e in zoo.load_manifest() if e["id"] == model_id)
    if not zoo.cached(entry):
        pytest.skip(f"zoo model {model_id} is not in the cache (bench/zoo/zoo.py fetch)")
    inputs = zoo.make_inputs(entry, 1)
    kiln.compile(zoo.model_path(entry), tmp_path / "m.kiln", shapes={n: list(a.shape) for n, a in inputs.items()})
    runner = kiln.Runner(tmp_path / "m.kiln", profile=True)
    runner.run(inputs)
    runner.run(inputs)
    runner.save_trace(tmp_path / "trace.json")
    steps = check_trace(json.load(open(tmp_path / "trace.json")), 2)
    assert len(steps) >= 10
