"""Crafted .npy inputs (issue 12, findings 6, 7, 8 and 10) are refused with a
clear error and exit status 1: before the fix a 20-digit dimension aborted
kiln (std::out_of_range from stoll), a 60 KB header overflowed the stack in
std::regex, a 77-byte file made it zero-fill gigabytes before noticing the
data was missing, a minus sign was dropped ((-4,) read as 4) and the rank
had no limit. Well-formed files, numpy's own included, still load."""

import struct

import numpy as np
import onnx
import pytest

from test_compile_run import mlp_model


def npy(header: str, data: bytes = b"", version: int = 1) -> bytes:
    text = header.encode("latin1")
    if version == 1:
        return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text + data
    return b"\x93NUMPY" + bytes([version, 0]) + struct.pack("<I", len(text)) + text + data


@pytest.fixture
def mlp(kiln, tmp_path):
    onnx.save(mlp_model(batch=2), tmp_path / "mlp.onnx")
    assert kiln("compile", tmp_path / "mlp.onnx", "-o", tmp_path / "mlp.kiln").returncode == 0
    return tmp_path / "mlp.kiln"


def run_with(kiln, mlp, tmp_path, content: bytes):
    (tmp_path / "x.npy").write_bytes(content)
    return kiln("run", mlp, "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", tmp_path / "out")


@pytest.mark.parametrize("content,message", [
    (npy("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999, 8), }"), "a dimension above 2^62"),
    (npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1000000, 1000000), }"), "holds fewer than the 4000000000000 bytes"),
    (npy("{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 4611686018427387904), }"), "is too large"),
    (npy("{'descr': '<f4', 'fortran_order': False, 'shape': (-4,), }", b"\0" * 16), "a negative dimension"),
    (npy("{'descr': '<f4', 'fortran_order': False, 'shape': (" + "1, " * 40 + "), }"), "more than 32 dimensions"),
    (npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 8), " + " " * 60000 + "'x" * 100 + "}", version=2),
     "header: expected ':'"),
    (npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 8" + ", 8" * 20000 + "), }", version=2),
     "more than 32 dimensions"),
    (npy("{'descr': '<f4', 'shape': (2, 8), }", b"\0" * 63), "holds fewer than the 64 bytes"),
    (npy("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 8), }", b"\0" * 64), "Fortran-order"),
    (npy("{'descr': '<f4', 'fortran_order': False, }"), "header has no 'shape'"),
    (npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 8), 'extra': 1}"), "unknown key 'extra'"),
    (npy("{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2, 8), }"), "expected True or False"),
    (npy("{'descr': '<f4, 'shape': (2, 8), }"), "header:"),
], ids=["20-digit-dim", "1e12-elements", "size-overflow", "negative-dim", "rank-40", "60KB-header",
        "20000-dims", "short-data", "fortran", "no-shape", "unknown-key", "bad-bool", "unterminated"])
def test_crafted_headers_are_refused(kiln, mlp, tmp_path, content, message):
    result = run_with(kiln, mlp, tmp_path, content)
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert message in result.stderr, result.stderr
    assert "x.npy" in result.stderr


@pytest.mark.parametrize("header", [
    "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 8), }",        # numpy's own form
    '{"descr": "<f4", "fortran_order": False, "shape": (2,8)}',           # double quotes, no spaces
    "{'shape': (2, 8), 'fortran_order': False, 'descr': '<f4'}          \n",  # any key order
], ids=["numpy", "double-quotes", "key-order"])
def test_well_formed_headers_load(kiln, mlp, tmp_path, header):
    x = np.arange(16, dtype=np.float32).reshape(2, 8)
    result = run_with(kiln, mlp, tmp_path, npy(header, x.tobytes()))
    assert result.returncode == 0, result.stderr
    np.save(tmp_path / "ref.npy", x)
    reference = kiln("run", mlp, "--input", f"x={tmp_path / 'ref.npy'}", "--output-dir", tmp_path / "ref")
    assert reference.returncode == 0, reference.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "y.npy"), np.load(tmp_path / "ref" / "y.npy"))


def test_empty_arrays_have_no_data_to_check(kiln, tmp_path):
    """A zero dimension makes the size 0 whatever the others (docs/format.md):
    the reader accepts (0, 2^62) without overflow; the model then refuses the
    shape as it would any other."""
    onnx.save(mlp_model(batch=2), tmp_path / "mlp.onnx")
    assert kiln("compile", tmp_path / "mlp.onnx", "-o", tmp_path / "mlp.kiln").returncode == 0
    (tmp_path / "x.npy").write_bytes(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (0, 4611686018427387904), }"))
    result = kiln("run", tmp_path / "mlp.kiln", "--input", f"x={tmp_path / 'x.npy'}")
    assert result.returncode == 1 and "input 'x' must be" in result.stderr, result.stderr
