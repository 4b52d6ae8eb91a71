"""NonZero, NonMaxSuppression, Compress and Unique on values the model computes: their output
sizes are known only as the model runs, so kiln runs it in stages (the
selection evaluated on the host, what follows specialized on the sizes it
gave). Checked against onnxruntime over calls whose selections differ in
size, with the plans cached per size."""

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import kiln

RNG = np.random.default_rng(11)


def save(tmp_path, name, nodes, inputs, outputs, inits):
    graph = helper.make_graph(nodes, name, inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    return path


def detector(tmp_path):
    """A detection head as exporters write it: boxes and class scores from a
    feature map, NonMaxSuppression with constant thresholds, then the kept
    boxes gathered by index."""
    n = 40
    nodes = [
        helper.make_node("MatMul", ["features", "Wb"], ["raw"]),                   # [1, n, 4]
        helper.make_node("Sigmoid", ["raw"], ["unit"]),
        helper.make_node("Mul", ["unit", "size"], ["boxes"]),                      # corners in [0, 10)
        helper.make_node("MatMul", ["features", "Ws"], ["logits"]),                # [1, n, 3]
        helper.make_node("Sigmoid", ["logits"], ["probs"]),
        helper.make_node("Transpose", ["probs"], ["scores"], perm=[0, 2, 1]),      # [1, 3, n]
        helper.make_node("NonMaxSuppression", ["boxes", "scores", "max_boxes", "iou", "score_th"], ["selected"]),
        helper.make_node("Gather", ["selected", "box_column"], ["box_index"], axis=1),
        helper.make_node("Squeeze", ["boxes", "zero_axis"], ["box_list"]),
        helper.make_node("Gather", ["box_list", "box_index"], ["kept"], axis=0),
    ]
    inits = [numpy_helper.from_array(RNG.standard_normal((8, 4)).astype(np.float32), "Wb"),
             numpy_helper.from_array(RNG.standard_normal((8, 3)).astype(np.float32), "Ws"),
             numpy_helper.from_array(np.array(10.0, np.float32), "size"),
             numpy_helper.from_array(np.array([20], np.int64), "max_boxes"),
             numpy_helper.from_array(np.array([0.3], np.float32), "iou"),
             numpy_helper.from_array(np.array([0.6], np.float32), "score_th"),
             numpy_helper.from_array(np.array(2, np.int64), "box_column"),
             numpy_helper.from_array(np.array([0], np.int64), "zero_axis")]
    return save(tmp_path, "detector", nodes, [helper.make_tensor_value_info("features", TensorProto.FLOAT, [1, n, 8])],
                [helper.make_tensor_value_info("selected", TensorProto.INT64, ["k", 3]),
                 helper.make_tensor_value_info("kept", TensorProto.FLOAT, ["k", 4])], inits)


def test_non_max_suppression_on_computed_boxes_matches_onnxruntime(tmp_path):
    path = detector(tmp_path)
    report = kiln.compile(path, tmp_path / "detector.kiln")
    assert report["runtime_shapes"]
    runner = kiln.Runner(tmp_path / "detector.kiln")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    counts = set()
    for _ in range(12):
        features = (RNG.standard_normal((1, 40, 8)) * RNG.uniform(0.2, 2)).astype(np.float32)
        ours = runner.run({"features": features})
        selected, kept = session.run(None, {"features": features})
        np.testing.assert_array_equal(ours["selected"], selected)
        np.testing.assert_allclose(ours["kept"], kept, rtol=1e-4, atol=1e-6)
        counts.add(len(selected))
    assert len(counts) > 1, counts  # the selections differed in size
    stats = runner.memory_stats()
    # The backbone compiled once; what follows the selection once per count.
    assert stats["plan_cache_hits"] > 0


def test_non_zero_of_a_computed_mask_matches_onnxruntime(tmp_path):
    nodes = [helper.make_node("Greater", ["x", "threshold"], ["mask"]),
             helper.make_node("NonZero", ["mask"], ["where"]),
             helper.make_node("Transpose", ["where"], ["points"], perm=[1, 0]),
             helper.make_node("GatherND", ["x", "points"], ["values"])]
    inits = [numpy_helper.from_array(np.array(0.5, np.float32), "threshold")]
    path = save(tmp_path, "mask", nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["h", "w"])],
                [helper.make_tensor_value_info("where", TensorProto.INT64, [2, "k"]),
                 helper.make_tensor_value_info("values", TensorProto.FLOAT, ["k"])], inits)
    kiln.compile(path, tmp_path / "mask.kiln", dynamic=True)
    runner = kiln.Runner(tmp_path / "mask.kiln")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for shape in [(4, 5), (4, 5), (7, 3), (1, 1)]:
        x = RNG.uniform(0, 1, shape).astype(np.float32)
        ours = runner.run({"x": x})
        where, values = session.run(None, {"x": x})
        np.testing.assert_array_equal(ours["where"], where)
        np.testing.assert_array_equal(ours["values"], values)
    x = np.zeros((3, 3), np.float32)  # nothing selected: empty outputs
    assert runner.run({"x": x})["where"].shape == (2, 0)


def test_compress_and_unique_of_computed_values_match_onnxruntime(tmp_path):
    """Rows kept by a computed condition (Compress along axis 0), and the
    distinct rounded values of a computed tensor with their counts (Unique)."""
    nodes = [helper.make_node("ReduceMax", ["x"], ["row_max"], axes=[1], keepdims=0),
             helper.make_node("Greater", ["row_max", "threshold"], ["keep"]),
             helper.make_node("Compress", ["x", "keep"], ["rows"], axis=0),
             helper.make_node("Mul", ["x", "ten"], ["scaled"]),
             helper.make_node("Floor", ["scaled"], ["bins"]),
             helper.make_node("Unique", ["bins"], ["values", "first", "inverse", "counts"], sorted=1)]
    inits = [numpy_helper.from_array(np.array(0.8, np.float32), "threshold"),
             numpy_helper.from_array(np.array(10.0, np.float32), "ten")]
    path = save(tmp_path, "select", nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, 4])],
                [helper.make_tensor_value_info("rows", TensorProto.FLOAT, ["r", 4]),
                 helper.make_tensor_value_info("values", TensorProto.FLOAT, ["u"]),
                 helper.make_tensor_value_info("first", TensorProto.INT64, ["u"]),
                 helper.make_tensor_value_info("inverse", TensorProto.INT64, [24]),
                 helper.make_tensor_value_info("counts", TensorProto.INT64, ["u"])], inits)
    kiln.compile(path, tmp_path / "select.kiln")
    runner = kiln.Runner(tmp_path / "select.kiln")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    for _ in range(5):
        x = RNG.uniform(0, 1, (6, 4)).astype(np.float32)
        ours = runner.run({"x": x})
        for name, theirs in zip(names, session.run(None, {"x": x})):
            np.testing.assert_array_equal(ours[name], theirs, err_msg=name)
