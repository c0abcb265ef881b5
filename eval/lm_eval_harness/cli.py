"""lm-eval's own command line with the ``fox`` model registered (lm-eval 0.4.x has no plugin entry point for
models, so ``lm-eval run --model fox`` alone does not know it):

    python -m eval.lm_eval_harness.cli run --model fox --model_args path=outputs/run_a,batch_size=16 \
        --tasks piqa,hellaswag --num_fewshot 0 --output_path results/lm_eval_raw [--include_path DIR]

Every argument is lm-eval's (``python -m eval.lm_eval_harness.cli run --help``).
"""

import eval.lm_eval_harness.model  # noqa: F401  (registers "fox")
from lm_eval.__main__ import cli_evaluate

if __name__ == "__main__":
    cli_evaluate()
