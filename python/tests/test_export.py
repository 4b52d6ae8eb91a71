"""Session.export_onnx and export_package (docs/training.md): the trained
weights and running statistics written back into the package's source
model, in inference mode, cut to the wanted outputs; the exported model
runs in onnxruntime and as a kiln inference package with the same results."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln

RNG = np.random.default_rng(5)
INIT = {"w1": (RNG.standard_normal((6, 8)) * 0.4).astype(np.float32),
        "gamma": np.ones(8, np.float32), "beta": np.zeros(8, np.float32),
        "mean": np.zeros(8, np.float32), "var": np.ones(8, np.float32),
        "w2": (RNG.standard_normal((8, 3)) * 0.4).astype(np.float32)}


def model(path, batch=16):
    f = TensorProto.FLOAT
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Unsqueeze", ["h", "axes"], ["h4"]),
             helper.make_node("BatchNormalization", ["h4", "gamma", "beta", "mean", "var"], ["n4"]),
             helper.make_node("Squeeze", ["n4", "axes"], ["n"]),
             helper.make_node("Relu", ["n"], ["r"]),
             helper.make_node("Dropout", ["r", "ratio"], ["d"]),
             helper.make_node("MatMul", ["d", "w2"], ["scores"]),
             helper.make_node("SoftmaxCrossEntropyLoss", ["scores", "labels"], ["loss"])]
    graph = helper.make_graph(
        nodes, "bn_mlp", [helper.make_tensor_value_info("x", f, [batch, 6]),
                          helper.make_tensor_value_info("labels", TensorProto.INT64, [batch])],
        [helper.make_tensor_value_info("loss", f, [])],
        [numpy_helper.from_array(v, n) for n, v in INIT.items()] +
        [numpy_helper.from_array(np.array([2, 3], np.int64), "axes"),
         numpy_helper.from_array(np.array(0.2, np.float32), "ratio")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)


@pytest.fixture
def trained(tmp_path, device):
    """A session that trained 8 steps, on cpu and on sim."""
    model(tmp_path / "m.onnx")
    kiln.compile_training(tmp_path / "m.onnx", tmp_path / "m.kiln", loss="loss", optimizer=kiln.optim.Adam(0.05))
    session = kiln.Session(tmp_path / "m.kiln", device, num_host_transfers=8)
    with session:
        session.run({"x": RNG.standard_normal((8, 16, 6)).astype(np.float32),
                     "labels": RNG.integers(0, 3, (8, 16)).astype(np.int64)})
    return session


def test_the_export_holds_the_trained_values_in_inference_mode(tmp_path, trained):
    trained.export_onnx(tmp_path / "out.onnx", outputs=["scores"], batch="N")
    exported = onnx.load(tmp_path / "out.onnx")
    onnx.checker.check_model(exported, full_check=True)
    values = {i.name: numpy_helper.to_array(i) for i in exported.graph.initializer}
    for name in INIT:  # weights trained, running statistics updated: all written back
        np.testing.assert_array_equal(values[name], trained.get_tensor_data(name), err_msg=name)
        assert not np.array_equal(values[name], INIT[name]), name
    assert [i.name for i in exported.graph.input] == ["x"]  # labels fed only the loss
    assert [o.name for o in exported.graph.output] == ["scores"]
    assert exported.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"
    bn = next(n for n in exported.graph.node if n.op_type == "BatchNormalization")
    assert [a.name for a in bn.attribute if a.name == "training_mode"] == [] and len(bn.output) == 1
    # Inference: the running statistics normalise, Dropout passes through.
    x = RNG.standard_normal((5, 6)).astype(np.float32)
    h = x @ values["w1"]
    n = (h - values["mean"]) / np.sqrt(values["var"] + 1e-5) * values["gamma"] + values["beta"]
    want = np.maximum(n, 0) @ values["w2"]
    got = ort.InferenceSession(str(tmp_path / "out.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_export_package_runs_like_onnxruntime(tmp_path, trained):
    report = trained.export_package(tmp_path / "infer.kiln", outputs=["scores"], batch=7)
    assert report["steps"] > 0 and (tmp_path / "infer.onnx").exists()
    x = RNG.standard_normal((7, 6)).astype(np.float32)
    got = kiln.Runner(tmp_path / "infer.kiln").run({"x": x})["scores"]
    want = ort.InferenceSession(str(tmp_path / "infer.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_an_inference_package_with_variables_exports_written_weights(tmp_path, device):
    model(tmp_path / "m.onnx")
    kiln.compile(tmp_path / "m.onnx", tmp_path / "v.kiln", variables=["w2"])
    with kiln.Session(tmp_path / "v.kiln", device) as session:
        session.write_variable_data("w2", np.full((8, 3), 0.5, np.float32))
        session.export_onnx(tmp_path / "v.onnx")
    values = {i.name: numpy_helper.to_array(i) for i in onnx.load(tmp_path / "v.onnx").graph.initializer}
    np.testing.assert_array_equal(values["w2"], np.full((8, 3), 0.5, np.float32))
    np.testing.assert_array_equal(values["w1"], INIT["w1"])


def test_export_errors(tmp_path, trained):
    with pytest.raises(kiln.Error, match=r"\['nope'\] are not values of the model"):
        trained.export_onnx(tmp_path / "bad.onnx", outputs=["nope"])
    assert not (tmp_path / "bad.onnx").exists()
    model(tmp_path / "m.onnx")
    kiln.compile(tmp_path / "m.onnx", tmp_path / "plain.kiln")
    with pytest.raises(kiln.Error, match="keeps no source model: it has no variables"):
        kiln.Session(tmp_path / "plain.kiln").export_onnx(tmp_path / "plain.onnx")
