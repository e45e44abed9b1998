"""The model: its parts (parts), where it comes from (sources), reading its weights (weights), sharding (sharding), building (build), its loss (losses) and FLOPs (flops)."""
