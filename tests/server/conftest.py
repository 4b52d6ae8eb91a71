"""Fixtures for the `kiln serve` tests: real model repositories of compiled
packages, a real server process on free ports, and Triton's own clients
(tritonclient) talking to it over HTTP and gRPC.

Runs in .venv-serve (requirements-serve.txt), where tritonclient's pins
live apart from kiln's main environment."""

import os
import pathlib
import re
import signal
import subprocess
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def kiln_binary() -> pathlib.Path:
    path = REPO / os.environ.get("KILN_BUILD_DIR", "build/release") / "tools" / "kiln"
    if not path.exists():
        pytest.fail(f"no kiln binary at {path}: build first (make build) or set KILN_BUILD_DIR")
    return path


class Mlp:
    """x [N, 16] -> y = relu(x W1 + b1) W2 [N, 4] and z = sigmoid(y) [N, 4]."""

    def __init__(self, seed=0):
        rng = np.random.default_rng(seed)
        self.w1 = rng.standard_normal((16, 32)).astype(np.float32) * 0.25
        self.b1 = rng.standard_normal(32).astype(np.float32) * 0.1
        self.w2 = rng.standard_normal((32, 4)).astype(np.float32) * 0.25

    def reference(self, x):
        y = np.maximum(x @ self.w1 + self.b1, 0) @ self.w2
        return {"y": y, "z": 1 / (1 + np.exp(-y))}

    def onnx(self, path):
        nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["h1"]),
                 helper.make_node("Relu", ["h1"], ["h2"]), helper.make_node("MatMul", ["h2", "w2"], ["y"]),
                 helper.make_node("Sigmoid", ["y"], ["z"])]
        graph = helper.make_graph(
            nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4]),
             helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 4])],
            [numpy_helper.from_array(self.w1, "w1"), numpy_helper.from_array(self.b1, "b1"),
             numpy_helper.from_array(self.w2, "w2")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        onnx.save(model, path)


def compile_mlp(kiln_binary, folder: pathlib.Path, mlp: Mlp, batch=8):
    folder.mkdir(parents=True, exist_ok=True)
    mlp.onnx(folder / "model.onnx")
    subprocess.run([str(kiln_binary), "compile", str(folder / "model.onnx"), "--batch", str(batch), "-o",
                    str(folder / "model.kiln")], check=True, capture_output=True)
    (folder / "model.onnx").unlink()


@pytest.fixture(scope="session")
def mlp_package(kiln_binary, tmp_path_factory):
    """One compiled Mlp package (batch 8), copied into each repository."""
    folder = tmp_path_factory.mktemp("mlp_package")
    compile_mlp(kiln_binary, folder, Mlp(0))
    return folder / "model.kiln"


def add_model(repository: pathlib.Path, name: str, package: pathlib.Path, version=1, config=None):
    folder = repository / name / str(version)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.kiln").write_bytes(package.read_bytes())
    if config is not None:
        import json
        (repository / name / "config.json").write_text(json.dumps(config))


class Server:
    """A `kiln serve` process on free ports."""

    def __init__(self, binary, repository, extra_args=(), env=None):
        self.repository = repository
        args = [str(binary), "serve", "--model-repository", str(repository), "--http-port", "0", "--grpc-port", "0",
                "--metrics-port", "0", *map(str, extra_args)]
        self.stderr_path = repository.parent / f"serve-{time.monotonic_ns()}.log"
        self.stderr = open(self.stderr_path, "w")
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=self.stderr,
                                        env={**os.environ, **(env or {})})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            text = self.stderr_path.read_text()
            found = re.search(r"listening on \S+: HTTP (-?\d+), gRPC (-?\d+), metrics (-?\d+)", text)
            if found:
                self.http_port, self.grpc_port, self.metrics_port = map(int, found.groups())
                return
            if self.process.poll() is not None:
                raise RuntimeError(f"kiln serve exited with {self.process.returncode}:\n{text}")
            time.sleep(0.05)
        self.process.kill()
        raise RuntimeError("kiln serve did not start in 60 s:\n" + self.stderr_path.read_text())

    @property
    def http_url(self):
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self):
        return f"127.0.0.1:{self.grpc_port}"

    def log(self):
        return self.stderr_path.read_text()

    def terminate(self, timeout=60):
        """SIGTERM, then wait; returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout)
        finally:
            self.stderr.close()

    def kill(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.stderr.close()


@pytest.fixture
def start_server(kiln_binary):
    servers = []

    def start(repository, extra_args=(), env=None):
        server = Server(kiln_binary, repository, extra_args, env)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.kill()


@pytest.fixture
def repository(tmp_path, mlp_package):
    """A repository with the Mlp as model 'mlp' (version 1)."""
    repo = tmp_path / "models"
    add_model(repo, "mlp", mlp_package)
    return repo


@pytest.fixture
def server(start_server, repository):
    return start_server(repository)
