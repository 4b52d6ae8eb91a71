"""`pip install .` (pyproject.toml, scikit-build-core) into a fresh virtual
environment: `import kiln` works without PYTHONPATH, compiles an ONNX model
and runs it; the wheel holds the module, the runtime and compiler libraries
beside it and the type stubs, and puts the `kiln` command on the venv's PATH."""

import os
import pathlib
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import REPO, kiln_version


@pytest.fixture(scope="module")
def fresh_venv(build_dir, tmp_path_factory):
    if os.environ.get("KILN_TEST_WHEEL") != "1":
        pytest.skip("builds kiln a second time, into a wheel: run by `make test-wheel`")
    if not (build_dir / "libkiln_runtime.so").exists():
        pytest.skip(f"{build_dir} is not a shared-library build (the wheel is built from the release configuration)")
    venv = tmp_path_factory.mktemp("wheel") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    # The build reuses build/wheel (pyproject.toml), and ccache the objects
    # of the other builds.
    result = subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "--disable-pip-version-check",
                             "--quiet", str(REPO)], capture_output=True, text=True, timeout=3600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return venv


def in_venv(venv, *args, cwd):
    # No PYTHONPATH, and not from the repository: the installed package only.
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=600, cwd=cwd, env=env)


def test_import_compile_and_run_without_pythonpath(fresh_venv, tmp_path):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 4)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Relu", ["xw"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "model.onnx")
    x = rng.standard_normal((2, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    script = (
        "import kiln, numpy as np\n"
        "kiln.compile('model.onnx', 'model.kiln')\n"
        "y = kiln.Runner('model.kiln').run({'x': np.load('x.npy')})['y']\n"
        "np.save('y.npy', y)\n"
        "print(kiln.__version__, kiln.__file__)\n")
    result = in_venv(fresh_venv, fresh_venv / "bin/python", "-c", script, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    version, location = result.stdout.split()
    assert version == kiln_version()
    assert pathlib.Path(location).is_relative_to(fresh_venv)  # the installed package, not the source tree
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), np.maximum(x @ w, 0), rtol=1e-5, atol=1e-6)


def test_wheel_contents(fresh_venv):
    package = next(fresh_venv.rglob("site-packages/kiln"))
    major, minor, _ = kiln_version().split(".")
    libraries = sorted(p.name for p in package.glob("libkiln*"))
    # One file each, by SONAME (a wheel would store a symbolic link as a copy).
    assert libraries == [f"libkiln_compiler.so.{major}.{minor}", f"libkiln_runtime.so.{major}.{minor}"], libraries
    assert (package / "_kiln.pyi").is_file() and (package / "py.typed").is_file()
    assert (package / "session.py").is_file()


def test_kiln_command_on_the_venv_path(fresh_venv, tmp_path):
    result = in_venv(fresh_venv, "kiln", "--version", cwd=tmp_path)
    assert result.returncode == 0 and f"kiln {kiln_version()}" in result.stdout, result.stderr
