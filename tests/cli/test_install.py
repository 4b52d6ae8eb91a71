"""kiln as a dependency: `cmake --install` into a temporary prefix, then
projects outside the tree build against it and run (examples/consumer/):
a CMake project with find_package(kiln), and a C program with pkg-config
and the C API. Also what the shared libraries export and need."""

import os
import pathlib
import re
import shutil
import subprocess

import pytest

from conftest import REPO, kiln_version

CONSUMER = REPO / "examples" / "consumer"


def run(args, **kwargs):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=600, **kwargs)


@pytest.fixture(scope="module")
def prefix(build_dir, tmp_path_factory):
    if not (build_dir / "libkiln_runtime.so").exists():
        pytest.skip(f"{build_dir} has no shared libraries (KILN_BUILD_SHARED is off in this preset)")
    prefix = tmp_path_factory.mktemp("prefix")
    result = run(["cmake", "--install", build_dir, "--prefix", prefix])
    assert result.returncode == 0, result.stderr
    return prefix


def libdir(prefix):
    return next(path.parent for path in prefix.rglob("libkiln_runtime.so"))


def test_layout_and_the_installed_command(prefix):
    lib = libdir(prefix)
    major, minor, _ = kiln_version().split(".")
    for name in ("kiln_runtime", "kiln_compiler"):
        # The SONAME carries major.minor while the major is 0.
        assert (lib / f"lib{name}.so.{major}.{minor}").is_symlink()
        assert (lib / f"lib{name}.so.{kiln_version()}").is_file()
        soname = run(["readelf", "-d", lib / f"lib{name}.so"]).stdout
        assert f"[lib{name}.so.{major}.{minor}]" in soname
    assert (prefix / "include/kiln/c_api.h").is_file() and (prefix / "include/kiln/model_runner.h").is_file()
    assert (lib / "cmake/kiln/kilnConfig.cmake").is_file() and (lib / "cmake/kiln/kilnConfigVersion.cmake").is_file()
    assert (lib / "pkgconfig/kiln.pc").is_file()
    version = run([prefix / "bin/kiln", "--version"])
    assert version.returncode == 0 and f"kiln {kiln_version()}" in version.stdout


def test_runtime_exports_only_kiln_symbols(prefix):
    lib = libdir(prefix) / "libkiln_runtime.so"
    symbols = run(["nm", "-D", "--defined-only", "-C", lib]).stdout.splitlines()
    names = [line.split(" ", 2)[2] for line in symbols]
    kiln_symbol = re.compile(r"^(kiln::|kiln_|(typeinfo|typeinfo name|vtable|VTT|guard variable) for kiln::|"
                             r"(non-)?virtual thunk to kiln::|construction vtable for .*-in-kiln::)")
    assert len(names) > 100
    assert [n for n in names if not kiln_symbol.match(n)] == []
    assert "kiln_runner_execute_async" in names  # the C API is in the runtime library
    assert not any(n.startswith("kiln::compile(") for n in names)  # the compiler is not


def test_runtime_links_without_the_compiler_onnx_or_protobuf(prefix):
    lib = libdir(prefix)
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+)\]", run(["readelf", "-d", lib / "libkiln_runtime.so"]).stdout)
    assert needed, "readelf found no NEEDED entries"
    assert not [n for n in needed if re.search(r"protobuf|onnx|kiln_compiler", n)], needed
    compiler = run(["readelf", "-d", lib / "libkiln_compiler.so"]).stdout
    assert f"libkiln_runtime.so.{'.'.join(kiln_version().split('.')[:2])}" in compiler


def compile_and_run(prefix, tmp_path):
    """Builds the CMake consumer against `prefix` and runs it: it compiles
    tmp_path/model.kiln and prints its outputs."""
    build = tmp_path / "build"
    configure = run(["cmake", "-S", CONSUMER, "-B", build, "-G", "Ninja", f"-DCMAKE_PREFIX_PATH={prefix}"])
    assert configure.returncode == 0, configure.stdout + configure.stderr
    compiled = run(["cmake", "--build", build])
    assert compiled.returncode == 0, compiled.stdout + compiled.stderr
    result = run([build / "compile_and_run", tmp_path / "model.kiln"])
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_cmake_consumer_compiles_and_runs_a_model(prefix, tmp_path):
    result = compile_and_run(prefix, tmp_path)
    # y = x @ w + b for x = [[1, 0, -1], [0.5, 0.25, 2]], w = [[1, 2], [3, 4], [5, 6]], b = [0.5, -0.5]
    assert "y[0][0] = -3.5" in result.stdout and "y[1][1] = 13.5" in result.stdout
    assert f"kiln {kiln_version()}: ok" in result.stdout


def test_c_consumer_with_pkg_config(prefix, tmp_path):
    compile_and_run(prefix, tmp_path)  # writes the package to run
    env = {**os.environ, "PKG_CONFIG_PATH": str(libdir(prefix) / "pkgconfig")}
    flags = run(["pkg-config", "--cflags", "--libs", "kiln"], env=env)
    assert flags.returncode == 0, flags.stderr
    compiler = shutil.which("cc") or shutil.which("gcc")
    program = tmp_path / "run_package"
    built = run([compiler, "-std=c11", "-Wall", "-Werror", CONSUMER / "run_package.c", *flags.stdout.split(),
                 f"-Wl,-rpath,{libdir(prefix)}", "-o", program])
    assert built.returncode == 0, built.stderr
    result = run([program, tmp_path / "model.kiln"])
    assert result.returncode == 0, result.stderr
    # Every input 1: y[j] = sum_i w[i][j] + b[j] = 9.5 and 11.5, for both rows.
    assert result.stdout.splitlines()[:4] == ["y[0] = 9.5", "y[1] = 11.5", "y[2] = 9.5", "y[3] = 11.5"]


@pytest.mark.parametrize("wanted, found", [("0.2", True), (kiln_version(), True), ("0.1", False), ("0.3", False),
                                           ("1.0", False)])
def test_find_package_checks_the_version(prefix, tmp_path, wanted, found):
    # While the major version is 0, a minor version is a compatibility boundary.
    if wanted == "0.2" and not kiln_version().startswith("0.2."):
        pytest.skip("the version moved on")
    (tmp_path / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.25)\nproject(probe LANGUAGES NONE)\n"
        f"find_package(kiln {wanted} REQUIRED)\n")
    result = run(["cmake", "-S", tmp_path, "-B", tmp_path / "build", f"-DCMAKE_PREFIX_PATH={prefix}"])
    assert (result.returncode == 0) == found, result.stdout + result.stderr
