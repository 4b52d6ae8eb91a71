"""Plugin libraries through the command line: `kiln compile --plugin`, then
`kiln run` in a fresh process, which finds the library the package records
beside the package or in KILN_PLUGIN_PATH, and refuses a missing library or
one with other bytes (real files, real processes; docs/plugins.md)."""

import os
import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper


def example_plugin(build_dir):
    return build_dir / "examples" / "libkiln_example_ops.so"


def rotate_model(path):
    """Rotate(x, y, a) -> (x', y'); AddInPlace(Swish(x'), y'); BlockScale by 0.5 (laid out by its allocator
    hook); SerializedMatMul(that, w): every example op."""
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Rotate", ["x", "y", "a"], ["xr", "yr"], domain="com.example"),
             helper.make_node("Swish", ["xr"], ["sw"], domain="com.example", beta=0.5),
             helper.make_node("AddInPlace", ["sw", "yr"], ["sum"], domain="com.example"),
             helper.make_node("BlockScale", ["sum"], ["half"], domain="com.example", factor=0.5, alignment=512),
             helper.make_node("SerializedMatMul", ["half", "w"], ["out"], domain="com.example",
                              serialization_factor=2)]
    graph = helper.make_graph(
        nodes, "rotate",
        [helper.make_tensor_value_info(n, f, [3, 4]) for n in ("x", "y", "a")] +
        [helper.make_tensor_value_info("w", f, [4, 5])],
        [helper.make_tensor_value_info("out", f, None), helper.make_tensor_value_info("yr", f, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    onnx.save(model, path)


def inputs(folder):
    rng = np.random.default_rng(7)
    arrays = {n: rng.standard_normal(s).astype(np.float32) for n, s in
              (("x", (3, 4)), ("y", (3, 4)), ("a", (3, 4)), ("w", (4, 5)))}
    args = []
    for name, array in arrays.items():
        np.save(folder / f"{name}.npy", array)
        args += ["--input", f"{name}={folder / (name + '.npy')}"]
    return arrays, args


def reference(arrays):
    c, s = np.cos(arrays["a"]), np.sin(arrays["a"])
    xr = arrays["x"] * c - arrays["y"] * s
    yr = arrays["x"] * s + arrays["y"] * c
    swish = xr / (1 + np.exp(-0.5 * xr))
    return (0.5 * (swish + yr)) @ arrays["w"], yr


def clean_env():
    env = dict(os.environ)
    env.pop("KILN_PLUGIN_PATH", None)
    return env


def test_compile_without_the_plugin_names_the_unknown_ops(kiln, tmp_path):
    rotate_model(tmp_path / "rotate.onnx")
    result = kiln("compile", tmp_path / "rotate.onnx", "-o", tmp_path / "rotate.kiln")
    assert result.returncode == 1
    assert "Rotate (com.example, opset 1)" in result.stderr
    assert "SerializedMatMul (com.example, opset 1)" in result.stderr


def test_plugin_package_runs_with_the_library_beside_it_or_on_the_path(kiln, build_dir, tmp_path):
    rotate_model(tmp_path / "rotate.onnx")
    result = kiln("compile", tmp_path / "rotate.onnx", "-o", tmp_path / "rotate.kiln", "--plugin",
                  example_plugin(build_dir))
    assert result.returncode == 0, result.stderr
    dump = kiln("dump", "-m", tmp_path / "rotate.kiln")
    assert "plugin.libkiln_example_ops.so: level=2;hash=" in dump.stdout
    arrays, args = inputs(tmp_path)
    want_out, want_yr = reference(arrays)

    # Beside the package.
    beside = tmp_path / "beside"
    beside.mkdir()
    shutil.copy(tmp_path / "rotate.kiln", beside)
    shutil.copy(example_plugin(build_dir), beside)
    result = kiln("run", beside / "rotate.kiln", *args, "--output-dir", beside, env=clean_env())
    assert result.returncode == 0, result.stderr
    np.testing.assert_allclose(np.load(beside / "out.npy"), want_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.load(beside / "yr.npy"), want_yr, rtol=1e-5, atol=1e-6)

    # On a sim device (its own memory: the plugin steps run on its arena).
    on_sim = tmp_path / "on_sim"
    on_sim.mkdir()
    env = clean_env()
    env.update(KILN_SIM_DEVICES="1", KILN_DEVICE_LOCK_DIR=str(tmp_path / "locks"))
    result = kiln("run", beside / "rotate.kiln", *args, "--device", "sim", "--output-dir", on_sim, env=env)
    assert result.returncode == 0, result.stderr
    np.testing.assert_allclose(np.load(on_sim / "out.npy"), want_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.load(on_sim / "yr.npy"), want_yr, rtol=1e-5, atol=1e-6)

    # In a folder of KILN_PLUGIN_PATH.
    alone, libs = tmp_path / "alone", tmp_path / "libs"
    alone.mkdir()
    libs.mkdir()
    shutil.copy(tmp_path / "rotate.kiln", alone)
    shutil.copy(example_plugin(build_dir), libs)
    env = clean_env()
    env["KILN_PLUGIN_PATH"] = f"/nonexistent:{libs}"
    result = kiln("run", alone / "rotate.kiln", *args, "--output-dir", alone, env=env)
    assert result.returncode == 0, result.stderr
    np.testing.assert_allclose(np.load(alone / "out.npy"), want_out, rtol=1e-5, atol=1e-5)


def test_a_missing_library_is_a_clear_error(kiln, build_dir, tmp_path):
    rotate_model(tmp_path / "rotate.onnx")
    assert kiln("compile", tmp_path / "rotate.onnx", "-o", tmp_path / "rotate.kiln", "--plugin",
                example_plugin(build_dir)).returncode == 0
    _, args = inputs(tmp_path)
    result = kiln("run", tmp_path / "rotate.kiln", *args, "--output-dir", tmp_path, env=clean_env())
    assert result.returncode == 1
    assert "needs plugin library 'libkiln_example_ops.so'" in result.stderr
    assert "KILN_PLUGIN_PATH" in result.stderr


def test_a_library_with_other_bytes_is_refused(kiln, build_dir, tmp_path):
    rotate_model(tmp_path / "rotate.onnx")
    assert kiln("compile", tmp_path / "rotate.onnx", "-o", tmp_path / "rotate.kiln", "--plugin",
                example_plugin(build_dir)).returncode == 0
    # Another build of "the same" library: one byte appended changes its hash.
    shutil.copy(example_plugin(build_dir), tmp_path / "libkiln_example_ops.so")
    with open(tmp_path / "libkiln_example_ops.so", "ab") as f:
        f.write(b"\0")
    _, args = inputs(tmp_path)
    result = kiln("run", tmp_path / "rotate.kiln", *args, "--output-dir", tmp_path, env=clean_env())
    assert result.returncode == 1
    assert "with hash" in result.stderr and "another build" in result.stderr


def test_a_plugin_needing_a_newer_kiln_is_refused_at_compile(kiln, build_dir, tmp_path):
    rotate_model(tmp_path / "rotate.onnx")
    future = build_dir / "tests" / "plugins" / "libkiln_test_plugin_future.so"
    if not future.exists():
        pytest.skip("the test plugins are built with the unit tests")
    result = kiln("compile", tmp_path / "rotate.onnx", "-o", tmp_path / "rotate.kiln", "--plugin", future)
    assert result.returncode == 1
    assert "needs plugin API level 3; this kiln has level 2" in result.stderr


def test_autoload_off_uses_only_libraries_the_application_loaded(kiln, build_dir, tmp_path):
    rotate_model(tmp_path / "rotate.onnx")
    assert kiln("compile", tmp_path / "rotate.onnx", "-o", tmp_path / "rotate.kiln", "--plugin",
                example_plugin(build_dir)).returncode == 0
    shutil.copy(example_plugin(build_dir), tmp_path)  # beside the package: found, but not loaded
    _, args = inputs(tmp_path)
    env = clean_env()
    env["KILN_PLUGIN_AUTOLOAD"] = "0"
    result = kiln("run", tmp_path / "rotate.kiln", *args, "--output-dir", tmp_path, env=env)
    assert result.returncode == 1
    assert "KILN_PLUGIN_AUTOLOAD=0 forbids loading" in result.stderr
    # Loaded by the command itself (--plugin), the library is used.
    result = kiln("run", tmp_path / "rotate.kiln", *args, "--output-dir", tmp_path, "--plugin",
                  example_plugin(build_dir), env=env)
    assert result.returncode == 0, result.stderr
    result = kiln("bench", tmp_path / "rotate.kiln", "--iterations", "3", "--plugin", example_plugin(build_dir),
                  env=env)
    assert result.returncode == 0, result.stderr
