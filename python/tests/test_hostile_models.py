"""Models crafted to crash the compiler's constant folding (issue 12, finding
3), each of which killed the process before the fix: Add of int64 [0] and
[1] read an empty vector (broadcasting 1 against 0 gave 1), INT64_MIN / -1
trapped (SIGFPE), a Slice with empty starts threw from .at(0) (and its
kernel, handed the empty constant as a null pointer, read it as a scalar), a
broadcast of zero-sized constants asked for 2^40 elements. Each now compiles and gives
what the kernels give at run time (core/wrapping_arithmetic.h: wrap-around,
x / 0 = 0, INT_MIN / -1 = INT_MIN)."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import kiln

INT64_MIN = np.iinfo(np.int64).min


def compile_and_run(tmp_path, nodes, inits, outputs, inputs=(), feeds=None):
    graph = helper.make_graph(nodes, "hostile", list(inputs), outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "m.onnx")
    kiln.compile(tmp_path / "m.onnx", tmp_path / "m.kiln")
    return kiln.Runner(tmp_path / "m.kiln").run(feeds or {})


def out(name, dtype=TensorProto.INT64):
    return helper.make_tensor_value_info(name, dtype, None)


def test_broadcast_of_one_against_zero_is_empty(tmp_path):
    inits = [numpy_helper.from_array(np.zeros(0, np.int64), "a"), numpy_helper.from_array(np.array([5], np.int64), "b")]
    y = compile_and_run(tmp_path, [helper.make_node("Add", ["a", "b"], ["y"])], inits, [out("y")])["y"]
    assert y.shape == (0,)


def test_integer_division_never_traps(tmp_path):
    inits = [numpy_helper.from_array(np.array([INT64_MIN, 7, -7, 9], np.int64), "a"),
             numpy_helper.from_array(np.array([-1, 0, 2, -2], np.int64), "b")]
    nodes = [helper.make_node("Div", ["a", "b"], ["y"]), helper.make_node("Neg", ["a"], ["n"]),
             helper.make_node("Mul", ["a", "b"], ["m"]), helper.make_node("Sub", ["a", "b"], ["s"])]
    result = compile_and_run(tmp_path, nodes, inits, [out("y"), out("n"), out("m"), out("s")])
    np.testing.assert_array_equal(result["y"], [INT64_MIN, 0, -3, -4])  # truncating; x / 0 = 0
    with np.errstate(over="ignore"):
        a = np.array([INT64_MIN, 7, -7, 9], np.int64)
        b = np.array([-1, 0, 2, -2], np.int64)
        np.testing.assert_array_equal(result["n"], -a)     # -INT64_MIN wraps to itself
        np.testing.assert_array_equal(result["m"], a * b)  # wraps as numpy does
        np.testing.assert_array_equal(result["s"], a - b)


def test_slice_with_empty_starts_is_the_whole_tensor(tmp_path):
    data = np.array([3, 1, 4, 1, 5], np.int64)
    inits = [numpy_helper.from_array(data, "x"), numpy_helper.from_array(np.zeros(0, np.int64), "starts"),
             numpy_helper.from_array(np.zeros(0, np.int64), "ends")]
    y = compile_and_run(tmp_path, [helper.make_node("Slice", ["x", "starts", "ends"], ["y"])], inits, [out("y")])["y"]
    np.testing.assert_array_equal(y, data)


def test_range_that_would_overflow_is_not_folded(tmp_path):
    top = np.iinfo(np.int64).max
    inits = [numpy_helper.from_array(np.array(top - 2, np.int64), "start"),
             numpy_helper.from_array(np.array(top, np.int64), "limit"),
             numpy_helper.from_array(np.array(5, np.int64), "delta")]
    y = compile_and_run(tmp_path, [helper.make_node("Range", ["start", "limit", "delta"], ["y"])], inits, [out("y")])["y"]
    np.testing.assert_array_equal(y, [top - 2])


def test_broadcast_of_zero_sized_constants_with_huge_dimensions(tmp_path):
    # (numpy itself refuses a shape whose non-zero dimensions pass 2^63 bytes;
    # 2^20 x 2^20 is as good a test: before the fix 2^40 elements were asked for.)
    inits = [numpy_helper.from_array(np.zeros((0, 1 << 20, 1, 1), np.int64), "a"),
             numpy_helper.from_array(np.zeros((1, 1, 1 << 20, 0), np.int64), "b")]
    y = compile_and_run(tmp_path, [helper.make_node("Add", ["a", "b"], ["y"])], inits, [out("y")])["y"]
    assert y.shape == (0, 1 << 20, 1 << 20, 0)


def compile_error(tmp_path, nodes, inits, inputs, outputs):
    graph = helper.make_graph(nodes, "hostile", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "m.onnx")
    try:
        kiln.compile(tmp_path / "m.onnx", tmp_path / "m.kiln")
    except kiln.Error as error:
        return str(error)
    return "(compiled)"


def test_reshape_whose_sizes_overflow_is_refused(tmp_path):
    """Shape inference (finding 4): [2, 2^62] to [-1] multiplied past 2^63
    and computed INT64_MIN % -1 (SIGFPE)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 1 << 62])
    shape = numpy_helper.from_array(np.array([-1], np.int64), "shape")
    message = compile_error(tmp_path, [helper.make_node("Reshape", ["x", "shape"], ["y"])], [shape], [x],
                            [out("y", TensorProto.FLOAT)])
    assert "overflow" in message, message


