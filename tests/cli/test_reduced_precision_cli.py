"""Reduced precision through the command line.

A QDQ-quantized block through `kiln compile`, `kiln run` and `kiln bench
--profile`: its Convs become int8 steps (kiln.NhwcQLinearConv), its residual
Add the depthwise Conv's sum post-op and its MaxPool an 8-bit one, and the output stays within
one quantization step of onnxruntime's per layer. Here so that `make
test-asan` runs the int8 kernels under AddressSanitizer too (the numerics in
detail: python/tests/test_qdq.py). And `--precision bf16`, the same as
`--bf16` (python/tests/test_bf16_cpu.py)."""

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from test_models import save


def qdq_block(path):
    rng = np.random.default_rng(5)
    c = 32
    inits = [numpy_helper.from_array(np.array(0.04, np.float32), "s"),
             numpy_helper.from_array(np.array(128, np.uint8), "z"),
             numpy_helper.from_array(np.array(0, np.uint8), "z0"),
             numpy_helper.from_array(rng.integers(-127, 128, (c, 16, 3, 3)).astype(np.int8), "w1"),
             numpy_helper.from_array(rng.integers(-127, 128, (c, 1, 3, 3)).astype(np.int8), "w2"),
             numpy_helper.from_array(rng.uniform(0.001, 0.004, c).astype(np.float32), "ws"),
             numpy_helper.from_array(np.zeros(c, np.int8), "wz")]
    dq = lambda x, y, *extra: helper.make_node("DequantizeLinear", [x, *extra], [y])  # noqa: E731
    q = lambda x, y, zero="z": helper.make_node("QuantizeLinear", [x, "s", zero], [y])  # noqa: E731
    nodes = [q("x", "xq"), dq("xq", "xd", "s", "z"),
             helper.make_node("DequantizeLinear", ["w1", "ws", "wz"], ["w1d"], axis=0),
             helper.make_node("DequantizeLinear", ["w2", "ws", "wz"], ["w2d"], axis=0),
             helper.make_node("Conv", ["xd", "w1d"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]), q("r1", "r1q", "z0"), dq("r1q", "r1d", "s", "z0"),
             helper.make_node("Conv", ["r1d", "w2d"], ["c2"], pads=[1, 1, 1, 1], group=c), q("c2", "c2q"),
             dq("c2q", "c2d", "s", "z"),
             helper.make_node("MaxPool", ["r1d"], ["p"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             q("p", "pq", "z0"), dq("pq", "pd", "s", "z0"),
             helper.make_node("Add", ["c2d", "pd"], ["sum"]), q("sum", "sq"), dq("sq", "y", "s", "z")]
    save(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 20, 20])],
         [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, 20, 20])], inits, path)


def test_a_qdq_block_runs_in_int8(kiln, tmp_path):
    qdq_block(tmp_path / "m.onnx")
    done = kiln("compile", tmp_path / "m.onnx", "-o", tmp_path / "m.kiln")
    assert done.returncode == 0, done.stderr
    x = np.random.default_rng(6).standard_normal((1, 16, 20, 20)).astype(np.float32) * 3
    np.save(tmp_path / "x.npy", x)
    ran = kiln("run", tmp_path / "m.kiln", "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", tmp_path)
    assert ran.returncode == 0, ran.stderr
    profile = kiln("bench", tmp_path / "m.kiln", "--iterations", "2", "--warmup", "0", "--profile")
    assert profile.returncode == 0, profile.stderr
    for op in ("kiln.NhwcQLinearConv", "kiln.NhwcMaxPool"):
        assert op in profile.stdout, profile.stdout
    assert "kiln.QLinearAdd" not in profile.stdout  # the depthwise Conv's sum post-op (passes/conv_fusion.h)
    assert " Conv " not in profile.stdout and "kiln.NhwcConv " not in profile.stdout
    ours = np.load(tmp_path / "y.npy")
    want = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.abs(ours - want).max() / 0.04 <= 2.01


def test_precision_bf16_is_the_bf16_flag(kiln, tmp_path):
    rng = np.random.default_rng(7)
    save([helper.make_node("MatMul", ["x", "w"], ["y"])], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
         [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 32])],
         [numpy_helper.from_array(rng.standard_normal((64, 32)).astype(np.float32), "w")], tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", rng.standard_normal((4, 64)).astype(np.float32))
    outputs = []
    for name, flags in (("flag", ["--bf16"]), ("precision", ["--precision", "bf16"])):
        done = kiln("compile", tmp_path / "m.onnx", "-o", tmp_path / f"{name}.kiln", *flags)
        assert done.returncode == 0, done.stderr
        (tmp_path / name).mkdir()
        ran = kiln("run", tmp_path / f"{name}.kiln", "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", tmp_path / name)
        assert ran.returncode == 0, ran.stderr
        outputs.append(np.load(tmp_path / name / "y.npy"))
    np.testing.assert_array_equal(outputs[0], outputs[1])
    refused = kiln("compile", tmp_path / "m.onnx", "-o", tmp_path / "f8.kiln", "--precision", "f8")
    assert refused.returncode != 0 and not (tmp_path / "f8.kiln").exists()


def test_kiln_quantize_runs_the_python_tool(kiln, build_dir, tmp_path):
    import os
    import sys

    import pytest
    if not (build_dir / "python" / "kiln" / "quantize.py").exists():
        pytest.skip(f"no Python module under {build_dir}: `kiln quantize` runs python -m kiln.quantize")
    rng = np.random.default_rng(8)
    save([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])],
         [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
         [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
         [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")], tmp_path / "m.onnx")
    (tmp_path / "cal").mkdir()
    for i in range(4):
        np.save(tmp_path / "cal" / f"{i}.npy", rng.standard_normal((1, 3, 8, 8)).astype(np.float32))
    env = dict(os.environ, KILN_PYTHON=sys.executable, PYTHONPATH=str(build_dir / "python"))
    done = kiln("quantize", tmp_path / "m.onnx", "--calibration", tmp_path / "cal", "-o", tmp_path / "q.onnx",
                "--method", "entropy", env=env)
    assert done.returncode == 0, done.stderr
    assert "quantized 1 nodes (entropy calibration)" in done.stdout and (tmp_path / "q.onnx").exists()
    compiled = kiln("compile", tmp_path / "q.onnx", "-o", tmp_path / "q.kiln")
    assert compiled.returncode == 0, compiled.stderr
    missing = kiln("quantize", tmp_path / "m.onnx", env=dict(env, KILN_PYTHON=str(tmp_path / "no-python")))
    assert missing.returncode == 1 and "set KILN_PYTHON" in missing.stderr
