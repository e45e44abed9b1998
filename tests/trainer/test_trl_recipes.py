"""A TRL user's YAML means here what it means in TRL 1.16: its defaults, its keys, real public recipes.

The recipes in tests/trainer/data/trl_recipes/ are the exact bytes of public SFT recipes (TRL's
example config, alignment-handbook and open-r1 recipes), each pinned in SOURCES.json by its
repository, commit, raw URL and sha256, so these tests run offline and on a fork. Each recipe
parses; every key is either applied (the resulting TrainConfig is compared with the values of
trl.SFTConfig built from the same keys) or accepted because its value does nothing here (recorded
in the config's sources), or refused with the reason named below.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from pathlib import Path

import pytest
import yaml

from tests.guards import nonempty
from trainer.config import trl as trl_keys
from trainer.config.flags import ConfigError
from trainer.config.load import merge, parse

RECIPES = Path(__file__).parent / "data" / "trl_recipes"
SOURCES = json.loads((RECIPES / "SOURCES.json").read_text())
UNPACKED = "packing: false is not supported"
# recipe -> {refused key: the reason's words}; every other key of the recipe is applied or accepted
REFUSED = {
    "trl-example_config.yaml": {},
    "handbook-zephyr-7b-beta-sft-full.yaml": {},
    "handbook-zephyr-7b-gemma-sft-full.yaml": {
        "dataset_kwargs": "datasets and models are prepared by this trainer"},
    "handbook-smollm2-sft.yaml": {},
    "handbook-smollm3-sft.yaml": {
        "trust_remote_code": "no trust_remote_code", "gradient_checkpointing_kwargs": "set use_reentrant: false",
        "packing_strategy": "use packing_strategy: bfd"},
    "handbook-constitutional-ai-sft-anthropic.yaml": {},
    "handbook-starchat2-15b-sft.yaml": {},
    "open-r1-olympiccoder-7b-sft.yaml": {"packing": UNPACKED},
    "open-r1-openr1-distill-7b-sft.yaml": {"packing": UNPACKED},
}
# keys `trl sft` reads that are not SFTConfig's (ScriptArguments / ModelConfig / the recipe script's own)
NOT_SFT_CONFIG = {"model_name_or_path", "model_revision", "torch_dtype", "attn_implementation", "dataset_name",
                  "dataset_config", "dataset_train_split", "dataset_test_split", "dataset_mixture", "chat_template",
                  "trust_remote_code", "max_seq_length"}
TRL_DEFAULTS = {"lr": 2e-5, "epochs": 3, "steps": None, "schedule": "linear", "seq_len": 1024,
                "micro_batch_size": 8, "adam_beta2": 0.999, "seed": 42, "train_on": "completion_only",
                "activation_checkpointing": True, "report_to": "none", "checkpoint_every": 500, "log_every": 10}


def recipe(name: str) -> dict:
    return yaml.safe_load((RECIPES / name).read_bytes())


def test_every_pinned_recipe_is_the_upstream_file_byte_for_byte():
    assert set(SOURCES) == set(REFUSED) == {p.name for p in RECIPES.glob("*.yaml")}
    for name, source in nonempty(SOURCES.items(), "pinned recipes"):
        assert hashlib.sha256((RECIPES / name).read_bytes()).hexdigest() == source["sha256"], name
        assert source["url"] == (f"https://raw.githubusercontent.com/{source['repository']}/{source['commit']}/"
                                 f"{source['path']}")


def test_the_vendored_defaults_are_the_installed_trls_and_are_read_from_it():
    trl = pytest.importorskip("trl")
    found, origin = trl_keys.sft_defaults()
    assert origin == f"trl {trl.__version__}"
    assert found == trl_keys.SFT_DEFAULTS  # the fallback table, used where TRL is not installed, is TRL's
    assert trl.SFTConfig.__dataclass_fields__["completion_only_loss"].default is None


def test_a_trl_yaml_takes_trls_defaults_and_this_trainers_own_yaml_and_flags_keep_its_defaults(tmp_path):
    trl_yaml = {"model_name_or_path": "m", "dataset_name": "d.jsonl"}
    cfg = merge(trl_yaml, {"num_workers": 2})
    assert {k: getattr(cfg, k) for k in TRL_DEFAULTS} == TRL_DEFAULTS
    assert cfg.global_batch_size == 8 * 1 * 2  # per_device_train_batch_size x accumulation x workers
    assert cfg.sources["defaults"].startswith("trl (trl ")
    assert cfg.sources["settings"]["lr"].endswith("default: learning_rate")
    assert cfg.sources["settings"]["model"] == "YAML: model_name_or_path"
    assert "per_device_train_batch_size x gradient_accumulation_steps" in cfg.sources["settings"]["global_batch_size"]
    ours = merge({"model": "m", "dataset": "d.jsonl"}, {"num_workers": 2})
    assert (ours.lr, ours.epochs, ours.schedule, ours.seq_len, ours.global_batch_size, ours.adam_beta2,
            ours.train_on) == (1e-5, None, "cosine", 2048, 64, 0.95, "completion")
    assert ours.sources["defaults"] == "trainer" and "lr" not in ours.sources["settings"]
    assert parse(["--model", "m", "--dataset", "d.jsonl"]).lr == 1e-5
    # the choice made explicit, either way
    assert merge({**trl_yaml, "defaults": "trainer"}, {}).lr == 1e-5
    assert merge({"model": "m", "dataset": "d.jsonl", "defaults": "trl"}, {}).lr == 2e-5
    with pytest.raises(ConfigError, match="key 'defaults' = 'hf': must be one of trl, trainer"):
        merge({**trl_yaml, "defaults": "hf"}, {})
    # a flag's --steps replaces TRL's default of 3 epochs (transformers: max_steps wins), and is recorded
    short = merge(trl_yaml, {"steps": 5})
    assert (short.steps, short.epochs, short.sources["settings"]["steps"]) == (5, None, "flag")


@pytest.mark.parametrize("text, train_on", [
    ("", "completion_only"),                                  # TRL: messages train every token, completions only
    ("assistant_only_loss: true\n", "completion"),
    ("completion_only_loss: false\n", "all"),
    ("completion_only_loss: true\n", "completion_only"),
])
def test_the_loss_mask_follows_trls_two_switches(text, train_on):
    assert merge({"model_name_or_path": "m", "dataset_name": "d", **(yaml.safe_load(text) or {})}, {}).train_on \
        == train_on


def test_keys_whose_value_does_nothing_here_are_accepted_and_recorded():
    values = {"model_name_or_path": "m", "dataset_name": "d", "do_eval": False, "eval_strategy": "no",
              "per_device_eval_batch_size": 4, "log_level": "info", "dataset_num_proc": 12,
              "overwrite_output_dir": True, "gradient_checkpointing_kwargs": {"use_reentrant": False},
              "push_to_hub": False, "hub_model_id": "me/model", "bf16": True,
              "remove_unused_columns": True, "save_strategy": "no"}
    cfg = merge(values, {})
    assert set(cfg.sources["accepted"]) == set(values) - {"model_name_or_path", "dataset_name",
                                                          "per_device_eval_batch_size", "save_strategy",
                                                          "push_to_hub", "hub_model_id"}  # (these two: applied)
    assert cfg.checkpoint_every == 0 and cfg.eval_every == 0  # save_strategy: no: only the final checkpoint
    with pytest.raises(ConfigError) as e:
        merge({**values, "eval_strategy": "best", "gradient_checkpointing_kwargs": {"use_reentrant": True}}, {})
    problems = "\n".join(e.value.problems)
    assert len(e.value.problems) == 2, problems
    for needle in ("'eval_strategy' = 'best': not applicable here: evaluation runs every eval_steps steps or every "
                   "epoch: use eval_strategy: steps, epoch or no", "set use_reentrant: false"):
        assert needle in problems


def _reference(values: dict):
    """trl.SFTConfig built from the recipe's SFTConfig keys (on CPU, nothing pushed, no backend imported)."""
    trl = pytest.importorskip("trl")
    fields = {f.name for f in dataclasses.fields(trl.SFTConfig)}
    kept = {k: v for k, v in values.items() if k in fields and k not in NOT_SFT_CONFIG}
    kept.update(bf16=False, use_cpu=True, push_to_hub=False, report_to="none", output_dir=kept.get("output_dir", "o"))
    return trl.SFTConfig(**{k: v for k, v in kept.items() if k not in ("hub_model_id", "hub_strategy")})


