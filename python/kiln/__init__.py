"""kiln: compile neural networks ahead of time into .kiln packages and run them.

    import kiln, numpy as np
    kiln.compile("model.onnx", "model.kiln", shapes={"x": [1, 3, 224, 224]})
    runner = kiln.Runner("model.kiln")
    outputs = runner.run({"x": np.zeros((1, 3, 224, 224), np.float32)})

Errors are raised as kiln.Error with the message kiln's C++ core gives.
"""

from __future__ import annotations

import atexit
import json
import warnings
import weakref
from typing import Mapping, Optional, Sequence

import ml_dtypes
import numpy as np

from ._kiln import DeviceRunner, DynamicExecutor, Error, Executor, StepTrace, __version__, is_graph_package, package_target
from ._kiln import compile as _compile
from ._kiln import load_plugin as _load_plugin
from ._kiln import register_host_op as _register_host_op

__all__ = ["Error", "Runner", "__version__", "compile", "load_plugin", "register_host_op"]


def register_host_op(domain: str, name: str, function, *, inputs=1, outputs: int = 1, infer=None) -> None:
    """Registers a Python function as the op `domain`.`name` of this process
    (docs/plugins.md, "Host callback ops"): a node of that op in a model
    calls `function(*input_arrays)` on the host in the middle of the program
    and writes what it returns (one array, or a tuple of `outputs` arrays)
    into the step's outputs, converted to their dtype; the shapes must be the
    inferred ones. `inputs`: a count, or (min, max). `infer(types)` gets
    [(numpy dtype, shape)] (-1 for unknown dimensions) and returns one
    (dtype, shape) per output; without it, every output has the first
    input's type. The input arrays are read-only views valid during the call
    only. Register before compiling and before loading a package that uses
    the op; kiln.Error when the name is taken or refused."""
    low, high = (inputs, inputs) if isinstance(inputs, int) else inputs

    def call(input_views, output_views):
        arrays = [view.view(_NUMPY_DTYPES[dtype]).reshape(tuple(shape)) for view, shape, dtype in input_views]
        results = function(*arrays)
        if not isinstance(results, (tuple, list)):
            results = (results,)
        if len(results) != len(output_views):
            raise Error(f"{domain}.{name} returned {len(results)} arrays for {len(output_views)} outputs")
        for i, (result, (view, shape, dtype)) in enumerate(zip(results, output_views)):
            result = np.asarray(result)
            if tuple(result.shape) != tuple(shape):
                raise Error(f"{domain}.{name} returned shape {tuple(result.shape)} for output {i}, "
                            f"expected {tuple(shape)}")
            view.view(_NUMPY_DTYPES[dtype]).reshape(tuple(shape))[...] = result

    def infer_types(types, count):
        named = [(np.dtype(_NUMPY_DTYPES[dtype]), tuple(shape)) for dtype, shape in types]
        result = infer(named) if infer is not None else [named[0]] * count
        return [(_DTYPE_NAMES[np.dtype(dtype)], [int(d) for d in shape]) for dtype, shape in result]

    _register_host_op(domain, name, int(low), int(high), int(outputs), call, infer_types)


def load_plugin(path) -> dict:
    """Loads a plugin library of custom operators (docs/plugins.md) into this
    process: compile() knows its ops from then on, and packages that use them
    record it. Returns {"name", "path", "api_level", "hash", "ops"}. Loading
    the same library again returns it; kiln.Error when the library is
    missing, not a kiln plugin, needs a newer plugin API level, or registers
    an op kiln refuses."""
    return _load_plugin(str(path))

# kiln's dtype names and the numpy types that hold them; the narrow float
# and sub-byte integer types are ml_dtypes', which keep one element per byte
# as kiln does.
_NUMPY_DTYPES = {
    "f32": np.float32, "f64": np.float64, "f16": np.float16, "i8": np.int8, "u8": np.uint8, "i16": np.int16,
    "u16": np.uint16, "i32": np.int32, "u32": np.uint32, "i64": np.int64, "u64": np.uint64, "bool": np.bool_,
    "bf16": ml_dtypes.bfloat16, "f8e4m3": ml_dtypes.float8_e4m3fn, "f8e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
    "f8e5m2": ml_dtypes.float8_e5m2, "f8e5m2fnuz": ml_dtypes.float8_e5m2fnuz, "f8e8m0": ml_dtypes.float8_e8m0fnu,
    "f4e2m1": ml_dtypes.float4_e2m1fn, "i4": ml_dtypes.int4, "u4": ml_dtypes.uint4, "i2": ml_dtypes.int2,
    "u2": ml_dtypes.uint2,
}
# The ml_dtypes types, which the bindings (numpy's own types only) receive
# as views of their bits.
_DTYPE_NAMES = {np.dtype(t): name for name, t in _NUMPY_DTYPES.items()}
_BIT_VIEWS = {np.dtype(t) for t in _NUMPY_DTYPES.values() if np.dtype(t).type.__module__.startswith("ml_dtypes")}


