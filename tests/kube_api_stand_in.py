"""A stand-in for a Kubernetes API server: it serves only the ``deployments/scale``
subresource (``GET`` and ``PATCH``, apps/v1), as the Kubernetes API defines it, so the
Kubernetes scaler runs its real client (the official ``kubernetes`` package, configured
by a kubeconfig) against real HTTP without a cluster.

What it keeps: each Deployment's replicas, every PATCH received, and a bearer token it
requires (401 otherwise). Deployments named in ``forbidden`` answer 403, as RBAC would.
``on_scale`` is called with (name, replicas) after each accepted PATCH: a test plays the
Deployment controller there (starts or stops the workers the replicas stand for).
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

_SCALE = re.compile(r"^/apis/apps/v1/namespaces/([^/]+)/deployments/([^/]+)/scale$")
_MERGE_PATCHES = ("application/strategic-merge-patch+json", "application/merge-patch+json")


@dataclass
class KubeAPI:
    url: str
    token: str
    namespace: str
    replicas: dict[str, int]
    patches: list[tuple[str, int]] = field(default_factory=list)
    forbidden: set[str] = field(default_factory=set)
    on_scale: Callable[[str, int], None] = lambda name, replicas: None

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "stand-in",
            "clusters": [{"name": "stand-in", "cluster": {"server": self.url}}],
            "users": [{"name": "router", "user": {"token": self.token}}],
            "contexts": [{"name": "stand-in", "context": {
                "cluster": "stand-in", "user": "router", "namespace": self.namespace}}],
        }))  # fmt: skip
        return path


def _status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}  # fmt: skip


def _scale(namespace: str, name: str, replicas: int) -> dict:
    return {
        "kind": "Scale", "apiVersion": "autoscaling/v1",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"replicas": replicas},
        "status": {"replicas": replicas, "selector": f"app.kubernetes.io/instance={name}"},
    }  # fmt: skip


def _handler(api: KubeAPI) -> type[BaseHTTPRequestHandler]:
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _reply(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _target(self) -> tuple[str, str] | None:
            if self.headers.get("Authorization") != f"Bearer {api.token}":
                self._reply(401, _status(401, "Unauthorized", "Unauthorized"))
                return None
            match = _SCALE.match(self.path.split("?")[0])
            if match is None or match[1] != api.namespace or match[2] not in api.replicas:
                self._reply(404, _status(404, "NotFound", f"{self.path} not found"))
                return None
            if match[2] in api.forbidden:
                verb = self.command.lower()
                self._reply(403, _status(403, "Forbidden", f"cannot {verb} deployments/scale"))
                return None
            return match[1], match[2]

        def do_GET(self) -> None:
            target = self._target()
            if target is not None:
                with lock:
                    self._reply(200, _scale(*target, api.replicas[target[1]]))

        def do_PATCH(self) -> None:
            target = self._target()
            if target is None:
                return
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            content_type = self.headers.get("Content-Type", "").split(";")[0]
            replicas = body.get("spec", {}).get("replicas") if isinstance(body, dict) else None
            if content_type not in _MERGE_PATCHES or not isinstance(replicas, int):
                self._reply(422, _status(422, "Invalid", f"unsupported patch {content_type}"))
                return
            with lock:
                api.replicas[target[1]] = replicas
                api.patches.append((target[1], replicas))
                self._reply(200, _scale(*target, replicas))
            api.on_scale(target[1], replicas)

    return Handler


@contextlib.contextmanager
def kube_api(replicas: dict[str, int], namespace: str = "pdserve") -> Iterator[KubeAPI]:
    api = KubeAPI("", "stand-in-token", namespace, dict(replicas))
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(api))
    api.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield api
    finally:
        server.shutdown()
        server.server_close()