def test_col2im_whose_block_overflows_is_refused(tmp_path):
    """[2^32, 2^32] blocks multiplied to 0 and were divided by (SIGFPE)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 4])
    inits = [numpy_helper.from_array(np.array([4, 4], np.int64), "image"),
             numpy_helper.from_array(np.array([1 << 32, 1 << 32], np.int64), "block")]
    message = compile_error(tmp_path, [helper.make_node("Col2Im", ["x", "image", "block"], ["y"])], inits, [x],
                            [out("y", TensorProto.FLOAT)])
    if message == "(compiled)":  # its shape left to run time: the refusal comes with the first call
        try:
            kiln.Runner(tmp_path / "m.kiln").run({"x": np.zeros((1, 4, 4), np.float32)})
            message = "(ran)"
        except kiln.Error as error:
            message = str(error)
    assert "holds more than 2^63 elements" in message, message


def external_data_model(directory, data_name="w.bin"):
    """y = x @ w with w's 64 floats stored in `data_name` beside the model."""
    w = np.arange(64, dtype=np.float32).reshape(8, 8)
    tensor = numpy_helper.from_array(w, "w")
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", data_name), ("offset", "0"), ("length", str(w.nbytes))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "ext",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [out("y", TensorProto.FLOAT)], [tensor])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, directory / "m.onnx")
    return w


def test_external_data_through_a_symlink_out_of_the_model_directory_is_refused(tmp_path):
    """Finding 9: a symlink shipped beside a model read any file of the
    machine into the package (and its outputs)."""
    (tmp_path / "model").mkdir()
    w = external_data_model(tmp_path / "model")
    secret = tmp_path / "secret.bin"
    secret.write_bytes(w.tobytes())
    (tmp_path / "model" / "w.bin").symlink_to(secret)
    try:
        kiln.compile(tmp_path / "model" / "m.onnx", tmp_path / "m.kiln")
        message = "(compiled)"
    except kiln.Error as error:
        message = str(error)
    assert "outside the model's directory" in message, message


def test_external_data_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    import os
    external_data_model(tmp_path)
    os.mkfifo(tmp_path / "w.bin")
    try:
        kiln.compile(tmp_path / "m.onnx", tmp_path / "m.kiln")
        message = "(compiled)"
    except kiln.Error as error:
        message = str(error)
    assert "not a regular file" in message, message


def test_external_data_links_that_stay_inside_are_read(tmp_path):
    """A link inside the directory, and the Hugging Face cache's layout (the
    model and its data both links into blobs/), still load."""
    x = np.ones((1, 8), np.float32)
    (tmp_path / "plain").mkdir()
    w = external_data_model(tmp_path / "plain", data_name="link.bin")
    (tmp_path / "plain" / "real.bin").write_bytes(w.tobytes())
    (tmp_path / "plain" / "link.bin").symlink_to("real.bin")
    kiln.compile(tmp_path / "plain" / "m.onnx", tmp_path / "a.kiln")
    np.testing.assert_allclose(kiln.Runner(tmp_path / "a.kiln").run({"x": x})["y"], x @ w, rtol=1e-6)

    blobs, snapshot = tmp_path / "hub" / "blobs", tmp_path / "hub" / "snapshots" / "rev"
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    external_data_model(blobs, data_name="w.bin")
    (blobs / "m.onnx").rename(blobs / "sha-model")
    (blobs / "sha-data").write_bytes(w.tobytes())
    (snapshot / "m.onnx").symlink_to("../../blobs/sha-model")
    (snapshot / "w.bin").symlink_to("../../blobs/sha-data")
    kiln.compile(snapshot / "m.onnx", tmp_path / "b.kiln")
    np.testing.assert_allclose(kiln.Runner(tmp_path / "b.kiln").run({"x": x})["y"], x @ w, rtol=1e-6)


