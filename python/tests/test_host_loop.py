"""Loops whose bodies change shape from one iteration to the next, which kiln
runs on the host iteration by iteration (src/specialize/host_loop.h), against
onnxruntime:
- a decoder that writes step i of a preallocated buffer through
  Slice(buffer, i, min(T, i + 1)) and ScatterElements, the way Paddle's
  set_value is exported (SLANet's table decoder), with weights carried through
  the Loop unchanged, a captured input, and a stop condition computed from
  the data;
- a carried value that grows by one row per iteration (Concat), with a scan
  output;
- a Loop that runs no iteration (its initial values come out);
- and the same model run twice and with another input, so that cached
  specializations are reused and the results still match."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def save(graph, path):
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def compare(path, feeds_list, tmp_path):
    kiln.compile(path, tmp_path / "model.kiln")
    runner = kiln.Runner(tmp_path / "model.kiln")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for feeds in feeds_list:
        ours = runner.run(feeds)
        theirs = session.run(None, feeds)
        for (name, value), expected in zip(ours.items(), theirs):
            assert value.shape == expected.shape, name
            np.testing.assert_allclose(value, expected, rtol=1e-5, atol=1e-5, err_msg=name)
    return runner


def const(name, array):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(array), name + "_value"))


def decoder_model(steps, width):
    """h_{i+1} = tanh(h_i W + x), written into row i of out[1, steps, width]
    by Slice + ScatterElements; stops early once h's mean drops below the
    threshold input."""
    body_nodes = [
        # The step's row of the buffer, sliced as Paddle's exporter does: its
        # extent depends on the step count.
        helper.make_node("Unsqueeze", ["step", "axis0"], ["starts"]),
        helper.make_node("Add", ["step", "one"], ["step_plus_one"]),
        helper.make_node("Unsqueeze", ["step_plus_one", "axis0"], ["stop"]),
        helper.make_node("Shape", ["buffer"], ["buffer_shape"]),
        helper.make_node("Gather", ["buffer_shape", "one_index"], ["length"]),
        helper.make_node("Min", ["length", "stop"], ["ends"]),
        helper.make_node("Slice", ["buffer", "starts", "ends", "axis1"], ["row"]),
        helper.make_node("Shape", ["row"], ["row_shape"]),
        # The new state, expanded to the row's shape and scattered into row i.
        helper.make_node("MatMul", ["h", "w"], ["hw"]),
        helper.make_node("Add", ["hw", "x"], ["pre"]),
        helper.make_node("Tanh", ["pre"], ["h_next"]),
        helper.make_node("Unsqueeze", ["h_next", "axis0"], ["h_next_3d"]),
        helper.make_node("Expand", ["h_next_3d", "row_shape"], ["update"]),
        helper.make_node("Reshape", ["step", "shape_111"], ["step_3d"]),
        helper.make_node("Expand", ["step_3d", "row_shape"], ["indices"]),
        helper.make_node("ScatterElements", ["buffer", "indices", "update"], ["buffer_next"], axis=1),
        helper.make_node("ReduceMean", ["h_next"], ["mean"], keepdims=0),
        helper.make_node("Greater", ["mean", "threshold"], ["keep_going"]),
        helper.make_node("Add", ["step", "one"], ["step_next"]),
    ]
    body_inits = [numpy_helper.from_array(np.array([0], np.int64), "axis0"),
                  numpy_helper.from_array(np.array([1], np.int64), "axis1"),
                  numpy_helper.from_array(np.array(1, np.int64), "one"),
                  numpy_helper.from_array(np.array(1, np.int64), "one_index"),
                  numpy_helper.from_array(np.array([1, 1, 1], np.int64), "shape_111")]
    body = helper.make_graph(
        body_nodes, "decoder_step",
        [helper.make_tensor_value_info("iteration", I64, []), helper.make_tensor_value_info("cond", B, []),
         helper.make_tensor_value_info("h", F, [1, width]), helper.make_tensor_value_info("buffer", F, [1, "T", width]),
         helper.make_tensor_value_info("step", I64, []), helper.make_tensor_value_info("w", F, [width, width])],
        [helper.make_tensor_value_info("keep_going", B, []), helper.make_tensor_value_info("h_next", F, [1, width]),
         helper.make_tensor_value_info("buffer_next", F, [1, "T", width]), helper.make_tensor_value_info("step_next", I64, []),
         helper.make_tensor_value_info("w", F, [width, width])],
        body_inits)
    rng = np.random.default_rng(3)
    nodes = [const("trip_count", np.array(1024, np.int64)), const("start", np.array(True)),
             const("h0", np.zeros((1, width), np.float32)),
             # A placeholder the body overwrites, as Paddle's exporter carries it.
             const("buffer0", np.zeros((1, steps, width), np.float32)),
             const("step0", np.array(0, np.int64)),
             const("weights", (rng.standard_normal((width, width)) * 0.5).astype(np.float32)),
             helper.make_node("Loop", ["trip_count", "start", "h0", "buffer0", "step0", "weights"],
                              ["h_final", "buffer_final", "steps_run", "weights_final"], body=body),
             helper.make_node("Unsqueeze", ["steps_run", "axis0_outer"], ["steps_1d"]),
             helper.make_node("Slice", ["buffer_final", "zero_1d", "steps_1d", "axis1_outer"], ["decoded"])]
    inits = [numpy_helper.from_array(np.array([0], np.int64), "axis0_outer"),
             numpy_helper.from_array(np.array([0], np.int64), "zero_1d"),
             numpy_helper.from_array(np.array([1], np.int64), "axis1_outer")]
    graph = helper.make_graph(nodes, "decoder",
                              [helper.make_tensor_value_info("x", F, [1, width]),
                               helper.make_tensor_value_info("threshold", F, [])],
                              [helper.make_tensor_value_info("decoded", F, [1, "S", width]),
                               helper.make_tensor_value_info("h_final", F, [1, width])], inits)
    return graph


def test_decoder_writing_step_rows_into_a_buffer(tmp_path):
    path = save(decoder_model(steps=40, width=16), tmp_path / "decoder.onnx")
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 16)).astype(np.float32)
    feeds = [{"x": x, "threshold": np.array(-10.0, np.float32)},  # runs all 40 steps (Slice clamps past them)
             {"x": x, "threshold": np.array(-10.0, np.float32)},  # the same again: cached plans
             {"x": x + 0.3, "threshold": np.array(0.05, np.float32)}]  # stops when the mean drops
    compare(path, feeds, tmp_path)


def growing_model():
    """acc grows by one row per iteration (Concat); each iteration also
    scans out acc's sum; M iterations from the input."""
    body = helper.make_graph(
        [helper.make_node("Cast", ["iteration"], ["i_f"], to=F),
         helper.make_node("Add", ["x", "i_f"], ["row"]),
         helper.make_node("Concat", ["acc", "row"], ["acc_next"], axis=0),
         helper.make_node("ReduceSum", ["acc_next"], ["total"], keepdims=0),
         helper.make_node("Identity", ["cond"], ["cond_out"])],
        "grow",
        [helper.make_tensor_value_info("iteration", I64, []), helper.make_tensor_value_info("cond", B, []),
         helper.make_tensor_value_info("acc", F, ["n", 3])],
        [helper.make_tensor_value_info("cond_out", B, []), helper.make_tensor_value_info("acc_next", F, ["n1", 3]),
         helper.make_tensor_value_info("total", F, [])])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["M", "", "acc0"], ["acc", "totals"], body=body)], "growing",
        [helper.make_tensor_value_info("M", I64, []), helper.make_tensor_value_info("x", F, [1, 3]),
         helper.make_tensor_value_info("acc0", F, [1, 3])],
        [helper.make_tensor_value_info("acc", F, ["rows", 3]), helper.make_tensor_value_info("totals", F, ["M"])])
    return graph


@pytest.mark.parametrize("trip_count", [0, 1, 5])
def test_carried_value_growing_per_iteration(tmp_path, trip_count):
    path = save(growing_model(), tmp_path / "grow.onnx")
    rng = np.random.default_rng(5)
    feeds = {"M": np.array(trip_count, np.int64), "x": rng.standard_normal((1, 3)).astype(np.float32),
             "acc0": rng.standard_normal((1, 3)).astype(np.float32)}
    if trip_count == 0:
        # No iteration: the initial value comes out, and an empty scan output.
        kiln.compile(path, tmp_path / "model.kiln")
        ours = kiln.Runner(tmp_path / "model.kiln").run(feeds)
        np.testing.assert_array_equal(ours["acc"], feeds["acc0"])
        assert ours["totals"].shape[0] == 0
        return
    compare(path, [feeds], tmp_path)
