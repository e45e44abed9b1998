"""The CustomResourceDefinitions a chart ships in its crds/ folder, read from the chart archive.

Helm applies crds/ only when a release is first installed and never on an upgrade (helm.sh's
"Limitations on CRDs"), so a new `kuberayVersion` would run the new operator against the old
RayCluster and RayJob schemas, and the API server would prune every field the old schema lacks.
The program therefore declares these CRDs itself (workloads.stack), exactly as the archive of the
version it installs holds them, and tells Helm to skip them.

`chart_crds` is pure (archive bytes in, manifests out); `archive` finds the version's archive on
this machine or downloads it from the chart's repository, as Helm itself would, checked against
the digest the repository's index.yaml publishes.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import urllib.error
import urllib.request
from functools import cache
from pathlib import Path

import yaml

from workloads.charts import ChartRelease

CHARTS_ENV = "RAYTRAIN_CHARTS"  # a folder of <chart>-<version>.tgz archives, searched first
UPSTREAM_CACHE_ENV = "RAYTRAIN_UPSTREAM_CACHE"  # where `python -m tests.upstream fetch` puts the pinned charts
REPO = Path(__file__).resolve().parents[1]
DOWNLOADS = REPO / ".cache" / "charts"
TIMEOUT_S = 60
KIND = "CustomResourceDefinition"
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # 4 MB of KubeRay CRDs: libyaml when it is there


class ChartArchiveError(RuntimeError):
    """The chart archive of a configured version cannot be found, fetched or read."""


def archive_name(chart: ChartRelease) -> str:
    return f"{chart.chart}-{chart.version}.tgz"


def search_path() -> list[Path]:
    """Where an archive is looked for: $RAYTRAIN_CHARTS, this program's downloads, ../shared/reference/charts
    (this project's machines), the tests' pinned cache."""
    upstream = Path(os.environ.get(UPSTREAM_CACHE_ENV) or REPO / ".cache" / "upstream")
    first = [Path(os.environ[CHARTS_ENV])] if os.environ.get(CHARTS_ENV) else []
    return [*first, DOWNLOADS, REPO.parent / "shared" / "reference" / "charts", upstream]


def chart_crds(archive: bytes, chart: str) -> list[dict]:
    """Every CRD under `<chart>/crds/` of the archive, in file order, as parsed YAML."""
    found = []
    try:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            members = sorted((m for m in tar.getmembers() if m.isfile() and m.name.startswith(f"{chart}/crds/")
                              and m.name.endswith((".yaml", ".yml"))), key=lambda m: m.name)
            for member in members:
                for doc in yaml.load_all(tar.extractfile(member).read(), Loader=_LOADER):
                    if doc and doc.get("kind") == KIND:
                        found.append(doc)
    except (tarfile.TarError, yaml.YAMLError) as err:
        raise ChartArchiveError(f"chart {chart}: the archive cannot be read ({err})") from None
    return found


def _download(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            return response.read()
    except (OSError, urllib.error.URLError) as err:
        raise ChartArchiveError(f"cannot download {url}: {err}") from None


def _fetch(chart: ChartRelease, where: str) -> bytes:
    """The archive the repository's index.yaml lists for the version, checked against its digest."""
    index_url = chart.repository.rstrip("/") + "/index.yaml"
    entries = (yaml.load(_download(index_url), Loader=_LOADER).get("entries") or {}).get(chart.chart, [])
    entry = next((e for e in entries if str(e.get("version")) == chart.version), None)
    if entry is None:
        raise ChartArchiveError(f"{where}: {index_url} has no {chart.chart} {chart.version}; "
                                "set a version the repository publishes")
    url = entry["urls"][0] if "://" in entry["urls"][0] else chart.repository.rstrip("/") + "/" + entry["urls"][0]
    data = _download(url)
    digest = hashlib.sha256(data).hexdigest()
    if entry.get("digest") and digest != entry["digest"]:
        raise ChartArchiveError(f"{url}: sha256 {digest}, but {index_url} publishes {entry['digest']}")
    return data


def archive(chart: ChartRelease, *, where: str) -> bytes:
    """The chart archive of the release's version: found locally, or downloaded once into .cache/charts."""
    name = archive_name(chart)
    for folder in search_path():
        if (folder / name).is_file():
            return (folder / name).read_bytes()
    try:
        data = _fetch(chart, where)
    except ChartArchiveError as err:
        raise ChartArchiveError(
            f"{where}: the CRDs of {chart.chart} {chart.version} come from its chart archive, which is not on this "
            f"machine ({', '.join(map(str, search_path()))}) and could not be fetched: {err}. Put {name} in "
            f"${CHARTS_ENV}, or run where {chart.repository} is reachable") from None
    DOWNLOADS.mkdir(parents=True, exist_ok=True)
    (DOWNLOADS / name).write_bytes(data)
    return data


@cache
def _crds_json(name: str, version: str, repository: str, where: str) -> str:
    chart = ChartRelease(name, name, version, repository, "", "")
    return json.dumps(chart_crds(archive(chart, where=where), name))


def of_release(chart: ChartRelease, *, where: str) -> list[dict]:
    """The release's chart's CRDs, read once per version (a fresh copy each call: they become resource inputs).

    `where` names the setting that chose the version, in errors."""
    return json.loads(_crds_json(chart.chart, chart.version, chart.repository, where))


def digest(spec: dict) -> dict:
    """What an offline plan declares instead of a CRD's spec: the sha256 of its canonical JSON."""
    return {"sha256": hashlib.sha256(json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()).hexdigest()}
