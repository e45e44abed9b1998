"""What each Ray worker runs: the loop (run), one step (step), parallelism (parallel), memory fit (memory), optimizer (optim), monitoring (monitor, metrics), checkpoint cadence (checkpointer)."""
