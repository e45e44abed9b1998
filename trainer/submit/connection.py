"""Reaching the Ray head: a kubectl port-forward (closed afterwards), the auth token, the job client."""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import shlex
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Iterator, Sequence

from facts import ray as ray_facts
from trainer.submit.target import SubmitError, Target, kubectl, run_command, stack_target

CONNECT_TIMEOUT_S = 10.0


PORT_FORWARD_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def port_forward(target: Target, timeout: float = PORT_FORWARD_TIMEOUT_S) -> Iterator[str]:
    """`kubectl port-forward` to the head's dashboard port on 127.0.0.1, closed on exit."""
    port = free_port()
    cmd = [*kubectl(target), "port-forward", f"svc/{target.service}", f"{port}:{ray_facts.DASHBOARD_PORT}",
           "--address", "127.0.0.1"]
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except FileNotFoundError:
        raise SubmitError("kubectl is not installed or not on PATH; install it, or pass --address") from None
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SubmitError(f"kubectl port-forward to svc/{target.service} in namespace {target.namespace} "
                                  f"exited: {proc.stderr.read().strip()}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            time.sleep(0.2)
        else:
            raise SubmitError(f"kubectl port-forward to svc/{target.service} did not open within {timeout:.0f} s")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()


def auth_token_from_cluster(target: Target) -> str:
    """The token KubeRay generated for the RayCluster (authOptions.mode: token), from its Secret."""
    base = kubectl(target)
    spec = json.loads(run_command([*base, "get", "raycluster", target.raycluster, "-o", "json"],
                                  "reading the RayCluster to find its auth Secret"))
    name = (spec.get("spec", {}).get("authOptions") or {}).get("secretName")
    secrets = json.loads(run_command([*base, "get", "secrets", "-o", "json"],
                                     "listing Secrets to find the Ray auth token"))
    for secret in secrets.get("items", []):
        owners = {(o.get("kind"), o.get("name")) for o in secret["metadata"].get("ownerReferences", [])}
        named = name and secret["metadata"]["name"] == name
        data = secret.get("data", {})
        if (named or ("RayCluster", target.raycluster) in owners) and ray_facts.AUTH_TOKEN_KEY in data:
            return base64.b64decode(data[ray_facts.AUTH_TOKEN_KEY]).decode().strip()
    raise SubmitError(f"no Secret with an auth_token for RayCluster {target.raycluster} in namespace {target.namespace}; "
                      "is authOptions.mode token set? Or export RAY_AUTH_TOKEN yourself")


def check_reachable(address: str, token: str | None, timeout: float = CONNECT_TIMEOUT_S) -> str:
    """Fail fast, within `timeout`, with the cause: unreachable, not Ray, token missing or wrong."""
    request = urllib.request.Request(f"{address.rstrip('/')}/api/version")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read()).get("ray_version", "unknown")
    except urllib.error.HTTPError as err:
        if err.code == 401:
            raise SubmitError(f"the Ray cluster at {address} requires a token: set RAY_AUTH_TOKEN "
                              "(or omit it to read the RayCluster's auth Secret with kubectl)") from None
        if err.code == 403:
            raise SubmitError(f"the Ray cluster at {address} rejected the token: RAY_AUTH_TOKEN is wrong "
                              "for this cluster; read it again from the RayCluster's auth Secret") from None
        raise SubmitError(f"{address} answered HTTP {err.code} on /api/version: is it a Ray dashboard?") from None
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", err)
        raise SubmitError(f"cannot reach the Ray dashboard at {address} within {timeout:.0f} s ({reason}); "
                          "check --address, or that the port-forward / cluster is up") from None


@contextlib.contextmanager
def connect(args: argparse.Namespace, target: Target | None = None) -> Iterator["JobSubmissionClient"]:  # noqa: F821
    """A JobSubmissionClient for --address, or through a port-forward that is closed afterwards."""
    token = os.environ.get("RAY_AUTH_TOKEN") or None
    with contextlib.ExitStack() as stack:
        if args.address:
            target = Target(args.address, args.namespace, args.service, args.raycluster)
        elif target is None and args.stack:
            target, _ = stack.enter_context(stack_target(args.stack))
        elif target is None:
            target = Target(None, args.namespace, args.service, args.raycluster)
        address = target.address or stack.enter_context(
            port_forward(target, timeout=max(args.timeout, PORT_FORWARD_TIMEOUT_S)))
        if token is None and target.address is None:
            token = auth_token_from_cluster(target)
        check_reachable(address, token, timeout=args.timeout)
        yield job_client(address, token)


def job_client(address: str, token: str | None):
    if token:  # before Ray is imported: it reads the auth mode once
        os.environ["RAY_AUTH_MODE"] = "token"
        os.environ["RAY_AUTH_TOKEN"] = token
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    try:
        return JobSubmissionClient(address)
    except AuthenticationError as err:
        raise SubmitError(f"authentication with the Ray cluster at {address} failed: {err}") from None
    except ConnectionError as err:
        raise SubmitError(f"cannot reach the Ray cluster at {address}: {err}") from None


def parse_connection(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse, then take RAY_ADDRESS (as `ray job` does) when it is a dashboard URL and nothing else says where."""
    args = parser.parse_args(argv)
    env_address = os.environ.get("RAY_ADDRESS", "")
    if not args.address and not args.stack and env_address.startswith(("http://", "https://")):
        args.address = env_address
    return args


def connection_flags(args: argparse.Namespace) -> list[str]:
    """The flags that reach the same cluster again (for the commands this prints)."""
    if args.address:
        return ["--address", args.address]
    if args.stack:
        return ["--stack", args.stack]
    out = []
    for name, default in (("namespace", ray_facts.DEFAULT_NAMESPACE), ("service", ray_facts.head_service()),
                          ("raycluster", ray_facts.CLUSTER_NAME)):
        if getattr(args, name) != default:
            out += [f"--{name}", getattr(args, name)]
    return out


def command_hint(command: str, run: str, connection: Sequence[str] = ()) -> str:
    """A command that works as printed: this interpreter, the run, the same connection flags."""
    return shlex.join([sys.executable, "-m", "trainer", command, run, *connection])


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("reaching the Ray cluster")
    group.add_argument("--address", help="Ray dashboard URL, e.g. http://127.0.0.1:8265 (default: RAY_ADDRESS when "
                                         "it is such a URL and --stack is not given, else a port-forward)")
    group.add_argument("--stack", help="Pulumi stack whose outputs name the namespace, service and kubeconfig")
    group.add_argument("--namespace", default=ray_facts.DEFAULT_NAMESPACE,
                       help=f"namespace of the RayCluster ({ray_facts.DEFAULT_NAMESPACE})")
    group.add_argument("--service", default=ray_facts.head_service(),
                       help=f"head service to port-forward to ({ray_facts.head_service()})")
    group.add_argument("--raycluster", default=ray_facts.CLUSTER_NAME, help="RayCluster name, for its auth Secret")
    group.add_argument("--timeout", type=float, default=CONNECT_TIMEOUT_S, metavar="SECONDS",
                       help=f"give up reaching the cluster after this long ({CONNECT_TIMEOUT_S:g})")