def _check_against_trl(cfg, values: dict, workers: int) -> None:
    ref = _reference(values)
    seq_len = values.get("max_length", values.get("max_seq_length", ref.max_length))  # max_seq_length: TRL < 0.20
    expected = {"lr": ref.learning_rate, "seq_len": seq_len, "micro_batch_size": ref.per_device_train_batch_size,
                "global_batch_size": ref.per_device_train_batch_size * ref.gradient_accumulation_steps * workers,
                "grad_clip": ref.max_grad_norm, "seed": ref.seed, "adam_beta1": ref.adam_beta1,
                "adam_beta2": ref.adam_beta2, "adam_epsilon": ref.adam_epsilon, "weight_decay": ref.weight_decay,
                "log_every": ref.logging_steps, "activation_checkpointing": ref.gradient_checkpointing,
                "schedule": trl_keys.SCHEDULES[str(ref.lr_scheduler_type.value)],
                "min_lr_ratio": (ref.lr_scheduler_kwargs or {}).get("min_lr_rate", 0.0),
                "epochs": int(ref.num_train_epochs) if ref.max_steps <= 0 else None,
                "train_on": {(True, None): "completion", (False, None): "completion_only",
                             (False, False): "all"}[(ref.assistant_only_loss, ref.completion_only_loss)],
                "eos_token": ref.eos_token, "dataset_text_field": ref.dataset_text_field,
                "warmup_ratio": values.get("warmup_ratio", 0.0)}
    save, evaluation = values.get("save_strategy", "steps"), values.get("eval_strategy", "no")
    expected["checkpoint_every"] = ref.save_steps if save == "steps" else 0
    expected["checkpoint_each_epoch"] = save == "epoch"
    expected["eval_every"] = (ref.eval_steps or ref.logging_steps) if evaluation == "steps" else 0
    expected["eval_each_epoch"] = evaluation == "epoch"
    expected["eval_batch_size"] = values.get("per_device_eval_batch_size")
    if ref.save_total_limit is not None:
        expected["num_to_keep"] = ref.save_total_limit
    assert {k: getattr(cfg, k) for k in expected} == expected
    report_to = values.get("report_to", "none")
    assert cfg.report_to == (",".join(report_to) if isinstance(report_to, list) else report_to)
    assert cfg.model == values["model_name_or_path"]
    assert cfg.model_revision == values.get("model_revision")  # TRL's ModelConfig: the hub revision downloaded
    assert (cfg.push_to_hub, cfg.hub_model_id) == (values.get("push_to_hub", False), values.get("hub_model_id"))
    assert cfg.chat_template == values.get("chat_template")


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_every_key_of_a_real_recipe_is_applied_as_trl_applies_it_or_refused_with_its_reason(name):
    values = recipe(name)
    refused = REFUSED[name]
    if refused:
        with pytest.raises(ConfigError) as e:
            merge(values, {"num_workers": 2}, yaml_source=name)
        by_key = {p.split(" key ", 1)[1].split(" ", 1)[0].strip("'"): p for p in e.value.problems}
        assert set(by_key) == set(refused), e.value.problems
        for key, reason in nonempty(refused.items(), "refused keys"):
            assert reason in by_key[key], (key, by_key[key])
    kept = {k: v for k, v in values.items() if k not in refused}
    kept.setdefault("dataset_name", "local.jsonl")  # a mixture's recipe: its datasets swapped for a local one
    cfg = merge(kept, {"num_workers": 2}, yaml_source=name)
    assert cfg.sources["defaults"].startswith("trl")
    named = " ".join(cfg.sources["settings"].values())
    applied = {k for k in kept if re.search(rf"\b{k}\b", named)}
    assert not applied & set(cfg.sources["accepted"])
    assert applied | set(cfg.sources["accepted"]) == set(kept), set(kept) - applied - set(cfg.sources["accepted"])
    _check_against_trl(cfg, kept, workers=2)


