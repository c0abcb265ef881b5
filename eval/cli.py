"""Command-line entry for the evaluation tools: a user error prints ``error: <message>`` and exits with code 2,
without a traceback (``HYDRA_FULL_ERROR=1`` shows it, as for train.py)."""

from __future__ import annotations

import os
import sys


def user_errors() -> tuple[type[BaseException], ...]:
    """A bad argument or input file, and a checkpoint that does not load (when the checkpoint code is loaded)."""
    errors: list[type[BaseException]] = [ValueError, FileNotFoundError, FileExistsError]
    checkpoint = sys.modules.get("forgetting_transformer.training.checkpoint")
    if checkpoint is not None:
        errors.append(checkpoint.CheckpointError)
    return tuple(errors)


def run_cli(main, argv=None):
    try:
        return main(argv)
    except Exception as e:
        if not isinstance(e, user_errors()) or os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
