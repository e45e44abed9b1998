"""Starting a run from the user's machine: the pre-flight and the TorchTrainer (launch), the cluster check (cluster), the local demo (local), `trainer data` (datacheck)."""
