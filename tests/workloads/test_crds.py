"""The KubeRay chart version's CRDs, declared by the program as their own resources (workloads.crds).

Helm applies a chart's crds/ only on first install; these tests check that the program declares
exactly what the pinned chart archive holds (parsed here from the archive's own files), that Helm is
told to skip them, that they outlive `pulumi destroy`, and that a new version is an in-place update.
"""
from __future__ import annotations

import io
import shutil
import tarfile

import pytest
import yaml

from deploy import offline, plan
from tests import charts as stand_ins
from tests import upstream
from tests.guards import nonempty
from workloads import charts, crds
from workloads.stack import RayWorkloads

from .conftest import settings, stack_file

CRD = "kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition"
RELEASE = "kubernetes:helm.sh/v3:Release"
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/ray@sha256:" + "ab" * 32


def archive_files(archive: bytes) -> dict[str, list[dict]]:
    """Each file of the archive's kuberay-operator/crds/, parsed on its own."""
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {m.name: [d for d in yaml.load_all(tar.extractfile(m).read(), Loader=LOADER) if d]
                for m in tar.getmembers() if m.isfile() and m.name.startswith("kuberay-operator/crds/")}


@pytest.fixture(scope="module")
def chart_files() -> dict[str, list[dict]]:
    return archive_files(upstream.path("kuberay-operator-1.7.0.tgz").read_bytes())


@pytest.fixture(scope="module")
def full_run():
    """RayWorkloads alone under the mocks, with the CRDs' full specs (what `pulumi up` applies)."""
    def program():
        RayWorkloads("ray", settings("dev"), image=IMAGE, kubeconfig="{}",
                     irsa_role_arn="arn:aws:iam::1:role/r", checkpoint_uri="s3://b/p", cluster_dependencies=[])
        return {}
    result = offline.run(stack_file("dev"), stack="dev", program=program)
    return result, {r["name"]: r for r in plan.records(result)}


def test_the_program_declares_the_chart_archives_crds_as_they_are(chart_files, full_run):
    _, records = full_run
    declared = {r["inputs"]["metadata"]["name"]: r["inputs"] for r in records.values() if r["type"] == CRD}
    upstream_crds = {d["metadata"]["name"]: d for docs in chart_files.values() for d in docs}
    assert sorted(declared) == sorted(nonempty(upstream_crds, "CRDs in the chart's crds/")) == [
        "rayclusters.ray.io", "raycronjobs.ray.io", "rayjobs.ray.io", "rayservices.ray.io"]
    for name in nonempty(upstream_crds, "CRDs in the chart's crds/"):
        assert declared[name] == upstream_crds[name], name


def test_the_reference_raycluster_and_rayjob_crds_are_the_charts(chart_files):
    for name in ("ray.io_rayclusters.yaml", "ray.io_rayjobs.yaml"):
        (reference,) = [d for d in yaml.load_all(upstream.path(name).read_text(), Loader=LOADER) if d]
        assert chart_files[f"kuberay-operator/crds/{name}"] == [reference], name


def test_helm_skips_them_and_the_operator_waits_for_them(full_run):
    result, records = full_run
    release = records["ray-kuberay-operator"]
    assert release["inputs"]["skipCrds"] is True
    crd_urns = nonempty(result.urns(lambda r: r.type == CRD), "declared CRDs")
    assert set(crd_urns) <= result.registrations[release["urn"]].dependencies
    others = [r for r in records.values() if r["type"] == RELEASE and r["name"] != "ray-kuberay-operator"]
    assert all("skipCrds" not in r["inputs"] for r in nonempty(others, "device plugin releases"))


def test_they_are_retained_on_destroy_through_an_adopting_provider(full_run):
    """Deleting a CRD deletes every RayCluster and RayJob: `pulumi destroy` leaves them in the cluster.
    A stack Helm installed already has them: their provider upserts and takes Helm's fields."""
    result, records = full_run
    for r in nonempty([r for r in records.values() if r["type"] == CRD], "declared CRDs"):
        assert r["options"]["retainOnDelete"] is True and r["options"]["protect"] is False, r["name"]
        provider = result.registrations[r["urn"]].provider
        assert provider.split("::")[-1].startswith("ray-crd-k8s")
    (crd_provider,) = [r for r in result.resources if r.type == "pulumi:providers:kubernetes" and r.name == "ray-crd-k8s"]
    assert offline.plain(crd_provider.inputs).get("upsertExistingObjects") in (True, "true")
    assert offline.plain(crd_provider.inputs).get("enablePatchForce") in (True, "true")
    (main,) = [r for r in result.resources if r.type == "pulumi:providers:kubernetes" and r.name == "ray-k8s"]
    assert "upsertExistingObjects" not in main.inputs  # every other object keeps AlreadyExists


