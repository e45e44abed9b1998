"""TensorBoard reads a run folder on s3:// (docs/training.md's `tensorboard --logdir s3://...`), against moto's S3.

Without TensorFlow, TensorBoard's file layer reads s3:// with boto3 (in requirements-trainer.txt);
its fast Rust loader handles only local and gs:// folders, so for s3:// it uses this Python
loader, the one tested here. S3_ENDPOINT points it at the test server, as it would at any
S3-compatible endpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from trainer.loop.metrics import MetricsWriter
from trainer.storage import Storage

from .test_s3_storage import BUCKET, KEY, REGION, SECRET, s3  # noqa: F401 - the moto S3 server fixture


def test_tensorboard_loads_the_scalars_of_a_run_folder_on_s3(s3, tmp_path):  # noqa: F811
    w = MetricsWriter(tmp_path / "run", enabled=True, start_step=0, total_steps=2, progress=False)
    for step in (1, 2):
        w.log({"step": step, "loss": 3.0 - step, "tokens_per_s": 100.0 * step})
    w.close()
    Storage.from_uri(f"s3://{BUCKET}/runs/tb-run", fs=s3.filesystem()).upload_dir(tmp_path / "run" / "tensorboard",
                                                                                  "tensorboard")
    env = {**os.environ, "S3_ENDPOINT": f"http://{s3.endpoint}", "AWS_ACCESS_KEY_ID": KEY,
           "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_REGION": REGION}
    # a fresh process, as `tensorboard --logdir` is: TensorBoard reads S3_ENDPOINT when it is imported
    proc = subprocess.run([sys.executable, "-c", READ, f"s3://{BUCKET}/runs/tb-run"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout) == {"train/loss": [[1, 2.0], [2, 1.0]], "train/tokens_per_s": [[1, 100.0],
                                                                                                  [2, 200.0]]}


READ = """
import json, sys
from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer
mux = EventMultiplexer().AddRunsFromDirectory(sys.argv[1])
mux.Reload()
(run,) = mux.Runs()
print(json.dumps({tag: [[e.step, e.value] for e in mux.Scalars(run, tag)] for tag in sorted(mux.Runs()[run]["scalars"])}))
"""