def _as_bits(array: np.ndarray) -> np.ndarray:
    """The array itself, or for an ml_dtypes type a view of its bytes as
    unsigned integers of the same size."""
    return array.view(f"u{array.itemsize}") if array.dtype in _BIT_VIEWS else array


def compile(onnx_path, out_path, shapes: Optional[Mapping[str, Sequence[int]]] = None,
            batch: Optional[int] = None, dynamic: bool = False, target: str = "cpu",
            quantize_activations: bool = False, tf32: bool = False, fp16: bool = False,
            bf16: bool = False, plugins: Sequence = (), variables: Sequence[str] = (),
            gradients_of: Optional[str] = None, wrt: Sequence[str] = ()) -> dict:
    """Compiles an ONNX model into a .kiln package.

    shapes fixes input shapes ({"x": [1, 3, 224, 224]}); batch fixes every
    unknown leading input dimension. Input dimensions left unknown stay
    symbolic and the package is specialized per input signature at run time
    (so is a model whose shapes depend on input values, always), with a
    warning unless dynamic=True asks for that.
    Returns the compile report (steps, and step_kernels: steps per kernel,
    which shows what the fusions made; views, constants, arena bytes against
    the lower bound; runtime_shapes tells whether the package is specialized
    at run time). target="cuda" makes a package for NVIDIA GPUs (static
    shapes only; docs/cuda.md). quantize_activations=True computes MatMuls
    over int8 weights (weight-only quantized models) in int8, quantizing
    their activations per row in groups of 32 as the model runs: about twice
    as fast on CPUs with AVX-512 VNNI, and it changes results (about 5e-3
    relative on a MiniLM); the report's int8_matmuls counts them. tf32=True
    (target="cuda") lets products and convolutions use TF32 tensor cores:
    faster, about 1e-3 relative error. fp16=True (target="cuda") stores
    tensors in f16 where the cuda kernels take it (products and convolutions
    on f16 tensor cores, summing in f32; inputs and outputs stay f32): faster,
    with errors of 2e-4 to 6e-2 of an output's magnitude on real models, and
    f16's range (docs/cuda.md). bf16=True does the same in bf16: f32's
    range, coarser rounding; on the cpu target it makes products with
    constant weights multiply in bf16 (sums in f32) on CPUs with AVX-512
    BF16, which is slower than f32 on CPUs without AMX
    (docs/performance.md). plugins: plugin libraries to load first
    (load_plugin), whose custom operators the model uses. variables: names of
    weights (initializers) to keep as variables, which a Session reads and
    replaces without recompiling (they are not folded into other constants;
    docs/session.md). gradients_of: the name of a one-element loss value;
    the package then also outputs the gradient of the loss with respect to
    each value named in `wrt` (weights or inputs), as "<name>_grad",
    computed by reverse-mode differentiation (docs/training.md)."""
    for plugin in plugins:
        _load_plugin(str(plugin))
    fixed = {name: [int(d) for d in dims] for name, dims in (shapes or {}).items()}
    report = _compile(str(onnx_path), str(out_path), fixed, None if batch is None else int(batch), bool(dynamic),
                      str(target), bool(quantize_activations), bool(tf32), bool(fp16), bool(bf16),
                      [str(v) for v in variables], str(gradients_of or ""), [str(v) for v in wrt])
    if report["unfixed_input"]:
        warnings.warn(f"kiln.compile: {report['unfixed_input']} is not fixed: shapes are fixed at run time, per "
                      "input signature (shapes= or batch= makes a static package, faster to load)", stacklevel=2)
    return report


# Runners on devices, stopped before the interpreter finalizes: their
# ModelRunner's threads may be calling host functions (register_host_op),
# which need the interpreter.
_device_runners = weakref.WeakSet()


@atexit.register
def _stop_device_runners():
    for runner in list(_device_runners):
        runner._executor = None


