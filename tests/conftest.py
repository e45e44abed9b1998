"""Fixtures every test directory uses: the real KubeRay v1.7.0 RayCluster CRD (tests.upstream) as validators."""
from __future__ import annotations

import copy

import jsonschema
import pytest
import yaml

from tests import upstream


def _load_schema() -> dict:
    crd_path = upstream.path("ray.io_rayclusters.yaml")  # KubeRay v1.7.0; `python -m tests.upstream fetch`
    crd = yaml.load(crd_path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return v1["schema"]["openAPIV3Schema"]


def no_unknown_fields(schema):
    """The schema with additionalProperties: false on every object that lists its properties.

    The API server prunes unknown fields silently (and kubectl --validate=strict refuses them);
    this turns a misspelt or misplaced field into a validation error here."""
    if isinstance(schema, list):
        return [no_unknown_fields(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: no_unknown_fields(v) for k, v in schema.items()}
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


@pytest.fixture(scope="session")
def raycluster_schema() -> jsonschema.Validator:
    """The v1 openAPIV3Schema as a validator (OpenAPI v3.0 schemas read as JSON Schema draft 7)."""
    schema = _load_schema()
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


@pytest.fixture(scope="session")
def strict_raycluster_schema(raycluster_schema) -> jsonschema.Validator:
    return jsonschema.Draft7Validator(no_unknown_fields(copy.deepcopy(raycluster_schema.schema)))




# The Ray tests in two groups, each on its own xdist worker with its own session cluster: one stream of Ray runs
# leaves a core idle between its runs' bursts, two keep both busy. Split by measured time (pytest --durations,
# -m ray -n 0): the runs that share the fault-tolerance reference run stay together (reference_runs trains it
# once per process); every other module is in the default group.
RAY_GROUP_OF_MODULE = {name: "ray-reference" for name in (
    "test_fault_tolerance", "test_user_errors_on_ray", "test_s3_storage", "test_hybrid", "test_trl_recipes")}


def pytest_itemcollected(item):
    """Every test that needs the session's Ray cluster is a `ray` test: `pytest -m "not ray and not slow"` is the
    fast tier (`slow`: the few Ray-free tests of ~8 s or more, marked where they are).

    Under pytest-xdist (pytest.ini: `--dist loadgroup`) each Ray group runs on one worker in file order: one
    session cluster per group, each module's shared runs reused, while the other tests fill the gaps, a module to a
    worker (its module-scoped fixtures built once, not once per worker). Marked as each item is collected, before
    any collection_modifyitems hook (xdist's reads the groups in its own)."""
    module = item.module.__name__
    if "ray_cluster" in getattr(item, "fixturenames", ()):
        item.add_marker(pytest.mark.ray)
        item.add_marker(pytest.mark.xdist_group(RAY_GROUP_OF_MODULE.get(module.rsplit(".", 1)[-1], "ray")))
    else:
        item.add_marker(pytest.mark.xdist_group(module))
