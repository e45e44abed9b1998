"""Fixtures for the workloads tests: stack runs under mocks that also record each resource's dependencies and
provider, and a small OCI registry served on localhost (the KubeRay CRD's validators are in tests/conftest.py)."""
from __future__ import annotations

import hashlib
import http.server
import threading
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import pytest

from deploy import config, offline, program
from tests.stacks import read_stack_file
from workloads.settings import Workloads

REPO = Path(__file__).resolve().parents[2]


# --- stack configurations and runs -------------------------------------------------------------

def stack_file(stack: str) -> dict:
    return read_stack_file(stack, REPO)


def stack_config(stack: str, **overrides) -> config.StackConfig:
    raw = stack_file(stack)
    raw.update({k if ":" in k else f"raytrain-eks:{k}": v for k, v in overrides.items()})
    return config.load(raw, stack=stack)


def settings(stack: str, **overrides) -> Workloads:
    """What the workloads of Pulumi.<stack>.yaml (plus overrides) are made of, as the program hands it over."""
    return program.workloads(stack_config(stack, **overrides))


@dataclass
class StackRun:
    """A program run and its dependency graph (offline.PlanResult records both)."""

    result: offline.PlanResult

    def __getattr__(self, name):
        return getattr(self.result, name)


def run_stack(stack: str, **overrides) -> StackRun:
    """Run the program for Pulumi.<stack>.yaml (plus overrides)."""
    raw = stack_file(stack)
    raw.update({k if ":" in k else f"raytrain-eks:{k}": v for k, v in overrides.items()})
    return StackRun(offline.run(raw, stack=stack))


@pytest.fixture(scope="session")
def dev_run() -> StackRun:
    return run_stack("dev")


@pytest.fixture(scope="session")
def p5_run() -> StackRun:
    return run_stack("p5")


# --- a fake OCI registry -----------------------------------------------------------------------

INDEX_DIGEST = "sha256:" + hashlib.sha256(b"multi-arch image index").hexdigest()
SINGLE_MANIFEST_DIGEST = "sha256:" + hashlib.sha256(b"one platform's manifest").hexdigest()
SERVICE = "fake-registry"
SLOW_SECONDS = 3.0


class FakeRegistry:
    """Distribution-spec behaviour, per repository and tag:

    - open/*: no authentication; every other repository needs `Bearer pull:<repository>`, obtained
      anonymously from /token with scope repository:<repository>:pull. The 401 challenge names
      scope "aws", as public.ecr.aws does, so a client must ask for the repository scope itself.
    - private/*: the token service hands out a token that does not grant the pull (401 again).
    - denied/*: the token service answers 401. basic/*: challenges with Basic, not Bearer.
    - tags: missing -> 404, nodigest -> 200 without Docker-Content-Digest, baddigest -> a malformed
      digest, boom -> 500, slow -> answers after SLOW_SECONDS; any other tag resolves, to the
      index digest when the client accepts an OCI index or Docker manifest list.
    """

    def __init__(self):
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.release = threading.Event()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RegistryHandler)
        self.server.registry = self
        self.server.daemon_threads = True
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def image(self, repository: str, tag: str) -> str:
        return f"{self.host}/{repository}:{tag}"

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


class _RegistryHandler(http.server.BaseHTTPRequestHandler):
    """The FakeRegistry's answers: the token service on GET /token, manifests on HEAD /v2/<repo>/manifests/<tag>."""

    @property
    def registry(self) -> FakeRegistry:
        return self.server.registry

    def log_message(self, *args):
        pass

    def _reply(self, status, headers=(), body=b""):
        self.send_response(status)
        for key, value in headers:
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self):
        self.registry.requests.append(("GET", self.path, dict(self.headers)))
        url = urllib.parse.urlparse(self.path)
        if url.path != "/token":
            return self._reply(404)
        query = urllib.parse.parse_qs(url.query)
        scope = query.get("scope", [""])[0]
        repository = scope.removeprefix("repository:").removesuffix(":pull")
        if query.get("service") != [SERVICE] or not scope.endswith(":pull"):
            return self._reply(400, body=b'{"errors": [{"code": "UNSUPPORTED"}]}')
        if repository.startswith("denied/"):
            return self._reply(401, body=b'{"errors": [{"code": "DENIED"}]}')
        token = "anonymous" if repository.startswith("private/") else f"pull:{repository}"
        self._reply(200, [("Content-Type", "application/json")], f'{{"token": "{token}"}}'.encode())

    def do_HEAD(self):
        self.registry.requests.append(("HEAD", self.path, dict(self.headers)))
        parts = self.path.split("/")
        if parts[:2] != ["", "v2"] or "manifests" not in parts:
            return self._reply(404)
        at = parts.index("manifests")
        repository, tag = "/".join(parts[2:at]), parts[at + 1]
        if repository.startswith("basic/"):
            return self._reply(401, [("WWW-Authenticate", 'Basic realm="fake"')])
        if not repository.startswith("open/") and self.headers.get("Authorization") != f"Bearer pull:{repository}":
            realm = f"http://{self.registry.host}/token"
            return self._reply(401, [("WWW-Authenticate", f'Bearer realm="{realm}",service="{SERVICE}",scope="aws"')])
        if tag in ("missing", "boom"):
            return self._reply(404 if tag == "missing" else 500)
        if tag == "slow":
            self.registry.release.wait(SLOW_SECONDS)
        self._reply(200, self._manifest_headers(tag))

    def _manifest_headers(self, tag: str) -> list[tuple[str, str]]:
        """An index when the client accepts one, else a single manifest; the digest as the tag says."""
        accept = self.headers.get("Accept", "")
        multi = ("application/vnd.oci.image.index.v1+json" in accept
                 or "application/vnd.docker.distribution.manifest.list.v2+json" in accept)
        headers = [("Content-Type", "application/vnd.oci.image.index.v1+json" if multi
                    else "application/vnd.oci.image.manifest.v1+json")]
        if tag == "baddigest":
            headers.append(("Docker-Content-Digest", "sha256:not-a-digest"))
        elif tag != "nodigest":
            headers.append(("Docker-Content-Digest", INDEX_DIGEST if multi else SINGLE_MANIFEST_DIGEST))
        return headers


@pytest.fixture(scope="session")
def _registry_server():
    server = FakeRegistry()
    yield server
    server.close()


@pytest.fixture
def registry(_registry_server) -> FakeRegistry:
    _registry_server.requests.clear()
    return _registry_server
