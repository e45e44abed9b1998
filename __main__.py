"""Pulumi entry point: `pulumi up` runs this file."""
import pulumi

from infra.config import ConfigError
from infra.program import main

try:
    main()
except ConfigError as err:  # every problem with its fix, printed by Pulumi without a traceback
    raise pulumi.RunError(str(err)) from None
