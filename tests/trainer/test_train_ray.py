"""End to end on real Ray clusters (CPU, gloo): the demo CLI on a cluster of its own, worker-count invariance,
failure + resume on the session's cluster, and the Hugging Face export."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from tests.guards import nonempty
from trainer import demo
from trainer.jobs import launch, local
from trainer.loop.metrics import read_metrics
from trainer.run_folder import checkpoint as ckpt

REPO = Path(__file__).resolve().parents[2]
STEPS = 10
# Small, fast and identical for every run below. The micro-batch is the trainer's default, auto: the
# tiny model needs about 4 MiB per sequence, so each worker takes its whole share (4 rows with 2 workers).
COMMON = ["--steps", str(STEPS), "--seed", "0", "--global-batch-size", "8", "--micro-batch-size", "auto",
          "--seq-len", "128", "--log-every", "1", "--checkpoint-every", "5"]


def _losses(run: Path) -> list[float]:
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    return [r["loss"] for r in rows]


def _events(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]


def _config(out: Path, workers: int):
    local.prepare_assets(out, seed=0)
    return local.demo_config(COMMON + ["--workers", str(workers)], out)


# What `ray start --head` and `ray.init()` take unless told: GCS, dashboard, client server, dashboard agent.
DEFAULT_PORTS = (6379, 8265, 10001, 52365)


@contextlib.contextmanager
def _listening(port: int):
    """A listener on every interface at `port` while the block runs; nothing when something here holds it
    already (then it is busy, which is the point)."""
    sock = socket.socket()
    try:
        sock.bind(("0.0.0.0", port))
        sock.listen()
    except OSError:
        sock.close()
        yield False
        return
    try:
        yield True
    finally:
        sock.close()


@pytest.fixture(scope="module")
def demo_run(ray_cluster, trainer_cache, tmp_path_factory):
    """`python -m trainer local` with 2 workers: the reference run of this file.

    RAY_ADDRESS and the address file `ray start` leaves (RAY_TMPDIR/ray_current_cluster) both name the
    session's running cluster, as on a machine where one runs already: the demo must keep to a cluster
    of its own, Ray Train's placement-group cleaner included (asking the other cluster, it would find no
    controller there and give up, or remove the run's group). Ray's default ports are held meanwhile, as
    a `ray start` with its defaults (or another `trainer local`) holds them: the demo's cluster takes free ones.
    """
    out = tmp_path_factory.mktemp("runs") / "two-workers"
    ray_tmp = Path(tempfile.mkdtemp(prefix="rt-", dir="/tmp"))  # short: Ray's socket paths must fit
    (ray_tmp / "ray_current_cluster").write_text(ray_cluster.address)
    env = {**ray_cluster.client_env(), "RAY_ADDRESS": ray_cluster.address, "RAY_TMPDIR": str(ray_tmp)}
    with contextlib.ExitStack() as held:
        for port in DEFAULT_PORTS:
            held.enter_context(_listening(port))
        proc = subprocess.run([sys.executable, "-m", "trainer", "local", "--workers", "2", "--max-failures", "0",
                               "--out", str(out)] + COMMON, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=600)
    shutil.rmtree(ray_tmp, ignore_errors=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return out, proc.stdout + proc.stderr  # worker logs (the progress bar) arrive on stderr


def test_local_keeps_to_its_own_cluster_when_another_one_is_named_everywhere(demo_run):
    _, output = demo_run
    assert "training on a local Ray cluster of its own" in output
    dashboard = re.search(r"training on a local Ray cluster of its own \(dashboard http://[^:]+:(\d+)\)", output)
    assert dashboard and int(dashboard.group(1)) not in DEFAULT_PORTS, output[-3000:]  # held: a free one
    assert "Failed to find a valid port" not in output and "address already in use" not in output
    assert "num_cpus and num_gpus must not be provided" not in output
    assert "Found multiple active Ray instances" not in output and "with cleaner" not in output, output[-3000:]


def test_local_demo_trains_checkpoints_exports_and_reports(demo_run):
    out, stdout = demo_run
    for needle in ("held-out exact match before training", "exact match", "metrics", str(out / "model"),
                   "train [############............]  5/10  50% | loss"):  # rank 0's progress bar
        assert needle in stdout, needle
    rows = nonempty(read_metrics(out / "metrics.jsonl"), "metrics rows")
    for key in ("step", "loss", "lr", "grad_norm", "tokens_per_s", "step_time_s", "data_wait_s", "peak_mem_gb"):
        assert all(key in r for r in rows), key
    assert rows[-1]["loss"] < rows[0]["loss"]
    assert all(r["tokens_per_s"] > 0 and r["grad_norm"] > 0 for r in rows)
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    names = ckpt.names(out)
    assert names == [ckpt.dir_name(5), ckpt.dir_name(10)]
    for name in names:
        marker = json.loads((out / name / ckpt.MARKER).read_text())
        assert marker["step"] == ckpt.step_of(name) and marker["world_size"] == 2
        assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= {p.name for p in (out / name).iterdir()}
        assert (out / name / "rng" / "rank_1.pt").is_file()
        state = json.loads((out / name / ckpt.TRAIN_STATE).read_text())
        assert state["data_position"]["rows_consumed"] == 8 * state["step"]
    events = _events(out)
    assert [e["event"] for e in events] == ["start", "checkpoint", "checkpoint", "export"]
    start = events[0]
    assert (start["micro_batch_size"], start["grad_accum_steps"]) == (4, 1)
    fit = start["micro_batch"]  # estimated on CPU, the host's memory split between its 2 ranks
    assert (fit["micro_batch_size"], fit["source"], fit["ranks_per_host"]) == (4, "estimated", 2)
    assert fit["fixed_gib"] + 4 * fit["per_row_gib"] <= fit["budget_gib"]
    assert "micro-batch: 4 sequences (auto, estimated" in stdout  # rank 0's log line


def test_one_worker_that_fails_mid_run_resumes_and_ends_with_the_two_worker_runs_losses(demo_run, tmp_path):
    """The global batch, not the worker count, fixes what a run computes: one worker takes the whole batch
    (an automatic micro-batch of 8) where the demo run's two take 4 each. Its worker group fails at step 8
    (an exception in the workers), Ray starts it again, and it resumes from the step-5 checkpoint with the
    micro-batch chosen again, so the losses of all ten steps are the two-worker run's."""
    out2, _ = demo_run
    out = tmp_path / "one-worker-interrupted"
    cfg = dataclasses.replace(_config(out, workers=1), fail_at_step=8, max_failures=1)
    launch.train(cfg)
    events = _events(out)
    assert [e["event"] for e in events][:3] == ["start", "checkpoint", "resume"], events
    assert events[2]["step"] == 5 and events[2]["checkpoint"].endswith(ckpt.dir_name(5))
    assert events[0]["micro_batch"]["source"] == "estimated"
    assert events[0]["micro_batch_size"] == events[2]["micro_batch_size"] == 8  # chosen again on the restart
    one, two = _losses(out), _losses(out2)
    pairs = list(zip(one, two, strict=True))
    assert max(abs(a - b) / abs(b) for a, b in pairs) < 1e-3, pairs
    assert len(set(one)) > 1  # the losses move: the comparison is not between constants


