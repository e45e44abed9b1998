"""Issue 29, item 2: `--address` at a port that is not Ray's is refused within seconds, naming what answered,
instead of `ray.init` retrying without end. The check speaks gRPC's first step (HTTP/2); the server that must
pass is a real gRPC server (grpcio, Ray's own dependency), the others real sockets of other kinds."""

from __future__ import annotations

import http.server
import socket
import threading
import time

import pytest

from trainer.__main__ import main as trainer
from trainer.jobs.cluster import ClusterError, check_reachable


@pytest.fixture
def grpc_port():
    from concurrent import futures

    import grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield port
    server.stop(0)


@pytest.fixture
def http_port():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def _raw_server(behaviour):
    """A TCP server whose every connection is handled by `behaviour(conn)` in a thread of its own."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    held = []

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            held.append(conn)
            threading.Thread(target=behaviour, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return listener, held


@pytest.fixture
def raw_port(request):
    listener, held = _raw_server(request.param)
    yield listener.getsockname()[1]
    listener.close()
    for conn in held:
        conn.close()


def test_a_real_grpc_server_passes_the_check(grpc_port):
    check_reachable(f"127.0.0.1:{grpc_port}", timeout=5)  # no error: it answered as the GCS does


def test_an_http_server_is_refused_naming_what_answered(http_port):
    with pytest.raises(ClusterError) as e:
        check_reachable(f"127.0.0.1:{http_port}", timeout=5)
    text = str(e.value)
    assert text.startswith(f"--address 127.0.0.1:{http_port}: not a Ray cluster: an HTTP/1 server answers ("), text
    assert "trainer submit --address http://HOST:PORT" in text and "6379" in text


def _silent(conn):
    time.sleep(30)


def _hang_up(conn):
    conn.close()


def _redis(conn):
    conn.recv(100)
    conn.sendall(b"-ERR unknown command 'PRI'\r\n")


@pytest.mark.parametrize("raw_port, needle", [
    (_silent, "it accepts connections but says nothing within 1 s"),
    (_hang_up, "it closed the connection at the first bytes of Ray's protocol"),
    (_redis, "a Redis-like server answers (b\"-ERR unknown command 'PRI'"),
], indirect=["raw_port"], ids=["silent", "hangs up", "redis"])
def test_a_port_that_is_not_ray_is_refused_within_the_deadline(raw_port, needle):
    t0 = time.monotonic()
    with pytest.raises(ClusterError) as e:
        check_reachable(f"127.0.0.1:{raw_port}", timeout=1)
    assert time.monotonic() - t0 < 10
    assert f"--address 127.0.0.1:{raw_port}: not a Ray cluster: {needle}" in str(e.value), str(e.value)


def test_train_at_a_web_server_exits_2_before_ray_and_before_the_preflight(http_port, monkeypatch, capsys, tmp_path):
    import ray

    monkeypatch.setattr(ray, "init", lambda *a, **k: (_ for _ in ()).throw(AssertionError("reached ray.init")))
    code = trainer(["train", "--address", f"127.0.0.1:{http_port}", "--model", str(tmp_path / "m"), "--dataset",
                    str(tmp_path / "d.jsonl"), "--out", str(tmp_path / "run")])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1, errors
    assert errors[0].startswith(f"error: --address 127.0.0.1:{http_port}: not a Ray cluster: an HTTP/1"), errors
    assert not (tmp_path / "run").exists()
