"""kiln: compile neural networks ahead of time into .kiln packages and run them.

    import kiln, numpy as np
    kiln.compile("model.onnx", "model.kiln", shapes={"x": [1, 3, 224, 224]})
    runner = kiln.Runner("model.kiln")
    outputs = runner.run({"x": np.zeros((1, 3, 224, 224), np.float32)})

Errors are raised as kiln.Error with the message kiln's C++ core gives.
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

import numpy as np

from ._kiln import Error, Executor
from ._kiln import compile as _compile

__all__ = ["Error", "Runner", "compile"]

_NUMPY_DTYPES = {
    "f32": np.float32, "f64": np.float64, "f16": np.float16, "i8": np.int8, "u8": np.uint8, "i16": np.int16,
    "u16": np.uint16, "i32": np.int32, "u32": np.uint32, "i64": np.int64, "u64": np.uint64, "bool": np.bool_,
}
# bfloat16 and the 8-bit floats come from ml_dtypes (as in onnx's own numpy
# helpers); they cross into C++ as unsigned integers of their size.
_STORAGE_DTYPES = {}
try:
    import ml_dtypes

    _NUMPY_DTYPES.update({"bf16": ml_dtypes.bfloat16, "f8e4m3": ml_dtypes.float8_e4m3fn,
                          "f8e5m2": ml_dtypes.float8_e5m2})
    _STORAGE_DTYPES.update({"bf16": np.uint16, "f8e4m3": np.uint8, "f8e5m2": np.uint8})
except ImportError:  # without ml_dtypes those types stay out of reach from numpy
    pass


def compile(onnx_path, out_path, shapes: Optional[Mapping[str, Sequence[int]]] = None,
            batch: Optional[int] = None) -> dict:
    """Compiles an ONNX model into a .kiln package.

    shapes fixes input shapes ({"x": [1, 3, 224, 224]}); batch fixes every
    unknown leading input dimension. Returns the compile report (steps, views,
    constants, arena bytes against the lower bound)."""
    fixed = {name: [int(d) for d in dims] for name, dims in (shapes or {}).items()}
    return _compile(str(onnx_path), str(out_path), fixed, None if batch is None else int(batch))


class Runner:
    """Runs a compiled package on the CPU.

    run() checks each input's name, dtype and shape, passes it to the model
    without copying when it is C-contiguous (others are copied once), and the
    model writes straight into the output arrays it returns. One run() at a
    time per Runner; the GIL is released while the model runs. `threads`:
    threads per kernel (0: OMP_NUM_THREADS, or one per core)."""

    def __init__(self, path, model: str = "", threads: int = 0):
        if threads < 0:
            raise Error(f"threads must be 0 or more, got {threads}")
        self._executor = Executor(str(path), model, threads)
        self.inputs = [(name, tuple(shape), dtype) for name, shape, dtype in self._executor.inputs]
        self.outputs = [(name, tuple(shape), dtype) for name, shape, dtype in self._executor.outputs]

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict:
        expected = {name for name, _, _ in self.inputs}
        unknown = sorted(set(inputs) - expected)
        missing = sorted(expected - set(inputs))
        if unknown or missing:
            raise Error(f"inputs: unknown {unknown}, missing {missing} (the model takes {sorted(expected)})")
        arrays = []
        for name, shape, dtype in self.inputs:
            if dtype not in _NUMPY_DTYPES:
                raise Error(f"input '{name}' has dtype {dtype}, which numpy cannot hold")
            array = np.asarray(inputs[name])
            if array.dtype != _NUMPY_DTYPES[dtype]:
                raise Error(f"input '{name}' must be {np.dtype(_NUMPY_DTYPES[dtype])}, got {array.dtype}")
            if array.shape != shape:
                raise Error(f"input '{name}' must have shape {shape}, got {array.shape}")
            array = np.ascontiguousarray(array)  # a copy only when not C-contiguous
            arrays.append(array.view(_STORAGE_DTYPES[dtype]) if dtype in _STORAGE_DTYPES else array)
        for name, _, dtype in self.outputs:
            if dtype not in _NUMPY_DTYPES:
                raise Error(f"output '{name}' has dtype {dtype}, which numpy cannot hold")
        outputs = [np.empty(shape, dtype=_STORAGE_DTYPES.get(dtype, _NUMPY_DTYPES[dtype]))
                   for _, shape, dtype in self.outputs]
        self._executor.run(arrays, outputs)
        return {name: array.view(_NUMPY_DTYPES[dtype]) if dtype in _STORAGE_DTYPES else array
                for (name, _, dtype), array in zip(self.outputs, outputs)}
