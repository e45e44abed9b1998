"""The memory plan (trainer.model.footprint, trainer.jobs.plan): bytes per rank against FSDP2's real shards,
the reference shapes against a written-out arithmetic, the "Done when" numbers, and the pre-flight refusal."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from tests.guards import nonempty
from tests.trainer import architectures
from trainer.jobs import plan
from trainer.loop.parallel import plan_sharding
from trainer.model import footprint as fp

GIB = 2 ** 30


def _tiny(kind: str):
    from transformers import LlamaConfig, Qwen2Config

    if kind == "qwen2-tied":  # tied embedding and head: one group with the final norm
        return Qwen2Config(vocab_size=130, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    return LlamaConfig(vocab_size=131, hidden_size=48, intermediate_size=80, num_hidden_layers=3,  # odd rows
                       num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=False)


def _real_shards(config, rank: int, world: int) -> dict[str, int]:
    """Bytes rank `rank` of `world` allocates for parameters, gradients and AdamW states after one real step.

    torch's fake process group runs every collective as a no-op, so one process builds the very
    DTensors FSDP2 gives that rank: the shapes are real, the values are not looked at.
    """
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from transformers import AutoModelForCausalLM

    from trainer.model.sharding import mixed_precision, shard_model

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        shard_model(model, mixed_precision(False))
        model.to_empty(device="cpu")
        with torch.no_grad():
            for p in model.parameters():
                p.to_local().normal_(0, 0.02)
        ids = torch.randint(0, config.vocab_size, (1, 16))
        model(input_ids=ids, labels=ids).loss.backward()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        opt.step()

        def nbytes(tensors) -> int:
            """The storages behind the tensors, each once: FSDP2 pads every rank's piece to rank 0's, and a
            group's reduce-scatter output holds its gradients side by side."""
            storages = {}
            for t in tensors:
                local = t.to_local() if hasattr(t, "to_local") else t
                storages[local.untyped_storage().data_ptr()] = local.untyped_storage().nbytes()
            return sum(storages.values())

        states = [v for s in opt.state.values() for k, v in s.items() if k != "step"]
        return {"params": nbytes(model.parameters()), "grads": nbytes(p.grad for p in model.parameters()),
                "optimizer": nbytes(nonempty(states, "AdamW states")),
                "local_params": sum(p.to_local().numel() for p in model.parameters())}
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("kind", ["qwen2-tied", "llama-untied"])
def test_plan_bytes_per_rank_are_the_real_fsdp2_shards_of_a_tiny_model(kind):
    config = _tiny(kind)
    census = fp.census(config)
    world = 3
    planned = fp.footprint(census, "full", world, seq_len=16)
    real = _real_shards(config, 0, world)
    assert (planned.params_bytes, planned.grads_bytes, planned.optimizer_bytes) == (
        real["params"], real["grads"], real["optimizer"])
    # rank 0 holds the largest piece: the last rank holds less of the rows that do not divide by 3
    assert _meta_shards(config, world, rank=world - 1) < real["local_params"] == _meta_shards(config, world)
    assert planned.trainable == census.total == sum(p.numel() for p in _meta(config).parameters())


def _meta(config):
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def test_lora_adapters_counted_by_the_plan_are_peft_s_own():
    peft = pytest.importorskip("peft")
    config = _tiny("llama-untied")
    model = peft.get_peft_model(_meta(config), peft.LoraConfig(r=4, target_modules="all-linear"))
    peft_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert fp.footprint(fp.census(config), "lora", 1, seq_len=16, lora_rank=4).trainable == peft_trainable


