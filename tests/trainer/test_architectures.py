"""Every popular architecture, loaded and trained the way transformers does it.

Tiny random-init models from transformers' own config classes (tests/trainer/architectures.py),
saved with save_pretrained, tied and untied heads. Against transformers itself:
- the model the trainer builds (meta device, FSDP2, per-shard loading with transformers'
  key conversion) equals `from_pretrained` of the same folder, every parameter and every
  buffer, persistent or not; also on 2 gloo ranks, where each rank reads only its rows;
- the first step's loss and gradient norm equal transformers' own forward and backward on
  the same batch (softcapping, router auxiliary loss and all), for the chunked and the
  plain loss;
- an architecture the trainer cannot shard is refused by the pre-flight check;
- two of them (Gemma 2, Mixtral) end to end on the session's Ray cluster, with the export.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from torch.distributed.tensor import DTensor

from tests.guards import nonempty
from trainer.loop.parallel import ONE_PROCESS
from trainer.loop.step import IGNORE_INDEX, loss_path, train_step
from trainer.model.build import build_model, check_architecture

from .architectures import CASES, NAMES, SCALED, VOCAB, config, write_model
from .conftest import free_port

CPU = torch.device("cpu")
IDS = [f"{name}-{'tied' if tied else 'untied'}" for name, tied in CASES]


@pytest.fixture(scope="session")
def arch_model(tmp_path_factory):
    root = tmp_path_factory.mktemp("architectures")
    return lambda name, tied: write_model(name, tied, root / f"{name}-{'tied' if tied else 'untied'}")


def every_tensor(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and buffers (non-persistent ones included), gathered when sharded."""
    out = {}
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        out[name] = (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()
    return out


def reference(folder: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa")


def assert_same_tensors(got: dict, want: dict, what: str) -> None:
    assert sorted(got) == sorted(want), f"{what}: {sorted(set(got) ^ set(want))}"
    differ = [n for n in want if not (got[n].dtype == want[n].dtype and torch.equal(got[n], want[n]))]
    assert not differ, f"{what}: {len(differ)} of {len(want)} tensors differ from from_pretrained: {differ[:6]}"


@pytest.mark.parametrize("name,tied", CASES, ids=IDS)
def test_the_trainer_builds_exactly_the_model_from_pretrained_gives(process_group, arch_model, name, tied):
    folder = arch_model(name, tied)
    want = reference(folder)
    model = build_model(folder, device=CPU, use_gpu=False)
    assert_same_tensors(every_tensor(model), every_tensor(want), f"{name} tied={tied}")
    non_persistent = [n for n, _ in want.named_buffers() if n not in want.state_dict()]
    assert non_persistent  # rotary frequencies (and Gemma's embedding scale): compared above, in no checkpoint
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    assert (head.weight is embed.weight) == tied
    assert isinstance(head.weight, DTensor)


def one_batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows of one document each, 6 prompt tokens unlabelled; labels as transformers takes them (unshifted)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (2, 24), generator=g)
    labels = ids.clone()
    labels[:, :6] = IGNORE_INDEX
    return ids, labels


@pytest.mark.parametrize("name,tied", CASES + [(n, True) for n in SCALED],
                         ids=IDS + [f"{n}-tied" for n in SCALED])
def test_the_first_step_loss_and_gradient_norm_are_transformers_own(process_group, arch_model, name, tied):
    folder = arch_model(name, tied)
    ids, hf_labels = one_batch()
    ref = reference(folder)
    out = ref(input_ids=ids, labels=hf_labels)
    out.loss.backward()
    ref_loss = float(out.loss.detach())
    ref_norm = float(torch.nn.utils.clip_grad_norm_(ref.parameters(), float("inf")))
    assert ref_norm > 0

    model = build_model(folder, device=CPU, use_gpu=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # the weights stay put: both losses see the same model
    labels = torch.roll(hf_labels, -1, 1)
    labels[:, -1] = IGNORE_INDEX
    batch = {"input_ids": ids, "labels": labels, "position_ids": torch.arange(24).expand(2, 24).clone()}
    for impl in ("chunked", "plain"):
        step = train_step(model, opt, None, [batch], device=CPU, collectives=ONE_PROCESS, grad_clip=0.0, loss=impl)
        assert float(step.loss) == pytest.approx(ref_loss, rel=1e-5), impl
        assert float(step.grad_norm) == pytest.approx(ref_norm, rel=1e-4), impl
        assert loss_path(model, impl) == impl  # the chunked loss reproduced the model's own
        aux = getattr(out, "aux_loss", None)
        if getattr(config(name, tied), "output_router_logits", False):
            coef = config(name, tied).router_aux_loss_coef
            assert float(aux.detach()) > 0 and float(step.aux_loss) == pytest.approx(coef * float(aux.detach()), rel=1e-5)
        else:
            assert aux is None and step.aux_loss is None


def test_the_loss_check_leaves_every_parameter_sharded(process_group, arch_model):
    """It runs before the optimizer is built: FSDP2 must have put the sharded parameters back."""
    from trainer.loop.step import check_loss_path

    model = build_model(arch_model("gemma2", True), device=CPU, use_gpu=False)
    assert check_loss_path(model, "chunked", CPU, collectives=ONE_PROCESS) == "chunked"
    assert all(isinstance(p, DTensor) for p in nonempty(model.parameters(), "parameters"))


def test_every_architecture_passes_the_shardability_check():
    for name in nonempty(NAMES, "architectures"):
        parts = check_architecture(config(name, False))
        assert len(parts.layers) == 2 and parts.norm is not None, name
    assert isinstance(check_architecture(config("gpt_neox", False)).norm, torch.nn.LayerNorm)  # final_layer_norm


# ---------------------------------------------------------------- 2 gloo ranks: each reads its own rows

SHARDED = [("mixtral", False), ("qwen2_moe", False), ("gpt_neox", False), ("gemma3", True)]


def _shard_worker(rank: int, world: int, port: int, folders: list[str], out_dir: str) -> None:
    import torch.distributed as dist

    from trainer.model import weights

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    reads: list[tuple[str, int]] = []
    real_read = weights.Checkpoint.read

    def recording_read(self, key, rows=None):  # the real read, counted
        tensor = real_read(self, key, rows)
        reads.append((f"{Path(self.folder).name}/{key}", tensor.numel()))
        return tensor

    weights.Checkpoint.read = recording_read
    try:
        result = {}
        for folder in folders:
            result[Path(folder).name] = every_tensor(build_model(folder, device=CPU, use_gpu=False))
        everyone = [None] * world
        dist.all_gather_object(everyone, reads)
        if rank == 0:
            torch.save({"tensors": result, "reads": everyone}, os.path.join(out_dir, "sharded.pt"))
    finally:
        weights.Checkpoint.read = real_read
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_ranks_each_read_only_their_rows_and_build_the_from_pretrained_model(arch_model, tmp_path):
    from safetensors import safe_open

    folders = [arch_model(name, tied) for name, tied in SHARDED]
    mp.start_processes(_shard_worker, args=(2, free_port(), [str(f) for f in folders], str(tmp_path)),
                       nprocs=2, join=True, start_method="spawn")
    res = torch.load(tmp_path / "sharded.pt")
    for folder in folders:
        assert_same_tensors(res["tensors"][folder.name], every_tensor(reference(folder)), folder.name)
    checkpoint = {}
    for folder in folders:
        with safe_open(str(folder / "model.safetensors"), "pt") as f:
            checkpoint.update({f"{folder.name}/{k}": f.get_slice(k).get_shape() for k in f.keys()})
    per_rank = [dict() for _ in res["reads"]]
    for rank, reads in enumerate(res["reads"]):
        for key, numel in reads:
            per_rank[rank][key] = per_rank[rank].get(key, 0) + numel
    for key, shape in nonempty(checkpoint.items(), "checkpoint tensors"):
        total = int(torch.tensor(shape).prod()) if shape else 1
        got = [r.get(key, 0) for r in per_rank]
        assert sum(got) == total, (key, got, total)  # every element read once, by one rank, nowhere twice
    experts = [k for k in checkpoint if ".experts." in k and "shared" not in k]
    assert experts and all(sum(k in r for r in per_rank) == 1 for k in experts)  # an expert is read by one rank
    mixtral = [k for k in experts if k.startswith("mixtral")]
    assert {k.split(".experts.")[1].split(".")[0] for k in mixtral if k in per_rank[1]} == {"2"}  # 3 experts: 2 + 1


# ---------------------------------------------------------------- refused before Ray starts

def test_an_architecture_the_trainer_cannot_shard_is_refused_before_ray_starts(tmp_path, demo_assets, capsys):
    from transformers import OpenAIGPTConfig, T5Config

    from trainer.__main__ import main as trainer
    from trainer.config.flags import ConfigError, TrainConfig
    from trainer.jobs.launch import preflight

    gpt = tmp_path / "openai-gpt"
    OpenAIGPTConfig(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4).save_pretrained(gpt)
    t5 = tmp_path / "t5"
    T5Config(vocab_size=VOCAB, d_model=32, num_layers=2, num_heads=4).save_pretrained(t5)
    base = TrainConfig(model=str(gpt), dataset=str(demo_assets["train"]), seq_len=128, global_batch_size=4,
                       num_workers=1)
    with pytest.raises(ConfigError) as err:
        preflight(base)
    msg = str(err.value)
    assert "--model: OpenAIGPTLMHeadModel (openai-gpt) cannot be sharded by the trainer" in msg
    assert "decoder layers" in msg and "_no_split_modules" in msg
    with pytest.raises(ConfigError, match=r"model_type 't5': transformers has no causal-LM class"):
        preflight(dataclasses.replace(base, model=str(t5)))
    # `python -m trainer train` stops at the pre-flight check: before ray.init, exit status 2
    assert trainer(["train", "--model", str(gpt), "--dataset", str(demo_assets["train"]), "--seq-len", "128",
                    "--global-batch-size", "4", "--num-workers", "1", "--storage-path", str(tmp_path / "runs")]) == 2
    assert "cannot be sharded" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
    assert preflight(dataclasses.replace(base, model=str(demo_assets["model"])))["decoder_layers"] == 2


# ---------------------------------------------------------------- end to end through the training loop

# One architecture unlike the demo's Qwen2 (MoE, untied, per-expert keys in the export) through the loop
# each Ray worker runs, on a one-rank gloo group in this process: its checkpoint and export are the
# architecture's own. That the loop runs the same under Ray Train is the demo's and the fault-tolerance
# runs' to show (tests/trainer/test_train_ray.py, test_fault_tolerance.py); two-rank sharded loading
# of every architecture is checked above.
LOOP_CASES = [("mixtral", False)]


@pytest.fixture(scope="module")
def loop_runs(trainer_cache, arch_model, demo_assets, tmp_path_factory):
    import torch.distributed as dist

    from trainer.config.flags import TrainConfig
    from trainer.loop.parallel import setup_parallel
    from trainer.loop.run import run
    from trainer.storage import Storage

    from .conftest import free_port

    root = tmp_path_factory.mktemp("arch-runs")
    runs = {}
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        for name, tied in LOOP_CASES:
            cfg = TrainConfig(model=str(arch_model(name, tied)), dataset=str(demo_assets["train"]), seq_len=128,
                              global_batch_size=4, micro_batch_size=2, steps=4, lr=1e-2, log_every=1, num_workers=1,
                              device="cpu", storage_path=str(root), run_name=name, cache_dir=str(trainer_cache),
                              progress=False)
            run(cfg, setup_parallel(cfg, 0, 1, 0), Storage.from_uri(cfg.run_uri))
            runs[name] = root / name
    finally:
        dist.destroy_process_group()
    return runs


@pytest.mark.parametrize("name,tied", LOOP_CASES, ids=[n for n, _ in LOOP_CASES])
def test_trains_checkpoints_and_exports_through_the_training_loop(loop_runs, arch_model, name, tied):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from trainer.loop.metrics import read_metrics
    from trainer.run_folder import checkpoint as ckpt

    from .reference_runs import checkpoint_state

    run = loop_runs[name]
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(r["grad_norm"] > 0 for r in rows) and rows[-1]["loss"] < rows[0]["loss"], rows
    exported = AutoModelForCausalLM.from_pretrained(run / "model")
    trained = checkpoint_state(run / ckpt.dir_name(4))["model"]
    state = exported.state_dict()
    for key, value in trained.items():
        if tied and key == "lm_head.weight":
            continue
        torch.testing.assert_close(state[key], value.to(torch.bfloat16), rtol=0, atol=0, msg=key)
    init = reference(arch_model(name, tied)).state_dict()
    assert max(float((state[k].float() - init[k]).abs().max()) for k in trained) > 1e-3  # trained, not copied
    with safe_open(str(run / "model" / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    with safe_open(str(arch_model(name, tied) / "model.safetensors"), "pt") as f:
        assert keys == set(f.keys())  # the layout save_pretrained writes (per-expert keys for Mixtral)
    assert json.loads((run / "model" / "config.json").read_text())["model_type"] == name
