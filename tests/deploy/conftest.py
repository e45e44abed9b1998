"""The update diff's plans read chart archives (workloads.crds): a KubeRay version this machine lacks is a stand-in."""
from __future__ import annotations

import os

import pytest

from tests import charts
from workloads import crds


@pytest.fixture(scope="session", autouse=True)
def stand_in_charts(tmp_path_factory):
    """$RAYTRAIN_CHARTS holds kuberay-operator 1.6.0 as tests/charts.py derives it from 1.7.0."""
    folder = tmp_path_factory.mktemp("charts")
    charts.stand_in(folder)
    saved = os.environ.get(crds.CHARTS_ENV)
    os.environ[crds.CHARTS_ENV] = str(folder)
    yield folder
    if saved is None:
        os.environ.pop(crds.CHARTS_ENV, None)
    else:
        os.environ[crds.CHARTS_ENV] = saved
