"""The Ray cluster a run joins: reachable within seconds, and large enough, ever, for the run.

`ray.init` waits minutes for an address nobody answers, and Ray Train waits forever for
workers the cluster can never place (its startup timeout is retried without limit), so
both are checked here first, naming what was asked and what exists.
"""

from __future__ import annotations

import os
import socket
from typing import Mapping

from facts import ray as ray_facts
from facts.errors import UserError, first_line

CONNECT_TIMEOUT_S = 5.0


class ClusterError(UserError):
    """The cluster cannot be reached, or can never run the job as asked."""


def gcs_endpoint(address: str | None, environ: Mapping[str, str] | None = None) -> tuple[str, int] | None:
    """(host, port) that `ray.init(address)` connects to, or None when Ray finds the cluster itself."""
    env = os.environ if environ is None else environ
    value = address if address not in (None, "", "auto") else env.get("RAY_ADDRESS", "")
    if value in ("", "auto", "local"):
        return None
    if value.startswith(("http://", "https://")):
        raise ClusterError(f"--address {value}: a dashboard URL; `trainer train` joins the cluster itself "
                           f"(the head's GCS address, HOST:6379). Use `trainer submit --address {value}` to run "
                           f"a job through the dashboard")
    host_port = value.removeprefix("ray://")
    host, sep, port = host_port.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ClusterError(f"--address {value}: expected HOST:PORT (the Ray head's GCS port, 6379 by default), "
                           f"auto or local")
    return host.strip("[]"), int(port)


# HTTP/2's client preface and an empty SETTINGS frame: a gRPC server (Ray's GCS) answers with its own SETTINGS
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
H2_SETTINGS = 0x4


def check_reachable(address: str | None, timeout: float = CONNECT_TIMEOUT_S,
                    environ: Mapping[str, str] | None = None) -> None:
    """The GCS answers as gRPC (HTTP/2) does within `timeout`, or ClusterError naming the address and what answered.

    A TCP connection alone proves nothing: `ray.init` retries without end against a port where something
    else listens. So the check speaks the first step of the GCS's protocol (gRPC over HTTP/2: the client
    preface, to which a server replies with a SETTINGS frame) with a deadline. With RAY_USE_TLS the GCS speaks
    TLS first: then only the connection is checked.
    """
    env = os.environ if environ is None else environ
    endpoint = gcs_endpoint(address, env)
    if endpoint is None:
        return
    host, port = endpoint
    fix = "check the address (the Ray head's GCS port, 6379 by default), or that the cluster is up (`ray status`)"
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            if env.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
                return
            answer = _first_answer(conn, timeout)
    except OSError as e:
        raise ClusterError(f"--address {host}:{port}: nothing answers there within {timeout:.0f} s "
                           f"({first_line(e)}); {fix}") from None
    problem = not_grpc(answer, timeout)
    if problem:
        raise ClusterError(f"--address {host}:{port}: not a Ray cluster: {problem}; {fix}")


def _first_answer(conn: socket.socket, timeout: float) -> bytes | None:
    """What the server sends back to the HTTP/2 preface within `timeout` (None: silence; b"": it hung up)."""
    conn.settimeout(timeout)
    try:
        conn.sendall(H2_PREFACE)
        return conn.recv(256)
    except socket.timeout:
        return None
    except ConnectionError:
        return b""


def not_grpc(answer: bytes | None, timeout: float) -> str | None:
    """Why `answer` is not an HTTP/2 server's (a gRPC server's) reply to the preface, naming what answered; None if it is."""
    if answer is None:
        return f"it accepts connections but says nothing within {timeout:.0f} s where Ray's GCS answers at once"
    if not answer:
        return "it closed the connection at the first bytes of Ray's protocol (gRPC)"
    if len(answer) >= 9 and answer[3] == H2_SETTINGS:
        return None
    if answer.startswith(b"HTTP/") or answer.lstrip()[:1] == b"<":
        line = answer.split(b"\n", 1)[0].strip().decode("latin-1")[:60]
        return (f"an HTTP/1 server answers ({line!r}); a dashboard or other web server, not the GCS (for the "
                f"dashboard, use `trainer submit --address http://HOST:PORT`)")
    if answer.startswith((b"-ERR", b"+", b"-NOAUTH")):
        return f"a Redis-like server answers ({answer[:40]!r})"
    if answer[:1] == b"\x15" or answer[:1] == b"\x16":
        return "a TLS server answers (if this is a Ray cluster with TLS, set RAY_USE_TLS=1 and its certificates)"
    return f"something that does not speak gRPC answers (first bytes {answer[:24]!r})"


