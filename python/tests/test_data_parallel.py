"""Data-parallel training across processes (kiln.distributed, docs/training.md):
examples/train_data_parallel.py run by `mpirun -np 2` (real processes, Open
MPI's Allreduce) ends with the same weights in both processes, equal to one
process training on the whole global batches."""

import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

import kiln

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
import train_data_parallel as example  # noqa: E402

STEPS = 12


def test_two_processes_train_like_one_on_the_global_batch(tmp_path):
    mpirun = shutil.which("mpirun")
    assert mpirun is not None, "mpirun (Debian's openmpi-bin) is missing: run `make setup`"
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_btl="self,vader",
               PYTHONPATH=os.pathsep.join(p for p in [str(pathlib.Path(kiln.__file__).parents[1]),
                                                      os.environ.get("PYTHONPATH", "")] if p))
    result = subprocess.run([mpirun, "--oversubscribe", "-np", "2", sys.executable,
                             str(ROOT / "examples" / "train_data_parallel.py"), "--out", str(tmp_path / "dp"),
                             "--steps", str(STEPS)], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    ranks = [np.load(tmp_path / "dp" / f"rank{r}.npz") for r in range(2)]

    # One process, the whole global batch, the same optimiser.
    example.mlp(tmp_path / "one.onnx", example.GLOBAL_BATCH)
    kiln.compile_training(tmp_path / "one.onnx", tmp_path / "one.kiln", loss="loss",
                          optimizer=kiln.optim.SGD(0.1, momentum=0.9))
    x, labels = example.data(STEPS)
    with kiln.Session(tmp_path / "one.kiln", num_host_transfers=STEPS) as session:
        losses = session.run({"x": x, "labels": labels})["loss"]
        want = session.get_tensors_data(["w1", "b1", "w2", "b2"])
    for name, value in want.items():
        np.testing.assert_array_equal(ranks[0][name], ranks[1][name], err_msg=f"{name} differs between the processes")
        np.testing.assert_allclose(ranks[0][name], value, rtol=1e-5, atol=1e-6, err_msg=name)
    # Each process's loss is its shard's mean; their mean is the global batch's.
    np.testing.assert_allclose((ranks[0]["losses"] + ranks[1]["losses"]) / 2, losses, rtol=1e-5, atol=1e-6)
    assert losses[-1] < losses[0] / 2  # it learned


def test_a_missing_all_reduce_op_is_named(tmp_path):
    example.mlp(tmp_path / "m.onnx", 4)
    from kiln._kiln import compile as raw_compile
    with pytest.raises(kiln.Error, match="no op com.nowhere.Mean is registered in this process"):
        raw_compile(str(tmp_path / "m.onnx"), str(tmp_path / "m.kiln"), {}, None, training_loss="loss",
                    gradient_all_reduce="com.nowhere.Mean")
