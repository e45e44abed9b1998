"""Facts every side of the project shares: infra, workloads, the trainer and the policy pack import them.

Standard library only: the trainer runs this package inside the DLC image, the Pulumi program in
its own virtualenv and the policy pack in another, so nothing here may need more than Python.
One module per kind of fact; nothing outside this package keeps a copy of any of them.
"""
