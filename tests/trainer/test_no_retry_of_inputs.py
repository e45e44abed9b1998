"""Issue 29, item 1: an attempt is retried only when a machine failed; a mistake in the inputs ends the run at
once (exit 2), and what can be checked before Ray (vocabulary, seed, wandb credentials) is, in the pre-flight."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.guards import nonempty
from trainer.__main__ import main as trainer
from trainer.jobs import failures


def _group_error(**by_rank):
    from ray.train import WorkerGroupError

    return WorkerGroupError("failed", {int(rank[1:]): e for rank, e in by_rank.items()})


def _machine_failures():
    import ray.exceptions as rex
    import torch.distributed as dist

    from trainer.loop.run import InjectedFailure
    from trainer.run_folder.checkpoint import CheckpointError

    return [rex.ActorDiedError(), rex.NodeDiedError("node lost"), dist.DistNetworkError("peer gone"),
            RuntimeError("NCCL error in: ProcessGroupNCCL.cpp: unhandled system error"),
            RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection closed by peer"),
            ConnectionResetError(104, "Connection reset by peer"), OSError(5, "Input/output error"),
            InjectedFailure("--fail-at-step 3"), CheckpointError("not saved")]


def _input_failures():
    from trainer.data.formats import DataError

    return [IndexError("index out of range in self"), OverflowError("Overflow when unpacking long"),
            KeyError("messages"), ValueError("bad value"), TypeError("unsupported operand"),
            RuntimeError("CUDA error: device-side assert triggered"), FileNotFoundError(2, "No such file", "x.json"),
            type("UsageError", (Exception,), {})("api_key not configured (no-tty)"), DataError("record 3: bad")]


def test_only_machine_failures_are_retried():
    for error in nonempty(_machine_failures(), "machine failures"):
        group = _group_error(r0=error)
        assert failures.machine_failure(error), error
        assert failures.user_error(group) is None and failures.retryable(group), error


def test_a_failure_of_the_inputs_on_any_rank_is_a_user_error_naming_the_rank_and_is_not_retried():
    import ray.exceptions as rex

    from facts.errors import EXIT_USAGE, UserError

    for error in nonempty(_input_failures(), "input failures"):
        group = _group_error(r0=rex.ActorDiedError(), r3=error)  # rank 0 lost with it: still no retry
        found = failures.user_error(group)
        assert isinstance(found, UserError) and found.exit_code == EXIT_USAGE, error
        assert not failures.retryable(group), error
        text = str(found)
        if not isinstance(error, UserError):
            assert text.startswith(f"rank 3: {type(error).__name__}") and "not retried" in text, text
            assert "\n" not in text and len(text) < 700, text
        else:
            assert found is error


def test_the_worker_input_error_crosses_a_pickle_as_ray_carries_it():
    import pickle

    error = failures.WorkerInputError("rank 1: IndexError: x")
    assert str(pickle.loads(pickle.dumps(error))) == "rank 1: IndexError: x"


@pytest.fixture(autouse=True)
def no_ray(monkeypatch):
    import ray

    def refuse(*args, **kwargs):
        raise AssertionError("the bad input reached ray.init")

    monkeypatch.setattr(ray, "init", refuse)


def _train(demo_assets, tmp_path, *extra):
    return trainer(["train", "--model", str(demo_assets["model"]), "--dataset", str(demo_assets["train"]),
                    "--seq-len", "128", "--global-batch-size", "8", "--num-workers", "2",
                    "--out", str(tmp_path / "runs" / "job"), *extra])


def test_a_tokenizer_larger_than_the_models_vocabulary_is_refused_before_ray(demo_assets, tmp_path, capsys):
    from transformers import AutoTokenizer

    folder = tmp_path / "big-tokenizer"
    shutil.copytree(demo_assets["model"], folder)
    tok = AutoTokenizer.from_pretrained(folder)
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    tok.add_tokens([f"<extra_{i}>" for i in range(vocab)])
    tok.save_pretrained(folder)
    assert _train(demo_assets, tmp_path, "--tokenizer", str(folder)) == 2
    err = capsys.readouterr().err
    assert f"--tokenizer: the tokenizer has {len(tok)} tokens, more than the model's vocabulary (vocab_size = " \
           f"{vocab}" in err, err
    assert "use the model's own tokenizer" in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists()


def test_a_seed_beyond_64_bits_is_refused_with_the_range(demo_assets, tmp_path, capsys):
    assert _train(demo_assets, tmp_path, "--seed", str(2**64)) == 2
    err = capsys.readouterr().err
    assert f"--seed (seed) = {2**64}: must be from 0 to {2**64 - 1}" in err, err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("mode, needles", [
    ("online", ["--report-to wandb: no wandb credentials (WANDB_MODE online)", "WANDB_API_KEY", "wandb login",
                "WANDB_MODE=offline"]),
    ("offlien", ["--report-to wandb: WANDB_MODE='offlien' is not a wandb mode"]),
])
def test_report_to_wandb_without_credentials_is_refused_before_ray(demo_assets, tmp_path, capsys, monkeypatch,
                                                                    mode, needles):
    for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_MODE", mode)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    assert _train(demo_assets, tmp_path, "--report-to", "wandb") == 2
    err = capsys.readouterr().err
    for needle in nonempty(needles, "phrases"):
        assert needle in err, (needle, err)
    assert not (tmp_path / "runs").exists()


def test_wandb_credentials_from_the_environment_or_netrc_or_offline_mode_pass(tmp_path):
    from trainer.loop.metrics import credential_problems

    netrc = tmp_path / "netrc"
    netrc.write_text("machine api.wandb.ai login user password " + "k" * 40 + "\n")
    netrc.chmod(0o600)
    assert credential_problems(["wandb"], {"WANDB_API_KEY": "k" * 40}) == []
    assert credential_problems(["wandb"], {"NETRC": str(netrc)}) == []
    assert credential_problems(["wandb"], {"WANDB_MODE": "offline", "NETRC": str(tmp_path / "none")}) == []
    assert credential_problems(["wandb"], {"NETRC": str(tmp_path / "none")})  # the same without any: refused
    assert credential_problems(["tensorboard"], {}) == []
