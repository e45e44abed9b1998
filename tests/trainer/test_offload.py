"""--offload cpu: FSDP2's CPUOffloadPolicy on every group, the plan's bytes moved from the GPU to the worker
pod's memory (exact, on the Llama-3.1-8B shape built on the meta device), and the combinations refused.

On CPU devices the policy is meaningless (FSDP2 copies host tensors to a host "device"), so a --device cpu
run with it is refused and these tests check the sharding kwargs on FSDP2's own state and the plan as
arithmetic; the GPU path (pinned host shards, gloo beside NCCL for the gradient norm) has not run here."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.guards import nonempty
from trainer.config.flags import ConfigError, TrainConfig, validate
from trainer.jobs import plan
from trainer.model import footprint as fp

GIB = 2 ** 30
# g6.12xlarge: 192 GiB, less the node reserve max(8, ceil(10 % of 192)) = 20 and EFA's ceil(5128 x 2 MiB) = 11 GiB
G6_POD_GIB = 192 - 20 - 11


def _gpu_cfg(**kw) -> TrainConfig:
    return TrainConfig(model="m", dataset="d", device="gpu", num_workers=8, instance_type="g6.12xlarge",
                       global_batch_size=64, **kw)


def test_offload_moves_the_states_to_host_memory_and_stages_two_groups_on_the_gpu():
    c = fp.census(plan.shape_config("llama-3.1-8b"))
    on = fp.footprint(c, "full", 8, seq_len=2048)
    off = fp.footprint(c, "full", 8, seq_len=2048, offload=True)
    # the states: 16 bytes a parameter of rank 0's pieces, now pinned on the host
    assert off.host_bytes == on.states_bytes == sum(p.shard(8) for p in c.params) * 16 and on.host_bytes == 0
    # the GPU keeps the rest, plus the host-to-device copies of the two largest groups' fp32 shards: the head
    # group (lm_head 128256 x 4096 and the final norm's 4096, each in 8 row pieces)
    staged = 2 * 4 * (-(-128256 // 8) * 4096 + 4096 // 8)
    assert off.peak_bytes == on.peak_bytes - on.states_bytes + staged
    with pytest.raises(ValueError, match="qlora"):
        fp.footprint(c, "qlora", 8, seq_len=2048, offload=True)


def test_the_plan_checks_a_node_s_offloaded_states_against_the_worker_pod_memory_limit():
    config = plan.shape_config("llama-3.1-8b")
    made = plan.make_plan(config, plan.Target("g6.12xlarge", 2), offload=True)
    assert [e["method"] for e in made["methods"]] == ["full", "lora"]  # qlora's NF4 base is not offloaded
    full = made["methods"][0]
    states = fp.footprint(fp.census(config), "full", 8, seq_len=2048,
                          activation_checkpointing=full["activation_checkpointing"], offload=True).host_bytes
    assert full["host_bytes_per_node"] == int(4 * states)  # the 4 ranks of one node
    assert full["host_budget_bytes"] == int(G6_POD_GIB * GIB * 0.8) and made["worker_pod_memory_gib"] == G6_POD_GIB
    assert full["fits"] and round(full["params_gib"], 2) == 3.74  # the table's numbers, now in host memory
    # the workers' pod gets the same memory from the same function (workloads.raycluster's worker group)
    from facts.catalog import GPU_TYPES
    from workloads import raycluster

    assert raycluster.worker_resources(GPU_TYPES["g6.12xlarge"])["memory"] == f"{G6_POD_GIB}Gi"


def test_a_full_fine_tune_beyond_gpu_memory_fits_with_offload_and_one_beyond_host_memory_is_refused():
    qwen14 = plan.shape_config("qwen2.5-14b")
    assert "a full fine-tune needs" in plan.run_refusal(_gpu_cfg(), qwen14)[0]  # 34.76 GiB per L4 without
    why, made = plan.run_refusal(_gpu_cfg(offload="cpu"), qwen14)
    assert why is None and made["methods"][0]["gib_per_gpu"] < made["methods"][0]["budget_gib"]
    llama70 = plan.shape_config("llama-3.1-70b")
    why, made = plan.run_refusal(_gpu_cfg(offload="cpu"), llama70)
    ranks = made["methods"][0]
    per_rank = fp.footprint(fp.census(llama70), "full", 8, seq_len=2048, activation_checkpointing=True,
                            offload=True).host_bytes
    assert ranks["sharding"] == "full" and ranks["host_bytes_per_node"] == int(4 * per_rank)
    assert f"pins {int(4 * per_rank):,} bytes" in why and f"above the {int(G6_POD_GIB * GIB * 0.8):,} bytes" in why
    assert f"of the Ray worker pod's {G6_POD_GIB} GiB memory limit" in why and "--method lora or qlora" in why


def test_fully_shard_gets_cpu_offload_policy_on_every_group(process_group):
    """FSDP2's own state after sharding (on the meta device, as the build does before materialising)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, OffloadPolicy
    from transformers import AutoModelForCausalLM, LlamaConfig

    from trainer.model.sharding import mixed_precision, shard_model

    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)

    def groups(offload: bool) -> list:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        shard_model(model, mixed_precision(False), offload=offload)
        found = {id(g): g for m in model.modules() if isinstance(m, FSDPModule)  # norm + lm_head: one group
                 if (g := m._get_fsdp_state()._fsdp_param_group) is not None}
        return nonempty(list(found.values()), "FSDP2 groups")

    offloaded = groups(True)
    assert len(offloaded) == 2 + 2  # the decoder layers, the embedding, the norm with lm_head (the root holds none)
    for group in nonempty(offloaded, "offloaded groups"):
        assert isinstance(group.offload_policy, CPUOffloadPolicy) and group.offload_policy.pin_memory
    params = nonempty([p for group in offloaded for p in group.fsdp_params], "sharded parameters")
    assert len(params) == sum(1 for _ in AutoModelForCausalLM.from_config(config).parameters())
    assert all(p.offload_to_cpu and p.pin_memory for p in params)
    for group in nonempty(groups(False), "groups without offload"):
        assert type(group.offload_policy) is OffloadPolicy and not any(p.offload_to_cpu for p in group.fsdp_params)


