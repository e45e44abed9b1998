"""The composition root: the stack's configuration, the Pulumi program that composes infra and workloads
from it, the offline harness that runs the program under mocks, and the offline plan.

infra (AWS) and workloads (Kubernetes) never import each other; this package turns the one
StackConfig into each component's explicit arguments.
"""