def ceilings(current: Mapping[str, float], autoscaler_max: Mapping[str, float] | None) -> tuple[dict, str]:
    """The most of each resource the cluster can ever have, and where that comes from.

    An autoscaling cluster (KubeRay's autoscaler keeps its node groups' maxima in the GCS)
    can grow to its configured maximum; any other cluster has what it has now.
    """
    if autoscaler_max:
        return {k: max(float(v), float(current.get(k, 0))) for k, v in {**current, **autoscaler_max}.items()}, \
            "at most, with the autoscaler's node groups at their maximum"
    return dict(current), "and cannot grow (no autoscaler)"


def capacity_problem(need: Mapping[str, float], current: Mapping[str, float],
                     autoscaler_max: Mapping[str, float] | None, *, num_workers: int) -> str | None:
    """Why the run can never be placed, naming the ask and what exists; None when it can be."""
    limit, how = ceilings(current, autoscaler_max)
    short = {k: v for k, v in need.items() if v > limit.get(k, 0)}
    if not short:
        return None
    name, asked = next(iter(short.items()))
    have = int(limit.get(name, 0))
    per_worker = asked / max(1, num_workers)
    fits = int(have // per_worker) if per_worker else 0
    fix = (f"use --num-workers {fits} or fewer" if fits else
           ("there is no GPU in this cluster; use --device cpu, or a cluster with GPU nodes" if name == "GPU"
            else f"the cluster has no {name}"))
    later = "" if autoscaler_max else " (nodes still starting count once they have joined: `ray status`)"
    return (f"--num-workers {num_workers} asks for {asked:g} {name} ({per_worker:g} per worker); the Ray cluster has "
            f"{have} {name} {how}; {fix}, or add nodes to the cluster{later}")


def pool_resources(nodes: list[dict], pool: str) -> dict[str, float] | None:
    """What the live nodes of node pool `pool` (their Ray label facts.ray.POOL_LABEL) have; None when there are none."""
    found = [n for n in nodes if n.get("Alive") and (n.get("Labels") or {}).get(ray_facts.POOL_LABEL) == pool]
    if not found:
        return None
    total: dict[str, float] = {}
    for node in found:
        for name, amount in (node.get("Resources") or {}).items():
            total[name] = total.get(name, 0.0) + float(amount)
    return total


def check_capacity(num_workers: int, use_gpu: bool, pool: str | None = None) -> None:
    """Collective-free check against the connected cluster (ray.init first); with `pool`, against its nodes.

    A cluster that cannot grow and has no node of the pool would leave the workers waiting forever.
    An autoscaling one may start the pool's nodes (its maxima carry no labels): its maximum counts.
    """
    import ray
    from ray.train import ScalingConfig

    need = ScalingConfig(num_workers=num_workers, use_gpu=use_gpu).total_resources
    try:
        from ray._private.state import state

        autoscaler_max = state.get_max_resources_from_cluster_config()
    except Exception:  # noqa: BLE001 - a private API: without it, the current size is the ceiling
        autoscaler_max = None
    current = ray.cluster_resources()
    if pool and not autoscaler_max:
        current = pool_resources(ray.nodes(), pool)
        if current is None:
            raise ClusterError(f"--pool {pool}: no node of this Ray cluster is in that pool (Ray label "
                               f"{ray_facts.POOL_LABEL}={pool}) and it cannot grow (no autoscaler); name a pool its "
                               f"nodes are in, or drop --pool. On a stack, worker pods started before their group "
                               f"carried the label lack it until recreated "
                               f"(`kubectl -n <ray namespace> delete pods -l ray.io/node-type=worker`)")
    problem = capacity_problem(need, current, autoscaler_max, num_workers=num_workers)
    if problem:
        raise ClusterError(problem if not pool or autoscaler_max else problem.replace(
            "the Ray cluster has", f"pool {pool} of the Ray cluster has", 1))


def shared_storage_problem(alive_nodes: int, can_grow: bool, storage: str) -> str | None:
    """Why a run folder on one node's disk cannot serve this cluster: other nodes (now or once the autoscaler
    adds them) would write checkpoints the others never see; None on a single node that stays one."""
    if alive_nodes <= 1 and not can_grow:
        return None
    why = f"it has {alive_nodes} nodes" if alive_nodes > 1 else "its autoscaler can add nodes"
    return (f"no --storage-path was given and the run folder would be {storage} on the head's disk, but {why}, "
            f"which cannot all reach that folder; pass --storage-path s3://BUCKET/PREFIX (storage every node "
            f"reaches), or submit with --stack NAME to use the stack's bucket")


def check_single_node(storage: str) -> None:
    """shared_storage_problem for the connected cluster (ray.init first); ClusterError when there is one."""
    import ray

    try:
        from ray._private.state import state

        can_grow = bool(state.get_max_resources_from_cluster_config())
    except Exception:  # noqa: BLE001 - a private API: without it, the nodes alive now decide
        can_grow = False
    problem = shared_storage_problem(sum(1 for n in ray.nodes() if n.get("Alive")), can_grow, storage)
    if problem:
        raise ClusterError(problem)
