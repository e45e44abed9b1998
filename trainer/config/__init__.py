"""The training configuration: the declarations (flags), their TRL/transformers names (trl), where values come from (load)."""
