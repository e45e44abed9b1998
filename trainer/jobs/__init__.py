"""Starting a run from the user's machine or the driver.

launch: the pre-flight, the TorchTrainer and its retries (`trainer train`); cluster: reachable
and large enough; local: the local demo (`trainer local`); datacheck: `trainer data`.
"""