class Runner:
    """Runs a compiled package: on the CPU, or on a device.

    run() checks each input's name, dtype and shape, passes it to the model
    without copying when it is C-contiguous (others are copied once), and the
    model writes straight into the output arrays it returns. One run() at a
    time per Runner; the GIL is released while the model runs. `threads`:
    threads per kernel (0: OMP_NUM_THREADS, or one per core).

    Packages with run-time shapes (compile(..., dynamic=True), or shapes read
    from input values) accept any size in their unknown dimensions (-1 in
    `inputs`): each new input signature is compiled once and cached, up to
    `plan_cache_capacity` of them; memory_stats() reports the shared arena
    and the cache, shrink() gives the memory back.

    With profile=True every run() also records when each step ran: trace()
    gives the Chrome trace (the JSON that chrome://tracing and Perfetto open)
    of the runs so far, save_trace(path) writes it, clear_trace() starts
    over. Tracing reads the clock twice per step: time the model without it.

    device: "cpu" (the host executor), "sim" or "cuda" (a ModelRunner on that
    device: inputs are copied to it and outputs back; no profile). Default:
    "cuda" for a package compiled with target="cuda", else "cpu". A package
    with run-time shapes runs on its target: compiled with target="cuda" and
    dynamic=True, each signature is compiled for the GPU and run there.

    flush_denormals (default True): denormal floats are flushed to zero
    while the model runs (FTZ and DAZ on the kernel threads; the caller's
    mode is restored after each run). Models whose activations underflow
    run several times faster on Intel cores. Floats below 1.2e-38 are then
    zero, as results and when read (Ceil of 1e-40 is 0). False keeps the
    caller's floating-point mode."""

    def __init__(self, path, model: str = "", threads: int = 0, plan_cache_capacity: int = 16,
                 profile: bool = False, device: Optional[str] = None, flush_denormals: bool = True):
        if threads < 0:
            raise Error(f"threads must be 0 or more, got {threads}")
        self.dynamic = is_graph_package(str(path), model)
        target = package_target(str(path), model)
        self.device = device or target
        if self.dynamic and self.device != target:
            raise Error(f"a package with run-time shapes runs on its target, '{target}' (device='{self.device}')")
        if self.device != "cpu" and not self.dynamic:
            if profile:
                raise Error(f"device='{self.device}' runs without profile=True")
            self._executor = DeviceRunner(str(path), model, self.device, flush_denormals)
            _device_runners.add(self)
            self._trace = None
            self.inputs = [(name, tuple(shape), dtype) for name, shape, dtype in self._executor.inputs]
            self.outputs = [(name, tuple(shape), dtype) for name, shape, dtype in self._executor.outputs]
            return
        if self.dynamic:
            self._executor = DynamicExecutor(str(path), model, threads, plan_cache_capacity, flush_denormals)
        else:
            self._executor = Executor(str(path), model, threads, flush_denormals)
        self._trace = StepTrace() if profile else None
        self.inputs = [(name, tuple(shape), dtype) for name, shape, dtype in self._executor.inputs]
        self.outputs = [(name, tuple(shape), dtype) for name, shape, dtype in self._executor.outputs]

    @property
    def steps_run(self) -> int:
        """Kernel steps run by all calls so far, sub-programs' included (an If
        counts the branch it took, a Loop every iteration of its body); for
        static packages only."""
        if self.dynamic or self.device != "cpu":
            raise Error("steps_run is kept for static packages on the host executor only")
        return self._executor.steps_run

    def memory_stats(self) -> dict:
        """arena_bytes, and for run-time-shape packages the plan cache's hits,
        misses (each one a compile), evictions and size."""
        if self.dynamic:
            return self._executor.memory_stats()
        if self.device != "cpu":
            raise Error("memory_stats() reports the host executor's memory; this Runner runs on " + self.device)
        return {"arena_bytes": self._executor.arena_bytes, "plan_cache_hits": 0, "plan_cache_misses": 0,
                "plan_cache_evictions": 0, "cached_plans": 1}

    def shrink(self) -> None:
        """Frees the arena and the cached specializations of a run-time-shape
        package (they are rebuilt on the next call); nothing for others."""
        if self.dynamic:
            self._executor.shrink()

    def trace(self) -> dict:
        """The Chrome trace of the runs so far: {"traceEvents": [...]}, one
        event per step (name: kernel; args: op, output, input and output
        shapes) and one per run. Needs profile=True."""
        return json.loads(self._profiling().to_json())

    def save_trace(self, path) -> None:
        """Writes trace() as JSON to `path`."""
        self._profiling().write(str(path))

    def clear_trace(self) -> None:
        self._profiling().clear()

    def _profiling(self) -> StepTrace:
        if self._trace is None:
            raise Error("this Runner records no trace: make it with profile=True")
        return self._trace

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
            if not _fits(array.shape, shape, self.dynamic):
                raise Error(f"input '{name}' must have shape {_show(shape)}, got {array.shape}")
            # A copy only when not C-contiguous; reshape keeps a 0-d array 0-d (the
            # shape is part of a run-time-shape package's signature).
            arrays.append(_as_bits(np.ascontiguousarray(array).reshape(array.shape)))
        if self.dynamic:
            dtypes = [dtype for _, _, dtype in self.inputs]
            # Outputs are made as their shapes become known (a model whose shapes
            # depend on values it computes runs in stages); kiln writes into them.
            outputs = []
            for data, shape, dtype in self._executor.run_allocating(arrays, dtypes, self._trace):
                if dtype not in _NUMPY_DTYPES:
                    raise Error(f"an output has dtype {dtype}, which numpy cannot hold")
                outputs.append(data.view(_NUMPY_DTYPES[dtype]).reshape(tuple(shape)))
        elif self.device != "cpu":
            outputs = [np.empty(shape, dtype=_NUMPY_DTYPES[dtype]) for _, shape, dtype in self.outputs]
            self._executor.run(arrays, [_as_bits(output) for output in outputs])
        else:
            outputs = [np.empty(shape, dtype=_NUMPY_DTYPES[dtype]) for _, shape, dtype in self.outputs]
            self._executor.run(arrays, [_as_bits(output) for output in outputs], self._trace)
        return {name: array for (name, _, _), array in zip(self.outputs, outputs)}


