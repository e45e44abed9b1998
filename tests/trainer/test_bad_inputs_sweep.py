"""The bad-input sweep's cases of issue 29 (tests/trainer/bad_inputs_sweep.py, ISSUE_29), run in the test suite:
each through the CLI's main in-process, as a user runs it. None may be retried, hang or end in a traceback: each
exits 2 with one `error:` line, and leaves every file of its folder as it was (nothing lost, nothing written)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainer import bad_inputs_sweep as sweep_module


@pytest.fixture(scope="module")
def sweep(demo_assets, tmp_path_factory):
    web = sweep_module.web_server()
    sweep = sweep_module.Sweep(tmp_path_factory.mktemp("sweep"), Path(demo_assets["model"]),
                               Path(demo_assets["train"]), {"http": web.server_address[1]})
    yield sweep
    web.shutdown()
    web.server_close()


@pytest.fixture(autouse=True)
def no_ray(monkeypatch):
    import ray

    def refuse(*args, **kwargs):
        raise AssertionError("the bad input reached ray.init")

    monkeypatch.setattr(ray, "init", refuse)


@pytest.mark.parametrize("index", range(len(sweep_module.ISSUE_29)),
                         ids=[c.name for c in sweep_module.ISSUE_29])
def test_each_input_of_the_sweep_exits_2_with_one_error_line_and_loses_nothing(sweep, index):
    case = sweep_module.ISSUE_29[index]
    got = sweep_module.run_in_process(sweep, index, case)
    err = got["stderr"]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert got["exit"] == 2, (case.name, got["exit"], err[-2000:])
    assert len(errors) == 1 and "Traceback" not in err, (case.name, err[-2000:])
    assert len(err) < 5000, (case.name, len(err))  # bounded: no value echoed whole
    assert got["after"] == got["before"], (case.name, sorted(set(got["after"]) ^ set(got["before"])))
