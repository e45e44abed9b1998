"""What a run leaves in its folder: sharded checkpoints (checkpoint), the run record (record), the exported model (export), and what a folder may resume with (resume)."""
