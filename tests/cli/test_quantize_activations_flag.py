"""kiln compile --quantize-activations says what it did: how many MatMuls over
int8 weights compute in int8, a notice when the model has none, and an error
for a target other than cpu. (The rewrite and its numerics:
python/tests/test_quantize_activations.py.)"""

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from test_models import save

K, N = 64, 8


def int8_weight_model(path):
    w = np.random.default_rng(1).integers(-128, 128, (K, N)).astype(np.int8)
    nodes = [helper.make_node("Cast", ["w"], ["wf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["wf", "scale"], ["wd"]),
             helper.make_node("MatMul", ["x", "wd"], ["y"])]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.full(N, 0.01, np.float32), "scale")]
    save(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, K])],
         [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, N])], inits, path)


def test_reports_the_matmuls_it_quantized(kiln, tmp_path):
    int8_weight_model(tmp_path / "m.onnx")
    done = kiln("compile", tmp_path / "m.onnx", "-o", tmp_path / "m.kiln", "--quantize-activations")
    assert done.returncode == 0, done.stderr
    assert "int8: 1 MatMuls over int8 weights compute in int8" in done.stdout
    plain = kiln("compile", tmp_path / "m.onnx", "-o", tmp_path / "p.kiln")
    assert plain.returncode == 0 and "int8:" not in plain.stdout


def test_notice_when_no_matmul_has_int8_weights(kiln, tmp_path):
    w = np.ones((K, N), np.float32)
    save([helper.make_node("MatMul", ["x", "w"], ["y"])], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, K])],
         [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, N])], [numpy_helper.from_array(w, "w")],
         tmp_path / "f.onnx")
    done = kiln("compile", tmp_path / "f.onnx", "-o", tmp_path / "f.kiln", "--quantize-activations")
    assert done.returncode == 0, done.stderr
    assert "notice: --quantize-activations found no MatMul over int8 weights" in done.stderr


def test_refused_for_the_cuda_target(kiln, tmp_path):
    int8_weight_model(tmp_path / "m.onnx")
    done = kiln("compile", tmp_path / "m.onnx", "-o", tmp_path / "c.kiln", "--quantize-activations", "--target", "cuda")
    assert done.returncode != 0 and "for the cpu target" in done.stderr
    assert not (tmp_path / "c.kiln").exists()
