"""Fixtures shared by the Python tests."""

import pytest


@pytest.fixture(params=["cpu", "sim"])
def device(request, monkeypatch, tmp_path):
    """Each test on the cpu and on a simulated accelerator (two sim devices, for replicas), with a device lock
    directory of its own."""
    monkeypatch.setenv("KILN_SIM_DEVICES", "2")
    monkeypatch.setenv("KILN_DEVICE_LOCK_DIR", str(tmp_path / "locks"))
    return request.param
