"""Plot per-token loss L(i) curves from the JSON files ``run.py`` (or train.py) writes; no model needed.

    python -m eval.per_token_loss.plot RESULT.json [RESULT.json ...] --out per_token_loss.png [--window 101]
        [--label NAME ...]

The legend names each curve by its model; where two files hold the same model (two runs of it), their runs' names
are added (the run dir of train.py's ``per_token_loss.json``, else the file's name). ``--label``, once per file and
in their order, names the curves instead. Two identical labels are refused. The plot and its averages live in
``forgetting_transformer.plotting``, which training uses too.
"""

from __future__ import annotations

import argparse

from forgetting_transformer.plotting import cumulative_average, curve_labels, moving_average, plot_per_token_loss

__all__ = ["cumulative_average", "curve_labels", "moving_average", "plot_per_token_loss", "main"]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="+", help="per-token-loss JSON files")
    p.add_argument("--out", required=True, help="output PNG")
    p.add_argument("--window", type=int, default=101)
    p.add_argument("--logx", action="store_true")
    p.add_argument("--label", action="append", default=None, metavar="NAME",
                   help="legend label of the next file, once per file in their order (default: the model's name, "
                        "and the run's where two files share it)")
    a = p.parse_args(argv)
    print(plot_per_token_loss(a.results, a.out, window=a.window, logx=a.logx, labels=a.label))


if __name__ == "__main__":
    from eval.cli import run_cli

    run_cli(main)
