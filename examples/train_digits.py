"""Trains a small CNN on scikit-learn's handwritten digits (8x8 images, bundled
inside the scikit-learn wheel: nothing is downloaded) with kiln, then runs
the trained model as an inference package (docs/training.md).

    PYTHONPATH=build/release/python .venv/bin/python examples/train_digits.py [--device sim] [--epochs 25]

The model is written as ONNX with numpy-initialised weights; kiln compiles
it into a training package (forward, backward and Adam's update in one main
program); a kiln.Session runs one epoch per call (num_host_transfers
batches); Session.export_package writes the trained model back as ONNX (the
scores as its output, the loss cut away, any batch size) and compiles it
for inference; kiln.Runner checks it on the held-out images.
"""

import argparse
import pathlib
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from sklearn.datasets import load_digits

import kiln

BATCH = 32


def build_model(path: pathlib.Path, weights: dict, batch: int) -> None:
    """conv 3x3 (8) - relu - maxpool 2 - conv 3x3 (16) - relu - maxpool 2 - dense 10, and the loss."""
    nodes = [helper.make_node("Conv", ["x", "k1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p1", "k2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("MaxPool", ["r2"], ["p2"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Flatten", ["p2"], ["f"]),
             helper.make_node("Gemm", ["f", "w", "b"], ["scores"], transB=1)]
    nodes.append(helper.make_node("SoftmaxCrossEntropyLoss", ["scores", "labels"], ["loss"]))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 1, 8, 8]),
              helper.make_tensor_value_info("labels", TensorProto.INT64, [batch])]
    outputs = [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])]
    graph = helper.make_graph(nodes, "digits", inputs, outputs,
                              [numpy_helper.from_array(value, name) for name, value in weights.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def initial_weights(rng: np.random.Generator) -> dict:
    """He initialisation for the convolutions, Glorot for the dense layer."""
    def he(shape, fan_in):
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)
    return {"k1": he((8, 1, 3, 3), 9), "b1": np.zeros(8, np.float32),
            "k2": he((16, 8, 3, 3), 72), "b2": np.zeros(16, np.float32),
            "w": (rng.standard_normal((10, 64)) * np.sqrt(1.0 / 64)).astype(np.float32),
            "b": np.zeros(10, np.float32)}


def progress(epoch: int, epochs: int, loss: float, seconds: float) -> None:
    filled = int(30 * epoch / epochs)
    sys.stdout.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] epoch {epoch}/{epochs}  loss {loss:.4f}  "
                     f"{seconds:.1f} s")
    sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu or sim")
    parser.add_argument("--epochs", type=int, default=25)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None]  # [1797, 1, 8, 8] in [0, 1]
    labels = digits.target.astype(np.int64)
    rng = np.random.default_rng(args.seed)
    order = rng.permutation(len(images))
    test, train = order[:360], order[360:]
    batches = len(train) // BATCH  # one run() = one epoch of whole batches

    work = pathlib.Path(tempfile.mkdtemp(prefix="kiln-digits-"))
    weights = initial_weights(rng)
    build_model(work / "train.onnx", weights, BATCH)
    kiln.compile_training(work / "train.onnx", work / "train.kiln", loss="loss", optimizer=kiln.optim.Adam(0.01))
    session = kiln.Session(work / "train.kiln", device=args.device, num_host_transfers=batches)
    start = time.perf_counter()
    with session:
        for epoch in range(1, args.epochs + 1):
            picks = rng.permutation(train)[:batches * BATCH].reshape(batches, BATCH)
            losses = session.run({"x": images[picks], "labels": labels[picks]})["loss"]
            progress(epoch, args.epochs, float(losses.mean()), time.perf_counter() - start)
    print()

    # The trained model for inference: the scores of any number of images, run by kiln.Runner on the held-out ones.
    session.export_package(work / "digits.kiln", outputs=["scores"], batch=len(test))
    scores = kiln.Runner(work / "digits.kiln").run({"x": images[test]})["scores"]
    accuracy = float((scores.argmax(axis=1) == labels[test]).mean())
    print(f"test accuracy {accuracy:.1%} on {len(test)} held-out digits ({args.device}, {args.epochs} epochs of "
          f"{batches} steps); model: {work / 'digits.onnx'}")
    return 0 if accuracy >= 0.97 else 1


if __name__ == "__main__":
    sys.exit(main())