def _fits(actual: tuple, declared: tuple, dynamic: bool) -> bool:
    if not dynamic:
        return actual == declared
    if len(declared) and len(actual) != len(declared):
        return False
    return all(d == -1 or d == a for a, d in zip(actual, declared))


def _show(shape: tuple) -> str:
    return "(" + ", ".join("?" if d == -1 else str(d) for d in shape) + ")"


from .session import Session  # noqa: E402 (it uses the dtype tables above)
from . import optim  # noqa: E402
from . import distributed  # noqa: E402 (registers the all-reduce op of data-parallel packages)


def compile_training(onnx_path, out_path, loss: str, optimizer: Optional["optim.Optimizer"] = None,
                     trainable: Optional[Sequence[str]] = None,
                     shapes: Optional[Mapping[str, Sequence[int]]] = None, batch: Optional[int] = None,
                     gradient_accumulation: int = 1, seed: int = 0, plugins: Sequence = (),
                     data_parallel: Optional[str] = None) -> dict:
    """Compiles a training package (docs/training.md): its main program runs
    one training step, the model forward, the gradient of `loss` (a
    one-element value of the model) with respect to the `trainable` weights
    (default: every f32 initializer) and `optimizer`'s update (default
    optim.SGD(0.01)), written over the weights, which become variables. Run
    it with a kiln.Session: each run() is num_host_transfers steps, and
    get_tensor_data() reads the trained weights. gradient_accumulation=k:
    the optimiser steps once every k runs with the mean of their gradients
    (k micro-batches as one batch of k times the size).

    Training mode: BatchNormalization normalises with each batch's
    statistics and updates its running mean and variance (variables, not
    trained); Dropout draws a new mask each step from a stream that starts
    at `seed` (the same masks in every session of the package). plugins:
    plugin libraries to load first; their ops are differentiated through
    the gradient ops they declare (docs/plugins.md). data_parallel: the
    step averages its gradients before updating, so that copies training on
    shards of each global batch stay in step: "replicas" over the replicas
    of a Session (replication_factor, inputs [steps, replicas, *shape]),
    "mpi" over the processes of an MPI job (kiln.distributed)."""
    for plugin in plugins:
        load_plugin(plugin)
    all_reduces = {None: "", "replicas": "kiln.replicas.AllReduceMean", "mpi": distributed.ALL_REDUCE}
    if data_parallel not in all_reduces:
        raise Error(f"data_parallel is None, 'replicas' or 'mpi', not {data_parallel!r}")
    all_reduce = all_reduces[data_parallel]
    optimizer = optimizer or optim.SGD(0.01)
    fixed = {name: [int(d) for d in dims] for name, dims in (shapes or {}).items()}
    return _compile(str(onnx_path), str(out_path), fixed, None if batch is None else int(batch), False, "cpu",
                    False, False, False, False, [], "", [], str(loss), [str(t) for t in (trainable or [])],
                    optimizer.numbers(), optimizer.kind, int(gradient_accumulation), int(seed), all_reduce)

