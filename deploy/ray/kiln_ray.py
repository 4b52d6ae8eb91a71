"""kiln serve behind Ray Serve: each Ray Serve replica runs its own
`kiln serve` (on a free loopback port, with the model repository) and
forwards the KServe v2 HTTP calls that Ray's HTTP proxy routes to it, bytes
unchanged (JSON, the binary tensor data extension, every endpoint). Ray
spreads the traffic over the replicas; on a Ray cluster the same code puts
them on other machines.

    ray start --head                       # or a cluster
    python deploy/ray/kiln_ray.py --model-repository models --replicas 2 --port 8000

Then any KServe v2 client talks to http://HOST:8000/v2/... as to kiln
serve itself. Each response carries `X-Kiln-Replica` (the replica's process
id), so load spreading can be seen."""

import argparse
import os
import re
import subprocess
import time
import urllib.request

from ray import serve
from starlette.requests import Request
from starlette.responses import Response

# Request and response headers the protocol uses; the rest stay in Ray.
FORWARDED = ("content-type", "inference-header-content-length", "authorization")


@serve.deployment(ray_actor_options={"num_cpus": 1})
class KilnReplica:
    def __init__(self, model_repository: str, kiln_binary: str = "kiln", threads_per_replica: int = 1):
        env = {**os.environ, "OMP_NUM_THREADS": str(threads_per_replica)}
        self.log_path = f"/tmp/kiln-ray-replica-{os.getpid()}.log"
        self.log = open(self.log_path, "w")
        self.process = subprocess.Popen(
            [kiln_binary, "serve", "--model-repository", model_repository, "--host", "127.0.0.1", "--http-port", "0",
             "--grpc-port", "-1", "--metrics-port", "-1"], stdout=subprocess.DEVNULL, stderr=self.log, env=env)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            found = re.search(r"HTTP (\d+)", open(self.log_path).read())
            if found:
                self.base = f"http://127.0.0.1:{found.group(1)}"
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError("kiln serve did not start:\n" + open(self.log_path).read())

    async def __call__(self, request: Request) -> Response:
        body = await request.body()
        headers = {k: v for k, v in request.headers.items() if k.lower() in FORWARDED}
        forwarded = urllib.request.Request(self.base + request.url.path, data=body or None, headers=headers,
                                           method=request.method)
        try:
            with urllib.request.urlopen(forwarded, timeout=300) as answer:
                status, data, answer_headers = answer.status, answer.read(), answer.headers
        except urllib.error.HTTPError as error:
            status, data, answer_headers = error.code, error.read(), error.headers
        out = {k: v for k, v in answer_headers.items() if k.lower() in FORWARDED}
        out["X-Kiln-Replica"] = str(os.getpid())
        return Response(content=data, status_code=status, headers=out)

    def __del__(self):
        if getattr(self, "process", None) is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=60)


def app(model_repository: str, replicas: int = 2, kiln_binary: str = "kiln", threads_per_replica: int = 1):
    return KilnReplica.options(num_replicas=replicas).bind(model_repository, kiln_binary, threads_per_replica)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-repository", required=True)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--kiln", default="kiln")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    serve.run(app(os.path.abspath(args.model_repository), args.replicas, args.kiln), route_prefix="/", blocking=True)


if __name__ == "__main__":
    main()
