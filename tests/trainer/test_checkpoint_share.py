"""Resuming from object storage: each rank fetches only its share of a checkpoint (real DCP, 2 gloo ranks)."""

from __future__ import annotations

import os

import torch
import torch.multiprocessing as mp

from tests.guards import nonempty

from .conftest import free_port


def _share_worker(rank: int, world: int, port: int, model_dir: str, out_dir: str) -> None:
    import pyarrow.fs as pafs
    import torch.distributed as dist

    from trainer.model.build import build_model
    from trainer.run_folder import checkpoint as ckpt
    from trainer.storage import Storage

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        cpu = torch.device("cpu")
        model = build_model(model_dir, device=cpu, use_gpu=False)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        ids = torch.randint(0, model.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(rank))
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        # not a LocalFileSystem: the path a bucket takes (download, not read in place)
        remote = Storage(pafs.SubTreeFileSystem(out_dir, pafs.LocalFileSystem()), "run")
        ckpt.save(remote, 1, model, opt, None, {"epoch": 0, "row": 0})
        name = ckpt.dir_name(1)
        with ckpt._rank_copy(remote, name, model, opt) as folder:
            # bytes on disk (st_blocks): a sparse file takes only what was written into it
            fetched = {p.relative_to(folder).as_posix(): p.stat().st_blocks * 512
                       for p in folder.rglob("*") if p.is_file()}
        fresh = build_model(model_dir, device=cpu, use_gpu=False)
        with torch.no_grad():
            for p in fresh.parameters():
                p.to_local().add_(1.0)  # unlike the saved weights until loaded
        fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
        ckpt.load(remote, name, fresh, fresh_opt, None)
        same = all(torch.equal(a.to_local(), b.to_local()) for a, b in zip(model.parameters(), fresh.parameters(),
                                                                            strict=True))
        moments = [(s["exp_avg"].to_local(), fresh_opt.state[q]["exp_avg"].to_local())
                   for (p, s), q in zip(opt.state.items(), fresh.parameters(), strict=True)]
        same_moments = bool(moments) and all(torch.equal(a, b) for a, b in moments)
        torch.save({"fetched": fetched, "same": same, "same_moments": same_moments},
                   os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_each_rank_fetches_only_its_share_of_a_checkpoint_from_object_storage(demo_assets, tmp_path):
    """Two gloo ranks (DCP's planner and the shard files need a real 2-rank world): each resumes bit-exactly
    from a copy holding the metadata, the train state, its own RNG file and only the shard files it reads."""
    mp.start_processes(_share_worker, args=(2, free_port(), str(demo_assets["model"]), str(tmp_path)),
                       nprocs=2, join=True, start_method="spawn")
    from trainer.run_folder import checkpoint as ckpt

    folder = tmp_path / "run" / ckpt.dir_name(1)
    saved = {p.relative_to(folder).as_posix(): p.stat().st_size for p in folder.rglob("*") if p.is_file()}
    shards = nonempty(sorted(f for f in saved if f.endswith(".distcp")), "shard files")
    assert len(shards) == 2 and min(saved[f] for f in shards) > 100_000, saved
    for r in (0, 1):
        res = torch.load(tmp_path / f"rank{r}.pt")
        fetched = res["fetched"]
        assert res["same"] and res["same_moments"], r  # the weights and AdamW moments, bit for bit
        assert f"rng/rank_{r}.pt" in fetched and f"rng/rank_{1 - r}.pt" not in fetched
        assert {".metadata", ckpt.MARKER, ckpt.TRAIN_STATE} <= set(fetched)
        own, other = f"__{r}_0.distcp", f"__{1 - r}_0.distcp"
        assert fetched[own] >= saved[own] * 0.9, (r, fetched, saved)  # its shards: (about) all of its own file
        # of the other rank's file at most the few blocks of values DCP wrote once for both
        assert fetched.get(other, 0) <= saved[other] * 0.1, (r, fetched, saved)
