"""`kiln compile --variables`: the named weights stay variables (a save
program reads them back, `kiln dump --anchors` shows its anchors), `kiln run`
runs the package as any other, and a name that is no weight is refused
(docs/session.md)."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def affine_model(path):
    w = np.arange(12, dtype=np.float32).reshape(4, 3)
    b = np.ones(3, np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])],
                              "affine", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return w, b


def test_variables_get_a_save_program_and_the_package_runs(kiln, tmp_path):
    w, b = affine_model(tmp_path / "m.onnx")
    result = kiln("compile", tmp_path / "m.onnx", "-o", tmp_path / "m.kiln", "--variables", "w,b")
    assert result.returncode == 0, result.stderr
    dump = kiln("dump", "--anchors", tmp_path / "m.kiln")
    assert dump.returncode == 0, dump.stderr
    assert "d2h_w" in dump.stdout and "d2h_b" in dump.stdout
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    result = kiln("run", tmp_path / "m.kiln", "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", tmp_path)
    assert result.returncode == 0, result.stderr
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), x @ w + b, rtol=1e-5)


def test_a_variable_that_is_no_weight_is_refused(kiln, tmp_path):
    affine_model(tmp_path / "m.onnx")
    result = kiln("compile", tmp_path / "m.onnx", "-o", tmp_path / "m.kiln", "--variables", "x")
    assert result.returncode == 1
    assert "variable 'x' is not a weight (initializer) of the model; its weights include: w, b" in result.stderr