def test_offload_runs_with_gloo_beside_nccl_and_a_foreach_optimizer(tmp_path):
    """The host gradients' norm is all-reduced over the mesh: gloo for host tensors (torchtune #2108)."""
    from trainer.jobs import launch

    cfg = dataclasses.replace(_gpu_cfg(offload="cpu"), storage_path=str(tmp_path))
    assert launch.build_trainer(cfg).backend_config.backend == "cpu:gloo,cuda:nccl"
    assert launch.build_trainer(dataclasses.replace(cfg, offload="none")).backend_config.backend == "nccl"


@pytest.mark.parametrize("kw, message", [
    (dict(device="gpu", method="qlora"), "--method qlora keeps its base as torchao NF4 tensors on the GPU, which "
                                         "FSDP2's CPU offload cannot move to host memory; use --method qlora without "
                                         "--offload, or --method lora (or full) with --offload cpu"),
    (dict(device="cpu"), "a --device cpu run keeps everything in host memory already (FSDP2's CPU offload is a no-op "
                         "there); drop --offload, or use --device gpu"),
])
def test_bad_offload_combinations_are_refused(kw, message):
    with pytest.raises(ConfigError) as e:
        validate(TrainConfig(model="m", dataset="d", offload="cpu", **kw))
    assert [p for p in e.value.problems if p.startswith("--offload")] == [
        next(p for p in e.value.problems if message in p)]


def test_offload_on_cpu_is_one_error_line_before_ray(capsys, tmp_path):
    from trainer.__main__ import main as trainer

    assert trainer(["train", "--model", "m", "--dataset", "d", "--device", "cpu", "--offload", "cpu",
                    "--storage-path", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "error: invalid training configuration (1 problem(s)):"
    assert err[1:] == ["  - --offload (offload) = 'cpu': moves GPU memory to host memory, and a --device cpu run keeps "
                       "everything in host memory already (FSDP2's CPU offload is a no-op there); drop --offload, or "
                       "use --device gpu"]
    assert not (tmp_path / "runs").exists()


def test_plan_offload_cpu_prints_the_host_memory(capsys):
    from trainer.__main__ import main as trainer

    assert trainer(["plan", "--model-shape", "qwen2.5-14b", "--instance-type", "g6.12xlarge", "--nodes", "2",
                    "--offload", "cpu", "--json"]) == 0
    import json

    out = json.loads(capsys.readouterr().out)
    assert out["offload"] == "cpu" and [e["method"] for e in out["methods"]] == ["full", "lora"]
    assert out["methods"][0]["fits"] and out["methods"][0]["host_fits"]
    assert trainer(["plan", "--model-shape", "qwen2.5-14b", "--instance-type", "g6.12xlarge", "--nodes", "2",
                    "--offload", "cpu"]) == 0
    table = capsys.readouterr().out
    assert "host GiB per node (usable) |" in table and f"| {out['methods'][0]['host_gib_per_node']:.2f} (128.80) |" \
        in table and "the worker pod's 161 GiB, 80% usable" in table
