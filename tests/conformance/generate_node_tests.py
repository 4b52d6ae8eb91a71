"""Writes the ONNX backend node tests to a directory.

The onnx wheel ships the test cases as Python code (onnx/backend/test/case/
node/) but not their data files, so this writes them the way onnx's own
`backend-test-tools generate-data` writes its model tests: one directory per
test with model.onnx and test_data_set_N/{input,output}_M.pb, plus
tolerances.json (each test's rtol and atol).

    python tests/conformance/generate_node_tests.py build/conformance/node

Generation is deterministic for a pinned onnx version (each case seeds
numpy itself or uses fixed data), so the expected-results file stays valid.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import warnings

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.backend.test.case import node as node_cases


def serialize(value, value_type: onnx.TypeProto, name: str) -> bytes:
    if value_type.HasField("sequence_type"):
        return numpy_helper.from_list(value, name).SerializeToString()
    if value_type.HasField("optional_type"):
        return numpy_helper.from_optional(value, name).SerializeToString()
    if value_type.HasField("map_type"):
        return numpy_helper.from_dict(value, name).SerializeToString()
    if isinstance(value, onnx.TensorProto):
        return value.SerializeToString()
    return numpy_helper.from_array(np.asarray(value), name).SerializeToString()


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out_dir = sys.argv[1]
    stamp = os.path.join(out_dir, "onnx_version")
    if os.path.exists(stamp) and open(stamp).read() == onnx.__version__:
        return 0  # already generated for this onnx version
    if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
    os.makedirs(out_dir)
    np.random.seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = node_cases.collect_testcases(None)
    tolerances = {}
    for case in cases:
        test_dir = os.path.join(out_dir, case.name)
        os.makedirs(test_dir)
        with open(os.path.join(test_dir, "model.onnx"), "wb") as f:
            f.write(case.model.SerializeToString())
        tolerances[case.name] = {"rtol": case.rtol, "atol": case.atol}
        graph = case.model.graph
        for i, (inputs, outputs) in enumerate(case.data_sets):
            data_dir = os.path.join(test_dir, f"test_data_set_{i}")
            os.makedirs(data_dir)
            for j, value in enumerate(inputs):
                with open(os.path.join(data_dir, f"input_{j}.pb"), "wb") as f:
                    f.write(serialize(value, graph.input[j].type, graph.input[j].name))
            for j, value in enumerate(outputs):
                with open(os.path.join(data_dir, f"output_{j}.pb"), "wb") as f:
                    f.write(serialize(value, graph.output[j].type, graph.output[j].name))
    with open(os.path.join(out_dir, "tolerances.json"), "w") as f:
        json.dump(tolerances, f, indent=0, sort_keys=True)
    with open(stamp, "w") as f:
        f.write(onnx.__version__)
    print(f"wrote {len(cases)} node tests to {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
