"""kiln.Session: a compiled model driven from Python with variables, host
transfers and replicas: the reference's popxl.Session on kiln's devices
(docs/session.md). The C++ HostSession (include/kiln/host_session.h) does
the work; this file speaks numpy."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional

import numpy as np

from . import _NUMPY_DTYPES, _as_bits, package_target
from ._kiln import Error, HostSession, source_model
from .export import inference_model


class Session:
    """A package on `device` ("cpu", "sim", "cuda", or one device such as
    "sim:1"; default: the package's target), `replication_factor` copies of
    it, each run() executing the main program `num_host_transfers` times.

    Use it as a context manager: entering attaches to the device(s) and
    sends the variables (weights_from_host) when it was detached; leaving
    fetches them back (weights_to_host, when a run may have changed them)
    and detaches, only if that context attached. Contexts nest.

    Data: every input of run() has the shape [num_host_transfers,
    replication_factor, *anchor_shape], each of the first two left out when
    it is 1 (the reference's rule); outputs have the same form.

    Variables (kiln.compile(..., variables=[...]), kiln compile --variables)
    follow the reference's lazy rules: get_tensor_data() fetches from the
    device only when attached and a run may have changed them since the last
    fetch; write_variable_data() updates the host copy, and the device too
    when attached. weights_to_host_count and weights_from_host_count count
    the transfers."""

    def __init__(self, package, device: Optional[str] = None, replication_factor: int = 1,
                 num_host_transfers: int = 1, model: str = ""):
        if replication_factor < 1 or num_host_transfers < 1:
            raise Error(f"replication_factor ({replication_factor}) and num_host_transfers "
                        f"({num_host_transfers}) must be 1 or more")
        self.package = str(package)
        self.device = device or package_target(str(package), model)
        self.replication_factor = int(replication_factor)
        self.num_host_transfers = int(num_host_transfers)
        self._session = HostSession(str(package), model, self.device, self.replication_factor,
                                    self.num_host_transfers)
        self._entered: List[bool] = []  # per open context: whether it attached
        table = lambda rows: {name: (tuple(shape), dtype) for name, shape, dtype in rows}  # noqa: E731
        self.inputs = table(self._session.inputs)
        self.outputs = table(self._session.outputs)
        self.variables = table(self._session.variables)
        self.constants = table(self._session.constants)

    # Attaching -----------------------------------------------------------

    def __enter__(self) -> "Session":
        self._entered.append(self._session.attach())
        return self

    def __exit__(self, *exc) -> None:
        if self._entered.pop():
            self._session.detach()

    @property
    def is_attached(self) -> bool:
        return self._session.is_attached

    # Running ---------------------------------------------------------------

    def host_shape(self, anchor_shape) -> tuple:
        """The shape run() takes or gives for an anchor of `anchor_shape`."""
        lead = ((self.num_host_transfers,) if self.num_host_transfers > 1 else ()) + \
               ((self.replication_factor,) if self.replication_factor > 1 else ())
        return lead + tuple(anchor_shape)

    def create_host_outputs(self) -> Dict[str, np.ndarray]:
        """Empty arrays, one per output, in the shape and dtype run() fills."""
        return {name: np.empty(self.host_shape(shape), dtype=_NUMPY_DTYPES[dtype])
                for name, (shape, dtype) in self.outputs.items()}

    def run(self, inputs: Optional[Mapping[str, np.ndarray]] = None) -> Dict[str, np.ndarray]:
        """Runs with `inputs` and returns new output arrays."""
        outputs = self.create_host_outputs()
        self.run_with_outputs(inputs or {}, outputs)
        return outputs

    def run_with_outputs(self, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray]) -> None:
        """Runs with `inputs`, writing into the caller's `outputs` (C-contiguous
        arrays of the shapes and dtypes create_host_outputs() makes)."""
        self._check_names("inputs", inputs, self.inputs)
        self._check_names("outputs", outputs, self.outputs)
        arrays = []
        for name, (shape, dtype) in self.inputs.items():
            array = np.asarray(inputs[name])
            self._check(name, "input", array, shape, dtype)
            arrays.append(_as_bits(np.ascontiguousarray(array)))
        results = []
        for name, (shape, dtype) in self.outputs.items():
            array = outputs[name]
            if not isinstance(array, np.ndarray):
                raise Error(f"output '{name}' must be a numpy array, got {type(array).__name__}")
            self._check(name, "output", array, shape, dtype)
            if not array.flags.c_contiguous or not array.flags.writeable:
                raise Error(f"output '{name}' must be a writeable C-contiguous array")
            results.append(_as_bits(array))
        self._session.run(list(self.inputs), arrays, list(self.outputs), results)

    def _check_names(self, what: str, given: Mapping, expected: Mapping) -> None:
        unknown = sorted(set(given) - set(expected))
        missing = sorted(set(expected) - set(given))
        if unknown or missing:
            raise Error(f"{what}: unknown {unknown}, missing {missing} (the model has {sorted(expected)})")

    def _check(self, name: str, kind: str, array: np.ndarray, shape: tuple, dtype: str) -> None:
        want = self.host_shape(shape)
        if array.dtype != np.dtype(_NUMPY_DTYPES[dtype]):
            raise Error(f"{kind} '{name}' must be {np.dtype(_NUMPY_DTYPES[dtype])}, got {array.dtype}")
        if array.shape != want:
            raise Error(f"{kind} '{name}' must have shape {want} ([num_host_transfers={self.num_host_transfers}, "
                        f"replication_factor={self.replication_factor}] + {list(shape)}, the ones of size 1 left "
                        f"out), got {array.shape}")

    # Variables -------------------------------------------------------------

    def get_tensor_data(self, name: str) -> np.ndarray:
        """A copy of a variable's or a constant's value (lazy: see the class)."""
        return self.get_tensors_data([name])[name]

    def get_tensors_data(self, names: Iterable[str]) -> Dict[str, np.ndarray]:
        """Copies of several tensors' values, with at most one transfer."""
        names = list(names)
        datas = self._session.read_tensors(names)
        result = {}
        for name, data in zip(names, datas):
            shape, dtype = self.variables.get(name) or self.constants[name]
            result[name] = data.view(_NUMPY_DTYPES[dtype]).reshape(shape)
        return result

    def write_variable_data(self, name: str, data) -> None:
        """Replaces a variable's value (lazy: see the class)."""
        self.write_variables_data({name: data})

    def write_variables_data(self, values: Mapping[str, np.ndarray]) -> None:
        """Replaces several variables' values, with at most one transfer."""
        arrays = []
        for name, data in values.items():
            if name not in self.variables:
                raise Error(f"'{name}' is not a variable of the model (variables: {sorted(self.variables)})")
            shape, dtype = self.variables[name]
            array = np.asarray(data)
            if array.dtype != np.dtype(_NUMPY_DTYPES[dtype]) or array.shape != tuple(shape):
                raise Error(f"variable '{name}' is {np.dtype(_NUMPY_DTYPES[dtype])} {tuple(shape)}, got "
                            f"{array.dtype} {array.shape}")
            arrays.append(_as_bits(np.ascontiguousarray(array)))
        self._session.write_variables(list(values), arrays)

    def weights_to_host(self) -> None:
        """Fetches the variables from the device(s) now."""
        self._session.weights_to_host()

    def weights_from_host(self) -> None:
        """Sends the host's variables to the device(s) now."""
        self._session.weights_from_host()

    # Exporting -------------------------------------------------------------

    def export_onnx(self, path, outputs: Optional[Iterable[str]] = None, batch=None) -> None:
        """Writes the ONNX model the package was compiled from with the
        variables' current values (the trained weights, BatchNormalization's
        running statistics), in inference mode. outputs: the values to keep
        as outputs (say the scores rather than the loss), with only what
        computes them; batch: a number or a name for the leading dimension
        of the inputs and outputs. Reads the variables as get_tensors_data
        does (fetching them when a run changed them)."""
        import onnx
        source = source_model(self.package)
        if source is None:
            raise Error(f"{self.package} keeps no source model: it has no variables (compile it with variables=, "
                        f"or with compile_training)")
        values = self.get_tensors_data(list(self.variables))
        onnx.save(inference_model(source, values, None if outputs is None else list(outputs), batch), str(path))

    def export_package(self, path, outputs: Optional[Iterable[str]] = None, batch=None, **compile_options) -> dict:
        """export_onnx, then kiln.compile of that model into an inference
        package at `path` (compile_options as kiln.compile takes them);
        returns the compile report. The ONNX model is written beside it
        (path with the suffix .onnx)."""
        from . import compile as compile_model
        onnx_path = Path(str(path)).with_suffix(".onnx")
        self.export_onnx(onnx_path, outputs, batch)
        return compile_model(onnx_path, path, **compile_options)

    @property
    def weights_to_host_count(self) -> int:
        return self._session.weights_to_host_count

    @property
    def weights_from_host_count(self) -> int:
        return self._session.weights_from_host_count

    @property
    def main_runs(self) -> int:
        """Main-program runs so far, over every replica."""
        return self._session.main_runs
