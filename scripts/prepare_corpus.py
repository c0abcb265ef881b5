#!/usr/bin/env python
"""Convert raw text into a LongCrawl64-format data directory (train.zarr, heldout.zarr,
tokenizer.json, meta.json) usable as ``data.data_dir``.

Examples (from the repo root):
    python scripts/prepare_corpus.py embedded --out data/gutenberg_sample
    python scripts/prepare_corpus.py books/ more.jsonl.xz --out data/mine --vocab-size 8192
    python scripts/prepare_corpus.py corpus.jsonl --out data/gpt2 --tokenizer gpt2 --doc-len 8192
    python scripts/prepare_corpus.py train-00.jsonl.xz --heldout validation.jsonl.xz --out data/books
    python scripts/prepare_corpus.py web.jsonl --out data/lc64_style --tokenizer gpt2 --text-escape json

The build is idempotent: rerunning with the same settings and unchanged inputs returns at
once; changed settings rebuild into a temporary directory that is renamed into place.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from forgetting_transformer.data.prepare import (
    EMBEDDED_CORPUS,
    ensure_prepared,
    format_summary,
    unigram_entropy,
)
from forgetting_transformer.data.tokenizer import TEXT_ESCAPES


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inputs", nargs="*", metavar="INPUT",
                   help=".txt files (one document each), .jsonl/.jsonl.xz/.jsonl.gz (one document "
                        "per line), directories (searched recursively), or the word 'embedded' "
                        f"for the bundled 20-book Gutenberg sample ({EMBEDDED_CORPUS.name})")
    p.add_argument("--out", required=True, help="output data directory (becomes data.data_dir)")
    p.add_argument("--tokenizer", default="train-bpe",
                   help="'train-bpe' (train a byte-level BPE on the train split; default), 'gpt2' "
                        "(download the GPT-2 tokenizer), or a path to a tokenizer.json / its directory")
    p.add_argument("--vocab-size", type=int, default=4096, help="BPE vocab size for train-bpe (default 4096)")
    p.add_argument("--doc-len", type=int, default=2048, help="tokens per row (default 2048)")
    p.add_argument("--min-doc-tokens", type=int, default=None,
                   help="drop documents with fewer tokens (default: doc-len)")
    p.add_argument("--heldout-docs", type=int, default=2,
                   help="documents held out (after a seeded shuffle) for heldout.zarr (default 2)")
    p.add_argument("--heldout", nargs="+", default=None, metavar="FILE",
                   help="files or directories whose documents form heldout.zarr (then every INPUT is train "
                        "and --heldout-docs is unused): a split fixed in advance, e.g. by author")
    p.add_argument("--text-key", default="text", help="JSON field holding the text (default 'text')")
    p.add_argument("--no-strip-gutenberg", action="store_true",
                   help="keep Project Gutenberg header/footer (default strips them)")
    p.add_argument("--max-docs", type=int, default=None, help="use only the first N documents")
    p.add_argument("--hf-dataset", default=None,
                   help="also stream documents from this Hugging Face dataset (needs `pip install datasets`)")
    p.add_argument("--hf-split", default="train", help="split for --hf-dataset (default 'train')")
    p.add_argument("--text-escape", choices=TEXT_ESCAPES, default="none",
                   help="escape each document before tokenizing: 'json' tokenizes json.dumps(text)[1:-1], as "
                        "LongCrawl64 was (train with data.text_escape=json); default 'none'")
    p.add_argument("--seed", type=int, default=0, help="seed of the document shuffle (default 0)")
    p.add_argument("--force", action="store_true", help="rebuild even if up to date")
    p.add_argument("--quiet", action="store_true",
                   help="no progress lines on stderr (they come every 10 s; FOX_PROGRESS_SECONDS sets the interval)")
    a = p.parse_args(argv)

    inputs = [EMBEDDED_CORPUS if x == "embedded" else Path(x) for x in a.inputs]
    if not inputs and not a.hf_dataset:
        p.error("give at least one INPUT (or 'embedded', or --hf-dataset NAME)")
    try:
        out = ensure_prepared(
            a.out, inputs=inputs, tokenizer=a.tokenizer, vocab_size=a.vocab_size, doc_len=a.doc_len,
            min_doc_tokens=a.min_doc_tokens, heldout_docs=a.heldout_docs, text_key=a.text_key,
            strip_gutenberg=not a.no_strip_gutenberg, max_docs=a.max_docs, hf_dataset=a.hf_dataset,
            hf_split=a.hf_split, seed=a.seed, heldout_inputs=a.heldout, text_escape=a.text_escape,
            progress=not a.quiet, force=a.force,
            summary=False,  # printed below, on stdout, whether built now or found up to date
        )
    except (FileNotFoundError, FileExistsError, ValueError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    meta = json.loads((Path(out) / "meta.json").read_text(encoding="utf-8"))
    print(format_summary(meta, out))
    print(f"  unigram entropy of train tokens: {unigram_entropy(out, 'train'):.4f} nats/token")
    return 0


if __name__ == "__main__":
    sys.exit(main())
