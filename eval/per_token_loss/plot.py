"""Plot per-token loss L(i) curves from the JSON files ``run.py`` (or train.py) writes; no model needed.

    python -m eval.per_token_loss.plot RESULT.json [RESULT.json ...] --out per_token_loss.png [--window 101]

The plot and its averages live in ``forgetting_transformer.plotting``, which training uses too.
"""

from __future__ import annotations

import argparse

from forgetting_transformer.plotting import cumulative_average, moving_average, plot_per_token_loss

__all__ = ["cumulative_average", "moving_average", "plot_per_token_loss", "main"]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="+", help="per-token-loss JSON files")
    p.add_argument("--out", required=True, help="output PNG")
    p.add_argument("--window", type=int, default=101)
    p.add_argument("--logx", action="store_true")
    a = p.parse_args(argv)
    print(plot_per_token_loss(a.results, a.out, window=a.window, logx=a.logx))


if __name__ == "__main__":
    from eval.cli import run_cli

    run_cli(main)
