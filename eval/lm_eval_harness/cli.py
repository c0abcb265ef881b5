"""lm-eval's own command line with the ``fox`` model registered (lm-eval 0.4.x has no plugin entry point for
models, so ``lm-eval run --model fox`` alone does not know it):

    python -m eval.lm_eval_harness.cli run --model fox --model_args path=outputs/run_a,batch_size=16 \
        --tasks piqa,hellaswag --num_fewshot 0 --output_path results/lm_eval_raw [--include_path DIR]

Every argument is lm-eval's (``python -m eval.lm_eval_harness.cli run --help``). An unknown key of ``fox``'s
model_args and an unknown task name are one ``error:`` line, as in the other evaluations (``eval.cli.run_cli``).
"""

from __future__ import annotations

import sys

from eval.cli import run_cli
from eval.lm_eval_harness.model import FoXLM  # registers "fox"
from eval.lm_eval_harness.run import check_tasks


def main(argv: list[str] | None = None) -> None:
    """lm-eval's ``cli_evaluate`` on ``argv`` (default: the command line). ``fox``'s model_args are checked before
    lm-eval starts; when lm-eval refuses the run, the task names are checked, so that a misspelt one is named with
    the nearest known names."""
    from lm_eval._cli import HarnessCLI
    from lm_eval.utils import setup_logging

    setup_logging()
    cli = HarnessCLI()
    if argv is not None:
        sys.argv[1:] = argv  # HarnessCLI reads sys.argv
    args = cli.parse_args()
    run = getattr(args, "command", None) == "run"
    if run and args.model == "fox":
        FoXLM.checked_model_args(args.model_args or {})
    try:
        cli.execute(args)
    except ValueError:
        if run and args.tasks:
            check_tasks(args.tasks, args.include_path)
        raise


if __name__ == "__main__":
    run_cli(main)
