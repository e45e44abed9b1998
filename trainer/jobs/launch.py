"""Pre-flight checks and the Ray Train TorchTrainer for a configuration.

`preflight` reads the model config and the dataset before anything is started or
written, so bad inputs fail in seconds with every problem listed, and the run folder
is never created for a job that cannot train.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from facts import ray as ray_facts
from facts.errors import EXIT_FAILED, EXIT_OK, UserError, first_line
from trainer.config.flags import ConfigError, TrainConfig, flag, is_inline_template, is_remote
from trainer.config.load import absolute_storage, add_arguments, from_args
from trainer.data import sources
from trainer.data.distributed import prepare_on_ray, prepared_storage
from trainer.data.formats import Renderer
from trainer.data.packing import DataError, DataSpec, check_records, pack_dataset, prepare, tokenizer_fingerprint, too_few_rows
from trainer.data.packing import summary as data_summary
from trainer.jobs import interrupt
from trainer.jobs.cluster import ClusterError, check_capacity, check_reachable, check_single_node
from trainer.jobs.failures import failure_summary, retryable, user_error
from trainer.jobs.plan import data_refusal, run_prediction, run_refusal
from trainer.loop.behaviour import measure
from trainer.loop.metrics import credential_problems, missing_backends
from trainer.loop.run import CHAT_TEMPLATE_KEY, MEMORY_PLAN_KEY, ONE_PER_ROW_KEY, PREPARED_KEY, train_func
from trainer.model import adapters, quantize
from trainer.model.build import check_architecture, check_checkpoint
from trainer.model.errors import ModelSourceError
from trainer.model.sources import (
    check_weights,
    describe_source,
    local_model_dir,
    pinned,
    read_model_config,
    set_eos_token,
    tokenizer_only,
)
from trainer.run_folder import checkpoint as ckpt
from trainer.run_folder import lock as run_lock
from trainer.run_folder import publish, resume
from trainer.run_folder.export import EXPORT_DIR
from trainer.storage import Storage, location_problem


def read_chat_template(spec: str, storage_fs: Any = None) -> str:
    """The text of --chat-template (a local or s3:// Jinja file, or the template itself); ValueError naming what
    is wrong."""
    if is_inline_template(spec):
        return spec
    try:
        if spec.startswith("s3://"):
            parent, _, name = spec.rpartition("/")
            text = Storage.from_uri(parent, fs=storage_fs).read_text(name)
        else:
            text = Path(spec).expanduser().read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{spec}: cannot read it ({type(e).__name__}: {e}); pass a Jinja chat template file") from None
    if not text.strip():
        raise ValueError(f"{spec}: the file is empty; pass a Jinja chat template file")
    return text


def preflight_tokenizer(cfg: TrainConfig, storage_fs: Any = None):
    """The tokenizer the workers will use (only its files are fetched), --chat-template applied."""
    tok = tokenizer_only(cfg.tokenizer or cfg.model, cfg.resolved_cache_dir, storage_fs=storage_fs,
                         revision=None if cfg.tokenizer else cfg.model_revision)
    if cfg.chat_template:
        tok.chat_template = read_chat_template(cfg.chat_template, storage_fs)
    set_eos_token(tok, cfg.eos_token)
    return tok


def preflight(cfg: TrainConfig, storage_filesystem: Any = None, *, full_data: bool = True,
              for_run: bool = True, data_later: bool = False) -> dict:
    """Every check that needs no Ray cluster; raises ConfigError listing every problem.

    The model's config, architecture and every weight file's header; the tokenizer and chat
    template; the run folder's location (writable, or a bucket that answers); the dataset:
    with `full_data`, read, rendered and packed exactly as the workers will (into the same
    cache, so on this machine they reuse it), which also proves one global batch of trained
    tokens exists at this --seq-len; otherwise (`trainer submit`, the job repeats the check
    at its start) the first 100 records rendered. With `for_run` (not `trainer data`): one
    global batch must exist, the run folder must be writable, and a run folder that
    holds a run resumes only with the inputs it was started with (trainer.run_folder.resume).
    With `data_later` (a run about to start on a connected cluster) the data is checked as `submit`
    does, and prepare_run_data packs it on the cluster's CPUs afterwards: this process holds no dataset.
    """
    problems: list[str] = []
    info: dict = {"notes": []}
    fs_for = lambda uri: storage_filesystem if uri.startswith("s3://") else None  # noqa: E731
    model_ok = _check_model(cfg, fs_for, info, problems)
    for name in missing_backends(cfg.reporters):
        problems.append(f"{flag('report_to')} {name}: the {name} package is not installed where the job runs; "
                        f"install it (pip install {name}; with `trainer submit`, --pip {name}), or drop it")
    tokenizer = template = None
    if cfg.chat_template:
        try:
            template = read_chat_template(cfg.chat_template, fs_for(cfg.chat_template))
        except ValueError as e:
            problems.append(f"{flag('chat_template')} {e}")
    cache_where = location_problem(cfg.resolved_cache_dir) if full_data else None
    if cache_where:  # before anything is downloaded or tokenized into it; `submit`: the job checks the cluster's
        named = flag("cache_dir") if cfg.cache_dir else f"{flag('cache_dir')} (unset: TRAINER_CACHE or the default)"
        problems.append(f"{named} {cfg.resolved_cache_dir}: {cache_where}; pass a folder this user can write")
    where = location_problem(cfg.run_uri, fs_for(cfg.run_uri)) if for_run else None
    if where:
        problems.append(f"{flag('out')} {cfg.run_uri} (--storage-path/--run-name): {where}")
    if not problems:
        try:
            tokenizer = preflight_tokenizer(cfg, storage_filesystem)
        except Exception as e:  # noqa: BLE001 - any failure to load it means the job cannot tokenize
            which = "tokenizer" if cfg.tokenizer else "model"
            problems.append(f"{flag(which)}: cannot load its tokenizer ({first_line(e)})")
        problems += vocabulary_problems(cfg, tokenizer, info.get("vocab_size"))
    if full_data:  # where the job runs (`trainer submit` checks here without the job's --env)
        problems += credential_problems(cfg.reporters)
        problems += publish.problems(cfg)
    try:
        _check_data(cfg, tokenizer, fs_for(cfg.dataset), info, full_data=full_data and not data_later,
                    for_run=for_run)
    except DataError as e:
        where = flag("chat_template") if "no chat template" in str(e) else flag("dataset")
        problems.append(f"{where}: {e}")
    if problems:
        raise ConfigError(problems)
    info["tokenizer"] = tokenizer
    info["data_later"] = full_data and data_later
    if model_ok and for_run:
        info["inputs"] = resume.inputs(cfg, data=(info.get("data") or {}).get("source_fingerprint",
                                                                           info.get("data_fingerprint")),
                                       tokenizer=tokenizer_fingerprint(tokenizer),
                                       model=resume.model_identity(cfg.model, storage_fs=fs_for(cfg.model)),
                                       chat_template=template)
        run_storage = Storage.from_uri(cfg.run_uri, fs=fs_for(cfg.run_uri))
        changed = resume.check(cfg, info["inputs"], run_storage)
        ckpt.check_resumable(run_storage)  # saved checkpoints, all damaged: never quietly trained again from 0
        info["notes"] += [f"{flag('resume_anyway')}: resuming {cfg.run_uri} although {d}" for d in changed]
    return info


def vocabulary_problems(cfg: TrainConfig, tokenizer, vocab_size: int | None) -> list[str]:
    """A tokenizer with more tokens than the model's embedding has rows: its high ids fail on the workers."""
    if tokenizer is None or not isinstance(vocab_size, int) or len(tokenizer) <= vocab_size:
        return []
    which = flag("tokenizer") if cfg.tokenizer else flag("model")
    return [f"{which}: the tokenizer has {len(tokenizer)} tokens, more than the model's vocabulary (vocab_size = "
            f"{vocab_size} in {flag('model')}'s config.json): token ids {vocab_size} and up index past its embedding "
            f"(an IndexError on every worker); use the model's own tokenizer, or a model whose vocabulary covers it"]


def _check_model(cfg: TrainConfig, fs_for: Callable[[str], Any], info: dict, problems: list[str]) -> bool:
    """The model's config (and --seq-len against it), architecture and weight headers; --tokenizer's config.

    Whether the model is usable (then its identity is recorded for resumption)."""
    model_ok = False
    try:
        if pinned(cfg.model_revision) and describe_source(cfg.model) != "hub":
            raise ModelSourceError(f"--model-revision {cfg.model_revision!r} (model_revision): applies to a Hugging "
                                   f"Face hub model, and {cfg.model!r} is a {describe_source(cfg.model)} one (it holds "
                                   f"one revision); drop it or set it to main")
        mcfg = read_model_config(cfg.model, storage_fs=fs_for(cfg.model), revision=cfg.model_revision)
        info["model_type"] = getattr(mcfg, "model_type", "?")
        info["vocab_size"] = getattr(mcfg, "vocab_size", None)
        limit = getattr(mcfg, "max_position_embeddings", None)
        if limit and cfg.seq_len > limit:
            problems.append(f"{flag('seq_len')} = {cfg.seq_len} exceeds the model's maximum sequence length "
                            f"(max_position_embeddings = {limit}); use --seq-len {limit} or less")
        info["decoder_layers"] = len(check_architecture(mcfg).layers)  # on the meta device: shardable?
        if cfg.lora:
            try:
                info["lora_targets"] = adapters.check_targets(mcfg, cfg.lora_targets)
            except ValueError as e:
                problems.append(f"{flag('lora_target_modules')}: {e}")
        if cfg.method == "qlora":
            try:
                info["nf4_linears"] = len(quantize.check(mcfg, cfg.shard_size or cfg.num_workers))
            except ValueError as e:
                problems.append(f"{flag('method')} qlora: {e}")
        too_big, info["plan"] = run_refusal(cfg, mcfg)  # GPU memory per worker, before any GPU is paid for
        info["memory_plan"] = run_prediction(cfg, mcfg, info["plan"])  # into run.json, beside the measured peak
        if too_big:
            problems.append(f"{flag('model')} {cfg.model}: {too_big}")
        info["weights"] = check_weights(cfg.model, storage_fs=fs_for(cfg.model), random_init=cfg.random_init,
                                        revision=cfg.model_revision)
        if info["weights"] and not cfg.random_init and describe_source(cfg.model) == "local":
            check_checkpoint(mcfg, local_model_dir(cfg.model))  # every tensor of the model in the files
        model_ok = _check_behaviour(cfg, mcfg, info, problems)
    except ModelSourceError as e:
        problems.append(f"{flag('model')}: {e}")
    if cfg.tokenizer:
        try:
            read_model_config(cfg.tokenizer, storage_fs=fs_for(cfg.tokenizer))
        except ModelSourceError as e:
            problems.append(f"{flag('tokenizer')}: {str(e).replace('model ', 'tokenizer ', 1)}")
    return model_ok


def _check_behaviour(cfg: TrainConfig, mcfg, info: dict, problems: list[str]) -> bool:
    """What the architecture does under the trainer, measured on its tiny shape (trainer.loop.behaviour):
    the attention implementation, document boundaries in packed rows, initialisation, the step."""
    found = measure(mcfg, attn_implementation=cfg.attn_implementation, random_init=cfg.random_init)
    info["behaviour"] = found
    problems.extend(found.problems)
    info["notes"] += list(found.notes)
    return not found.problems


def _check_data(cfg: TrainConfig, tokenizer, dataset_fs: Any, info: dict, *, full_data: bool, for_run: bool) -> None:
    """The dataset packed as the workers will (with `full_data` and a tokenizer), else its first records
    rendered; DataError when it cannot be used."""
    found = info.get("behaviour")
    one_per_row = found.one_per_row if found is not None else ""
    if one_per_row and not (full_data and tokenizer is not None):
        info["notes"].append(f"documents are trained one per row, not packed: {one_per_row}")
    if full_data and tokenizer is not None:
        packed = prepare(DataSpec.from_config(cfg, one_per_row), tokenizer=tokenizer, seq_len=cfg.seq_len,
                         cache_dir=cfg.resolved_cache_dir, storage_fs=dataset_fs)
        if for_run:
            packed.step_rows(0, cfg.global_batch_size, cfg.seed)  # at least one global batch
        info["data"] = packed.meta
        info["notes"] += data_summary(packed.meta, cfg.overlong)
        if cfg.evaluates:  # the held-out rows, packed into the same cache the workers read
            try:
                held_out = prepare(DataSpec.eval_from_config(cfg, one_per_row), tokenizer=tokenizer, seq_len=cfg.seq_len,
                                   cache_dir=cfg.resolved_cache_dir, storage_fs=dataset_fs)
            except DataError as e:
                raise DataError(f"the held-out data to evaluate ({flag('eval_dataset')}, else the {flag('eval_split')} "
                                f"{cfg.eval_split!r} of {flag('dataset')}): {e}") from None
            info["notes"].append(f"evaluation: {held_out.num_rows:,} packed rows {eval_schedule(cfg)}")
        return
    found = sources.sample(cfg.dataset, cfg.dataset_split, config=cfg.dataset_config, storage_fs=dataset_fs,
                           limit=100, cache_dir=cfg.resolved_cache_dir)  # the first records only, and the size
    renderer = Renderer(tokenizer, cfg.train_on) if tokenizer is not None else None
    check_records(found.records, cfg.dataset, renderer=renderer, text_field=cfg.dataset_text_field)
    info["sampled_records"] = len(found.records)
    if for_run and not is_remote(cfg.dataset) and not cfg.dataset.startswith("mixture:"):
        source = sources.resolve(cfg.dataset, config=cfg.dataset_config, split=cfg.dataset_split)
        if source.kind != "hub":  # a local file's content hash: a resume with changed data is refused here
            info["data_fingerprint"] = sources.fingerprint(source, cfg.resolved_cache_dir)  # memo: the pass reuses it
    if tokenizer is not None and found.size.records == len(found.records):  # the sample is the whole dataset
        stats = pack_dataset(found.records, DataSpec.from_config(cfg, one_per_row), tokenizer, cfg.seq_len)
        if for_run and stats.rows < cfg.global_batch_size:
            raise DataError(too_few_rows(stats.rows, cfg.seq_len, cfg.global_batch_size))
    too_big, info["data_size"] = data_refusal(cfg, tokenizer, found, info)
    if too_big:
        raise DataError(too_big)
    if info["data_size"] and info["data_size"]["estimate"]:
        info["notes"].append(f"prepared data: {info['data_size']['summary']}")


def scaling_config(cfg: TrainConfig):
    """The workers: --num-workers, on GPUs or CPUs and, with --pool, only on that pool's nodes.

    Ray 2.58's ScalingConfig.label_selector (ray/train/v2/api/config.py) becomes the worker
    placement group's bundle_label_selector: every worker on a node whose Ray labels match.
    """
    from ray.train import ScalingConfig

    return ScalingConfig(num_workers=cfg.num_workers, use_gpu=cfg.use_gpu,
                         label_selector=ray_facts.pool_labels(cfg.pool) if cfg.pool else None)


def process_group_backend(cfg: TrainConfig) -> str | None:
    """torch.distributed's backend for Ray Train's TorchConfig; None: Ray's default (nccl on GPU, gloo on CPU).

    With --offload cpu the gradients are sharded DTensors on the host, whose norm (gradient clipping) is
    all-reduced over the mesh: the host tensors need gloo beside NCCL (torchtune #2108, pytorch #148532)."""
    return "cpu:gloo,cuda:nccl" if cfg.offload == "cpu" else None


def checkpoint_config(cfg: TrainConfig):
    """Ray's retention: the newest --num-to-keep, or with --keep-best the best by eval loss (Ray keeps the latest
    too, to resume from)."""
    from ray.train import CheckpointConfig

    if cfg.keep_best:
        return CheckpointConfig(num_to_keep=cfg.num_to_keep, checkpoint_score_attribute="eval_loss",
                                checkpoint_score_order="min")
    return CheckpointConfig(num_to_keep=cfg.num_to_keep)


def prepare_run_data(cfg: TrainConfig, storage_filesystem: Any, found: dict) -> dict:
    """The data pass preflight(data_later=True) left to the cluster: the training (and held-out) data tokenized
    and packed by the cluster's CPUs into <--storage-path>/_data (trainer.data.distributed), or found there from
    an earlier run or attempt. Its counts and notes go into `found`, the shards' keys to the workers; a dataset
    that turns out unusable (bad records, nothing to train, less than one global batch) is a ConfigError."""
    if not found.get("data_later"):
        return found
    behaviour = found.get("behaviour")
    one_per_row = behaviour.one_per_row if behaviour is not None else ""
    remote = storage_filesystem if is_remote(cfg.storage_path) else None
    storage = Storage.from_uri(cfg.storage_path, fs=remote)

    def on_cluster(spec: DataSpec) -> dict:
        fs = storage_filesystem if spec.dataset.startswith("s3://") else None
        return prepare_on_ray(spec, found["tokenizer"], cfg.seq_len, storage, cfg.resolved_cache_dir, dataset_fs=fs)

    try:
        meta = on_cluster(DataSpec.from_config(cfg, one_per_row))
        if meta["rows"] < cfg.global_batch_size:
            raise DataError(too_few_rows(meta["rows"], cfg.seq_len, cfg.global_batch_size))
    except DataError as e:
        raise ConfigError([f"{flag('dataset')}: {e}"]) from None
    prep = meta["prep"]
    how = "found ready" if prep["reused"] else f"prepared by {prep['workers']} CPU workers in {prep['seconds']:.0f} s"
    notes = [f"data: {meta['records']:,} records packed into {meta['rows']:,} rows, {len(meta['shards'])} shards in "
             f"{prepared_storage(storage, meta['key']).root} ({how})"] + data_summary(meta, cfg.overlong)
    prepared = {"train": meta["key"]}
    if cfg.evaluates:
        try:
            held_out = on_cluster(DataSpec.eval_from_config(cfg, one_per_row))
        except DataError as e:
            raise ConfigError([f"{flag('dataset')}: the held-out data to evaluate ({flag('eval_dataset')}, else the "
                               f"{flag('eval_split')} {cfg.eval_split!r} of {flag('dataset')}): {e}"]) from None
        prepared["eval"] = held_out["key"]
        notes.append(f"evaluation: {held_out['rows']:,} packed rows {eval_schedule(cfg)}")
    print_notes({"notes": notes})
    found = {**found, "data": meta, "prepared": prepared, "data_later": False}
    if found.get("inputs") is not None:  # the data's content, known now: a resume with other data is refused
        found["inputs"] = {**found["inputs"], "data": meta["source_fingerprint"]}
        resume.check(cfg, found["inputs"], Storage.from_uri(cfg.run_uri, fs=remote))
    return found


def handed_to_workers(found: dict | None) -> dict:
    """What the pre-flight `found` that the workers take as it is (train_loop_config keys): the run's inputs for
    run.json, the packing verdict (so they need not measure the model again) and the memory plan's prediction."""
    if not found:
        return {}
    behaviour = found.get("behaviour")
    handed = {resume.INPUTS_KEY: found.get("inputs"), MEMORY_PLAN_KEY: found.get("memory_plan"),
              ONE_PER_ROW_KEY: behaviour.one_per_row if behaviour is not None else None,
              PREPARED_KEY: found.get("prepared")}
    return {k: v for k, v in handed.items() if v is not None}


def build_trainer(cfg: TrainConfig, storage_filesystem: Any = None, *, quiet: bool = False,
                  found: dict | None = None):
    """TorchTrainer running trainer.loop.run.train_func; `quiet` hides Ray Train's own INFO logs; what the
    pre-flight `found` travels to the workers (handed_to_workers).

    Ray retries nothing itself (max_failures 0; train() decides); preemptions keep Ray's own
    budget (FailureConfig.max_preemption_failures, unlimited by default).
    """
    from ray.train import FailureConfig, LoggingConfig, RunConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from trainer.loop.user_errors import QuietUserErrors

    storage_path = cfg.storage_path
    if storage_filesystem is not None and "://" in storage_path:
        storage_path = storage_path.split("://", 1)[1]
    loop_config = cfg.to_dict()
    if cfg.chat_template:  # read here, by the driver: the workers may be on nodes without the file
        fs = storage_filesystem if cfg.chat_template.startswith("s3://") else None
        loop_config[CHAT_TEMPLATE_KEY] = read_chat_template(cfg.chat_template, fs)
    loop_config.update(handed_to_workers(found))
    return TorchTrainer(
        train_func,
        train_loop_config=loop_config,
        torch_config=TorchConfig(backend=process_group_backend(cfg)),
        scaling_config=scaling_config(cfg),
        run_config=RunConfig(
            name=cfg.resolved_run_name,
            storage_path=storage_path,
            storage_filesystem=storage_filesystem,
            failure_config=FailureConfig(max_failures=0),
            callbacks=[QuietUserErrors()],  # a worker's UserError: the driver's one line, not Ray's tracebacks
            checkpoint_config=checkpoint_config(cfg),
            worker_runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false", "TRAINER_QUIET_RAY": str(int(quiet))}},
            logging_config=LoggingConfig(log_level="WARNING" if quiet else "INFO"),
        ),
    )


def train(cfg: TrainConfig, storage_filesystem: Any = None, *, check: bool = True, quiet: bool = False,
          found: dict | None = None):
    """Pre-flight and the cluster's size, then fit on the connected Ray cluster; returns Ray's Result.

    Ray Train retries every worker failure alike (its failure policy is not pluggable), a bad
    record or config included, each retry failing the same way. So Ray retries nothing, and
    this loop fits the same run name again (a resume from its last complete checkpoint) only
    after a machine failed (trainer.jobs.failures), up to --max-failures times. Any other
    failure of a worker is raised at once (a UserError: exit 2).
    """

    if check:
        found = preflight(cfg, storage_filesystem, data_later=True)
    check_capacity(cfg.num_workers, cfg.use_gpu, cfg.pool)
    found = prepare_run_data(cfg, storage_filesystem, found or {})
    run = Storage.from_uri(cfg.run_uri, fs=storage_filesystem)
    with run_lock.held(run, cfg.resolved_run_name):  # one run at a time trains into a run folder
        result = _fit_with_retries(cfg, run, storage_filesystem, quiet=quiet, found=found)
    if cfg.push_to_hub and result.error is None:  # as transformers' Trainer.push_to_hub at the end of training
        print(f"pushed {run.path(EXPORT_DIR)} to the Hugging Face Hub: {publish.push(run, cfg)}", flush=True)
    return result


def _fit_with_retries(cfg: TrainConfig, run: Storage, storage_filesystem: Any, *, quiet: bool, found: dict | None):
    failures = 0
    while True:
        note = ckpt.repair_ray_record(run)  # every attempt: Ray's controller reads the record at its start
        if note:
            print(f"note: {note}", file=sys.stderr, flush=True)
        try:
            with interrupt.stopped_by_signal(run) as stop:  # SIGINT, SIGTERM: exit 130 naming the checkpoint
                return stop.attach(build_trainer(cfg, storage_filesystem, quiet=quiet, found=found)).fit()
        except Exception as e:
            found = user_error(e)
            if found is not None:
                raise found from None
            if not retryable(e) or failures >= cfg.max_failures:
                raise
            failures += 1
            print(f"attempt {failures} failed ({failure_summary(e)}); restarting from the last complete checkpoint "
                  f"(retry {failures} of --max-failures {cfg.max_failures})", file=sys.stderr, flush=True)


def eval_schedule(cfg: TrainConfig) -> str:
    """When the held-out loss is measured, in words, from the three settings that ask for it."""
    when = [words for asked, words in ((cfg.eval_on_start, "at the start"),
                                       (cfg.eval_every, f"every {cfg.eval_every} steps"),
                                       (cfg.eval_each_epoch, "at the end of every epoch")) if asked]
    if not when:
        return "never"
    return when[0] if len(when) == 1 else ", ".join(when[:-1]) + " and " + when[-1]


def storage_default(environ=None) -> dict[str, str] | None:
    """The default storage path on the cluster: CHECKPOINT_URI, which the RayCluster sets on its head (the stack's
    bucket); else, for a job `submit --address` sent without storage, the head's own folder (facts.ray.NODE_RUNS_ENV)."""
    import os

    env = os.environ if environ is None else environ
    uri = env.get(ray_facts.CHECKPOINT_ENV)
    if uri:
        return {"storage_path": uri}
    on_node = env.get(ray_facts.NODE_RUNS_ENV)
    return {"storage_path": str(Path(on_node).expanduser().absolute())} if on_node else None


def print_notes(info: dict) -> None:
    """What the pre-flight found worth knowing (records truncated or dropped, a resume with changes)."""
    for note in info.get("notes", []):
        print(f"note: {note}", flush=True)


def connect(address: str | None, **kwargs):
    """ray.init, within seconds or with the reason: an address nobody answers, or no cluster to find."""
    import ray

    check_reachable(address)
    try:
        return ray.init(address=address, **kwargs)
    except ConnectionError as e:
        raise ClusterError(f"--address {address or 'auto'}: no Ray cluster found ({first_line(e)}); start one "
                           f"(`ray start --head`), pass --address HOST:PORT, or use `trainer local`") from None


def main(argv: Sequence[str]) -> int:
    """`python -m trainer train`: run one training job on an existing Ray cluster."""
    parser = argparse.ArgumentParser(prog="python -m trainer train",
                                     description="Fine-tune a causal LM with FSDP2 on a running Ray cluster.")
    parser.add_argument("--address", default="auto", help="Ray cluster address (default: auto)")
    add_arguments(parser)
    args = parser.parse_args(list(argv))
    address = args.__dict__.pop("address")
    default = storage_default()
    cfg = absolute_storage(from_args(args, default))
    on_node = bool(default) and not is_remote(default["storage_path"]) and cfg.storage_path == default["storage_path"]
    if not is_remote(cfg.storage_path) and cfg.num_workers > 1 and address not in ("auto", "local") and not on_node:
        print(f"note: {flag('storage_path')} {cfg.storage_path} is local; multi-node runs need shared storage (s3://)",
              file=sys.stderr)

    check_reachable(address)  # seconds, before the pre-flight reads the data
    run_lock.check_free(Storage.from_uri(cfg.run_uri), cfg.resolved_run_name)
    info = preflight(cfg, data_later=True)  # the data pass runs on the cluster's CPUs (prepare_run_data)
    print_notes(info)
    connect(address)
    if on_node:  # the head's own folder, chosen for a single-node cluster: it must still be one
        check_single_node(cfg.storage_path)
    try:
        train(cfg, check=False, found=info)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - fit() raises the workers' error once the retries are spent
        print(f"error: training failed: {e}", file=sys.stderr)
        return EXIT_FAILED
    print(f"done: run folder {cfg.run_uri}")
    return EXIT_OK
