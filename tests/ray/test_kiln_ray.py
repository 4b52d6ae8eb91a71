"""The Ray Serve deployment of kiln serve (deploy/ray/kiln_ray.py), on a
local Ray with 2 replicas: requests through Ray's HTTP proxy reach both
replicas' kiln serve, with the protocol's JSON and binary bodies and error
statuses unchanged. Runs in .venv-ray (requirements-ray.txt)."""

import json
import os
import pathlib
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "deploy" / "ray"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    kiln = REPO / os.environ.get("KILN_BUILD_DIR", "build/release") / "tools" / "kiln"
    folder = tmp_path_factory.mktemp("ray") / "models"
    (folder / "double" / "1").mkdir(parents=True)
    graph = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["y"])], "double",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
                              [numpy_helper.from_array(np.full(4, 2, np.float32), "two")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, folder / "double.onnx")
    subprocess.run([str(kiln), "compile", str(folder / "double.onnx"), "--batch", "4", "-o",
                    str(folder / "double" / "1" / "model.kiln")], check=True, capture_output=True)
    (folder / "double.onnx").unlink()
    return folder, kiln


def call(port, path, body=None, headers=None):
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, headers=headers or {},
                                     method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, answer.read(), answer.headers
    except urllib.error.HTTPError as error:
        return error.code, error.read(), error.headers


def test_two_replicas_behind_rays_proxy(repository):
    import ray
    from ray import serve

    import kiln_ray

    folder, kiln = repository
    port = free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(kiln_ray.app(str(folder), replicas=2, kiln_binary=str(kiln)), route_prefix="/")
        assert call(port, "/v2/health/ready")[0] == 200
        status, data, _ = call(port, "/v2/models/double")
        assert status == 200 and json.loads(data)["inputs"][0]["shape"] == [-1, 4]
        replicas = set()
        for i in range(40):
            x = np.arange(4 * (1 + i % 3), dtype=np.float32).reshape(-1, 4) + i
            if i % 2:
                header = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape),
                                                 "parameters": {"binary_data_size": x.nbytes}}],
                                     "outputs": [{"name": "y", "parameters": {"binary_data": True}}]}).encode()
                status, data, headers = call(port, "/v2/models/double/infer", header + x.tobytes(),
                                             {"Inference-Header-Content-Length": str(len(header))})
                assert status == 200
                length = int(headers["Inference-Header-Content-Length"])
                y = np.frombuffer(data[length:], np.float32).reshape(x.shape)
            else:
                body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape),
                                               "data": x.ravel().tolist()}]}).encode()
                status, data, headers = call(port, "/v2/models/double/infer", body)
                assert status == 200
                y = np.array(json.loads(data)["outputs"][0]["data"], np.float32).reshape(x.shape)
            np.testing.assert_array_equal(y, 2 * x)
            replicas.add(headers["X-Kiln-Replica"])
        assert len(replicas) == 2  # Ray spread the requests over both replicas
        status, data, _ = call(port, "/v2/models/double/infer", b"{")
        assert status == 400 and b"not valid JSON" in data
    finally:
        serve.shutdown()
        ray.shutdown()