def test_export_loads_with_from_pretrained_and_generates(demo_run):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, _ = demo_run
    model = AutoModelForCausalLM.from_pretrained(out / "model")
    tok = AutoTokenizer.from_pretrained(out / "model")
    assert model.dtype == torch.bfloat16
    assert (out / "model" / "generation_config.json").is_file() and tok.chat_template
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # still tied
    init = AutoModelForCausalLM.from_pretrained(out / "init-model")
    moved = (model.model.layers[0].mlp.up_proj.weight.float() - init.model.layers[0].mlp.up_proj.weight).abs().max()
    assert moved > 1e-3  # the exported weights are the trained ones
    prompt = tok.apply_chat_template([{"role": "user", "content": "reverse: abc"}], tokenize=False,
                                     add_generation_prompt=True)
    enc = tok(prompt, return_tensors="pt", add_special_tokens=False)
    gen = model.generate(**enc, max_new_tokens=5, do_sample=False, pad_token_id=tok.pad_token_id)
    assert gen.shape[1] > enc["input_ids"].shape[1]
    rows = [json.loads(line) for line in (out / "data" / "heldout.jsonl").read_text().splitlines() if line.strip()][:8]
    assert 0.0 <= demo.exact_match(model, tok, rows) <= 1.0


def test_the_run_folder_records_the_run_and_the_export_carries_a_model_card(demo_run):
    from huggingface_hub import ModelCard

    out, _ = demo_run
    run = json.loads((out / "run.json").read_text())
    assert run["config"]["steps"] == STEPS and run["config"]["num_workers"] == 2
    assert {"torch", "ray", "transformers", "datasets", "python"} <= set(run["versions"])
    assert run["hardware"]["world_size"] == 2 and run["hardware"]["nodes"] == 1
    assert run["data"]["source_fingerprint"]["files"][0][0] == "train.jsonl" and run["data"]["rows"] > 0
    assert run["data"]["packed_data_key"] and run["data"]["records"] == 4000  # the demo's generated task
    card = ModelCard.load(out / "model" / "README.md")
    last = read_metrics(out / "metrics.jsonl")[-1]
    assert card.data.library_name == "transformers"
    assert f"steps: {STEPS}, tokens: " in card.text and f"final loss: {last['loss']:.4f}" in card.text
    assert "2 worker(s) on 1 node(s): cpu" in card.text