HANDBOOK = Path(__file__).parent / "data" / "alignment_handbook"


def handbook_get_dataset(monkeypatch):
    """alignment-handbook's own get_dataset (src/alignment/data.py and configs.py, pinned byte for byte). Its
    configs.py also subclasses trl.ORPOConfig, which TRL 1.16 moved to trl.experimental: a stand-in base."""
    import sys
    import types

    import trl

    monkeypatch.setattr(trl, "ORPOConfig", type("ORPOConfig", (), {}), raising=False)

    sources = json.loads((HANDBOOK / "SOURCES.json").read_text())
    package = types.ModuleType("alignment_pinned")
    package.__path__ = []
    monkeypatch.setitem(sys.modules, "alignment_pinned", package)
    for name in ("configs", "data"):
        text = (HANDBOOK / f"{name}.py.txt").read_bytes()
        assert hashlib.sha256(text).hexdigest() == sources[f"{name}.py.txt"]["sha256"]
        module = types.ModuleType(f"alignment_pinned.{name}")
        module.__package__ = "alignment_pinned"
        monkeypatch.setitem(sys.modules, module.__name__, module)
        exec(compile(text, sources[f"{name}.py.txt"]["url"], "exec"), module.__dict__)
    return sys.modules["alignment_pinned.data"].get_dataset, sys.modules["alignment_pinned.configs"].ScriptArguments


