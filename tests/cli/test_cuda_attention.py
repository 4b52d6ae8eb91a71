"""Attention on cuda as one fused kernel (src/kernels/cuda/attention.cc):
the attention chains exporters write fuse into kiln.Attention for the cuda
target as for the cpu one (no GPU needed to check), and where the machine
has a GPU, the fused kernel matches onnxruntime on those chains and kiln's
CPU kernel (which passes ONNX's Attention conformance tests) on ONNX
Attention nodes of every form the kernel takes: 3-D and 4-D inputs,
grouped-query heads, bool and float masks broadcast from any rank, causal,
softcap, padding lengths, odd head sizes, one query, fully masked rows; a
head size past the kernel's limit runs on the host. In f32, and with f16
and bf16 storage within the bounds docs/cuda.md gives."""

import os
import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from test_attention_fusion import bert, four_d, save_form, sdpa, t5
from test_cuda import HALF_BOUNDS, assert_matches_onnxruntime, gpu_present, run

RNG = np.random.default_rng(31)


def exported(tmp_path, form):
    """An attention chain as test_attention_fusion builds it, with feeds."""
    path = tmp_path / f"{form.__name__}.onnx"
    return path, save_form(form, path)


FORMS = [bert, sdpa, t5, four_d]


@pytest.mark.parametrize("flag", ["", "--fp16"], ids=["f32", "fp16"])
@pytest.mark.parametrize("form", FORMS, ids=[f.__name__ for f in FORMS])
def test_exported_attention_fuses_for_cuda(kiln, build_dir, tmp_path, form, flag):
    path, _ = exported(tmp_path, form)
    args = ["--target", "cuda", "--print-ir"] + ([flag] if flag else [])
    result = kiln("compile", path, "-o", tmp_path / "m.kiln", *args)
    assert result.returncode == 0, result.stderr
    assert len(re.findall(r"kiln\.Attention", result.stdout)) == 1, result.stdout
    assert "Softmax" not in result.stdout and "MatMul" not in result.stdout, result.stdout
    # The fused kernel runs it on the GPU: no host step is announced for it
    # (a build without CUDA, as the sanitizer builds, runs every step there;
    # a bundle on a GPU machine has no CMake cache and is a CUDA build).
    cache = build_dir / "CMakeCache.txt"
    if not (cache.exists() and "KILN_CUDA:BOOL=OFF" in cache.read_text()):
        assert "Attention" not in "".join(re.findall(r"run on the host: .*", result.stderr)), result.stderr


def env_for(tmp_path):
    return dict(os.environ, KILN_DEVICE_LOCK_DIR=str(tmp_path / "locks"))


@pytest.mark.parametrize("form", FORMS, ids=[f.__name__ for f in FORMS])
def test_exported_attention_on_cuda_matches_onnxruntime(kiln, tmp_path, form):
    if not gpu_present(kiln, tmp_path):
        pytest.skip("no GPU on this machine")
    path, feeds = exported(tmp_path, form)
    package = tmp_path / "m.kiln"
    result = kiln("compile", path, "-o", package, "--target", "cuda")
    assert result.returncode == 0, result.stderr
    assert_matches_onnxruntime(path, feeds, run(kiln, package, feeds, tmp_path, "cuda", env=env_for(tmp_path)))


# ONNX Attention nodes: (id, opset, shapes and attributes). Q [b, hq, s, d]
# (or 3-D), K/V with hkv heads and t keys, V's head size dv. The kernel's
# three block shapes all appear: 16 queries with the keys split over four
# warps (few blocks: most cases), 16 queries unsplit (few_keys, head_128)
# and 64 queries (many_queries).
CASES = [
    ("4d", 23, dict(b=2, hq=4, hkv=4, s=37, t=37, d=64, dv=64)),
    ("4d_gqa_causal", 23, dict(b=2, hq=8, hkv=2, s=70, t=70, d=32, dv=32, is_causal=1)),
    ("3d_odd_heads_bool_mask", 23, dict(b=2, hq=3, hkv=3, s=19, t=45, d=17, dv=40, three_d=True, mask="bool4")),
    ("one_query_float_mask_softcap", 23, dict(b=3, hq=4, hkv=1, s=1, t=100, d=64, dv=48, mask="float2",
                                              scale=0.3, softcap=5.0)),
    ("causal_fewer_queries", 23, dict(b=1, hq=2, hkv=2, s=5, t=40, d=32, dv=32, is_causal=1, mask="float3")),
    ("head_128", 23, dict(b=1, hq=2, hkv=2, s=130, t=130, d=128, dv=128)),
    ("padding_lengths", 24, dict(b=3, hq=2, hkv=2, s=9, t=33, d=32, dv=32, nonpad=True)),
    ("head_160_on_the_host", 23, dict(b=1, hq=2, hkv=2, s=8, t=8, d=160, dv=160)),
    ("few_keys", 23, dict(b=1, hq=2, hkv=2, s=20, t=20, d=16, dv=16)),
    ("many_queries", 23, dict(b=8, hq=8, hkv=4, s=256, t=200, d=40, dv=24, mask="bool4")),
]


