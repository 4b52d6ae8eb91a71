"""Fixtures for the command-line tests: the built binaries and fresh example
packages written by the example program (real files, real processes)."""

import os
import pathlib
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def kiln_version() -> str:
    """KILN_VERSION from include/kiln/version.h, the version's one home."""
    text = (REPO / "include/kiln/version.h").read_text()
    return text.split('#define KILN_VERSION "', 1)[1].split('"', 1)[0]


@pytest.fixture(scope="session")
def build_dir() -> pathlib.Path:
    path = REPO / os.environ.get("KILN_BUILD_DIR", "build/release")
    if not (path / "tools" / "kiln").exists():
        pytest.fail(f"no kiln binary under {path}: build first (make build) or set KILN_BUILD_DIR")
    return path


@pytest.fixture(scope="session")
def kiln(build_dir):
    """Runs `kiln ARGS...`; returns the CompletedProcess (never raises)."""

    def run(*args, **kwargs):
        return subprocess.run([str(build_dir / "tools" / "kiln"), *map(str, args)],
                              capture_output=True, text=True, timeout=60, **kwargs)

    return run


@pytest.fixture
def example(build_dir, tmp_path) -> pathlib.Path:
    """A package holding one blob of every type."""
    path = tmp_path / "example.kiln"
    subprocess.run([str(build_dir / "examples" / "write_example_package"), str(path)], check=True,
                   capture_output=True)
    return path


@pytest.fixture
def split_example(build_dir, tmp_path):
    """The same model over two files: program + metadata, then the data."""
    program, data = tmp_path / "program.kiln", tmp_path / "data.kiln"
    subprocess.run([str(build_dir / "examples" / "write_example_package"), str(program), str(data)], check=True,
                   capture_output=True)
    return program, data
