"""Where a model and its tokenizer come from: a local folder, a Hugging Face hub id, or s3://.

--model / --tokenizer: a folder saved with save_pretrained, a hub id (org/name) or an s3://
prefix of such a folder (a hub model at --model-revision, TRL's model_revision); resolved to a
local folder holding config.json and the weight files trainer.model.weights reads, fetched
once per node into the cache (trainer.cache), and checked (config, weight headers) without
reading a tensor.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from facts.errors import first_line
from trainer import cache
from trainer.model.errors import ModelSourceError
from trainer.model.weights import Checkpoint
from trainer.storage import Storage

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_HUB_FILES = ["*.json", "*.jinja", "*.txt", "*.model", "tokenizer*"]  # plus the weight files (hub_weight_files)
BIN_WEIGHTS = re.compile(r"^pytorch_model(-\d+-of-\d+)?\.bin$")
RANDOM_INIT_FLAG = "--random-init"


def describe_source(spec: str) -> str:
    if spec.startswith("s3://"):
        return "s3"
    if Path(spec).expanduser().exists() or spec.startswith(("/", ".", "~")) or spec.count("/") > 1:
        return "local"
    return "hub" if HUB_ID.match(spec) else "local"


def pinned(revision: str | None) -> str | None:
    """The revision to ask the hub for: None for the default branch (`main` is the hub's default)."""
    return None if revision in (None, "", "main") else revision


def hub_failure(spec: str, revision: str | None, e: BaseException, what: str = "fetching it from") -> ModelSourceError:
    """Any hub failure means the same thing to the user; with a pinned revision, that revision may be the cause."""
    if pinned(revision):
        return ModelSourceError(f"model {spec!r} at revision {revision!r}: {what} the Hugging Face hub failed "
                                f"({first_line(e)}); check --model-revision (a branch, tag or commit of the repo; "
                                f"TRL's model_revision), the id, network access and HF_TOKEN for gated models")
    return ModelSourceError(f"model {spec!r}: not a local folder, and {what} the Hugging Face hub failed "
                            f"({first_line(e)}); check the id, network access and HF_TOKEN for gated models")


def local_model_dir(spec: str) -> Path:
    path = Path(spec).expanduser()
    if not (path / "config.json").is_file():
        why = "does not exist" if not path.exists() else "has no config.json"
        raise ModelSourceError(f"model {spec!r}: local folder {why}; pass a folder saved with save_pretrained, "
                               f"a Hugging Face hub id (org/name) or an s3:// prefix")
    return path.absolute()


def model_cache_key(spec: str, revision: str | None = None) -> str:
    """The per-node cache entry of a model source: one per hub revision (the default branch keeps its old key)."""
    return cache.key(spec if not pinned(revision) else f"{spec}@{revision}")


def resolve_model_path(spec: str, cache_dir: str | Path, *, storage_fs: Any = None,
                       revision: str | None = None) -> Path:
    """A local folder holding the model (a hub one at `revision`), downloading it first if needed.

    Every rank may call this: a file lock plus a completion marker in the per-node cache
    make the first caller on a node download and the others reuse its copy.
    """
    kind = describe_source(spec)
    if kind == "local":
        return local_model_dir(spec)
    target = Path(cache_dir) / "models" / model_cache_key(spec, revision)
    with cache.lock(cache_dir, "model-" + model_cache_key(spec, revision)):
        if cache.is_complete(target):
            return Path(json.loads((target / cache.MARKER).read_text())["path"])
        if kind == "s3":
            store = Storage.from_uri(spec, fs=storage_fs)
            if not store.exists("config.json"):
                raise ModelSourceError(f"model {spec!r}: no config.json under this s3:// prefix; "
                                       f"upload a folder saved with save_pretrained there")
            return cache.fill(target, store.download_dir, json.dumps({"path": str(target), "source": spec}))
        from huggingface_hub import snapshot_download

        try:
            path = Path(snapshot_download(spec, cache_dir=str(Path(cache_dir) / "hub"), revision=pinned(revision),
                                          allow_patterns=[*_HUB_FILES, *_hub_weight_patterns(spec, revision)]))
        except Exception as e:  # noqa: BLE001 - any hub failure means the same thing to the user
            raise hub_failure(spec, revision, e) from None
        target.mkdir(parents=True, exist_ok=True)  # the hub's own cache holds the files; the marker points there
        (target / cache.MARKER).write_text(json.dumps({"path": str(path), "source": spec,
                                                       **({"revision": revision} if pinned(revision) else {})}))
        return path


def hub_weight_files(files: list[str]) -> list[str]:
    """The top-level weight files from_pretrained would read: the safetensors when the repo has any,
    else the pytorch_model*.bin files (trainer.model.weights reads both)."""
    top = [f for f in files if "/" not in f]
    safetensors = sorted(f for f in top if f.endswith(".safetensors"))
    return safetensors or sorted(f for f in top if BIN_WEIGHTS.match(f))


def _hub_weight_patterns(spec: str, revision: str | None = None) -> list[str]:
    """The repo's weight files to download; offline (HF_HUB_OFFLINE), whichever of them the hub cache holds."""
    import huggingface_hub
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return ["*.safetensors", "pytorch_model*.bin"]
    return hub_weight_files(huggingface_hub.list_repo_files(spec, revision=pinned(revision)))


def weight_files(folder: str | Path) -> list[str]:
    """The weight files trainer.model.weights reads from a local folder (an index's files, else the glob)."""
    return Checkpoint.files_in(Path(folder))


def check_weights(spec: str, *, storage_fs: Any = None, random_init: bool = False,
                  revision: str | None = None) -> list[str]:
    """Every weight file of the model present and its header readable, without reading any tensor.

    No weight files is an error unless --random-init asks for the config's initialisation: a
    model trained from random weights by accident looks like a run that merely went badly.
    Returns the weight files' names.
    """
    kind = describe_source(spec)
    if kind == "local":
        folder = local_model_dir(spec)
        files = weight_files(folder)
        if files and not random_init:
            Checkpoint(folder).close()  # opens every file: safetensors headers, .bin zip index
    elif kind == "s3":
        files = _check_s3_weights(spec, storage_fs) if not random_init else []
    else:
        files = _check_hub_weights(spec, revision) if not random_init else []
        if files is None:  # offline: the workers' download is the check
            return []
    if not files and not random_init:
        raise no_weights(spec)
    return files


def no_weights(spec: str) -> ModelSourceError:
    return ModelSourceError(f"model {spec!r}: no weight files (*.safetensors or pytorch_model*.bin); training "
                            f"would start from random weights. Point --model at a folder saved with "
                            f"save_pretrained (weights included), or pass {RANDOM_INIT_FLAG} to train from the "
                            f"config's random initialisation on purpose")


def _safetensors_header_problem(read_at, size: int) -> str | None:
    """Why a safetensors file's header is unusable (read_at(offset, n) gives bytes), or None."""
    import struct

    if size < 8:
        return f"{size} bytes, shorter than a safetensors header"
    (n,) = struct.unpack("<Q", read_at(0, 8))
    if n > min(size - 8, 100 * 2**20):
        return f"the header claims {n} bytes, the file has {size}"
    try:
        header = json.loads(read_at(8, n))
    except ValueError as e:
        return f"the header is not JSON ({e})"
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)
            and isinstance(v.get("data_offsets"), list) and len(v["data_offsets"]) == 2]
    if not isinstance(header, dict) or len(ends) != len([k for k in header if k != "__metadata__"]):
        return "the header does not list tensors with data offsets"
    if 8 + n + max(ends, default=0) > size:
        return f"its tensors end at byte {8 + n + max(ends)}, the file has {size} (truncated?)"
    return None