def attention_model(tmp_path, name, opset, c):
    """One ONNX Attention node; returns its path and feeds."""
    q = [c["b"], c["hq"], c["s"], c["d"]]
    k = [c["b"], c["hkv"], c["t"], c["d"]]
    v = [c["b"], c["hkv"], c["t"], c["dv"]]
    y = [c["b"], c["hq"], c["s"], c["dv"]]
    attrs = {key: c[key] for key in ("is_causal", "scale", "softcap") if key in c}
    if c.get("three_d"):
        q, k, v, y = ([x[0], x[2], x[1] * x[3]] for x in (q, k, v, y))
        attrs.update(q_num_heads=c["hq"], kv_num_heads=c["hkv"])
    shapes = {"Q": q, "K": k, "V": v}
    feeds = {n: RNG.standard_normal(shape).astype(np.float32) for n, shape in shapes.items()}
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n, shape in shapes.items()]
    names = ["Q", "K", "V"]
    mask = c.get("mask")
    if mask == "bool4":  # [b, 1, s, t], a row of the first batch fully masked
        value = RNG.random((c["b"], 1, c["s"], c["t"])) > 0.3
        value[0, 0, 2, :] = False
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.BOOL, value.shape))
    elif mask in ("float2", "float3"):  # [s, t] or [hq, s, t], shorter than the keys: the rest is masked
        shape = (c["s"], c["t"] - 3) if mask == "float2" else (c["hq"], c["s"], c["t"])
        value = (RNG.standard_normal(shape) * 2).astype(np.float32)
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, value.shape))
    if mask:
        feeds["mask"] = value
        names.append("mask")
    if c.get("nonpad"):
        names += ["", "", "", "lengths"] if not mask else ["", "", "lengths"]
        feeds["lengths"] = np.array([c["t"], 20, 4], np.int64)[:c["b"]]
        inputs.append(helper.make_tensor_value_info("lengths", TensorProto.INT64, [c["b"]]))
    node = helper.make_node("Attention", names, ["Y"], **attrs)
    graph = helper.make_graph([node], name, inputs, [helper.make_tensor_value_info("Y", TensorProto.FLOAT, y)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    return path, feeds


@pytest.mark.parametrize("flag", ["", "--fp16", "--bf16"], ids=["f32", "fp16", "bf16"])
@pytest.mark.parametrize("name,opset,case", CASES, ids=[c[0] for c in CASES])
def test_attention_node_on_cuda_matches_the_cpu_kernel(kiln, tmp_path, name, opset, case, flag):
    if not gpu_present(kiln, tmp_path):
        pytest.skip("no GPU on this machine")
    path, feeds = attention_model(tmp_path, name, opset, case)
    cpu_package, cuda_package = tmp_path / "cpu.kiln", tmp_path / "cuda.kiln"
    compiled = kiln("compile", path, "-o", cpu_package)
    assert compiled.returncode == 0, compiled.stderr
    compiled = kiln("compile", path, "-o", cuda_package, "--target", "cuda", *([flag] if flag else []))
    assert compiled.returncode == 0, compiled.stderr
    # Every case has a cuda kernel (the compile names none for the host); the
    # head of 160 is declined at load and runs on the host all the same.
    assert not re.search(r"run on the host: .*Attention", compiled.stderr), compiled.stderr
    reference = run(kiln, cpu_package, feeds, tmp_path, "cpu")["Y"]
    ours = run(kiln, cuda_package, feeds, tmp_path, "cuda", env=env_for(tmp_path))["Y"]
    assert ours.shape == reference.shape and ours.dtype == reference.dtype
    if not flag:
        np.testing.assert_allclose(ours, reference, rtol=1e-4, atol=1e-5)
    else:
        error = np.max(np.abs(ours - reference)) / np.max(np.abs(reference))
        print(f"{name} {flag}: {error:.2e}")
        assert error <= HALF_BOUNDS[flag], error
