"""The stack's outputs offline, as `pulumi stack output --json` prints them, from Pulumi.<stack>.yaml under mocks.

    python -m deploy.stack_outputs --stack dev

What `trainer submit --rayjob --dry-run` builds its RayJob from, without AWS or the Pulumi CLI: the
same program as `python -m deploy.plan`, so the RayJob's cluster spec is the one `pulumi up` would export
(IDs, the bucket's name and the image digest are placeholders). The kubeconfig is left out.
"""
from __future__ import annotations

import argparse
import json
import sys

from deploy import config as stack_config
from deploy import offline, stack_file
from deploy.config import ConfigError
from deploy.plan import stack_path
from facts import errors
from facts import outputs as names


def outputs(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.stack_outputs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--stack", default="dev", help="reads Pulumi.<stack>.yaml (default: dev)")
    args = parser.parse_args(argv)
    stack = stack_file.read(stack_path(args.stack))
    try:
        stack_config.load(stack.config, stack=args.stack)
    except ConfigError as err:
        raise ConfigError([stack_file.locate(p, stack) for p in err.problems]) from None
    result = offline.run(stack.config, stack=args.stack)
    shown = {k: offline.plain(v) for k, v in result.outputs.items() if k not in names.SECRET}
    print(json.dumps(shown, indent=2, sort_keys=True, default=str))
    return 0


def main(argv: list[str] | None = None) -> int:
    return errors.run(outputs, argv)


if __name__ == "__main__":
    sys.exit(main())