def _check_s3_weights(spec: str, storage_fs: Any) -> list[str]:
    store = Storage.from_uri(spec, fs=storage_fs)
    sizes = {k: v for k, v in store.file_sizes().items() if "/" not in k}
    files = sorted(k for k in sizes if k.endswith(".safetensors")) or sorted(k for k in sizes if BIN_WEIGHTS.match(k))
    for name in files:
        if name.endswith(".safetensors"):
            with store.fs.open_input_file(store.path(name)) as f:
                problem = _safetensors_header_problem(lambda at, n: f.read_at(n, at), sizes[name])
            if problem:
                raise ModelSourceError(f"model {spec!r}: {name} cannot be read ({problem}); upload the folder "
                                       f"saved with save_pretrained again")
    return files


def _check_hub_weights(spec: str, revision: str | None = None) -> list[str] | None:
    """The hub repo's weight files; safetensors headers read remotely (HTTP range requests). None offline."""
    import huggingface_hub
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return None
    try:
        files = hub_weight_files(huggingface_hub.list_repo_files(spec, revision=pinned(revision)))
        if files and files[0].endswith(".safetensors"):
            huggingface_hub.get_safetensors_metadata(spec, revision=pinned(revision))
    except Exception as e:  # noqa: BLE001 - any hub failure means the same thing to the user
        raise hub_failure(spec, revision, e, "listing its weight files on") from None
    return files


