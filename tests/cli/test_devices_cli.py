"""`kiln devices`: the device table, sim devices from the environment, who
holds an attached device, and a clear error for a malformed variable."""

import os
import re
import subprocess
import sys


def env_with(tmp_path, **variables):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    env["KILN_DEVICE_LOCK_DIR"] = str(tmp_path / "locks")  # never the machine-wide directory
    env.update(variables)
    return env


def rows(stdout):
    """The table rows as lists of columns (split on runs of 2+ spaces)."""
    lines = stdout.split("\n\n")[0].splitlines()
    return [re.split(r"\s{2,}", line.strip()) for line in lines]


def test_lists_cpu_only_by_default(kiln, tmp_path):
    result = kiln("devices", env=env_with(tmp_path))
    assert result.returncode == 0, result.stderr
    table = rows(result.stdout)
    assert table[0] == ["ID", "KIND", "MEMORY", "THREADS", "TRANSFER", "ATTACHED"]
    assert [row[0] for row in table[1:] if not row[0].startswith("cuda:")] == ["cpu"]  # GPUs where there are any
    assert table[1][5] == "shared (never locked)"
    assert f"lock directory: {tmp_path / 'locks'}" in result.stdout


def test_lists_sim_devices_from_the_environment(kiln, tmp_path):
    result = kiln("devices", env=env_with(tmp_path, KILN_SIM_DEVICES="2", KILN_SIM_MEMORY="64M",
                                          KILN_SIM_LATENCY_US="50", KILN_SIM_BANDWIDTH_GBPS="10",
                                          KILN_SIM_THREADS="2"))
    assert result.returncode == 0, result.stderr
    table = rows(result.stdout)
    assert [row[0] for row in table[1:] if not row[0].startswith("cuda:")] == ["cpu", "sim:0", "sim:1"]
    for row in table[2:4]:
        assert row[1:] == ["sim", "64.0 MiB", "2", "50 us, 10 GB/s", "no"]


def test_shows_who_holds_an_attached_device(kiln, tmp_path):
    """A process holding the lock of sim:1 (flock, as DeviceManager takes it)
    is named in the ATTACHED column."""
    locks = tmp_path / "locks"
    locks.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, os, sys, time\n"
         "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o666)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
         "os.write(fd, f'pid {os.getpid()} holder\\n'.encode())\n"
         "print('locked', flush=True)\n"
         "sys.stdin.read()\n",
         str(locks / "sim-1.lock")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        result = kiln("devices", env=env_with(tmp_path, KILN_SIM_DEVICES="2"))
        assert result.returncode == 0, result.stderr
        table = {row[0]: row for row in rows(result.stdout)[1:]}
        assert table["sim:0"][5] == "no"
        assert table["sim:1"][5] == f"by pid {holder.pid} (holder)"
    finally:
        holder.stdin.close()
        holder.wait(timeout=10)


def test_malformed_variable_is_a_clear_error(kiln, tmp_path):
    result = kiln("devices", env=env_with(tmp_path, KILN_SIM_DEVICES="1", KILN_SIM_FAULTS="reset10"))
    assert result.returncode == 1
    assert "KILN_SIM_FAULTS: expected kind@job like 'reset@10'" in result.stderr
    assert "got 'reset10'" in result.stderr