def _arithmetic(name: str) -> dict[str, int]:
    """The reference shapes written out: embeddings, per layer q/k/v/o (+ Qwen's q/k/v biases), gated MLP,
    two norms, the final norm, an untied lm_head; LoRA rank 16 on the seven linears of each layer."""
    d, ff, layers, heads, kv_heads, vocab = {
        "llama-3.1-8b": (4096, 14336, 32, 32, 8, 128256), "qwen2.5-14b": (5120, 13824, 48, 40, 8, 152064),
        "qwen2.5-32b": (5120, 27648, 64, 40, 8, 152064), "llama-3.1-70b": (8192, 28672, 80, 64, 8, 128256)}[name]
    kv = kv_heads * d // heads
    bias = d + 2 * kv if name.startswith("qwen") else 0
    linear = d * d + 2 * d * kv + d * d + 3 * d * ff
    per_layer = linear + bias + 2 * d
    r = 16
    adapters = layers * r * ((d + d) + 2 * (d + kv) + (d + d) + 3 * (d + ff))
    return {"params": 2 * vocab * d + layers * per_layer + d, "linear": layers * linear, "adapters": adapters}


@pytest.mark.parametrize("name", list(plan.SHAPES))
def test_the_reference_shapes_match_the_written_out_arithmetic(name):
    a = _arithmetic(name)
    census = fp.census(plan.shape_config(name))
    assert census.total == a["params"]
    assert sum(p.numel for p in census.linears()) == a["linear"]
    n = 8  # every dimension of these shapes divides by 8: each rank holds an eighth
    full = fp.footprint(census, "full", n, seq_len=2048)
    assert (full.params_bytes, full.grads_bytes, full.optimizer_bytes) == (4 * a["params"] / n, 4 * a["params"] / n,
                                                                            8 * a["params"] / n)
    lora = fp.footprint(census, "lora", n, seq_len=2048)
    assert lora.trainable == a["adapters"]
    assert lora.params_bytes == 2 * a["params"] / n + 4 * a["adapters"] / n
    assert (lora.grads_bytes, lora.optimizer_bytes) == (4 * a["adapters"] / n, 8 * a["adapters"] / n)
    qlora = fp.footprint(census, "qlora", n, seq_len=2048)
    # 4-bit codes, an int8 scale per 64, a bf16 factor per 256 scales; per linear a bf16 mean and 16 bf16 codes
    nf4 = a["linear"] / n * (1 / 2 + 1 / 64 + 2 / (64 * 256)) + len(census.linears()) * (2 + 32)
    assert qlora.params_bytes == pytest.approx(nf4 + 2 * (a["params"] - a["linear"]) / n + 4 * a["adapters"] / n,
                                               rel=1e-12)
    ckpt = fp.footprint(census, "full", n, seq_len=2048, activation_checkpointing=True)
    assert ckpt.activations_bytes < full.activations_bytes and ckpt.states_bytes == full.states_bytes


