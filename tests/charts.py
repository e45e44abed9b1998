"""A stand-in for a KubeRay chart version this machine has no archive of, for the update diff's tests.

    python -m tests.charts DIR      # writes DIR/kuberay-operator-1.6.0.tgz; then RAYTRAIN_CHARTS=DIR

Only KubeRay 1.7.0's archive is pinned (tests/upstream.py) and nothing else can be downloaded here,
so a kuberayVersion change is planned against 1.7.0's archive with its Chart.yaml version set to the
other version and a category added to every CRD (spec.names.categories: its spec changes, as a
real version's does). The rows and tests that use it judge how a CRD change is applied, not 1.6.0's schemas.
"""
from __future__ import annotations

import io
import re
import sys
import tarfile
from pathlib import Path

from tests import upstream

BASE = "kuberay-operator-1.7.0.tgz"
STAND_IN_VERSION = "1.6.0"


def _edit(name: str, data: bytes, version: str) -> bytes:
    if name.endswith("/Chart.yaml"):
        text, count = re.subn(r"(?m)^version: 1\.7\.0$", f"version: {version}", data.decode())
        assert count == 1, "Chart.yaml of 1.7.0 names its version once"
        return text.encode()
    if "/crds/" in name:
        text, count = re.subn(r"(?m)^    - all$", f"    - all\n    - stand-in-{version}", data.decode())
        assert count == 1, f"{name} lists its categories (spec.names.categories: [all])"
        return text.encode()
    return data


def stand_in(into: Path, version: str = STAND_IN_VERSION, base: Path | None = None) -> Path:
    """DIR/kuberay-operator-<version>.tgz, derived from the pinned 1.7.0 archive."""
    source = base or upstream.path(BASE)
    out = io.BytesIO()
    with tarfile.open(source) as old, tarfile.open(fileobj=out, mode="w:gz") as new:
        for member in old.getmembers():
            if not member.isfile():
                new.addfile(member)
                continue
            data = _edit(member.name, old.extractfile(member).read(), version)
            member.size = len(data)
            new.addfile(member, io.BytesIO(data))
    into.mkdir(parents=True, exist_ok=True)
    target = into / f"kuberay-operator-{version}.tgz"
    target.write_bytes(out.getvalue())
    return target


if __name__ == "__main__":
    pinned = [p for p in (upstream.cache_dir() / BASE, upstream.SHARED / "charts" / BASE) if p.is_file()]
    if not pinned:
        sys.exit(f"{BASE} is not on this machine: run `{upstream.FETCH}` first")
    print(stand_in(Path(sys.argv[1]), base=pinned[0]))
