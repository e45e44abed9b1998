"""The per-node cache: a download cut short is never read, and is done again."""

from __future__ import annotations

import pytest

from trainer import cache
from trainer.config.flags import TrainConfig


def test_a_download_cut_short_is_never_read_and_is_done_again(tmp_path):
    target = tmp_path / "models" / cache.key("s3://bucket/model")

    def cut_short(folder):
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{")
        raise OSError("connection reset by peer")

    with pytest.raises(OSError, match="connection reset"):
        cache.fill(target, cut_short, "s3://bucket/model")
    assert not target.exists() and not cache.is_complete(target)

    def whole(folder):
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")

    assert cache.fill(target, whole, "s3://bucket/model") == target
    assert cache.is_complete(target) and (target / "config.json").read_text() == "{}"
    assert (target / cache.MARKER).read_text() == "s3://bucket/model"
    assert not target.with_name(target.name + ".tmp").exists()


def test_the_cache_is_cache_dir_else_trainer_cache_else_the_home_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("TRAINER_CACHE", str(tmp_path))
    assert TrainConfig().resolved_cache_dir == cache.default_dir() == str(tmp_path)
    assert TrainConfig(cache_dir="/scratch").resolved_cache_dir == "/scratch"
    monkeypatch.delenv("TRAINER_CACHE")
    assert cache.default_dir().endswith("/.cache/trainer")