@pytest.fixture(scope="module")
def model_70b(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama-70b-config")
    plan.shape_config("llama-3.1-70b").save_pretrained(folder)
    return folder


def test_done_when_on_the_reference_cluster(model_70b, capsys):
    from trainer.__main__ import main as trainer

    assert trainer(["plan", "--model", str(model_70b), "--instance-type", "g6.12xlarge", "--nodes", "2",
                    "--seq-len", "2048", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    by = {e["method"]: e for e in nonempty(out["methods"], "methods")}
    assert set(by) == {"full", "lora", "qlora"} and out["gpus"] == 8
    assert by["qlora"]["fits"] and by["qlora"]["gib_per_gpu"] <= 20
    assert not by["full"]["fits"] and by["full"]["gib_per_gpu"] > 100
    assert not by["lora"]["fits"]  # 70B's bf16 base is 16.5 GiB per L4 before activations
    for e in by.values():
        assert e["tokens_per_s"] > 0 and e["usd_per_million_tokens"] > 0 and e["budget_gib"] == pytest.approx(
            22888 / 1024 * 0.9, abs=0.01)
    target = plan.Target("g6.12xlarge", 2)
    lora32 = {e["method"]: e for e in plan.make_plan(plan.shape_config("qwen2.5-32b"), target)["methods"]}
    assert lora32["lora"]["fits"] and not lora32["full"]["fits"]
    full8 = plan.make_plan(plan.shape_config("llama-3.1-8b"), target, methods=("full",))["methods"][0]
    assert full8["fits"] and full8["sharding"] == "full" and full8["activation_checkpointing"]
    assert full8["gib_per_gpu_without_checkpointing"] > full8["budget_gib"]
    # a node's 4 GPUs cannot hold the 8B full fine-tune: auto keeps full sharding, and says why
    assert "hybrid sharding would not fit" in full8["sharding_reason"]
    # the table form
    assert trainer(["plan", "--model-shape", "llama-3.1-70b", "--instance-type", "g6.12xlarge", "--nodes", "2"]) == 0
    text = capsys.readouterr().out
    assert "| qlora | yes |" in text and "| full | **no** | 143." in text


def test_auto_takes_hybrid_only_when_a_node_holds_the_run():
    hosts = ["a"] * 4 + ["b"] * 4
    assert plan_sharding("auto", 8, hosts, instance_type="g6.12xlarge", micro_batches=4, params=10 ** 9).kind == "hybrid"
    chosen = plan_sharding("auto", 8, hosts, instance_type="g6.12xlarge", micro_batches=4, params=10 ** 9,
                           node_fits="30.00 GiB per GPU over one node's 4 GPUs, 20.12 GiB usable")
    assert chosen.kind == "full" and "hybrid sharding would not fit: 30.00 GiB" in chosen.reason
    # asked for explicitly, hybrid stays hybrid
    assert plan_sharding("hybrid", 8, hosts, node_fits="too big").kind == "hybrid"


def test_a_gpu_run_that_cannot_fit_is_refused_before_ray_with_the_bytes(model_70b, demo_assets, tmp_path, capsys):
    from trainer.__main__ import main as trainer

    argv = ["train", "--model", str(model_70b), "--tokenizer", str(demo_assets["model"]), "--random-init",
            "--dataset", str(demo_assets["train"]), "--seq-len", "2048", "--global-batch-size", "8",
            "--device", "gpu", "--num-workers", "8", "--instance-type", "g6.12xlarge",
            "--storage-path", str(tmp_path / "runs")]
    assert trainer(argv) == 2
    err = capsys.readouterr().err
    assert "a full fine-tune needs 143.34 GiB per GPU on 8 x NVIDIA L4" in err
    assert "above the 20.12 GiB usable" in err and "what fits there: --method qlora" in err
    assert not (tmp_path / "runs").exists()


def test_a_fixed_micro_batch_without_checkpointing_is_told_to_turn_it_on():
    from trainer.config.flags import TrainConfig

    cfg = TrainConfig(model="m", dataset="d", device="gpu", num_workers=8, instance_type="g6.12xlarge",
                      micro_batch_size=1, global_batch_size=8)
    why, made = plan.run_refusal(cfg, plan.shape_config("llama-3.1-8b"))
    assert made["methods"][0]["gib_per_gpu"] > made["methods"][0]["budget_gib"]
    assert "with --activation-checkpointing" in why and "19.83 GiB" in why
    assert plan.run_refusal(TrainConfig(model="m", dataset="d"), plan.shape_config("llama-3.1-8b")) == (None, None)



def test_run_json_gets_the_pre_flight_plan_of_the_run_s_own_method_and_sharding():
    """A GPU run of a known instance type: the entry the refusal judged (on 8 x L4 the 8B full fine-tune needs
    activation checkpointing and full sharding), the activations of the checkpointing it assumed."""
    from trainer.config.flags import TrainConfig

    for method, sharding, ckpt in (("full", "full", True), ("qlora", "hybrid", False)):
        cfg = TrainConfig(model="m", dataset="d", device="gpu", num_workers=8, instance_type="g6.12xlarge",
                          global_batch_size=64, method=method)
        config = plan.shape_config("llama-3.1-8b")
        why, made = plan.run_refusal(cfg, config)
        entry = next(e for e in made["methods"] if e["method"] == method)
        got = plan.run_prediction(cfg, config, made)
        assert why is None and (got["sharding"], got["activation_checkpointing"]) == (sharding, ckpt)
        assert {k: got[k] for k in ("params_gib", "grads_gib", "optimizer_gib", "gib_per_gpu", "fits")} == \
            {k: entry[k] for k in ("params_gib", "grads_gib", "optimizer_gib", "gib_per_gpu", "fits")}
        assert got["activations_gib"] == entry["activations_checkpointed_gib" if ckpt else "activations_gib"]
        assert got["gib_per_gpu"] == pytest.approx(got["params_gib"] + got["grads_gib"] + got["optimizer_gib"]
                                                   + got["activations_gib"] + got["buffers_gib"], abs=0.02)


@pytest.mark.parametrize("argv, message", [
    (["--model-shape", "llama-3.1-8b", "--instance-type", "g9.huge", "--nodes", "2"], "not in the instance catalog"),
    (["--model-shape", "llama-3.1-8b", "--instance-type", "g6.12xlarge", "--nodes", "0"], "--nodes 0: must be at least 1"),
    (["--model-shape", "llama-3.1-8b", "--instance-type", "g6.12xlarge"], "--instance-type and --nodes are both"),
    (["--model-shape", "llama-3.1-8b", "--stack", "dev", "--nodes", "2"], "give one of them"),
    (["--model-shape", "llama-3.1-8b", "--instance-type", "g6.12xlarge", "--nodes", "1", "--seq-len", "999999"],
     "exceeds the model's max_position_embeddings 131072"),
    (["--model", "/nonexistent/model", "--instance-type", "g6.12xlarge", "--nodes", "1"], "--model: model"),
])
def test_bad_plan_inputs_are_user_errors(argv, message, capsys):
    from trainer.__main__ import main as trainer

    assert trainer(["plan", *argv]) == 2
    assert message in capsys.readouterr().err


def test_the_workers_weigh_a_node_s_memory_before_hybrid_sharding():
    from trainer.config.flags import TrainConfig
    from trainer.loop.parallel import node_memory_problem

    cfg = TrainConfig(model="m", dataset="d", device="gpu", num_workers=8, instance_type="g6.12xlarge",
                      global_batch_size=8)
    hosts = ["a"] * 4 + ["b"] * 4
    why = node_memory_problem(cfg, plan.shape_config("llama-3.1-8b"), 8, hosts)
    # 16 B x 8.03B / 4 GPUs is 29.9 GiB of states alone, before activations and buffers
    assert float(why.split()[0]) > 29.9 and "over one node's 4 GPUs, 20.12 GiB usable" in why
    assert node_memory_problem(cfg, _tiny("qwen2-tied"), 8, hosts) is None
    assert node_memory_problem(cfg, plan.shape_config("llama-3.1-8b"), 8, ["a"] * 8) is None  # one node: no hybrid
    lora = dataclasses.replace(cfg, method="lora")  # a bf16 base and its adapters fit one node's 4 L4s
    assert node_memory_problem(lora, plan.shape_config("llama-3.1-8b"), 8, hosts) is None


DOC_TARGETS = [(name, t, n) for t, n in (("g6.12xlarge", 2), ("p5.48xlarge", 1)) for name in plan.SHAPES]


@pytest.mark.parametrize(("name", "instance_type", "nodes"), DOC_TARGETS)
def test_the_tables_of_docs_larger_models_are_the_plan_s_output(name, instance_type, nodes):
    from tests.test_readme import generated_table

    marker = (f"<!-- plan table: python -m trainer plan --model-shape {name} --instance-type {instance_type} "
              f"--nodes {nodes} -->\n")
    shown = generated_table("larger-models.md", marker)
    assert shown == plan.markdown(plan.make_plan(plan.shape_config(name), plan.Target(instance_type, nodes))), \
        f"run `{marker[5:-5]}` and paste its table under the marker"


def test_plan_on_a_stack_reads_its_gpu_pool_from_the_stack_outputs(tmp_path, monkeypatch, capsys):
    """`--stack`: the pool's instance type and node count from `pulumi stack output` (a stand-in pulumi on PATH)."""
    import os
    import sys

    from trainer.__main__ import main as trainer

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "pulumi"
    fake.write_text(f"#!{sys.executable}\nimport json, sys\nopen({str(tmp_path / 'calls')!r}, 'a').write("
                    f"json.dumps(sys.argv[1:]) + '\\n')\nprint(open({str(tmp_path / 'outputs.json')!r}).read())\n")
    fake.chmod(0o755)
    (tmp_path / "outputs.json").write_text(json.dumps({
        "rayNamespace": "ray", "rayHeadService": "raytrain-head-svc", "kubeconfig": '{"apiVersion": "v1"}',
        "gpuNodeType": "p5.48xlarge", "gpuNodeCount": 2}))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert trainer(["plan", "--model-shape", "llama-3.1-70b", "--stack", "dev", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["instance_type"], out["nodes"], out["gpus"]) == ("p5.48xlarge", 2, 16)
    assert json.loads((tmp_path / "calls").read_text()) == ["stack", "output", "--json", "--show-secrets", "--stack",
                                                            "dev"]
    (tmp_path / "outputs.json").write_text(json.dumps({"rayNamespace": "ray", "rayHeadService": "svc",
                                                       "kubeconfig": "{}"}))
    assert trainer(["plan", "--model-shape", "llama-3.1-70b", "--stack", "dev"]) == 2
    assert "no GPU node pool" in capsys.readouterr().err


def test_nf4_bytes_per_rank_are_torchao_s_own_sharded_by_fsdp2():
    """QLoRA's base: torchao's NF4 tensor as a frozen weight, sharded by FSDP2 (fake process group, 4 ranks)."""
    pytest.importorskip("torchao")
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import NF4Tensor, to_nf4

    def nbytes(t) -> int:
        return sum(getattr(t, name).nbytes for name in t.__tensor_flatten__()[0])

    weight = torch.randn(512, 1024, dtype=torch.bfloat16)
    assert nbytes(to_nf4(weight)) == fp.nf4_bytes(weight.numel())
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    try:
        linear = nn.Linear(1024, 512, bias=False)
        linear.weight = nn.Parameter(to_nf4(weight), requires_grad=False)
        fully_shard(linear)
        local = linear.weight.to_local()
        assert isinstance(local, NF4Tensor)
        param = fp.Param(512, 1024, 0, True, "q_proj")
        assert nbytes(local) == fp.stored_bytes(param, "qlora", 4) == fp.nf4_bytes(512 * 1024 // 4)
    finally:
        dist.destroy_process_group()


def _meta_shards(config, world: int, rank: int = 0) -> int:
    """Elements `rank` of `world` holds once FSDP2 shards the model as the trainer does (meta device: no memory)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from trainer.model.sharding import mixed_precision, shard_model

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        model = shard_model(_meta(config), mixed_precision(False))
        return sum(p.to_local().numel() for p in model.parameters())
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(("name", "tied"), architectures.CASES)
def test_every_architecture_the_trainer_trains_gets_exact_bytes_per_rank(name, tied):
    config = architectures.config(name, tied)
    census = fp.census(config)
    full = fp.footprint(census, "full", 3, seq_len=64)
    assert full.params_bytes == 4 * _meta_shards(config, 3)
    assert fp.footprint(census, "lora", 3, seq_len=64).trainable > 0  # every architecture has linears to adapt


def test_an_architecture_the_trainer_cannot_shard_gets_no_plan_but_the_reason(tmp_path, capsys):
    from transformers import T5Config

    from trainer.__main__ import main as trainer

    T5Config(vocab_size=128, d_model=32, num_layers=2, num_heads=4).save_pretrained(tmp_path / "t5")
    assert trainer(["plan", "--model", str(tmp_path / "t5"), "--instance-type", "g6.12xlarge", "--nodes", "1"]) == 2
    assert "--model: model_type 't5': transformers has no causal-LM class" in capsys.readouterr().err