def test_a_dataset_mixture_is_the_records_alignment_handbooks_get_dataset_gives(tmp_path, monkeypatch):
    """The mixture of a recipe (columns, weights, seed, test split) read as alignment-handbook reads it, its
    datasets swapped for local folders: the same records in the same order."""
    pytest.importorskip("trl")
    from trainer.data.packing import load_records

    for name, n in (("a", 10), ("b", 6)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "train.jsonl").write_text("".join(json.dumps(
            {"messages": [{"role": "user", "content": f"{name}{i}"}, {"role": "assistant", "content": "ok"}],
             "extra": i}) + "\n" for i in range(n)))
    mixture = {"datasets": [{"id": str(tmp_path / "a"), "split": "train", "columns": ["messages"], "weight": 0.5},
                            {"id": str(tmp_path / "b"), "split": "train", "columns": ["messages"], "weight": 1.0}],
               "seed": 3, "test_split_size": 0.25}
    get_dataset, script_arguments = handbook_get_dataset(monkeypatch)
    theirs = get_dataset(script_arguments(dataset_mixture=mixture))["train"].to_list()
    cfg = merge({"model_name_or_path": "m", "dataset_mixture": mixture}, {})
    assert cfg.dataset.startswith("mixture:") and cfg.sources["settings"]["dataset"] == "YAML: dataset_mixture"
    ours = load_records(cfg.dataset, cache_dir=tmp_path / "cache")
    assert ours == theirs and len(ours) == 8  # 5 + 6 records, 3 (25%) held out for evaluation
    assert cfg.resolved_run_name.startswith("m-mixture-")
    with pytest.raises(ConfigError, match=r"'dataset_mixture'.*datasets\[0\].weight: 2; expected a fraction"):
        merge({"model_name_or_path": "m", "dataset_mixture": {"datasets": [{"id": "x", "weight": 2}]}}, {})


def test_eos_token_and_an_inline_chat_template_are_applied_and_a_bad_eos_token_names_the_fix():
    """Alignment-handbook recipes give chat_template inline and eos_token by name (as TRL applies them)."""
    from trainer import demo
    from trainer.data.formats import Renderer, to_example
    from trainer.jobs.launch import read_chat_template
    from trainer.model.errors import ModelSourceError
    from trainer.model.sources import set_eos_token

    values = recipe("handbook-zephyr-7b-beta-sft-full.yaml")
    assert read_chat_template(values["chat_template"]) == values["chat_template"]  # the text, not a file name
    tok = demo.build_tokenizer()
    set_eos_token(tok, "<|endoftext|>")
    ids, _ = Renderer(tok, "completion_only").encode(to_example({"text": "ab"}, "r"))
    assert tok.decode(ids) == "ab<|endoftext|>"  # TRL appends the eos_token to text records
    with pytest.raises(ModelSourceError, match=r"--eos-token '<eos>': not a token of the tokenizer's vocabulary.*"
                                               r"pass one of its special tokens"):
        set_eos_token(tok, "<eos>")


