"""`kiln compile` and `kiln run` on ONNX models built with the onnx package,
checked against onnxruntime run on the same model and inputs."""

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper


def mlp_model(batch="batch", op_after="Relu"):
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "W1")
    b1 = numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b1")
    w2 = numpy_helper.from_array(rng.standard_normal((16, 4)).astype(np.float32), "W2")
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"]),
        helper.make_node("Add", ["h", "b1"], ["hb"]),
        helper.make_node(op_after, ["hb"], ["a"]),
        helper.make_node("MatMul", ["a", "W2"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4])], [w1, b1, w2])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def test_compiled_mlp_matches_onnxruntime(kiln, tmp_path):
    model = mlp_model()
    onnx.save(model, tmp_path / "mlp.onnx")
    result = kiln("compile", tmp_path / "mlp.onnx", "-o", tmp_path / "mlp.kiln", "--batch", "5", "--plan-report")
    assert result.returncode == 0, result.stderr
    assert "memory plan: arena" in result.stdout
    # MatMul + Add + Relu fuse into one step; the last MatMul is the second.
    assert re.search(r"compiled .* 2 steps", result.stdout), result.stdout

    x = np.random.default_rng(1).standard_normal((5, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    result = kiln("run", tmp_path / "mlp.kiln", "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    ours = np.load(tmp_path / "out" / "y.npy")
    (theirs,) = ort.InferenceSession(str(tmp_path / "mlp.onnx")).run(None, {"x": x})
    assert ours.shape == (5, 4)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


def test_an_unfixed_dimension_is_fixed_at_run_time_with_a_notice(kiln, tmp_path):
    onnx.save(mlp_model(), tmp_path / "mlp.onnx")
    result = kiln("compile", tmp_path / "mlp.onnx", "-o", tmp_path / "mlp.kiln")
    assert result.returncode == 0, result.stderr
    assert ("notice: input 'x' dimension 0 ('batch') is not fixed: shapes are fixed at run time, per input "
            "signature (--shape NAME:DIMS or --batch N makes a static package, faster to load)") in result.stderr
    assert "shapes known at run time" in result.stdout
    session = ort.InferenceSession(str(tmp_path / "mlp.onnx"))
    for batch in (1, 5):
        x = np.random.default_rng(batch).standard_normal((batch, 8)).astype(np.float32)
        np.save(tmp_path / "x.npy", x)
        ran = kiln("run", tmp_path / "mlp.kiln", "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", tmp_path / "out")
        assert ran.returncode == 0, ran.stderr
        np.testing.assert_allclose(np.load(tmp_path / "out" / "y.npy"), session.run(None, {"x": x})[0], rtol=1e-5,
                                   atol=1e-5)
    # --dynamic asks for it: no notice. --shape makes a static package.
    asked = kiln("compile", tmp_path / "mlp.onnx", "-o", tmp_path / "mlp.kiln", "--dynamic")
    assert asked.returncode == 0 and "not fixed" not in asked.stderr
    static = kiln("compile", tmp_path / "mlp.onnx", "-o", tmp_path / "mlp.kiln", "--shape", "x:2x8")
    assert static.returncode == 0 and "notice" not in static.stderr and "steps" in static.stdout


def test_unsupported_operators_are_listed_at_once(kiln, tmp_path):
    # String operators, which kiln leaves out on purpose (tests/conformance/excluded.txt).
    onnx.save(mlp_model(batch=1, op_after="Hardmax"), tmp_path / "m.onnx")
    model = onnx.load(tmp_path / "m.onnx")
    model.graph.node.append(helper.make_node("StringNormalizer", ["y"], ["s"]))
    model.graph.node.append(helper.make_node("RegexFullMatch", ["s"], ["d"], pattern="a"))
    model.graph.output.append(helper.make_tensor_value_info("d", TensorProto.BOOL, None))
    onnx.save(model, tmp_path / "m.onnx")
    result = kiln("compile", tmp_path / "m.onnx", "-o", tmp_path / "m.kiln")
    assert result.returncode == 1
    assert "Unsupported: 2 operators" in result.stderr, result.stderr
    assert "StringNormalizer (ai.onnx, opset 17)" in result.stderr, result.stderr
    assert "RegexFullMatch (ai.onnx, opset 17)" in result.stderr, result.stderr


def test_run_checks_its_inputs(kiln, tmp_path):
    onnx.save(mlp_model(batch=2), tmp_path / "mlp.onnx")
    assert kiln("compile", tmp_path / "mlp.onnx", "-o", tmp_path / "mlp.kiln").returncode == 0
    np.save(tmp_path / "bad.npy", np.zeros((3, 8), np.float32))
    result = kiln("run", tmp_path / "mlp.kiln", "--input", f"x={tmp_path / 'bad.npy'}")
    assert result.returncode == 1
    assert "input 'x' must be { dtype: F32, sizeInBytes: 64, shape [2, 8] }" in result.stderr
    result = kiln("run", tmp_path / "mlp.kiln")
    assert result.returncode == 1 and "pass --input x=FILE.npy or --random-inputs" in result.stderr
    result = kiln("run", tmp_path / "mlp.kiln", "--random-inputs", "--output-dir", tmp_path / "o")
    assert result.returncode == 0 and (tmp_path / "o" / "y.npy").exists()


@pytest.mark.parametrize("junk", [b"", b"not a model", bytes(range(256)) * 4])
def test_malformed_onnx_files_are_refused(kiln, tmp_path, junk):
    (tmp_path / "bad.onnx").write_bytes(junk)
    result = kiln("compile", tmp_path / "bad.onnx", "-o", tmp_path / "bad.kiln")
    assert result.returncode == 1, result.stderr
    assert "kiln: error:" in result.stderr


def test_bench_reports_latency_as_json(kiln, tmp_path):
    import json

    onnx.save(mlp_model(batch=1), tmp_path / "mlp.onnx")
    assert kiln("compile", tmp_path / "mlp.onnx", "-o", tmp_path / "mlp.kiln").returncode == 0
    result = kiln("bench", tmp_path / "mlp.kiln", "--iterations", "50", "--warmup", "5", "--json")
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stdout)
    assert stats["iterations"] == 50 and stats["steps"] == 2  # MatMul + Add + Relu fused, MatMul
    assert 0 < stats["p50_ms"] <= stats["p90_ms"]
    assert stats["throughput_per_s"] > 0 and stats["peak_rss_mib"] > 0
    np.save(tmp_path / "x.npy", np.ones((1, 8), np.float32))
    given = kiln("bench", tmp_path / "mlp.kiln", "--iterations", "5", "--input", f"x={tmp_path / 'x.npy'}", "--json")
    assert given.returncode == 0, given.stderr
    np.save(tmp_path / "bad.npy", np.ones((2, 8), np.float32))
    wrong = kiln("bench", tmp_path / "mlp.kiln", "--input", f"x={tmp_path / 'bad.npy'}")
    assert wrong.returncode == 1 and "input 'x' must be" in wrong.stderr


def test_bench_runs_and_profiles_a_package_with_runtime_shapes(kiln, tmp_path):
    import json

    onnx.save(mlp_model(), tmp_path / "mlp.onnx")
    assert kiln("compile", tmp_path / "mlp.onnx", "-o", tmp_path / "mlp.kiln", "--dynamic").returncode == 0
    # Its batch is known only from the input given.
    missing = kiln("bench", tmp_path / "mlp.kiln", "--iterations", "3")
    assert missing.returncode == 1, missing.stderr
    assert ("input 'x' is f32[?, 8]: its size is known only at run time, so pass --shape x:DIMS for random data, "
            "or --input x=FILE.npy") in missing.stderr
    # --shape gives the random data its size; it must fit what the package knows.
    shaped = kiln("bench", tmp_path / "mlp.kiln", "--iterations", "5", "--shape", "x:6x8", "--json")
    assert shaped.returncode == 0, shaped.stderr
    assert json.loads(shaped.stdout)["steps"] == 2
    wrong = kiln("bench", tmp_path / "mlp.kiln", "--iterations", "5", "--shape", "x:6x9")
    assert wrong.returncode == 1 and "--shape x:6x9 does not fit input 'x', f32[?, 8]" in wrong.stderr
    unknown = kiln("run", tmp_path / "mlp.kiln", "--random-inputs", "--shape", "z:6x8")
    assert unknown.returncode == 1 and "--shape z: the model has no input named 'z'" in unknown.stderr
    ran = kiln("run", tmp_path / "mlp.kiln", "--random-inputs", "--shape", "x:3x8", "--output-dir", tmp_path / "out")
    assert ran.returncode == 0, ran.stderr
    assert np.load(tmp_path / "out" / "y.npy").shape == (3, 4)
    np.save(tmp_path / "x.npy", np.ones((3, 8), np.float32))
    result = kiln("bench", tmp_path / "mlp.kiln", "--iterations", "20", "--input", f"x={tmp_path / 'x.npy'}", "--json")
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stdout)
    assert stats["steps"] == 2 and stats["arena_bytes"] > 0 and stats["p50_ms"] > 0
    profiled = kiln("bench", tmp_path / "mlp.kiln", "--iterations", "20", "--input", f"x={tmp_path / 'x.npy'}",
                    "--profile")
    assert profiled.returncode == 0, profiled.stderr
    assert "in 2 steps" in profiled.stdout
    assert '"outputs": ["f32[3,4]"]' in profiled.stdout  # the slowest steps name their shapes at run time


def test_bench_writes_a_chrome_trace(kiln, tmp_path):
    import json

    onnx.save(mlp_model(batch=1), tmp_path / "mlp.onnx")
    assert kiln("compile", tmp_path / "mlp.onnx", "-o", tmp_path / "mlp.kiln").returncode == 0
    result = kiln("bench", tmp_path / "mlp.kiln", "--iterations", "7", "--trace", tmp_path / "trace.json")
    assert result.returncode == 0, result.stderr
    trace = json.load(open(tmp_path / "trace.json"))
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    runs = [e for e in events if e["cat"] == "run"]
    steps = [e for e in events if e["cat"] == "step"]
    assert len(runs) == 7 and len(steps) == 7 * 2
    assert all(e["dur"] >= 0 and e["pid"] == 1 and e["tid"] == 1 for e in events)
    assert {e["name"] for e in steps} == {e["args"]["op"] for e in steps}
    assert steps[1]["args"]["outputs"] == ["f32[1,4]"]  # the second MatMul writes y
    unwritable = kiln("bench", tmp_path / "mlp.kiln", "--iterations", "2", "--trace", tmp_path / "no" / "t.json")
    assert unwritable.returncode != 0 and "cannot write the trace" in unwritable.stderr
