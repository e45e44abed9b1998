"""push_to_hub: the exported folder uploaded as transformers' Trainer uploads it; the token checked before Ray.

The Hugging Face Hub is an external API that cannot be reached here: HubApi below stands in for
huggingface_hub.HfApi (the two calls transformers' Trainer makes: create_repo, then upload_folder),
recording what it was asked and the files the folder held at that moment.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from trainer.config.flags import TrainConfig
from trainer.config.load import merge
from trainer.run_folder import publish
from trainer.storage import Storage


@dataclass
class HubApi:
    """huggingface_hub.HfApi's create_repo and upload_folder, answering as the Hub does (a bare name lands in the
    token's namespace), recording each call."""

    token: str | None = None
    namespace: str = "me"

    def __post_init__(self):
        self.calls: list[tuple] = []
        HubApi.last = self

    def create_repo(self, repo_id: str, *, private: bool | None = None, exist_ok: bool = False, **kw):
        self.calls.append(("create_repo", repo_id, {"private": private, "exist_ok": exist_ok, **kw}))
        return SimpleNamespace(repo_id=repo_id if "/" in repo_id else f"{self.namespace}/{repo_id}")

    def upload_folder(self, *, repo_id: str, folder_path: str, commit_message: str, **kw):
        files = sorted(str(p.relative_to(folder_path)) for p in Path(folder_path).rglob("*") if p.is_file())
        self.calls.append(("upload_folder", repo_id, {"files": files, "commit_message": commit_message, **kw}))
        return SimpleNamespace(commit_url=f"https://huggingface.co/{repo_id}/commit/0123abcd")


@pytest.fixture
def no_token(monkeypatch, tmp_path):
    from huggingface_hub import constants

    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    return tmp_path / "no-token"


def test_without_a_token_push_to_hub_is_one_error_naming_hf_token_and_the_login_and_a_saved_login_is_used(no_token,
                                                                                                         monkeypatch):
    cfg = merge({"model_name_or_path": "m", "dataset_name": "d", "push_to_hub": True,
                 "hub_model_id": "tiny-sft", "output_dir": "runs/x"}, {})
    (problem,) = publish.problems(cfg)
    assert problem.startswith("--push-to-hub (push_to_hub): no Hugging Face token to upload 'tiny-sft' with; set "
                              "HF_TOKEN") and "huggingface-cli login" in problem and "\n" not in problem
    no_token.write_text("hf_saved_by_login")  # what `hf auth login` writes
    assert publish.problems(cfg) == [] and publish.token() == "hf_saved_by_login"
    monkeypatch.setenv("HF_TOKEN", "hf_from_env")
    assert publish.token() == "hf_from_env"  # HF_TOKEN first, as huggingface_hub reads it
    assert publish.problems(TrainConfig(model="m", dataset="d", push_to_hub=True, export=False)) == [
        "--push-to-hub (push_to_hub): uploads the exported model, and --no-export turns the export off; drop one "
        "of them"]
    assert publish.problems(TrainConfig(model="m", dataset="d")) == []  # off: nothing to check


def test_the_export_folder_is_uploaded_to_the_repo_the_hub_names_with_transformers_commit_message(tmp_path):
    files = {"config.json": "{}", "model.safetensors": "x", "README.md": "card", "tokenizer.json": "{}"}
    (tmp_path / "r" / "model").mkdir(parents=True)
    for name, text in files.items():
        (tmp_path / "r" / "model" / name).write_text(text)
    (tmp_path / "r" / "checkpoint_00000002").mkdir()  # the run folder's other contents stay out
    api = HubApi(token="t")
    cfg = TrainConfig(model="m", dataset="d", push_to_hub=True, hub_private_repo=True, run_name="r")
    assert publish.push(Storage.from_uri(str(tmp_path / "r")), cfg, api) == "https://huggingface.co/me/r/commit/0123abcd"
    assert api.calls == [
        ("create_repo", "r", {"private": True, "exist_ok": True}),  # no hub_model_id: the run folder's name
        ("upload_folder", "me/r", {"files": sorted(files), "commit_message": "End of training"})]
    named = TrainConfig(model="m", dataset="d", push_to_hub=True, hub_model_id="org/tiny-sft", run_name="r")
    publish.push(Storage.from_uri(str(tmp_path / "r")), named, api := HubApi(token="t"))
    assert [c[1] for c in api.calls] == ["org/tiny-sft", "org/tiny-sft"]


def test_a_failed_upload_is_one_error_line_naming_the_exported_folder_and_how_to_upload_it(tmp_path):
    class RefusingHub(HubApi):
        def upload_folder(self, **kw):
            raise PermissionError("403 Forbidden: token has no write access")

    (tmp_path / "r" / "model").mkdir(parents=True)
    cfg = TrainConfig(model="m", dataset="d", push_to_hub=True, hub_model_id="org/x", run_name="r")
    with pytest.raises(publish.PushError) as e:
        publish.push(Storage.from_uri(str(tmp_path / "r")), cfg, RefusingHub())
    assert e.value.exit_code == 1 and "\n" not in str(e.value)
    folder = tmp_path / "r" / "model"
    assert str(e.value) == (f"the run finished and exported {folder}, but pushing it to the Hugging Face Hub "
                            f"repository 'org/x' failed (PermissionError: 403 Forbidden: token has no write access); "
                            f"check the token's write access and the network, then upload it with `hf upload org/x "
                            f"{folder}`")

