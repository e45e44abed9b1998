"""Pulumi entry point: `pulumi up` runs this file."""
from infra.program import main

main()
