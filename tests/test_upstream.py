"""The fetch step for upstream artifacts: pinned, checked, and a missing artifact is a failure naming the fix.

The chart repositories cannot be reached from this machine, so the download path runs against a
real HTTP server on localhost that serves what a Helm repository serves: index.yaml (with each
archive's digest) and the archives themselves, copied from the offline source.
"""
from __future__ import annotations

import dataclasses
import hashlib
import http.server
import os
import subprocess
import sys
import threading

import pytest
import yaml

from tests import upstream
from tests.guards import nonempty

REPO = upstream.REPO


@pytest.fixture
def chart_repository(tmp_path):
    """A Helm chart repository over HTTP: index.yaml plus the archive, relative URLs as chart-releaser writes them."""
    root = tmp_path / "repo"
    root.mkdir()
    artifact = upstream.ARTIFACTS["nvidia-device-plugin-0.20.0.tgz"]
    data = upstream.path(artifact.name).read_bytes()
    (root / artifact.name).write_bytes(data)
    index = {"apiVersion": "v1", "entries": {artifact.chart: [
        {"name": artifact.chart, "version": "0.19.0", "urls": ["old.tgz"], "digest": "0" * 64},
        {"name": artifact.chart, "version": artifact.version, "urls": [artifact.name],
         "digest": hashlib.sha256(data).hexdigest()}]}}
    (root / "index.yaml").write_text(yaml.safe_dump(index))

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield dataclasses.replace(artifact, repository=f"http://127.0.0.1:{server.server_address[1]}/"), root
    server.shutdown()
    server.server_close()


def test_a_chart_is_downloaded_through_its_repository_index_and_checked(chart_repository, tmp_path):
    artifact, _ = chart_repository
    into = tmp_path / "cache"
    into.mkdir()
    path, origin = upstream.fetch_artifact(artifact, into, offline_source=None)
    assert origin == f"{artifact.repository}{artifact.name}"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == artifact.sha256


def test_a_replaced_archive_is_refused(chart_repository, tmp_path):
    artifact, root = chart_repository
    tampered = bytearray((root / artifact.name).read_bytes())
    tampered[-1] ^= 0xFF
    (root / artifact.name).write_bytes(bytes(tampered))
    with pytest.raises(upstream.UpstreamError, match="sha256 .* expected 9e5642bc"):
        upstream.fetch_artifact(artifact, tmp_path, offline_source=None)


def test_a_version_missing_from_the_index_is_named(chart_repository, tmp_path):
    artifact, _ = chart_repository
    with pytest.raises(upstream.UpstreamError, match="lists no nvidia-device-plugin 9.9.9"):
        upstream.fetch_artifact(dataclasses.replace(artifact, version="9.9.9"), tmp_path, offline_source=None)


def test_the_offline_copies_match_their_pins():
    for artifact in nonempty(upstream.ARTIFACTS.values(), "pinned upstream artefacts"):
        data = upstream.path(artifact.name).read_bytes()
        if artifact.sha256:
            assert hashlib.sha256(data).hexdigest() == artifact.sha256, artifact.name
        if artifact.chart:
            upstream._check_chart(artifact, data)


def test_the_pinned_charts_are_the_versions_the_stacks_deploy():
    """The archives are the project's defaults, except the EFA chart: v0.5.32 is in no public archive."""
    from deploy.config import KEYS

    defaults = {k: KEYS[k].default for k in ("kuberayVersion", "nvidiaDevicePluginVersion", "clusterAutoscalerVersion")}
    versions = {a.chart: a.version for a in upstream.ARTIFACTS.values() if a.chart}
    assert versions["kuberay-operator"] == defaults["kuberayVersion"]
    assert versions["nvidia-device-plugin"] == defaults["nvidiaDevicePluginVersion"]
    assert versions["cluster-autoscaler"] == defaults["clusterAutoscalerVersion"]
    assert (versions["aws-efa-k8s-device-plugin"], KEYS["efaDevicePluginVersion"].default) == ("v0.5.30", "v0.5.32")


def test_a_missing_artifact_fails_with_the_fetch_command(tmp_path):
    """Run where neither the cache nor ../shared has anything: the test fails, it is not skipped."""
    probe = tmp_path / "test_probe.py"
    probe.write_text("from tests import upstream\n\ndef test_needs_helm():\n    upstream.helm()\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(probe)],
                          cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, upstream.CACHE_ENV: str(tmp_path / "empty")})
    assert proc.returncode == 1, proc.stdout
    assert "1 failed" in proc.stdout and "skipped" not in proc.stdout
    assert "run `python -m tests.upstream fetch` first" in proc.stdout


def test_the_fetched_helm_is_the_pinned_release():
    out = subprocess.run([str(upstream.helm()), "version", "--short"], capture_output=True, text=True, timeout=60)
    assert out.stdout.startswith(upstream.HELM_VERSION)
