"""The deployment recipes agree with the server they deploy: the KServe
manifests' and the container image's arguments are flags `kiln serve`
takes, the ports they expose are the ports those flags open, and the
protocol and probes are the ones the server speaks."""

import re
import subprocess

import yaml

from conftest import REPO


def serve_flags(kiln_binary):
    help_text = subprocess.run([str(kiln_binary), "serve", "--help"], capture_output=True, text=True,
                               check=True).stdout
    return set(re.findall(r"(--[a-z-]+)", help_text))


def flag_values(args):
    """['--a=1', '--b', '2'] -> {'--a': '1', '--b': '2'}"""
    values, i = {}, 0
    while i < len(args):
        if "=" in args[i]:
            key, value = args[i].split("=", 1)
            values[key] = value
            i += 1
        else:
            values[args[i]] = args[i + 1]
            i += 2
    return values


def test_serving_runtime_matches_the_server(kiln_binary):
    runtime = yaml.safe_load((REPO / "deploy/kserve/serving-runtime.yaml").read_text())
    assert runtime["kind"] == "ServingRuntime" and runtime["apiVersion"].startswith("serving.kserve.io/")
    assert {"v2", "grpc-v2"} <= set(runtime["spec"]["protocolVersions"])
    assert runtime["spec"]["supportedModelFormats"][0]["name"] == "kiln"
    container = runtime["spec"]["containers"][0]
    args = flag_values(container["args"])
    assert set(args) <= serve_flags(kiln_binary), set(args) - serve_flags(kiln_binary)
    assert args["--model-repository"] == "/mnt/models"  # where KServe's storage initializer writes
    assert args["--host"] == "0.0.0.0"  # the pod's network, not loopback
    assert [p["containerPort"] for p in container["ports"]] == [int(args["--http-port"])]
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] == int(args["--http-port"])
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    annotations = runtime["metadata"]["annotations"]
    assert annotations["prometheus.kserve.io/port"] == args["--metrics-port"]
    assert annotations["prometheus.kserve.io/path"] == "/metrics"


def test_inference_service_uses_the_runtime():
    service = yaml.safe_load((REPO / "deploy/kserve/inference-service.yaml").read_text())
    runtime = yaml.safe_load((REPO / "deploy/kserve/serving-runtime.yaml").read_text())
    predictor = service["spec"]["predictor"]
    assert predictor["model"]["runtime"] == runtime["metadata"]["name"]
    assert predictor["model"]["modelFormat"]["name"] == runtime["spec"]["supportedModelFormats"][0]["name"]
    assert predictor["model"]["protocolVersion"] in runtime["spec"]["protocolVersions"]
    assert predictor["scaleMetric"] == "concurrency" and predictor["maxReplicas"] > predictor["minReplicas"]


def test_container_image_matches_the_server(kiln_binary):
    dockerfile = (REPO / "server/Dockerfile").read_text()
    entrypoint = re.search(r"^ENTRYPOINT (\[.*\])$", dockerfile, re.M).group(1)
    assert yaml.safe_load(entrypoint) == ["kiln", "serve"]
    args = flag_values(yaml.safe_load(re.search(r"^CMD (\[.*\])$", dockerfile, re.M).group(1)))
    assert set(args) <= serve_flags(kiln_binary)
    exposed = {int(p) for p in re.search(r"^EXPOSE (.*)$", dockerfile, re.M).group(1).split()}
    assert exposed == {int(args[f]) for f in ("--http-port", "--grpc-port", "--metrics-port")}
    runtime = yaml.safe_load((REPO / "deploy/kserve/serving-runtime.yaml").read_text())
    runtime_args = flag_values(runtime["spec"]["containers"][0]["args"])
    for flag in ("--http-port", "--grpc-port", "--metrics-port", "--model-repository"):
        assert runtime_args[flag] == args[flag], flag
    assert re.search(r"^USER (\d+)$", dockerfile, re.M).group(1) != "0"  # not root
    # The build stage installs the project's own package list.
    assert "scripts/packages.txt" in dockerfile
