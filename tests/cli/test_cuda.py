"""The cuda target and device, end to end through the command line:
`kiln compile --target cuda` works on every machine (no GPU needed), and
where the machine has a GPU, `kiln run` on cuda matches onnxruntime (CPU)
on models that cover every cuda kernel family, a step that runs on the host
(no cuda kernel), CUDA graphs on and off, and `kiln bench` through the
model runner. Tests that need a GPU skip with the reason where none is."""

import json
import os
import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

RNG = np.random.default_rng(7)


def weight(name, *shape, scale=0.3):
    return numpy_helper.from_array((RNG.standard_normal(shape) * scale).astype(np.float32), name)


def save(tmp_path, name, nodes, inputs, outputs, initializers, opset=17):
    graph = helper.make_graph(nodes, name, inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    return path


def f32(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def encoder_block(tmp_path):
    """Attention and MLP of a transformer layer: Gather, MatMul (+bias, GELU),
    batched MatMul, Transpose, Softmax, LayerNormalization, Reshape views,
    a residual Add, Slice, Concat, Cast, Where and a reduction."""
    d, heads, seq = 32, 4, 8
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["emb"]),
        helper.make_node("LayerNormalization", ["emb", "ln_s", "ln_b"], ["x"], axis=-1),
        helper.make_node("MatMul", ["x", "Wq"], ["q0"]), helper.make_node("Add", ["q0", "bq"], ["q"]),
        helper.make_node("MatMul", ["x", "Wk"], ["k0"]), helper.make_node("Add", ["k0", "bk"], ["k"]),
        helper.make_node("Reshape", ["q", "heads_shape"], ["qh"]),
        helper.make_node("Reshape", ["k", "heads_shape"], ["kh"]),
        helper.make_node("Transpose", ["qh"], ["qt"], perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["kh"], ["kt"], perm=[0, 2, 3, 1]),
        helper.make_node("MatMul", ["qt", "kt"], ["scores"]),
        helper.make_node("Mul", ["scores", "scale"], ["scaled"]),
        helper.make_node("Cast", ["mask"], ["maskb"], to=TensorProto.BOOL),
        helper.make_node("Where", ["maskb", "scaled", "neg"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "qt"], ["ctx"]),
        helper.make_node("Transpose", ["ctx"], ["ctxt"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ctxt", "flat_shape"], ["ctxf"]),
        helper.make_node("Add", ["ctxf", "x"], ["res"]),
        helper.make_node("MatMul", ["res", "W1"], ["h0"]), helper.make_node("Add", ["h0", "b1"], ["h1"]),
        helper.make_node("Gelu", ["h1"], ["h"], domain=""),
        helper.make_node("Slice", ["h", "starts", "ends", "axes"], ["hs"]),
        helper.make_node("Concat", ["hs", "res"], ["cat"], axis=-1),
        helper.make_node("ReduceMean", ["cat", "rm_axes"], ["y"], keepdims=0),
        helper.make_node("LogSoftmax", ["y"], ["z"], axis=-1),
    ]
    ints = lambda name, values: numpy_helper.from_array(np.array(values, np.int64), name)
    inits = [weight("table", 50, d), weight("ln_s", d), weight("ln_b", d), weight("Wq", d, d), weight("bq", d),
             weight("Wk", d, d), weight("bk", d), weight("W1", d, 2 * d), weight("b1", 2 * d),
             ints("heads_shape", [1, seq, heads, d // heads]), ints("flat_shape", [1, seq, d]),
             numpy_helper.from_array(np.array(0.5, np.float32), "scale"),
             numpy_helper.from_array(np.array(-1e4, np.float32), "neg"),
             ints("starts", [3]), ints("ends", [3 + 16]), ints("axes", [2]), ints("rm_axes", [1])]
    inputs = [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, seq]),
              helper.make_tensor_value_info("mask", TensorProto.INT64, [1, 1, 1, seq])]
    path = save(tmp_path, "encoder", nodes, inputs, [f32("z", [1, 48])], inits, opset=20)
    feeds = {"ids": RNG.integers(0, 50, (1, seq)).astype(np.int64),
             "mask": np.array([[[[1, 1, 1, 1, 1, 1, 0, 0]]]], np.int64)}
    return path, feeds


def conv_net(tmp_path, batch=2):
    """Conv (+bias, ReLU), grouped, depthwise (+Clip) and 1x1 (+residual, ReLU)
    Convs, MaxPool, AveragePool, a residual,
    GlobalAveragePool, Flatten and Gemm; TopK has no cuda kernel and runs on
    the host between device steps."""
    nodes = [
        helper.make_node("Conv", ["x", "W1", "B1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "W2"], ["c2"], pads=[1, 1, 1, 1], group=4),
        # Depthwise (kiln's kernel, Clip fused) and 1x1 (cuBLAS, bias + residual + Relu fused).
        helper.make_node("Conv", ["c2", "Wd", "Bd"], ["d"], pads=[1, 1, 1, 1], group=16),
        helper.make_node("Clip", ["d", "lo", "hi"], ["d6"]),
        helper.make_node("Conv", ["d6", "Wp", "Bp"], ["pw"]),
        helper.make_node("Add", ["pw", "r1"], ["pr"]),
        helper.make_node("Relu", ["pr"], ["pr1"]),
        helper.make_node("Add", ["pr1", "r1"], ["res"]),
        helper.make_node("MaxPool", ["res"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("AveragePool", ["p"], ["ap"], kernel_shape=[2, 2], strides=[1, 1]),
        helper.make_node("GlobalAveragePool", ["ap"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "Wf", "Bf"], ["logits"], transB=1),
        helper.make_node("TopK", ["logits", "k"], ["top", "top_i"], axis=-1),
        helper.make_node("Sigmoid", ["top"], ["y"]),
    ]
    inits = [weight("W1", 16, 3, 3, 3), weight("B1", 16), weight("W2", 16, 4, 3, 3), weight("Wd", 16, 1, 3, 3),
             weight("Bd", 16), weight("Wp", 16, 16, 1, 1), weight("Bp", 16),
             numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
             numpy_helper.from_array(np.array(6.0, np.float32), "hi"), weight("Wf", 10, 16),
             weight("Bf", 10), numpy_helper.from_array(np.array([5], np.int64), "k")]
    path = save(tmp_path, "convnet", nodes, [f32("x", [batch, 3, 32, 32])], [f32("y", [batch, 5])], inits)
    return path, {"x": RNG.standard_normal((batch, 3, 32, 32)).astype(np.float32)}


def middle_axes(tmp_path):
    """Elementwise programs over every broadcast pattern the specialized
    kernels handle (full-size, a row of four, a column, an odd row, a
    scalar), Softmax and reductions over a middle axis with many rows
    (YOLOv8's distance bins), and a ConvTranspose whose kernel equals its
    stride (a segmentation head's upsampling)."""
    nodes = [
        helper.make_node("Softmax", ["x"], ["sm"], axis=1),
        helper.make_node("Mul", ["sm", "row"], ["a"]),            # a [300] row, 4-wide
        helper.make_node("Add", ["a", "col"], ["b"]),             # [4, 1] column
        helper.make_node("Sigmoid", ["b"], ["c"]),
        helper.make_node("Mul", ["c", "half"], ["d"]),            # a scalar
        helper.make_node("ReduceSum", ["d", "axes"], ["e"], keepdims=1),
        helper.make_node("Sub", ["d", "e"], ["f"]),               # [2, 1, 4, 300] over [2, 8, 4, 300]
        helper.make_node("Reshape", ["f", "as_image"], ["g"]),
        helper.make_node("ConvTranspose", ["g", "Wt", "Bt"], ["h"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Add", ["h", "odd"], ["y"]),             # a [50] row: one wide
    ]
    inits = [weight("row", 300), weight("col", 4, 1), numpy_helper.from_array(np.array(0.5, np.float32), "half"),
             numpy_helper.from_array(np.array([1], np.int64), "axes"),
             numpy_helper.from_array(np.array([2, 8, 48, 25], np.int64), "as_image"),
             weight("Wt", 8, 3, 2, 2), weight("Bt", 3), weight("odd", 50)]
    path = save(tmp_path, "middle_axes", nodes, [f32("x", [2, 8, 4, 300])], [f32("y", [2, 3, 96, 50])], inits)
    return path, {"x": (RNG.standard_normal((2, 8, 4, 300)) * 3).astype(np.float32)}


def copies(tmp_path):
    """Strided copies the runtime compiler specializes: a Transpose that keeps
    the last axis (four elements at a time), a reversing Slice (negative
    strides), a Transpose that moves the last axis, an Expand, a copy of
    8-byte elements (int64); Splits and Concats of 4- and 16-byte pieces."""
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1, 3]),
        helper.make_node("Slice", ["t", "starts", "ends", "axes", "steps"], ["s"]),
        helper.make_node("Transpose", ["s"], ["u"], perm=[3, 1, 2, 0]),
        helper.make_node("Expand", ["u", "shape"], ["v"]),
        helper.make_node("Cast", ["v"], ["w"], to=TensorProto.INT64),
        helper.make_node("Transpose", ["w"], ["z"], perm=[1, 0, 2, 3, 4]),
        helper.make_node("Cast", ["z"], ["y"], to=TensorProto.FLOAT),
        helper.make_node("Split", ["x", "sizes"], ["p", "q"], axis=3),
        helper.make_node("Concat", ["q", "p", "q"], ["c"], axis=3),             # rows of 27 floats
        helper.make_node("Split", ["c", "thirds"], ["c0", "c1", "c2"], axis=1),  # 16-byte pieces
        helper.make_node("Concat", ["c2", "c0"], ["d"], axis=1),
    ]
    inits = [numpy_helper.from_array(np.array([15], np.int64), "starts"),
             numpy_helper.from_array(np.array([-100], np.int64), "ends"),
             numpy_helper.from_array(np.array([3], np.int64), "axes"),
             numpy_helper.from_array(np.array([-1], np.int64), "steps"),
             numpy_helper.from_array(np.array([3, 16, 8, 6, 2], np.int64), "shape"),
             numpy_helper.from_array(np.array([5, 11], np.int64), "sizes"),
             numpy_helper.from_array(np.array([2, 2, 2], np.int64), "thirds")]
    path = save(tmp_path, "copies", nodes, [f32("x", [2, 6, 8, 16])],
                [f32("y", [16, 3, 8, 6, 2]), f32("d", [2, 4, 8, 27])], inits)
    return path, {"x": (RNG.standard_normal((2, 6, 8, 16)) * 100).round().astype(np.float32)}


def gpu_present(kiln, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    env["KILN_DEVICE_LOCK_DIR"] = str(tmp_path / "locks")
    return re.search(r"^cuda:0\s", kiln("devices", env=env).stdout, re.M) is not None


def compile_for(kiln, path, target, tmp_path):
    out = tmp_path / f"{path.stem}.{target}.kiln"
    result = kiln("compile", path, "-o", out, "--target", target)
    assert result.returncode == 0, result.stderr
    return out, result


def run(kiln, package, feeds, tmp_path, tag, env=None):
    args = []
    for name, value in feeds.items():
        np.save(tmp_path / f"{tag}_{name}.npy", value)
        args += ["--input", f"{name}={tmp_path / f'{tag}_{name}.npy'}"]
    out = tmp_path / f"out_{tag}"
    result = kiln("run", package, *args, "--output-dir", out, env=env)
    assert result.returncode == 0, result.stderr
    return {p.stem: np.load(p) for p in out.glob("*.npy")}


def assert_matches_onnxruntime(path, feeds, ours):
    """kiln's outputs against onnxruntime's CPU outputs, within the f32 bounds."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    theirs = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    assert sorted(ours) == sorted(theirs)
    for name, reference in theirs.items():
        np.testing.assert_allclose(ours[name], reference, rtol=1e-4, atol=1e-5, err_msg=name)


def compile_and_run(kiln, path, feeds, tmp_path, flag, env):
    """Compiles for cuda with a precision flag (--tf32, --fp16) and runs it."""
    tag = flag.strip("-")
    package = tmp_path / f"{tag}.kiln"
    result = kiln("compile", path, "-o", package, "--target", "cuda", flag)
    assert result.returncode == 0, result.stderr
    return run(kiln, package, feeds, tmp_path, tag, env=env)


def test_compile_for_cuda_needs_no_gpu(kiln, tmp_path):
    path, _ = conv_net(tmp_path)
    package, result = compile_for(kiln, path, "cuda", tmp_path)
    dump = kiln("dump", package, "--all")
    assert dump.returncode == 0, dump.stderr
    assert re.search(r"^\s*Device: cuda$", dump.stdout, re.M), dump.stdout
    # TopK has no cuda kernel: the compile says it will run on the host.
    assert re.search(r"run on the host: .*TopK x1", result.stderr), result.stderr


def test_cuda_package_without_a_gpu_is_refused_clearly(kiln, tmp_path):
    if gpu_present(kiln, tmp_path):
        pytest.skip("this machine has a GPU")
    path, feeds = conv_net(tmp_path)
    package, _ = compile_for(kiln, path, "cuda", tmp_path)
    np.save(tmp_path / "x.npy", feeds["x"])
    result = kiln("run", package, "--input", f"x={tmp_path / 'x.npy'}")
    assert result.returncode == 1
    assert "no cuda device on this machine" in result.stderr or "no CUDA device" in result.stderr, result.stderr


def dynamic_net(tmp_path):
    """Run-time shapes: any batch and image size (Conv, a mean over the image,
    a product), then the first k values of the product, k the count of its
    positive values: a shape that depends on what the model computes (the
    model runs in two stages)."""
    nodes = [
        helper.make_node("Conv", ["x", "Wc", "bc"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("ReduceMean", ["r"], ["m"], axes=[2, 3], keepdims=0),
        helper.make_node("MatMul", ["m", "Wm"], ["y"]),
        helper.make_node("Reshape", ["y", "flat_shape"], ["flat"]),
        helper.make_node("Greater", ["flat", "zero"], ["g"]),
        helper.make_node("Cast", ["g"], ["ones"], to=TensorProto.INT64),
        helper.make_node("ReduceSum", ["ones", "axes"], ["count"]),
        helper.make_node("Slice", ["flat", "start", "count"], ["head"]),
    ]
    inits = [weight("Wc", 4, 3, 3, 3), weight("bc", 4), weight("Wm", 4, 5),
             numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
             numpy_helper.from_array(np.array([-1], np.int64), "flat_shape"),
             numpy_helper.from_array(np.array([0], np.int64), "axes"),
             numpy_helper.from_array(np.array([0], np.int64), "start")]
    path = save(tmp_path, "dynamic_net", nodes, [f32("x", ["n", 3, "h", "w"])],
                [f32("y", ["n", 5]), f32("head", ["k"])], inits)
    return path


def test_dynamic_cuda_package_compiles_without_a_gpu(kiln, tmp_path):
    path = dynamic_net(tmp_path)
    package = tmp_path / "dyn.kiln"
    result = kiln("compile", path, "-o", package, "--target", "cuda", "--dynamic", "--fp16")
    assert result.returncode == 0, result.stderr
    dump = kiln("dump", package, "--all").stdout
    assert re.search(r"^\s*Device: cuda$", dump, re.M), dump
    assert "kiln-graph" in dump and "cuda.fp16" in dump, dump
    if gpu_present(kiln, tmp_path):
        return
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 8, 8), np.float32))
    refused = kiln("run", package, "--input", f"x={tmp_path / 'x.npy'}")
    assert refused.returncode == 1
    assert "no cuda device on this machine" in refused.stderr or "no CUDA device" in refused.stderr, refused.stderr


def test_dynamic_cuda_package_runs_each_signature_on_the_gpu(kiln, tmp_path):
    """Each input signature compiled for the GPU at its first call; a stage
    whose values decide the next one's shapes hands over through host
    memory."""
    if not gpu_present(kiln, tmp_path):
        pytest.skip("no GPU on this machine")
    path = dynamic_net(tmp_path)
    package = tmp_path / "dyn.kiln"
    result = kiln("compile", path, "-o", package, "--target", "cuda", "--dynamic")
    assert result.returncode == 0, result.stderr
    env = dict(os.environ, KILN_DEVICE_LOCK_DIR=str(tmp_path / "locks"))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for tag, shape in [("small", (1, 3, 8, 8)), ("large", (3, 3, 16, 12))]:
        feeds = {"x": RNG.standard_normal(shape).astype(np.float32)}
        ours = run(kiln, package, feeds, tmp_path, tag, env=env)
        theirs = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
        assert ours["head"].shape == theirs["head"].shape
        for name in ("y", "head"):
            np.testing.assert_allclose(ours[name], theirs[name], rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("make", [encoder_block, conv_net, middle_axes, copies],
                         ids=["encoder", "convnet", "middle_axes", "copies"])
@pytest.mark.parametrize("graphs", ["1", "0"], ids=["graphs", "no_graphs"])
@pytest.mark.parametrize("jit", ["1", "0"], ids=["specialized", "interpreted"])
def test_cuda_matches_onnxruntime(kiln, tmp_path, make, graphs, jit):
    """Each model on cuda, with CUDA graphs and without, with the elementwise
    kernels the runtime compiler specializes and with the interpreter."""
    if not gpu_present(kiln, tmp_path):
        pytest.skip("no GPU on this machine")
    path, feeds = make(tmp_path)
    package, _ = compile_for(kiln, path, "cuda", tmp_path)
    env = dict(os.environ, KILN_CUDA_GRAPHS=graphs, KILN_CUDA_JIT=jit, KILN_DEVICE_LOCK_DIR=str(tmp_path / "locks"))
    ours = run(kiln, package, feeds, tmp_path, "cuda", env=env)
    assert_matches_onnxruntime(path, feeds, ours)


def test_tf32_is_recorded_for_cuda_and_refused_for_cpu(kiln, tmp_path):
    path, _ = conv_net(tmp_path)
    plain, _ = compile_for(kiln, path, "cuda", tmp_path)
    fast = tmp_path / "convnet.tf32.kiln"
    result = kiln("compile", path, "-o", fast, "--target", "cuda", "--tf32")
    assert result.returncode == 0, result.stderr
    # The steps' math attribute (core/math_mode.h) travels in the executable.
    assert b"tf32" in fast.read_bytes() and b"tf32" not in plain.read_bytes()
    refused = kiln("compile", path, "-o", tmp_path / "cpu.kiln", "--tf32")
    assert refused.returncode == 1
    assert "tf32 (--tf32) is for the cuda target" in refused.stderr, refused.stderr


@pytest.mark.parametrize("make", [encoder_block, conv_net], ids=["encoder", "convnet"])
def test_tf32_stays_within_its_documented_tolerance(kiln, tmp_path, make):
    """TF32 rounds each product's operands to 10 bits of mantissa: docs/cuda.md
    documents 1e-2 of the output's largest magnitude as its bound."""
    if not gpu_present(kiln, tmp_path):
        pytest.skip("no GPU on this machine")
    path, feeds = make(tmp_path)
    env = dict(os.environ, KILN_DEVICE_LOCK_DIR=str(tmp_path / "locks"))
    (ours,) = compile_and_run(kiln, path, feeds, tmp_path, "--tf32", env).values()
    theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    error = np.max(np.abs(ours - theirs)) / np.max(np.abs(theirs))
    assert error <= 1e-2, error


@pytest.mark.parametrize("flag,dtype", [("--fp16", "F16"), ("--bf16", "BF16")], ids=["fp16", "bf16"])
def test_half_storage_stores_weights_in_16_bits_for_cuda(kiln, tmp_path, flag, dtype):
    path, _ = encoder_block(tmp_path)
    package = tmp_path / "encoder.half.kiln"
    result = kiln("compile", path, "-o", package, "--target", "cuda", flag)
    assert result.returncode == 0, result.stderr
    dump = kiln("dump", package, "--all").stdout
    # The products' weights travel as 16-bit copies; the model's inputs and
    # outputs keep their types.
    suffix = flag.strip("-").replace("fp", "f")  # f16, bf16
    assert re.search(rf'Name: "Wq:{suffix}":\s+TensorInfo: \{{ dtype: {dtype},', dump), dump
    assert re.search(r'Name: "z":\s+TensorInfo: \{ dtype: F32', dump), dump
    # For the cpu target, --fp16 is refused; --bf16 means bf16 products
    # (python/tests/test_bf16_cpu.py).
    cpu = kiln("compile", path, "-o", tmp_path / "cpu.kiln", flag)
    if flag == "--fp16":
        assert cpu.returncode == 1
        assert "fp16 (--fp16) is for the cuda target" in cpu.stderr, cpu.stderr
    else:
        assert cpu.returncode == 0, cpu.stderr


def test_fp16_and_bf16_exclude_each_other(kiln, tmp_path):
    path, _ = encoder_block(tmp_path)
    refused = kiln("compile", path, "-o", tmp_path / "both.kiln", "--target", "cuda", "--fp16", "--bf16")
    assert refused.returncode != 0
    assert "excludes" in refused.stderr or "exclude each other" in refused.stderr, refused.stderr


# The documented bounds (docs/cuda.md) against onnxruntime's f32 outputs, as a
# fraction of each output's largest magnitude: f16 keeps 11 bits of mantissa,
# bf16 8.
HALF_BOUNDS = {"--fp16": 1e-2, "--bf16": 3e-2}


@pytest.mark.parametrize("make", [encoder_block, conv_net, middle_axes, copies],
                         ids=["encoder", "convnet", "middle_axes", "copies"])
@pytest.mark.parametrize("jit", ["1", "0"], ids=["specialized", "interpreted"])
@pytest.mark.parametrize("flag", ["--fp16", "--bf16"], ids=["fp16", "bf16"])
def test_half_storage_stays_within_its_documented_tolerance(kiln, tmp_path, make, jit, flag):
    """16-bit storage rounds every converted tensor (f16 to 11 bits of
    mantissa, bf16 to 8): its error stays within the bound docs/cuda.md
    documents against onnxruntime's f32 outputs."""
    if not gpu_present(kiln, tmp_path):
        pytest.skip("no GPU on this machine")
    path, feeds = make(tmp_path)
    env = dict(os.environ, KILN_CUDA_JIT=jit, KILN_DEVICE_LOCK_DIR=str(tmp_path / "locks"))
    ours = compile_and_run(kiln, path, feeds, tmp_path, flag, env)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    theirs = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    assert sorted(ours) == sorted(theirs)
    for name, reference in theirs.items():
        assert ours[name].dtype == reference.dtype, name
        error = np.max(np.abs(ours[name] - reference)) / np.max(np.abs(reference))
        print(f"{flag} {make.__name__} jit={jit} {name}: {error:.2e}")
        assert error <= HALF_BOUNDS[flag], (name, error)


def test_bench_runs_a_cuda_package_through_the_runner(kiln, tmp_path):
    if not gpu_present(kiln, tmp_path):
        pytest.skip("no GPU on this machine")
    path, _ = conv_net(tmp_path)
    package, _ = compile_for(kiln, path, "cuda", tmp_path)
    env = dict(os.environ, KILN_DEVICE_LOCK_DIR=str(tmp_path / "locks"))
    result = kiln("bench", package, "--iterations", "30", "--warmup", "5", "--json", env=env)
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stdout)
    assert 0 < stats["p50_ms"] <= stats["p90_ms"]


def control_flow(tmp_path):
    """If, Loop and Scan with cuda kernels inside their bodies: an If on a
    condition the model computes (each branch a different product), a Loop of
    5 iterations with a carried value and a scan output, and a Scan that runs
    a running sum backwards over the middle axis."""
    then_branch = helper.make_graph(
        [helper.make_node("MatMul", ["x", "Wa"], ["ya"])], "then", [], [f32("ya", [4, 8])])
    else_branch = helper.make_graph(
        [helper.make_node("MatMul", ["x", "Wb"], ["yb"]), helper.make_node("Tanh", ["yb"], ["yc"])],
        "else", [], [f32("yc", [4, 8])])
    loop_body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["fi"], to=TensorProto.FLOAT),
         helper.make_node("MatMul", ["h_in", "Wl"], ["hw"]),
         helper.make_node("Add", ["hw", "fi"], ["hs"]),
         helper.make_node("Sigmoid", ["hs"], ["h_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("ReduceSum", ["h_out"], ["row"], keepdims=0)],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []), f32("h_in", [4, 8])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), f32("h_out", [4, 8]), f32("row", [])])
    scan_body = helper.make_graph(
        [helper.make_node("Add", ["acc_in", "xs"], ["acc_out"]),
         helper.make_node("Relu", ["acc_out"], ["ys"])],
        "scan_body", [f32("acc_in", [4]), f32("xs", [4])], [f32("acc_out", [4]), f32("ys", [4])])
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
        helper.make_node("Greater", ["total", "zero"], ["positive"]),
        helper.make_node("If", ["positive"], ["chosen"], then_branch=then_branch, else_branch=else_branch),
        helper.make_node("Loop", ["trips", "", "chosen"], ["h", "rows"], body=loop_body),
        helper.make_node("Transpose", ["chosen"], ["t"], perm=[1, 0]),
        helper.make_node("Scan", ["init", "t"], ["acc", "sums"], body=scan_body, num_scan_inputs=1,
                         scan_input_directions=[1]),
    ]
    inits = [weight("Wa", 6, 8), weight("Wb", 6, 8), weight("Wl", 8, 8),
             numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
             numpy_helper.from_array(np.array(5, np.int64), "trips"),
             numpy_helper.from_array(np.zeros(4, np.float32), "init")]
    path = save(tmp_path, "control_flow", nodes, [f32("x", [4, 6])],
                [f32("h", [4, 8]), f32("rows", [5]), f32("acc", [4]), f32("sums", [8, 4])], inits)
    return path, {"x": RNG.standard_normal((4, 6)).astype(np.float32)}


@pytest.mark.parametrize("sign", [1, -1], ids=["then", "else"])
def test_control_flow_runs_on_cuda(kiln, tmp_path, sign):
    """If, Loop and Scan on the GPU: the condition and the loop counters are
    read and written in device memory, in order with the kernels (both If
    branches taken, by the sign of the input)."""
    path, feeds = control_flow(tmp_path)
    feeds = {"x": np.abs(feeds["x"]) * sign}
    package, result = compile_for(kiln, path, "cuda", tmp_path)
    # Control flow runs on the device: the host-step notice never lists it
    # (a build without CUDA lists every other step).
    assert not re.search(r"kiln\.(If|Loop|Scan)", result.stderr), result.stderr
    if not gpu_present(kiln, tmp_path):
        pytest.skip("no GPU on this machine")
    env = dict(os.environ, KILN_DEVICE_LOCK_DIR=str(tmp_path / "locks"))
    ours = run(kiln, package, feeds, tmp_path, "cuda", env=env)
    assert_matches_onnxruntime(path, feeds, ours)


def test_dynamic_cuda_detector_selects_boxes_on_the_host(kiln, tmp_path):
    """NonMaxSuppression on boxes and scores the GPU computed: the first
    stage runs on the GPU, the selection on the host, what follows on the
    GPU again, specialized on the number of boxes kept."""
    n = 40
    nodes = [
        helper.make_node("MatMul", ["features", "Wb"], ["raw"]),
        helper.make_node("Sigmoid", ["raw"], ["unit"]),
        helper.make_node("Mul", ["unit", "size"], ["boxes"]),
        helper.make_node("MatMul", ["features", "Ws"], ["logits"]),
        helper.make_node("Sigmoid", ["logits"], ["probs"]),
        helper.make_node("Transpose", ["probs"], ["scores"], perm=[0, 2, 1]),
        helper.make_node("NonMaxSuppression", ["boxes", "scores", "max_boxes", "iou", "score_th"], ["selected"]),
        helper.make_node("Gather", ["selected", "box_column"], ["box_index"], axis=1),
        helper.make_node("Squeeze", ["boxes", "zero_axis"], ["box_list"]),
        helper.make_node("Gather", ["box_list", "box_index"], ["kept"], axis=0),
    ]
    inits = [weight("Wb", 8, 4), weight("Ws", 8, 3, scale=1.0),
             numpy_helper.from_array(np.array(10.0, np.float32), "size"),
             numpy_helper.from_array(np.array([20], np.int64), "max_boxes"),
             numpy_helper.from_array(np.array([0.3], np.float32), "iou"),
             numpy_helper.from_array(np.array([0.6], np.float32), "score_th"),
             numpy_helper.from_array(np.array(2, np.int64), "box_column"),
             numpy_helper.from_array(np.array([0], np.int64), "zero_axis")]
    path = save(tmp_path, "detector", nodes, [f32("features", [1, n, 8])],
                [helper.make_tensor_value_info("selected", TensorProto.INT64, ["k", 3]), f32("kept", ["k", 4])], inits)
    package = tmp_path / "detector.kiln"
    result = kiln("compile", path, "-o", package, "--target", "cuda")
    assert result.returncode == 0, result.stderr
    assert "shapes known at run time" in result.stdout, result.stdout
    if not gpu_present(kiln, tmp_path):
        pytest.skip("no GPU on this machine")
    env = dict(os.environ, KILN_DEVICE_LOCK_DIR=str(tmp_path / "locks"))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    counts = set()
    for tag in range(4):
        feeds = {"features": (RNG.standard_normal((1, n, 8)) * (0.5 + tag)).astype(np.float32)}
        ours = run(kiln, package, feeds, tmp_path, f"d{tag}", env=env)
        selected, kept = session.run(None, feeds)
        np.testing.assert_array_equal(ours["selected"], selected)
        np.testing.assert_allclose(ours["kept"], kept, rtol=1e-4, atol=1e-5)
        counts.add(len(selected))
    assert len(counts) > 1, counts
