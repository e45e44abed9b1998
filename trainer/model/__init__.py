"""The model.

parts: what FSDP2 groups; sources: where a model and tokenizer come from; weights: reading a
checkpoint shard by shard; sharding: FSDP2 groups; build: meta build, shard, load; losses;
flops: FLOPs per token and MFU; errors: why a model cannot be used.
"""
