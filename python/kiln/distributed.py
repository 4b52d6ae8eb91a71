"""Data-parallel training across processes (docs/training.md): every process
runs the same training package on its own shard of each global batch, and
the step averages the gradients over the processes, through MPI's
Allreduce (Open MPI, by mpi4py), before the optimiser updates the weights:
each process applies the same update, so the weights stay in step and
equal those of one process training on the whole batch.

    kiln.compile_training(model, package, loss="loss", data_parallel="mpi")
    mpirun -np 2 python train.py      # each process: kiln.Session(package), its shard

Importing kiln registers the all-reduce op (ALL_REDUCE), so any process
using kiln can compile and run such packages; mpi4py is imported on the
op's first call, so nothing needs MPI until a data-parallel step runs."""

from __future__ import annotations

import numpy as np

from . import register_host_op

ALL_REDUCE = "kiln.distributed.AllReduceMean"


def _world():
    from mpi4py import MPI
    return MPI.COMM_WORLD


def rank() -> int:
    """This process's index among the processes training together (0 without mpirun)."""
    return _world().Get_rank()


def size() -> int:
    """How many processes train together (1 without mpirun)."""
    return _world().Get_size()


def _all_reduce_mean(flat: np.ndarray) -> np.ndarray:
    world = _world()
    total = np.empty_like(flat)
    world.Allreduce(np.ascontiguousarray(flat), total)  # the sum, in every process
    total /= world.Get_size()
    return total


_domain, _name = ALL_REDUCE.rsplit(".", 1)
register_host_op(_domain, _name, _all_reduce_mean)
