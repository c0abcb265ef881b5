"""Export a training run as a Hugging Face model directory (config.json, model.safetensors, tokenizer).

    python scripts/export_hf.py RUN_DIR OUT_DIR [--step N] [--tokenizer PATH] [--overwrite]

The tokenizer is the run's ``data_dir/tokenizer.json`` (written by forgetting_transformer.data.prepare) unless
``--tokenizer`` names a tokenizer.json or a Hugging Face tokenizer directory (needed for data dirs without one,
e.g. GPT-2-tokenised LongCrawl64). The token with id ``data.bos_id`` becomes bos, eos and pad, and the tokenizer
prepends bos to every text, as the training data reader does. It is a ``FoXTokenizerFast`` that records the run's
``data.text_escape`` in tokenizer_config.json (``json`` for LongCrawl64: texts are JSON-escaped before BPE and
unescaped after decoding). OUT_DIR must be absent or empty unless ``--overwrite``; it is written whole or not at
all (a temporary directory renamed into place). Load with::

    import forgetting_transformer.hf  # registers the model type with the Auto classes
    model = AutoModelForCausalLM.from_pretrained(OUT_DIR); tokenizer = AutoTokenizer.from_pretrained(OUT_DIR)
"""

from __future__ import annotations

import argparse
from pathlib import Path

from eval.cli import positive_int, run_cli


def export(run_dir, out_dir, *, step: int | None = None, tokenizer: str | Path | None = None,
           overwrite: bool = False) -> Path:
    """Write ``out_dir`` (config, safetensors weights, generation config, tokenizer); return it."""
    from eval.common import load_run, run_tokenizer, to_hf
    from forgetting_transformer.hf import written_whole
    from forgetting_transformer.hf.tokenizer import save_tokenizer

    out_dir = Path(out_dir)
    with written_whole(out_dir, overwrite) as tmp:  # a used out_dir is refused before the run loads
        model, cfg, ckpt = load_run(run_dir, step=step)
        tok, tok_path = run_tokenizer(cfg, tokenizer)  # checked against the model before anything is written
        hf = to_hf(model, cfg)
        hf.eval().save_pretrained(tmp)
        save_tokenizer(tok, tmp, bos_id=int(cfg.data.bos_id), text_escape=tok.text_escape)
    print(f"exported {ckpt} ({cfg.model.name}) with tokenizer {tok_path} (text_escape={tok.text_escape}) to {out_dir}")
    return out_dir


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir")
    p.add_argument("out_dir")
    p.add_argument("--step", type=positive_int, default=None, help="checkpoint step (default: the latest)")
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer.json or HF tokenizer dir (default: the run's data_dir/tokenizer.json)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT_DIR")
    args = p.parse_args(argv)
    export(args.run_dir, args.out_dir, step=args.step, tokenizer=args.tokenizer, overwrite=args.overwrite)


if __name__ == "__main__":
    run_cli(main)