def test_an_alignment_handbook_recipe_runs_under_trainer_local_as_trl_would_and_pushes_its_model(
        ray_cluster, trainer_cache, tmp_path, monkeypatch, capsys):
    """The Done-when of the TRL work: alignment-handbook's constitutional-AI SFT recipe, its model and its two
    datasets swapped for local tiny ones and nothing else changed, trains under `trainer local` to the
    configuration TRL gives it (eval loss each epoch, its checkpoint cadence), exports, and pushes the export
    to the Hub (HubApi: the Hub's stand-in, tests/trainer/test_publish.py)."""
    import huggingface_hub
    from huggingface_hub import constants

    from tests.trainer.test_publish import HubApi
    from trainer import demo
    from trainer.__main__ import main as trainer
    from trainer.jobs import local
    from trainer.run_folder import checkpoint as ckpt

    name = "handbook-constitutional-ai-sft-anthropic.yaml"
    values = recipe(name)
    model = demo.write_init_model(tmp_path / "tiny", seed=0)
    config = json.loads((model / "config.json").read_text())  # the recipe's 2048 tokens fit the tiny model
    (model / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 2048}))
    rows, _ = demo.make_dataset(seed=0, n_train=3000, n_eval=1)
    values["model_name_or_path"] = str(model)
    for i, entry in enumerate(values["dataset_mixture"]["datasets"]):
        demo.write_jsonl(rows[i::2], tmp_path / f"data{i}" / "train.jsonl")
        entry.update(id=str(tmp_path / f"data{i}"), split="train")
        entry.pop("config")
    assert {k for k, v in recipe(name).items() if values[k] != v} == {"model_name_or_path", "dataset_mixture"}
    (tmp_path / name).write_text(yaml.safe_dump(values))
    out = tmp_path / "run"
    argv = ["local", "--config", str(tmp_path / name), "--out", str(out), "--num-workers", "1",
            "--address", ray_cluster.address, "--cache-dir", str(trainer_cache)]

    for variable in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    assert trainer(argv) == 2  # no token: refused before Ray, nothing trained
    err = capsys.readouterr().err
    assert "no Hugging Face token to upload 'mistral-7b-sft-constitutional-ai' with; set HF_TOKEN" in err
    assert not (out / "metrics.jsonl").exists()

    monkeypatch.setenv("HF_TOKEN", "hf_test")
    monkeypatch.setattr(huggingface_hub, "HfApi", HubApi)
    assert trainer(argv) == 0
    stdout = capsys.readouterr().out
    cfg = local.demo_config(argv[1:argv.index("--out")] + ["--num-workers", "1"], out)
    _check_against_trl(cfg, values, workers=1)  # the configuration TRL would use ...
    record = json.loads((out / "run.json").read_text())
    for key in ("lr", "seq_len", "global_batch_size", "micro_batch_size", "epochs", "schedule", "warmup_ratio",
                "min_lr_ratio", "seed", "train_on", "checkpoint_every", "num_to_keep", "eval_each_epoch"):
        assert record["config"][key] == getattr(cfg, key), key  # ... is the one the run trained with
    assert (record["config"]["attn_implementation"], cfg.attn_implementation) == ("sdpa", "sdpa")
    assert "flash_attention_2 is GPU-only; sdpa on CPU" in record["config"]["sources"]["settings"][
        "attn_implementation"]
    assert record["eval"]["last"]["eval_loss"] > 0 and ckpt.names(out) == [ckpt.dir_name(record["total_steps"])]
    exported = sorted(str(p.relative_to(out / "model")) for p in (out / "model").rglob("*") if p.is_file())
    assert {"config.json", "model.safetensors", "README.md"} <= set(exported)
    assert HubApi.last.calls == [
        ("create_repo", "mistral-7b-sft-constitutional-ai", {"private": None, "exist_ok": True}),
        ("upload_folder", "me/mistral-7b-sft-constitutional-ai", {"files": exported,
                                                                  "commit_message": "End of training"})]
    assert f"pushed {out / 'model'} to the Hugging Face Hub: https://huggingface.co/me/mistral-7b-sft-constitutional-ai" \
           f"/commit/0123abcd" in stdout
