"""Cast through kiln against ONNX's reference implementation (whose
conversions are ml_dtypes'), bit for bit: every f16 value into each narrow
type, with and without saturation, and every code of each narrow type back
to f32. Also checks that the Runner passes ml_dtypes arrays in and out."""

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import kiln

NARROW = {
    TensorProto.BFLOAT16: ml_dtypes.bfloat16,
    TensorProto.FLOAT8E4M3FN: ml_dtypes.float8_e4m3fn,
    TensorProto.FLOAT8E4M3FNUZ: ml_dtypes.float8_e4m3fnuz,
    TensorProto.FLOAT8E5M2: ml_dtypes.float8_e5m2,
    TensorProto.FLOAT8E5M2FNUZ: ml_dtypes.float8_e5m2fnuz,
    TensorProto.FLOAT8E8M0: ml_dtypes.float8_e8m0fnu,
    TensorProto.FLOAT4E2M1: ml_dtypes.float4_e2m1fn,
    TensorProto.INT4: ml_dtypes.int4,
    TensorProto.UINT4: ml_dtypes.uint4,
    TensorProto.INT2: ml_dtypes.int2,
    TensorProto.UINT2: ml_dtypes.uint2,
}


def cast_model(path, from_type, to_type, count, **attributes):
    node = helper.make_node("Cast", ["x"], ["y"], to=to_type, **attributes)
    graph = helper.make_graph([node], "cast", [helper.make_tensor_value_info("x", from_type, [count])],
                              [helper.make_tensor_value_info("y", to_type, [count])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 25)])
    onnx.save(model, path)
    return model


def run_both(tmp_path, x, from_type, to_type, **attributes):
    path = tmp_path / "cast.onnx"
    model = cast_model(path, from_type, to_type, x.size, **attributes)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    kiln.compile(path, tmp_path / "cast.kiln")
    got = kiln.Runner(tmp_path / "cast.kiln", threads=1).run({"x": x})["y"]
    assert got.dtype == want.dtype
    return got, want


def bits(array):
    return array.view(f"u{array.itemsize}")


def every_half():
    return np.arange(1 << 16, dtype=np.uint16).view(np.float16)


@pytest.mark.parametrize("to_type", sorted(NARROW))
@pytest.mark.parametrize("saturate", [1, 0])
def test_every_f16_value_converts_like_the_reference(tmp_path, to_type, saturate):
    got, want = run_both(tmp_path, every_half(), TensorProto.FLOAT16, to_type, saturate=saturate)
    mismatches = np.flatnonzero(bits(got) != bits(want))
    assert mismatches.size == 0, (f"{mismatches.size} differ; first: f16 bits {mismatches[0]:#06x} gave "
                                  f"{bits(got)[mismatches[0]]:#x}, want {bits(want)[mismatches[0]]:#x}")


@pytest.mark.parametrize("round_mode", ["up", "down", "nearest"])
def test_f32_to_e8m0_rounding_modes(tmp_path, round_mode):
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.standard_normal(2000) * 10.0 ** rng.integers(-30, 30, 2000),
                        [0.0, -0.0, np.inf, -np.inf, np.nan, 3.0e38, 1.5, 2.75, 1e-40]]).astype(np.float32)
    for saturate in (0, 1):
        got, want = run_both(tmp_path, x, TensorProto.FLOAT, TensorProto.FLOAT8E8M0, saturate=saturate,
                             round_mode=round_mode)
        np.testing.assert_array_equal(bits(got), bits(want))


@pytest.mark.parametrize("from_type", sorted(NARROW))
def test_every_code_converts_to_f32_like_the_reference(tmp_path, from_type):
    dtype = np.dtype(NARROW[from_type])
    width = {1: 256, 2: 1 << 16}[dtype.itemsize]
    if from_type in (TensorProto.INT4, TensorProto.UINT4, TensorProto.FLOAT4E2M1):
        width = 16
    if from_type in (TensorProto.INT2, TensorProto.UINT2):
        width = 4
    x = np.arange(width, dtype=f"u{dtype.itemsize}").view(dtype)
    got, want = run_both(tmp_path, x, from_type, TensorProto.FLOAT)
    np.testing.assert_array_equal(got, want)  # NaN where the reference has NaN


@pytest.mark.parametrize("to_type", [TensorProto.INT4, TensorProto.UINT4, TensorProto.INT2, TensorProto.UINT2,
                                     TensorProto.FLOAT8E4M3FN, TensorProto.BFLOAT16])
def test_f32_and_integers_convert_like_the_reference(tmp_path, to_type):
    x = np.array([-1e10, -9.5, -8.7, -2.5, -0.5, 0.5, 1.5, 2.5, 7.6, 15.5, 17, 1e10, np.nan, np.inf], np.float32)
    got, want = run_both(tmp_path, x, TensorProto.FLOAT, to_type)
    assert bits(got).tolist() == bits(want).tolist()
    ints = np.arange(-20, 21, dtype=np.int32)
    got, want = run_both(tmp_path, ints, TensorProto.INT32, to_type)
    assert bits(got).tolist() == bits(want).tolist()


def test_castlike_takes_the_second_inputs_type(tmp_path):
    node = helper.make_node("CastLike", ["x", "like"], ["y"], saturate=0)
    graph = helper.make_graph([node], "castlike",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
                               helper.make_tensor_value_info("like", TensorProto.FLOAT8E5M2, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT8E5M2, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    onnx.save(model, tmp_path / "castlike.onnx")
    kiln.compile(tmp_path / "castlike.onnx", tmp_path / "castlike.kiln")
    runner = kiln.Runner(tmp_path / "castlike.kiln")
    assert runner.inputs[1] == ("like", (1,), "f8e5m2")
    x = np.array([1.5, 1e6, -np.inf, 0.3], np.float32)
    like = np.zeros(1, ml_dtypes.float8_e5m2)
    got = runner.run({"x": x, "like": like})["y"]
    want = ReferenceEvaluator(model).run(None, {"x": x, "like": like})[0]
    assert got.dtype == ml_dtypes.float8_e5m2
    assert bits(got).tolist() == bits(want).tolist()
    with pytest.raises(kiln.Error, match="must be float8_e5m2, got float32"):
        runner.run({"x": x, "like": np.zeros(1, np.float32)})
