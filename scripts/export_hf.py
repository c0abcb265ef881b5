"""Export a training run as a Hugging Face model directory (config.json, model.safetensors, tokenizer).

    python scripts/export_hf.py RUN_DIR OUT_DIR [--step N] [--tokenizer PATH]

The tokenizer is the run's ``data_dir/tokenizer.json`` (written by forgetting_transformer.data.prepare) unless
``--tokenizer`` names a tokenizer.json or a Hugging Face tokenizer directory (needed for data dirs without one,
e.g. GPT-2-tokenised LongCrawl64). The token with id ``data.bos_id`` becomes bos, eos and pad, and the tokenizer
prepends bos to every text, as the training data reader does. Load with::

    import forgetting_transformer.models.hf  # registers the model type with the Auto classes
    model = AutoModelForCausalLM.from_pretrained(OUT_DIR); tokenizer = AutoTokenizer.from_pretrained(OUT_DIR)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def load_tokenizer(path: Path, bos_id: int, vocab_size: int):
    """A ``PreTrainedTokenizerFast`` from a tokenizer.json or HF tokenizer dir, with bos = eos = pad = the token
    ``bos_id``, bos prepended to each text, left padding (what ``generate`` needs)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if path.is_dir():
        base = AutoTokenizer.from_pretrained(str(path))
        token = base.convert_ids_to_tokens(bos_id)
        tok = PreTrainedTokenizerFast(tokenizer_object=base.backend_tokenizer, bos_token=token, eos_token=token,
                                      pad_token=token, add_bos_token=True, padding_side="left")
    elif path.is_file():
        from tokenizers import Tokenizer

        token = Tokenizer.from_file(str(path)).id_to_token(bos_id)
        if token is None:
            raise ValueError(f"{path} has no token with id data.bos_id={bos_id}")
        tok = PreTrainedTokenizerFast(tokenizer_file=str(path), bos_token=token, eos_token=token, pad_token=token,
                                      add_bos_token=True, padding_side="left")
    else:
        raise FileNotFoundError(f"tokenizer {path} not found")
    if len(tok) > vocab_size:
        raise ValueError(f"tokenizer {path} has {len(tok)} tokens but the model only {vocab_size}")
    return tok


def export(run_dir, out_dir, *, step: int | None = None, tokenizer: str | Path | None = None) -> Path:
    """Write ``out_dir`` (config, safetensors weights, generation config, tokenizer); return it."""
    from eval.common import load_run
    from forgetting_transformer.models.hf import FoXConfig, FoXForCausalLM

    model, cfg, ckpt = load_run(run_dir, step=step)
    tok_path = Path(tokenizer) if tokenizer is not None else Path(cfg.data.data_dir) / "tokenizer.json"
    if tokenizer is None and not tok_path.is_file():
        raise FileNotFoundError(
            f"the run's data dir has no tokenizer.json ({tok_path}; e.g. GPT-2 LongCrawl64): pass --tokenizer PATH "
            f"(a tokenizer.json or a Hugging Face tokenizer directory, e.g. a local copy of gpt2)")
    bos = int(cfg.data.bos_id)
    tok = load_tokenizer(tok_path, bos, int(cfg.model.vocab_size))

    hf = FoXForCausalLM(FoXConfig.from_model_config(cfg.model))
    hf.model.load_state_dict(model.state_dict())  # strict: the parameter names map 1:1
    hf.generation_config.bos_token_id = hf.generation_config.eos_token_id = bos
    hf.generation_config.pad_token_id = bos
    out_dir = Path(out_dir)
    hf.eval().save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    print(f"exported {ckpt} ({cfg.model.name}) with tokenizer {tok_path} to {out_dir}")
    return out_dir


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir")
    p.add_argument("out_dir")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer.json or HF tokenizer dir (default: the run's data_dir/tokenizer.json)")
    args = p.parse_args(argv)
    export(args.run_dir, args.out_dir, step=args.step, tokenizer=args.tokenizer)


if __name__ == "__main__":
    main()
