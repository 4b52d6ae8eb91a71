"""One recurrent layer, kiln against onnxruntime, taking turns.

    .venv/bin/python bench/recurrent_layer.py [--op LSTM|GRU] [--hidden 512] [--steps 32] [--rounds 4]

Builds one bidirectional LSTM or GRU (batch 1, input 512, random weights; the
shape of ddddocr's recognizer), compiles it with build/release/tools/kiln and
prints, per round, onnxruntime's p50 (Python, intra_op_num_threads=2) and
kiln's (`kiln bench --threads 2`), each in a process of its own, so that
both meet the machine in the same state. The figures of bench/RESULTS.md's
recurrent rows come from it.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KILN = os.path.join(ROOT, "build", "release", "tools", "kiln")
GATES = {"LSTM": 4, "GRU": 3}

ORT_TIMER = """
import sys, time, numpy as np, onnxruntime as ort
so = ort.SessionOptions(); so.intra_op_num_threads = 2
s = ort.InferenceSession(sys.argv[1], so, providers=["CPUExecutionProvider"])
x = np.random.default_rng(0).standard_normal([int(v) for v in sys.argv[2].split(",")]).astype(np.float32)
for _ in range(20): s.run(None, {"x": x})
times = []
for _ in range(100):
    start = time.perf_counter(); s.run(None, {"x": x}); times.append(time.perf_counter() - start)
print(sorted(times)[50] * 1000)
"""


def make_model(path, op, hidden, steps, inputs=512):
    rng = np.random.default_rng(0)
    g = GATES[op] * hidden
    weights = [numpy_helper.from_array((rng.standard_normal((2, g, inputs)) * 0.05).astype(np.float32), "W"),
               numpy_helper.from_array((rng.standard_normal((2, g, hidden)) * 0.05).astype(np.float32), "R"),
               numpy_helper.from_array((rng.standard_normal((2, 2 * g)) * 0.05).astype(np.float32), "B")]
    node = helper.make_node(op, ["x", "W", "R", "B"], ["y"], hidden_size=hidden, direction="bidirectional")
    graph = helper.make_graph([node], op.lower(), [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                [steps, 1, inputs])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [steps, 2, 1, hidden])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8), path)
    return f"{steps},1,{inputs}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--op", choices=sorted(GATES), default="LSTM")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        model = os.path.join(work, "layer.onnx")
        package = os.path.join(work, "layer.kiln")
        shape = make_model(model, args.op, args.hidden, args.steps)
        subprocess.run([KILN, "compile", model, "-o", package], check=True, capture_output=True)
        print(f"{args.op}, bidirectional, hidden {args.hidden}, {args.steps} steps, batch 1, 2 threads: p50 ms")
        for round_ in range(args.rounds):
            ort_ms = float(subprocess.run([sys.executable, "-c", ORT_TIMER, model, shape], check=True,
                                          capture_output=True, text=True).stdout.split()[-1])
            kiln_ms = json.loads(subprocess.run([KILN, "bench", "--threads", "2", "--json", package], check=True,
                                                capture_output=True, text=True).stdout)["p50_ms"]
            print(f"  round {round_ + 1}: onnxruntime {ort_ms:.3f}, kiln {kiln_ms:.3f} ({ort_ms / kiln_ms:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
