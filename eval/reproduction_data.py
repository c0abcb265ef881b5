"""The reproduction suite's data (scripts/reproduce.py): the book shards tokenized into the zarr layout, their record
in the results directory, and the held-out texts the evaluations read.

One tokenizer serves every shard set of a results directory (``OUT/tokenizer.json``, trained on the first call's
train shards and kept), so every run scores the same held-out tokens. The suite's shards are recorded in
``OUT/data.json``; another set (the ``long`` part's six shards) in ``OUT/data-<n>-shards.json``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def prepare_data(corpus: Path, shards: list[str], data_dir: Path, out: Path, work: Path, *, vocab_size: int,
                 doc_len: int, record_name: str = "data.json") -> dict:
    """Tokenize the shards into ``data_dir`` (idempotent), keep the tokenizer in ``out`` and the data's record in
    ``out / record_name``, and write the held-out texts the evaluations read: one book for the gate analysis,
    several joined as the needle-in-a-haystack haystack. A record of other shards or another tokenizer already
    there is an error: results of two corpora would mix."""
    from forgetting_transformer.data.prepare import ensure_prepared, iter_documents, strip_gutenberg_boilerplate

    train = [corpus / f"{s}.jsonl.xz" for s in shards]
    heldout = corpus / "validation.jsonl.xz"
    for f in [*train, heldout]:
        if not f.is_file():
            raise SystemExit(f"--corpus {corpus}: {f.name} not found (expected the book shards and validation file)")
    kept_tok = out / "tokenizer.json"
    tokenizer = str(kept_tok) if kept_tok.is_file() else "train-bpe"
    ensure_prepared(data_dir, inputs=train, heldout_inputs=[heldout], tokenizer=tokenizer, vocab_size=vocab_size,
                    doc_len=doc_len)
    out.mkdir(parents=True, exist_ok=True)
    if not kept_tok.is_file():
        shutil.copyfile(data_dir / "tokenizer.json", kept_tok)
    meta = json.loads((data_dir / "meta.json").read_text())
    record = {"shards": {f.name: sha256(f) for f in [*train, heldout]}, "tokenizer_sha256": sha256(kept_tok),
              "vocab_size": meta["vocab_size"], "bos_id": meta["bos_id"], "doc_len": meta["doc_len"],
              "train": meta["stats"]["train"], "heldout": meta["stats"]["heldout"]}
    data_json = out / record_name
    if data_json.is_file():
        before = json.loads(data_json.read_text())
        if before["shards"] != record["shards"] or before["tokenizer_sha256"] != record["tokenizer_sha256"]:
            raise SystemExit(f"{data_json} records other shards or another tokenizer than this call's data "
                             f"({sorted(before['shards'])} vs {sorted(record['shards'])}): results of two corpora "
                             "would mix; pass another --out")
    data_json.write_text(json.dumps(record, indent=1) + "\n")
    work.mkdir(parents=True, exist_ok=True)
    books = [strip_gutenberg_boilerplate(t) for _, t in iter_documents([heldout])]
    (work / "heldout_book.txt").write_text(books[0], encoding="utf-8")
    (work / "haystack.txt").write_text("\n\n".join(books[1:6]), encoding="utf-8")
    return record
