"""Custom operators from Python, end to end (docs/plugins.md):

  - the example plugin library (examples/plugins/example_ops.cc: Rotate,
    AddInPlace, SerializedMatMul, the composite Swish), loaded by
    kiln.compile(..., plugins=[...]);
  - a host callback: a Python function registered as an op;
  - a kiln.Expression node: a formula as text.

One model uses all of them; kiln compiles and runs it, and numpy checks it.

    PYTHONPATH=build/release/python .venv/bin/python examples/plugins/plugin_demo.py
"""

import pathlib
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper

import kiln

build = pathlib.Path(kiln.__file__).resolve().parents[2]
library = build / "examples" / "libkiln_example_ops.so"
if not library.exists():
    sys.exit(f"build the example library first ({library} is missing): make build")

# A host callback: any Python function over numpy arrays.
kiln.register_host_op("com.demo", "Clamp", lambda x: np.clip(x, -1.0, 1.0))

f = TensorProto.FLOAT
nodes = [
    helper.make_node("Rotate", ["x", "y", "angle"], ["xr", "yr"], domain="com.example"),
    helper.make_node("Swish", ["xr"], ["sw"], domain="com.example", beta=1.5),
    helper.make_node("AddInPlace", ["sw", "yr"], ["sum"], domain="com.example"),
    helper.make_node("Clamp", ["sum"], ["clamped"], domain="com.demo"),
    helper.make_node("SerializedMatMul", ["clamped", "w"], ["product"], domain="com.example",
                     serialization_factor=4),
    helper.make_node("Expression", ["product"], ["out"], domain="kiln", expression="2 * product + sin(product)"),
]
graph = helper.make_graph(
    nodes, "plugin_demo",
    [helper.make_tensor_value_info(n, f, [4, 8]) for n in ("x", "y", "angle")] +
    [helper.make_tensor_value_info("w", f, [8, 3])],
    [helper.make_tensor_value_info("out", f, None)])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1),
                                                helper.make_opsetid("com.demo", 1), helper.make_opsetid("kiln", 1)])

with tempfile.TemporaryDirectory() as folder:
    onnx_path, package = pathlib.Path(folder) / "demo.onnx", pathlib.Path(folder) / "demo.kiln"
    onnx.save(model, onnx_path)
    report = kiln.compile(onnx_path, package, plugins=[library])
    print("steps:", report["step_kernels"])
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in
             (("x", (4, 8)), ("y", (4, 8)), ("angle", (4, 8)), ("w", (8, 3)))}
    got = kiln.Runner(package).run(feeds)["out"]

c, s = np.cos(feeds["angle"]), np.sin(feeds["angle"])
xr, yr = feeds["x"] * c - feeds["y"] * s, feeds["x"] * s + feeds["y"] * c
product = np.clip(xr / (1 + np.exp(-1.5 * xr)) + yr, -1, 1) @ feeds["w"]
want = 2 * product + np.sin(product)
print("max |kiln - numpy|:", float(np.abs(got - want).max()))
assert np.allclose(got, want, rtol=1e-5, atol=1e-5)
