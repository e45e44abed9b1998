"""What each Ray worker runs.

run: the loop, top to bottom; step: one optimizer step; parallel: sharding plan, mesh and
collectives; memory: the micro-batch that fits; optim: AdamW and the schedule; monitor and
metrics: what is logged; checkpointer: when checkpoints are saved and reported to Ray.
"""
