"""Pulumi entry point: `pulumi up` runs this file."""
import pulumi

from deploy.program import main
from facts.errors import UserError

try:
    main()
except UserError as err:  # every problem with its fix, printed by Pulumi without a traceback
    raise pulumi.RunError(str(err)) from None
