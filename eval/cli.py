"""Command-line entry for the evaluation tools: a user error prints ``error: <message>`` and exits with code 2,
without a traceback (``HYDRA_FULL_ERROR=1`` shows it, as for train.py)."""

from __future__ import annotations

import argparse
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


def parse_list(text: str, flag: str, kind, ok, rule: str, *, unique: bool = False) -> list:
    """Comma-separated values of ``kind`` (int or float, or a parser raising ValueError) inside ``rule`` (``ok`` says
    which; ``unique``: none twice); else a ValueError naming ``flag`` and the value."""
    values = []
    for item in (i.strip() for i in text.split(",")):
        try:
            value = kind(item)
        except ValueError:
            raise ValueError(f"{flag}: {item!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not ok(value):
            raise ValueError(f"{flag}: {item} is outside {rule}")
        if unique and value in values:
            raise ValueError(f"{flag}: {item} is listed twice")
        values.append(value)
    return values


def positive_int(text: str) -> int:
    """An argparse ``type``: an integer >= 1 (argparse names the flag in its error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1; got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1; got {value}")
    return value


def add_generation_args(parser: argparse.ArgumentParser) -> None:
    """The batched-generation flags of the generation-based evaluations (``eval.common.GenerationOptions``)."""
    g = parser.add_argument_group("batched generation (greedy; the same outputs as one prompt at a time)")
    g.add_argument("--batch-size", type=positive_int, default=8,
                   help="prompts per generate() call, grouped by length (default 8; 1: one at a time)")
    g.add_argument("--max-batch-tokens", type=positive_int, default=None,
                   help="cap on a group's padded prompt tokens (prompts x its longest); default: no cap")
    g.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                   help="model weights (default auto: bfloat16 on CUDA, float32 elsewhere)")
    g.add_argument("--prefill-chunk", type=positive_int, default=None,
                   help="prompt tokens per prefill forward (default: 4096 for Transformers, the whole prompt "
                        "for FoX)")
    g.add_argument("--acp-eviction", action=argparse.BooleanOptionalAction, default=None,
                   help="drop cached keys the forget gates decayed below ACP's threshold (FoX with QK-norm; "
                        "default: the model config's acp_eviction)")
    g.add_argument("--compile-step", action=argparse.BooleanOptionalAction, default=False,
                   help="torch.compile the decoding step (tens of seconds once per process for a slightly faster "
                        "step; worth it for long generations; default off)")
    g.add_argument("--autotune", action=argparse.BooleanOptionalAction, default=False,
                   help="autotune the attention kernel in the prefill (tens of seconds per process for each new "
                        "shape of left-padded prompts, measured no faster afterwards; default off: the "
                        "kernel's fixed configs)")
