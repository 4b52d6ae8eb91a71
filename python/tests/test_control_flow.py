"""If, Loop and Scan compiled to sub-programs: outputs match onnxruntime,
nested control flow included, and an If runs only the branch it takes."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln

F = TensorProto.FLOAT


def save(graph, path, opset=17):
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def compare(path, feeds, tmp_path, **compile_args):
    kiln.compile(path, tmp_path / "model.kiln", **compile_args)
    runner = kiln.Runner(tmp_path / "model.kiln")
    ours = runner.run(feeds)
    theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    for (name, value), expected in zip(ours.items(), theirs):
        assert value.shape == expected.shape, name
        np.testing.assert_allclose(value, expected, rtol=1e-5, atol=1e-5, err_msg=name)
    return runner


def mlp_branch(name, rng, depth):
    """A small fused sub-model: depth x (MatMul W, Add b, Relu) over outer x."""
    nodes, inits, last = [], [], "x"
    for i in range(depth):
        w, b = f"{name}_w{i}", f"{name}_b{i}"
        inits += [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), w),
                  numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), b)]
        nodes += [helper.make_node("MatMul", [last, w], [f"{name}_m{i}"]),
                  helper.make_node("Add", [f"{name}_m{i}", b], [f"{name}_a{i}"]),
                  helper.make_node("Relu", [f"{name}_a{i}"], [f"{name}_r{i}"])]
        last = f"{name}_r{i}"
    nodes.append(helper.make_node("Identity", [last], [f"{name}_out"]))
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(f"{name}_out", F, [2, 8])], inits)


def test_if_runs_only_the_branch_it_takes(tmp_path):
    rng = np.random.default_rng(0)
    node = helper.make_node("If", ["cond"], ["y"], then_branch=mlp_branch("small", rng, 1),
                            else_branch=mlp_branch("large", rng, 6))
    graph = helper.make_graph([node], "select", [helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
                                                 helper.make_tensor_value_info("x", F, [2, 8])],
                              [helper.make_tensor_value_info("y", F, [2, 8])])
    path = save(graph, tmp_path / "if.onnx")
    x = rng.standard_normal((2, 8)).astype(np.float32)
    steps = {}
    for cond in (True, False):
        runner = compare(path, {"cond": np.array(cond), "x": x}, tmp_path)
        steps[cond] = runner.steps_run
        runner.run({"cond": np.array(not cond), "x": x})
        steps[(cond, "both")] = runner.steps_run
    # The branches are fused like a main graph (MatMul + Add + Relu is one
    # step per layer) and only the chosen one runs: the If, its layers and
    # the copy of its result.
    small, large = steps[True], steps[False]
    assert (small, large) == (1 + 1 + 1, 1 + 6 + 1)
    assert steps[(True, "both")] == steps[(False, "both")] == small + large


def loop_graph(trip_count, with_scan=True):
    """v_{i+1} = v_i * 0.5 + x * i (x captured from outside); scans v."""
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["i_f"], to=F),
         helper.make_node("Mul", ["x", "i_f"], ["xi"]),
         helper.make_node("Mul", ["v_in", "half"], ["v_half"]),
         helper.make_node("Add", ["v_half", "xi"], ["v_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])]
        + ([helper.make_node("Identity", ["v_out"], ["scan"])] if with_scan else []),
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", F, [3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", F, [3])]
        + ([helper.make_tensor_value_info("scan", F, [3])] if with_scan else []),
        [numpy_helper.from_array(np.array(0.5, np.float32), "half")])
    outputs = ["v_final"] + (["v_all"] if with_scan else [])
    node = helper.make_node("Loop", ["M", "", "v0"], outputs, body=body)
    graph = helper.make_graph(
        [node], "loop", [helper.make_tensor_value_info("x", F, [3]), helper.make_tensor_value_info("v0", F, [3])],
        [helper.make_tensor_value_info("v_final", F, [3])]
        + ([helper.make_tensor_value_info("v_all", F, [trip_count, 3])] if with_scan else []),
        [numpy_helper.from_array(np.array(trip_count, np.int64), "M")])
    return graph


def test_loop_with_carried_values_and_scan_outputs(tmp_path):
    path = save(loop_graph(7), tmp_path / "loop.onnx")
    feeds = {"x": np.array([1, -2, 3], np.float32), "v0": np.array([4, 5, 6], np.float32)}
    compare(path, feeds, tmp_path)


def test_loop_with_a_data_dependent_condition(tmp_path):
    """The loop stops when the carried sum passes a limit: no scan outputs,
    so the iteration count may be anything up to M."""
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "step"], ["s_out"]),
         helper.make_node("ReduceSum", ["s_out"], ["total"], keepdims=0),
         helper.make_node("Less", ["total", "limit"], ["cond_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("s_in", F, [2])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("s_out", F, [2])])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["M", "", "s0"], ["s"], body=body)], "until",
        [helper.make_tensor_value_info("s0", F, [2]), helper.make_tensor_value_info("step", F, [2]),
         helper.make_tensor_value_info("limit", F, [])],
        [helper.make_tensor_value_info("s", F, [2])],
        [numpy_helper.from_array(np.array(1000, np.int64), "M")])
    path = save(graph, tmp_path / "until.onnx")
    for limit in (0.0, 5.0, 100.0):
        compare(path, {"s0": np.zeros(2, np.float32), "step": np.array([0.5, 1.0], np.float32),
                       "limit": np.array(limit, np.float32)}, tmp_path)


def test_scan_states_directions_and_axes(tmp_path):
    """A running sum and a running max over axis 1, one input scanned
    backwards, outputs stacked on axis 0 and 1."""
    body = helper.make_graph(
        [helper.make_node("Add", ["sum_in", "a"], ["sum_out"]),
         helper.make_node("Max", ["max_in", "b"], ["max_out"]),
         helper.make_node("Mul", ["sum_out", "b"], ["prod"]),
         helper.make_node("Identity", ["max_out"], ["max_seen"])],
        "body",
        [helper.make_tensor_value_info("sum_in", F, [2]), helper.make_tensor_value_info("max_in", F, [2]),
         helper.make_tensor_value_info("a", F, [2]), helper.make_tensor_value_info("b", F, [2])],
        [helper.make_tensor_value_info("sum_out", F, [2]), helper.make_tensor_value_info("max_out", F, [2]),
         helper.make_tensor_value_info("prod", F, [2]), helper.make_tensor_value_info("max_seen", F, [2])])
    node = helper.make_node("Scan", ["s0", "m0", "A", "B"], ["s", "m", "P", "M"], body=body, num_scan_inputs=2,
                            scan_input_axes=[1, 0], scan_input_directions=[0, 1], scan_output_axes=[0, 1])
    graph = helper.make_graph(
        [node], "scan",
        [helper.make_tensor_value_info("s0", F, [2]), helper.make_tensor_value_info("m0", F, [2]),
         helper.make_tensor_value_info("A", F, [2, 5]), helper.make_tensor_value_info("B", F, [5, 2])],
        [helper.make_tensor_value_info("s", F, [2]), helper.make_tensor_value_info("m", F, [2]),
         helper.make_tensor_value_info("P", F, [5, 2]), helper.make_tensor_value_info("M", F, [2, 5])])
    path = save(graph, tmp_path / "scan.onnx")
    rng = np.random.default_rng(3)
    compare(path, {"s0": np.zeros(2, np.float32), "m0": np.full(2, -10, np.float32),
                   "A": rng.standard_normal((2, 5)).astype(np.float32),
                   "B": rng.standard_normal((5, 2)).astype(np.float32)}, tmp_path)


def test_nested_control_flow(tmp_path):
    """A Loop whose body holds an If (on the iteration's parity) whose then
    branch holds a Scan; captured values cross all three levels."""
    scan_body = helper.make_graph(
        [helper.make_node("Add", ["acc_in", "row"], ["acc_out"])], "scan_body",
        [helper.make_tensor_value_info("acc_in", F, [3]), helper.make_tensor_value_info("row", F, [3])],
        [helper.make_tensor_value_info("acc_out", F, [3])])
    then_branch = helper.make_graph(
        [helper.make_node("Scan", ["v_in", "table"], ["summed"], body=scan_body, num_scan_inputs=1)], "then", [],
        [helper.make_tensor_value_info("summed", F, [3])])
    else_branch = helper.make_graph(
        [helper.make_node("Mul", ["v_in", "scale"], ["scaled"])], "else", [],
        [helper.make_tensor_value_info("scaled", F, [3])])
    body = helper.make_graph(
        [helper.make_node("Div", ["i", "two"], ["half"]),
         helper.make_node("Mul", ["half", "two"], ["twice"]),
         helper.make_node("Sub", ["i", "twice"], ["parity"]),
         helper.make_node("Equal", ["parity", "zero"], ["even"]),
         helper.make_node("If", ["even"], ["v_out"], then_branch=then_branch, else_branch=else_branch),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", F, [3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", F, [3])],
        [numpy_helper.from_array(np.array(2, np.int64), "two"), numpy_helper.from_array(np.array(0, np.int64), "zero")])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["M", "", "v0"], ["v"], body=body)], "nested",
        [helper.make_tensor_value_info("v0", F, [3]), helper.make_tensor_value_info("table", F, [4, 3]),
         helper.make_tensor_value_info("scale", F, [3])],
        [helper.make_tensor_value_info("v", F, [3])],
        [numpy_helper.from_array(np.array(5, np.int64), "M")])
    path = save(graph, tmp_path / "nested.onnx")
    rng = np.random.default_rng(4)
    compare(path, {"v0": rng.standard_normal(3).astype(np.float32),
                   "table": rng.standard_normal((4, 3)).astype(np.float32),
                   "scale": np.array([0.5, -1, 2], np.float32)}, tmp_path)


@pytest.mark.parametrize("carried_name", ["w", "weights"])
def test_loop_invariant_work_runs_once(tmp_path, carried_name):
    """A Loop carries its weights through unchanged and transposes them, and
    projects a feature map read from outside, at every iteration (as
    Paddle's SLANet decoder does): that work moves out of the Loop
    (passes/loop_invariants.h), and the results still match onnxruntime.
    Paddle's exporter also names the carried input after the outer value it
    starts from ("weights" inside and out), hiding the outer name."""
    rng = np.random.default_rng(7)
    w = carried_name
    body = helper.make_graph(
        [helper.make_node("Transpose", [w], ["w_t"], perm=[1, 0]),
         helper.make_node("MatMul", ["features", "w_t"], ["projected"]),     # invariant: moves out
         helper.make_node("MatMul", ["h", "w_t"], ["hw"]),                   # reads h: stays
         helper.make_node("ReduceMean", ["projected"], ["context"], axes=[0], keepdims=1),
         helper.make_node("Add", ["hw", "context"], ["pre"]),
         helper.make_node("Tanh", ["pre"], ["h_next"]),
         helper.make_node("Identity", ["cond"], ["cond_out"])],
        "step",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h", F, [1, 8]), helper.make_tensor_value_info(w, F, [8, 8])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), helper.make_tensor_value_info("h_next", F, [1, 8]),
         helper.make_tensor_value_info(w, F, [8, 8])])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "", "h0", "weights"], ["h", "w_final"], body=body)], "invariant",
        [helper.make_tensor_value_info("features", F, [5, 8]), helper.make_tensor_value_info("h0", F, [1, 8])],
        [helper.make_tensor_value_info("h", F, [1, 8])],
        [numpy_helper.from_array(np.array(6, np.int64), "trips"),
         numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32) * 0.3, "weights")])
    path = save(graph, tmp_path / "invariant.onnx")
    feeds = {"features": rng.standard_normal((5, 8)).astype(np.float32),
             "h0": rng.standard_normal((1, 8)).astype(np.float32)}
    runner = compare(path, feeds, tmp_path)
    # The body keeps MatMul(h), the Add (with Tanh fused or not) and the
    # condition: at most 4 steps of the 7 nodes run per iteration.
    assert runner.steps_run <= 6 * 4 + 6, runner.steps_run
