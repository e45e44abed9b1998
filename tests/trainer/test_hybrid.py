"""Hybrid sharding: the plan (nodes from hostnames, the communication estimate that picks the
default), the host memory ranks on one node share for the automatic micro-batch, and a 2-D
(replicate, shard) mesh training on 4 Ray workers with the same losses."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from trainer.loop import parallel
from trainer.loop.parallel import ONE_PROCESS, plan_sharding

from .conftest import free_port

QWEN_PARAMS = 1_543_714_304


def test_one_node_is_full_sharding_whatever_auto_would_weigh():
    plan = plan_sharding("auto", 4, ["a"] * 4, instance_type="g6.12xlarge")
    assert (plan.kind, plan.mesh_shape, plan.mesh_dim_names, plan.nodes) == ("full", (4,), ("fsdp",), 1)


def test_two_g6_nodes_default_to_hybrid_from_the_estimate():
    plan = plan_sharding("auto", 8, ["a"] * 4 + ["b"] * 4, instance_type="g6.12xlarge", micro_batches=4,
                         params=QWEN_PARAMS)
    assert (plan.kind, plan.mesh_shape, plan.mesh_dim_names) == ("hybrid", (2, 4), ("replicate", "shard"))
    assert plan.nodes == 2 and plan.ranks_per_node == 4
    assert "40 Gbps" in plan.reason and "using hybrid" in plan.reason


def test_fast_network_and_one_micro_batch_keep_full_sharding():
    # p5: NVLink inside, 3200 Gbps EFA between nodes: one micro-batch per step favours full sharding
    plan = plan_sharding("auto", 16, ["a"] * 8 + ["b"] * 8, instance_type="p5.48xlarge", micro_batches=1,
                         params=QWEN_PARAMS)
    assert plan.kind == "full" and plan.mesh_shape == (16,)
    assert plan_sharding("auto", 16, ["a"] * 8 + ["b"] * 8, instance_type="p5.48xlarge", micro_batches=8,
                         params=QWEN_PARAMS).kind == "hybrid"


def test_explicit_choices_and_bad_topologies():
    assert plan_sharding("full", 8, ["a"] * 4 + ["b"] * 4).mesh_shape == (8,)
    assert plan_sharding("hybrid", 8, ["a"] * 4 + ["b"] * 4).mesh_shape == (2, 4)
    assert plan_sharding("hybrid", 4, ["a"] * 4, shard_size=2).mesh_shape == (2, 2)
    assert plan_sharding("hybrid", 4, ["a"] * 4).kind == "full"  # one replica is full sharding
    assert plan_sharding("auto", 8, ["a"] * 4 + ["b"] * 4).kind == "hybrid"  # unknown instance type
    with pytest.raises(ValueError, match="same number of workers on every node"):
        plan_sharding("hybrid", 5, ["a"] * 3 + ["b"] * 2)
    with pytest.raises(ValueError, match="shard size 3 does not divide the 4 workers"):
        plan_sharding("hybrid", 4, ["a"] * 4, shard_size=3)
    with pytest.raises(ValueError, match="sharding 'zero3'"):
        plan_sharding("zero3", 4, ["a"] * 4)


def test_full_sharding_over_two_g6_nodes_moves_0_9_model_sizes_per_collective():
    net = parallel.instance_network("g6.12xlarge")
    assert (net["network_gbps"], net["gpudirect_rdma"], net["gpus_per_node"]) == (40, False, 4)
    est = parallel.comm_estimate(QWEN_PARAMS, nodes=2, gpus_per_node=4, network_gbps=40,
                              intra_node_gbytes_per_s=net["intra_node_gbytes_per_s"], micro_batches=1)
    full, hybrid = est["full"], est["hybrid"]
    # bf16 all-gather twice, fp32 reduce-scatter once: 8 bytes per parameter per micro-batch, 7/8 of it over the wire
    assert full["bytes_over_network"] == pytest.approx(8 * QWEN_PARAMS * 7 / 8)
    assert full["seconds"] == pytest.approx(8 * QWEN_PARAMS * 7 / 8 / 5e9)
    # hybrid: only the fp32 gradient all-reduce crosses nodes, 2 (n-1)/n of it
    assert hybrid["bytes_over_network"] == pytest.approx(4 * QWEN_PARAMS)
    assert hybrid["seconds"] < full["seconds"]
    text = parallel.format_estimate(est, nodes=2, gpus_per_node=4, instance_type="g6.12xlarge", network_gbps=40,
                                 chosen="hybrid")
    assert "g6.12xlarge" in text and "full sharding 2.16 s" in text and "hybrid 1.61 s" in text


def test_an_unknown_instance_type_is_named_with_the_known_ones():
    with pytest.raises(ValueError, match="instance type 'g9.huge': unknown; use one of g6.12xlarge"):
        parallel.instance_network("g9.huge")


# ---------------------------------------------------------------- ranks sharing a host

def test_ranks_sharing_a_host_split_its_memory_for_the_automatic_micro_batch(monkeypatch):
    from transformers import AutoModelForCausalLM

    from trainer import demo
    from trainer.loop import memory

    model = AutoModelForCausalLM.from_config(demo.model_config())
    opt = torch.optim.AdamW(model.parameters())
    cpu = torch.device("cpu")

    def choose(host_bytes: float, ranks: int) -> dict:
        monkeypatch.setattr(memory, "available_host_bytes", lambda: host_bytes)
        return memory.choose_micro_batch(model, opt, rows=8, seq_len=128, device=cpu, collectives=ONE_PROCESS,
                                         ranks_per_host=ranks)

    plenty = choose(2.0**40, 1)
    per_row, fixed = plenty["per_row_gib"] * 2**30, plenty["fixed_gib"] * 2**30
    assert plenty["micro_batch_size"] == 8 and per_row > 0 and fixed > 0  # AdamW states not created yet
    host = (fixed + 8 * per_row) * 1.001 / 0.9  # just enough for 8 sequences on one rank
    alone, shared = choose(host, 1), choose(host, 2)
    assert alone["micro_batch_size"] == 8 and alone["ranks_per_host"] == 1
    assert shared["budget_gib"] == pytest.approx(alone["budget_gib"] / 2)
    expected = max(d for d in (1, 2, 4) if fixed + d * per_row <= host * 0.9 / 2)
    assert shared["micro_batch_size"] == expected < 8, (shared, expected)
    assert choose(host, 4)["micro_batch_size"] <= expected
    with pytest.raises(ValueError, match="ranks_per_host = 0"):
        choose(host, 0)


# ---------------------------------------------------------------- 4 Ray workers, 2-D mesh

STEPS = 4
ARGS = ["--steps", str(STEPS), "--seed", "0", "--global-batch-size", "16", "--micro-batch-size", "2",
        "--seq-len", "128", "--log-every", "1", "--checkpoint-every", "0"]


def _reference_losses(cfg) -> list[float]:
    """The same run on one process (world size 1): the losses any sharding must reproduce."""
    import torch.distributed as dist

    from trainer.data.packing import prepare
    from trainer.loop.optim import build_optimizer, build_scheduler
    from trainer.loop.step import train_step
    from trainer.model.build import build_model
    from trainer.model.sources import load_tokenizer

    # The address goes in init_method, not MASTER_PORT: a port left in os.environ is inherited by later
    # subprocesses, long after it was freed and reused.
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        cpu = torch.device("cpu")
        data = prepare(cfg.dataset, "train", load_tokenizer(cfg.model), cfg.seq_len, cfg.resolved_cache_dir)
        torch.manual_seed(cfg.seed)
        model = build_model(cfg.model, device=cpu, use_gpu=False, seed=cfg.seed)
        opt = build_optimizer(model, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=False)
        sched = build_scheduler(opt, warmup=cfg.warmup_steps, total=STEPS, schedule=cfg.schedule,
                                min_ratio=cfg.min_lr_ratio)
        losses = []
        for step in range(STEPS):
            mbs = data.micro_batches(step, rank=0, world_size=1, global_batch=cfg.global_batch_size,
                                     micro_batch=cfg.micro_batch_size, seed=cfg.seed)
            losses.append(float(train_step(model, opt, sched, mbs, device=cpu, collectives=ONE_PROCESS,
                                             grad_clip=cfg.grad_clip).loss))
        return losses
    finally:
        dist.destroy_process_group()


def test_hybrid_2x2_mesh_on_4_ray_workers_trains_like_one_process(ray_cluster, trainer_cache, tmp_path):
    import torch.distributed.checkpoint as dcp

    from trainer.jobs import launch, local
    from trainer.loop.metrics import read_metrics
    from trainer.run_folder import checkpoint as ckpt

    out = tmp_path / "hybrid"
    local.prepare_assets(out, seed=0)
    cfg = dataclasses.replace(local.demo_config(ARGS + ["--workers", "4"], out), sharding="hybrid", shard_size=2, export=False,
                              max_failures=0, progress=False)
    assert cfg.grad_accum_steps == 2  # 2 micro-batches per rank: the all-reduce is deferred to the second
    result = launch.train(cfg)
    assert result.error is None
    rows = read_metrics(out / "metrics.jsonl")
    hybrid = [r["loss"] for r in rows]
    reference = _reference_losses(cfg)
    assert len(hybrid) == STEPS and len(set(hybrid)) > 1
    pairs = list(zip(hybrid, reference, strict=True))
    assert max(abs(a - b) / b for a, b in pairs) < 1e-3, pairs
    # the checkpoint holds each weight in 2 shards (shard dim), not 4: the model was sharded 2-way, replicated 2-way
    meta = dcp.FileSystemReader(str(out / ckpt.dir_name(STEPS))).read_metadata().state_dict_metadata
    key = next(k for k in meta if k.startswith("model.") and k.endswith("layers.0.mlp.up_proj.weight"))
    assert len(meta[key].chunks) == 2, meta[key].chunks


def test_the_two_sequence_probe_runs_only_when_it_is_safe_on_every_rank():
    from trainer.loop.memory import measure_row_memory

    calls = []

    def probe(n: int) -> float:  # peak memory of a forward/backward of n sequences: 3 GB + 4 GB each
        calls.append(n)
        return 3e9 + n * 4e9

    assert measure_row_memory(probe, budget=40e9, states=1e9) == (3e9, 4e9) and calls == [1, 2]
    calls.clear()  # two sequences would need 14 GB + states: not probed, the whole 7 GB counts per sequence
    assert measure_row_memory(probe, budget=12e9, states=1e9) == (0.0, 7e9) and calls == [1]
    calls.clear()  # roomy here, but another rank is tight: every rank skips the second pass together
    assert measure_row_memory(probe, budget=40e9, states=1e9, agree=lambda ok: False) == (0.0, 7e9)
    assert calls == [1]


def test_running_out_of_gpu_memory_in_the_probe_turns_checkpointing_on_then_is_a_user_error(monkeypatch):
    """The probe's out-of-memory is what `fits: false` means: checkpointing on and probe again; still out of
    memory, a MemoryFitError (a UserError: Ray's driver raises it at once, no retry) with the numbers."""
    from transformers import AutoModelForCausalLM

    from facts.errors import UserError
    from trainer import demo
    from trainer.config.flags import TrainConfig
    from trainer.loop import memory
    from trainer.loop.parallel import WorkerEnv

    model = AutoModelForCausalLM.from_config(demo.model_config())
    opt = torch.optim.AdamW(model.parameters())
    probed = []

    def peak(model, rows, seq_len, device, impl):  # one sequence: 2 GiB with checkpointing, out of memory without
        probed.append(bool(model.is_gradient_checkpointing))
        if not model.is_gradient_checkpointing or seq_len > 4096:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return rows * 2.0 * 2**30

    # The CUDA calls a GPU would answer; the probe pass itself is `peak`.
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (20 * 2**30, 24 * 2**30))
    for name in ("memory_reserved", "memory_allocated"):
        monkeypatch.setattr(torch.cuda, name, lambda device=None: 0)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(memory, "probe_peak", peak)
    env = WorkerEnv(0, 1, 0, torch.device("cuda", 0), None)
    cfg = TrainConfig(model="m", dataset="d", seq_len=2048, global_batch_size=8, num_workers=1, device="gpu")
    fit = memory.resolve_micro_batch(cfg, model, opt, env)
    assert probed[0] is False and probed[1:] and all(probed[1:])
    assert fit["fits"] and fit["activation_checkpointing"] and fit["micro_batch_size"] >= 1
    assert "one sequence needs" in fit["activation_checkpointing_reason"]
    # the start event records the plan's prediction for this rank beside the measured peaks of metrics.jsonl
    assert fit["plan"]["activation_checkpointing"] and fit["plan"]["gib_per_gpu"] > fit["plan"]["states_gib"] > 0

    model.gradient_checkpointing_disable()
    with pytest.raises(memory.MemoryFitError) as e:
        memory.resolve_micro_batch(dataclasses.replace(cfg, seq_len=8192, model="m2"), model, opt, env)
    assert isinstance(e.value, UserError) and e.value.exit_code == 2
    msg = str(e.value)
    assert "--seq-len 8192: one sequence does not fit in GPU memory even with activation checkpointing" in msg
    assert "the plan predicts" in msg and "python -m trainer plan" in msg and "lower --seq-len" in msg
