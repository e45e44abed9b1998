"""The exported model uploaded to the Hugging Face Hub at the end of training (TRL's push_to_hub).

As transformers' Trainer does it: the repository is `hub_model_id`, else the run folder's name (the
output_dir's, there), created if missing (private with `hub_private_repo`) and named as the hub
answers (a bare name lands in the token's namespace); the export folder is then uploaded in one
commit, "End of training". The token is huggingface_hub's own (HF_TOKEN, else the one `hf auth login`
saved), checked before Ray starts so a finished run never fails on it.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from facts.errors import EXIT_FAILED, UserError, first_line
from trainer.run_folder.export import EXPORT_DIR
from trainer.storage import Storage

COMMIT_MESSAGE = "End of training"  # transformers' Trainer.push_to_hub


class PushError(UserError):
    """The run finished and exported, the upload did not: the work failed (exit 1), the model is in storage."""

    exit_code = EXIT_FAILED


def token() -> str | None:
    from huggingface_hub import get_token

    return get_token()


def repo_name(cfg) -> str:
    return cfg.hub_model_id or cfg.resolved_run_name


def problems(cfg) -> list[str]:
    """Why push_to_hub cannot upload at the end (checked before Ray): no export, or no token."""
    if not cfg.push_to_hub:
        return []
    if not cfg.export:
        return ["--push-to-hub (push_to_hub): uploads the exported model, and --no-export turns the export off; "
                "drop one of them"]
    if not token():
        return [f"--push-to-hub (push_to_hub): no Hugging Face token to upload {repo_name(cfg)!r} with; set HF_TOKEN "
                f"(a token with write access) or run `huggingface-cli login` (`hf auth login`) where the job runs, or "
                f"set push_to_hub: false"]
    return []


def push(run: Storage, cfg, api: Any = None) -> str:
    """Rank-free, after the run: the export folder of `run` uploaded; returns the commit's URL."""
    from huggingface_hub import HfApi

    api = api if api is not None else HfApi(token=token())
    try:
        repo = api.create_repo(repo_name(cfg), private=cfg.hub_private_repo, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="push-") as tmp:
            folder = Path(run.path(EXPORT_DIR)) if run.is_local else Path(tmp) / EXPORT_DIR
            if not run.is_local:
                run.download_dir(folder, EXPORT_DIR)
            commit = api.upload_folder(repo_id=repo.repo_id, folder_path=str(folder), commit_message=COMMIT_MESSAGE)
    except Exception as e:  # noqa: BLE001 - any Hub failure means the same: the model is exported, not uploaded
        raise PushError(f"the run finished and exported {run.path(EXPORT_DIR)}, but pushing it to the Hugging Face "
                        f"Hub repository {repo_name(cfg)!r} failed ({first_line(e)}); check the token's write access "
                        f"and the network, then upload it with `hf upload {repo_name(cfg)} "
                        f"{run.path(EXPORT_DIR)}`") from None
    return str(getattr(commit, "commit_url", commit))
