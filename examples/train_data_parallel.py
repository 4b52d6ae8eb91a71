"""Data-parallel training with kiln across processes (docs/training.md):

    mpirun -np 2 python examples/train_data_parallel.py --out DIR

Every process compiles the same training package (data_parallel="mpi"), takes
its shard of each global batch, and runs the steps with a kiln.Session; the
step averages the gradients over the processes (MPI Allreduce) before the
update, so every process ends with the same weights, those of one process
training on the whole batches. Each process writes its weights to
DIR/rank<r>.npz; the same code runs across machines under mpirun.
"""

import argparse
import pathlib
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import kiln
import kiln.distributed

GLOBAL_BATCH, FEATURES, HIDDEN, CLASSES = 16, 10, 32, 4


def mlp(path: pathlib.Path, batch: int) -> None:
    rng = np.random.default_rng(0)  # the same initial weights in every process
    weights = {"w1": rng.standard_normal((FEATURES, HIDDEN)) * 0.3, "b1": np.zeros(HIDDEN),
               "w2": rng.standard_normal((HIDDEN, CLASSES)) * 0.3, "b2": np.zeros(CLASSES)}
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h0"]), helper.make_node("Relu", ["h0"], ["h"]),
             helper.make_node("Gemm", ["h", "w2", "b2"], ["scores"]),
             helper.make_node("SoftmaxCrossEntropyLoss", ["scores", "labels"], ["loss"])]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, FEATURES]),
                       helper.make_tensor_value_info("labels", TensorProto.INT64, [batch])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        [numpy_helper.from_array(v.astype(np.float32), n) for n, v in weights.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)


def data(steps: int):
    """The global batches, the same in every process (a real job would read its shard from disk)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((steps, GLOBAL_BATCH, FEATURES)).astype(np.float32)
    labels = (x[..., :CLASSES].argmax(axis=-1)).astype(np.int64)  # a learnable rule
    return x, labels


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=pathlib.Path)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    rank, size = kiln.distributed.rank(), kiln.distributed.size()
    if GLOBAL_BATCH % size:
        raise SystemExit(f"the global batch of {GLOBAL_BATCH} does not split over {size} processes")
    shard = GLOBAL_BATCH // size
    args.out.mkdir(parents=True, exist_ok=True)
    model, package = args.out / f"rank{rank}.onnx", args.out / f"rank{rank}.kiln"
    mlp(model, shard)
    kiln.compile_training(model, package, loss="loss", optimizer=kiln.optim.SGD(0.1, momentum=0.9),
                          data_parallel="mpi")
    x, labels = data(args.steps)
    mine = slice(rank * shard, (rank + 1) * shard)
    with kiln.Session(package, num_host_transfers=args.steps) as session:
        losses = session.run({"x": x[:, mine], "labels": labels[:, mine]})["loss"]
        weights = session.get_tensors_data(["w1", "b1", "w2", "b2"])
    np.savez(args.out / f"rank{rank}.npz", losses=losses, **weights)
    print(f"rank {rank}/{size}: loss {losses[0]:.4f} -> {losses[-1]:.4f} on its shard of {shard}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