def read_model_config(spec: str, *, storage_fs: Any = None, revision: str | None = None):
    """The model's config without downloading weights (used by the pre-flight checks)."""
    from transformers import AutoConfig

    kind = describe_source(spec)
    try:
        if kind == "local":
            return AutoConfig.from_pretrained(str(local_model_dir(spec)))
        if kind == "s3":
            store = Storage.from_uri(spec, fs=storage_fs)
            if not store.exists("config.json"):
                raise ModelSourceError(f"model {spec!r}: no config.json under this s3:// prefix; "
                                       f"upload a folder saved with save_pretrained there")
            from transformers import PretrainedConfig

            d = json.loads(store.read_text("config.json"))
            return AutoConfig.for_model(d.pop("model_type"), **d) if "model_type" in d else PretrainedConfig(**d)
        return AutoConfig.from_pretrained(spec, revision=pinned(revision) or "main")
    except ModelSourceError:
        raise
    except Exception as e:  # noqa: BLE001
        if pinned(revision):
            raise hub_failure(spec, revision, e, "reading its config from") from None
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ModelSourceError(
            f"model {spec!r}: cannot read its config ({first}); pass a local folder saved with "
            f"save_pretrained, a Hugging Face hub id (org/name) or an s3:// prefix") from None


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                    "tokenizer.model", "added_tokens.json", "chat_template.jinja", "chat_template.json", "config.json")


def load_tokenizer(path: str | Path, *, cache_dir: str | Path | None = None, revision: str | None = None):
    """The tokenizer of a folder (or, with `cache_dir`, a hub id at `revision`); a missing pad token is the EOS
    token."""
    from transformers import AutoTokenizer

    kw: dict[str, Any] = {"cache_dir": str(Path(cache_dir) / "hub")} if cache_dir else {}
    if pinned(revision):
        kw["revision"] = revision
    tok = AutoTokenizer.from_pretrained(str(path), **kw)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def set_eos_token(tok, eos_token: str | None) -> None:
    """--eos-token (TRL's eos_token): the tokenizer's end-of-sequence token; ModelSourceError when it is not a
    token of the vocabulary (as TRL refuses it)."""
    if not eos_token:
        return
    if eos_token not in tok.get_vocab():
        raise ModelSourceError(f"--eos-token {eos_token!r}: not a token of the tokenizer's vocabulary (TRL refuses it "
                               f"too); pass one of its special tokens, e.g. {tok.eos_token!r}")
    tok.eos_token = eos_token


def tokenizer_only(spec: str, cache_dir: str | Path, *, storage_fs: Any = None, revision: str | None = None):
    """The tokenizer of a model source with only its tokenizer files fetched (the pre-flight needs no weights)."""
    import tempfile

    kind = describe_source(spec)
    if kind == "s3":
        store = Storage.from_uri(spec, fs=storage_fs)
        folder = Path(tempfile.mkdtemp(prefix="tokenizer-"))
        for name in _TOKENIZER_FILES:
            if store.exists(name):
                (folder / name).write_bytes(store.read_bytes(name))
        return load_tokenizer(folder)
    if kind == "hub":
        try:
            return load_tokenizer(spec, cache_dir=cache_dir, revision=revision)
        except Exception as e:  # any hub failure means the same thing to the user
            if pinned(revision):
                raise hub_failure(spec, revision, e, "fetching its tokenizer from") from None
            raise
    return load_tokenizer(Path(spec).expanduser())