def test_an_offline_plan_declares_each_spec_by_its_digest(full_run, chart_files):
    """The update diff needs only whether a spec changed; the digest is of the spec `pulumi up` applies."""
    _, records = full_run
    spec = records["ray-crd-rayclusters.ray.io"]["inputs"]["spec"]
    assert crds.digest(spec) == crds.digest(chart_files["kuberay-operator/crds/ray.io_rayclusters.yaml"][0]["spec"])
    assert set(crds.digest(spec)) == {"sha256"} and len(crds.digest(spec)["sha256"]) == 64


def release_of(version: str) -> charts.ChartRelease:
    return charts.kuberay_operator(settings("dev", kuberayVersion=version))


def test_without_shared_the_archive_comes_from_the_tests_pinned_cache(tmp_path, monkeypatch):
    """A fork has no ../shared: `python -m tests.upstream fetch` leaves the archive in the upstream cache."""
    cache = tmp_path / "upstream"
    cache.mkdir()
    shutil.copy(upstream.path("kuberay-operator-1.7.0.tgz"), cache)
    monkeypatch.setattr(crds, "REPO", tmp_path / "fork")
    monkeypatch.setattr(crds, "DOWNLOADS", tmp_path / "fork" / ".cache" / "charts")
    monkeypatch.delenv(crds.CHARTS_ENV, raising=False)
    monkeypatch.setenv(crds.UPSTREAM_CACHE_ENV, str(cache))
    assert crds.archive(release_of("1.7.0"), where="kuberayVersion") == upstream.path(
        "kuberay-operator-1.7.0.tgz").read_bytes()


def test_a_version_whose_archive_cannot_be_had_names_the_setting_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.setattr(crds, "REPO", tmp_path / "fork")
    monkeypatch.setattr(crds, "DOWNLOADS", tmp_path / "fork" / ".cache" / "charts")
    monkeypatch.setenv(crds.CHARTS_ENV, str(tmp_path / "none"))
    monkeypatch.setenv(crds.UPSTREAM_CACHE_ENV, str(tmp_path / "none"))

    def offline_download(url):
        raise crds.ChartArchiveError(f"cannot download {url}: no network")
    monkeypatch.setattr(crds, "_download", offline_download)
    with pytest.raises(crds.ChartArchiveError) as err:
        crds.archive(release_of("1.6.3"), where="raytrain-eks:kuberayVersion 1.6.3")
    message = str(err.value)
    assert message.startswith("raytrain-eks:kuberayVersion 1.6.3: the CRDs of kuberay-operator 1.6.3")
    assert "kuberay-operator-1.6.3.tgz" in message and crds.CHARTS_ENV in message and "index.yaml" in message


def test_a_download_is_checked_against_the_repositorys_digest(tmp_path, monkeypatch):
    good = upstream.path("kuberay-operator-1.7.0.tgz").read_bytes()
    index = yaml.safe_dump({"entries": {"kuberay-operator": [
        {"version": "1.6.3", "urls": ["kuberay-operator-1.6.3.tgz"], "digest": "0" * 64}]}}).encode()
    monkeypatch.setattr(crds, "_download", lambda url: index if url.endswith("index.yaml") else good)
    monkeypatch.setattr(crds, "DOWNLOADS", tmp_path / "downloads")
    monkeypatch.setenv(crds.CHARTS_ENV, str(tmp_path / "none"))
    monkeypatch.setattr(crds, "REPO", tmp_path / "fork")
    monkeypatch.setenv(crds.UPSTREAM_CACHE_ENV, str(tmp_path / "none"))
    with pytest.raises(crds.ChartArchiveError, match="publishes 0000"):
        crds.archive(release_of("1.6.3"), where="kuberayVersion")
    assert not (tmp_path / "downloads").exists()


def test_an_archive_that_is_not_one_is_an_error():
    with pytest.raises(crds.ChartArchiveError, match="chart kuberay-operator: the archive cannot be read"):
        crds.chart_crds(b"not a tar archive", "kuberay-operator")


def test_the_stand_in_version_differs_from_1_7_0_only_where_it_says(tmp_path, chart_files):
    made = archive_files(stand_ins.stand_in(tmp_path).read_bytes())
    assert sorted(made) == sorted(chart_files)
    for name in nonempty(chart_files, "CRD files of the chart"):
        assert made[name] != chart_files[name]
        assert made[name][0]["metadata"] == chart_files[name][0]["metadata"]


