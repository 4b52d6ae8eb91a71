"""Indexing operators through the Python Runner: sizes read from input
values (TopK's k, Range's scalars) specialize the package per call, and
bfloat16 crosses the boundary through ml_dtypes; results match onnxruntime."""

import ml_dtypes
import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

import kiln


def save(path, nodes, inputs, outputs, opset=18):
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    return path


def test_topk_and_range_sizes_come_from_input_values(tmp_path):
    t = helper.make_tensor_value_info
    path = save(tmp_path / "m.onnx",
                [helper.make_node("TopK", ["x", "k"], ["values", "indices"], largest=0),
                 helper.make_node("Range", ["start", "limit", "delta"], ["r"])],
                [t("x", TensorProto.FLOAT, [3, 10]), t("k", TensorProto.INT64, [1]),
                 t("start", TensorProto.INT32, []), t("limit", TensorProto.INT32, []),
                 t("delta", TensorProto.INT32, [])],
                [t("values", TensorProto.FLOAT, None), t("indices", TensorProto.INT64, None),
                 t("r", TensorProto.INT32, None)])
    kiln.compile(path, tmp_path / "m.kiln")
    runner = kiln.Runner(tmp_path / "m.kiln")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    for k, (start, limit, delta) in [(2, (0, 7, 2)), (5, (10, -3, -4)), (2, (3, 3, 1))]:
        feeds = {"x": rng.standard_normal((3, 10)).astype(np.float32), "k": np.array([k], np.int64),
                 "start": np.array(start, np.int32), "limit": np.array(limit, np.int32),
                 "delta": np.array(delta, np.int32)}
        got = runner.run(feeds)
        want = dict(zip(["values", "indices", "r"], session.run(None, feeds)))
        for name in want:
            assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape, name
            np.testing.assert_array_equal(got[name], want[name])


def test_bfloat16_einsum(tmp_path):
    t = helper.make_tensor_value_info
    path = save(tmp_path / "m.onnx", [helper.make_node("Einsum", ["a", "b"], ["y"], equation="bij,bjk->bik")],
                [t("a", TensorProto.BFLOAT16, [2, 3, 4]), t("b", TensorProto.BFLOAT16, [2, 4, 5])],
                [t("y", TensorProto.BFLOAT16, [2, 3, 5])])
    kiln.compile(path, tmp_path / "m.kiln")
    rng = np.random.default_rng(2)
    a = rng.standard_normal((2, 3, 4)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((2, 4, 5)).astype(ml_dtypes.bfloat16)
    y = kiln.Runner(tmp_path / "m.kiln").run({"a": a, "b": b})["y"]
    assert y.dtype == ml_dtypes.bfloat16 and y.shape == (2, 3, 5)
    want = np.einsum("bij,bjk->bik", a.astype(np.float32), b.astype(np.float32))
    np.testing.assert_allclose(y.astype(np.float32), want, rtol=1e-2, atol=1e-2)