def test_request_shapes_that_ask_for_more_memory_than_the_machine_has_are_refused(tmp_path):
    """A run-time-shape package specialized for a request whose values ask
    for terabytes (Expand to [10^6, 10^6]), as an intermediate (the arena)
    and as an output: both allocations threw std::bad_alloc (MemoryError);
    each is now a kiln.Error, and the runner serves the next request."""
    nodes = [helper.make_node("Expand", ["x", "shape"], ["big"]),
             helper.make_node("ReduceSum", ["big"], ["total"], keepdims=0)]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1]),
              helper.make_tensor_value_info("shape", TensorProto.INT64, [2])]
    x = np.array([2.5], np.float32)
    for outputs, expected in ((["total"], "the program's arena"), (["big"], "output 'big'")):
        graph = helper.make_graph(nodes if outputs == ["total"] else nodes[:1], "hostile", inputs,
                                  [out(name, TensorProto.FLOAT) for name in outputs])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        onnx.save(model, tmp_path / "m.onnx")
        kiln.compile(tmp_path / "m.onnx", tmp_path / "m.kiln")
        runner = kiln.Runner(tmp_path / "m.kiln")
        try:
            runner.run({"x": x, "shape": np.array([10**6, 10**6], np.int64)})
            raise AssertionError("4 TB were granted")
        except kiln.Error as error:
            assert expected in str(error) and "cannot be allocated on this machine" in str(error), error
        y = runner.run({"x": x, "shape": np.array([2, 3], np.int64)})[outputs[0]]
        np.testing.assert_allclose(y, 15.0 if outputs == ["total"] else np.full((2, 3), 2.5, np.float32))


BIG = 1 << 62


def inference_error(tmp_path, node, inits, x_shape):
    """The compile's error, or when the shape was left to run time (an
    inference that fails falls back to run-time shapes), the first call's."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)
    message = compile_error(tmp_path, [node], inits, [x], [out("y", TensorProto.FLOAT)])
    if message == "(compiled)":
        try:
            kiln.Runner(tmp_path / "m.kiln").run({"x": np.zeros(x_shape, np.float32)})
            message = "(ran)"
        except kiln.Error as error:
            message = str(error)
    return message


def test_dimension_formulas_that_overflow_are_refused(tmp_path):
    """Found by graph_run_fuzz (UBSan: signed overflow, undefined behaviour):
    Tile's size * repeats, Pad's pads summed, a Conv's dilated kernel, a
    DepthToSpace block squared, a Resize scale whose size is not finite,
    Split's sizes summed, a OneHot depth of 1e30. Each is now a compile error that names it."""
    cases = [
        (helper.make_node("Tile", ["x", "r"], ["y"]), [numpy_helper.from_array(np.array([4, BIG], np.int64), "r")],
         [2, 4]),
        (helper.make_node("Pad", ["x", "p"], ["y"]),
         [numpy_helper.from_array(np.array([BIG, BIG, 0, 0], np.int64), "p")], [2, 4]),
        (helper.make_node("Conv", ["x", "w"], ["y"], dilations=[BIG, 1]),
         [numpy_helper.from_array(np.zeros((1, 1, 3, 3), np.float32), "w")], [1, 1, 8, 8]),
        (helper.make_node("DepthToSpace", ["x"], ["y"], blocksize=1 << 32), [], [1, 4, 2, 2]),
        (helper.make_node("Resize", ["x", "", "s"], ["y"]),
         [numpy_helper.from_array(np.array([1, 1, 1e30, 1], np.float32), "s")], [1, 1, 2, 2]),
        (helper.make_node("Split", ["x", "s"], ["y", "z"], axis=1),
         [numpy_helper.from_array(np.array([BIG, BIG], np.int64), "s")], [2, 4]),
        (helper.make_node("OneHot", ["i", "d", "v"], ["y"]),
         [numpy_helper.from_array(np.array([0, 1], np.int64), "i"), numpy_helper.from_array(np.array(1e30, np.float32), "d"),
          numpy_helper.from_array(np.array([0, 1], np.float32), "v")], [1]),
    ]
    for node, inits, shape in cases:
        message = inference_error(tmp_path, node, inits, shape)
        assert "overflow" in message or "not a size" in message, (node.op_type, message)


def test_range_whose_length_overflows_is_refused(tmp_path):
    """Range from INT64_MIN to INT64_MAX: limit - start wrapped (undefined
    behaviour) before its length was computed."""
    inits = [numpy_helper.from_array(np.array(v, np.int64), n)
             for v, n in ((INT64_MIN, "a"), (np.iinfo(np.int64).max, "b"), (1, "d"))]
    message = compile_error(tmp_path, [helper.make_node("Range", ["a", "b", "d"], ["y"])], inits, [], [out("y")])
    if message == "(compiled)":  # left to run time, as inference failures are
        try:
            kiln.Runner(tmp_path / "m.kiln").run({})
            message = "(ran)"
        except kiln.Error as error:
            message = str(error)
    assert "too long" in message, message


def test_integer_cumsum_wraps(tmp_path):
    """CumSum's integer sums overflowed (undefined behaviour; graph_run_fuzz):
    they wrap, as Add does."""
    x = helper.make_tensor_value_info("x", TensorProto.INT64, [3])
    axis = numpy_helper.from_array(np.array(0, np.int64), "axis")
    feeds = {"x": np.array([np.iinfo(np.int64).max, 1, 1], np.int64)}
    y = compile_and_run(tmp_path, [helper.make_node("CumSum", ["x", "axis"], ["y"])], [axis], [out("y")], [x],
                        feeds)["y"]
    np.testing.assert_array_equal(y, [np.iinfo(np.int64).max, INT64_MIN, INT64_MIN + 1])
