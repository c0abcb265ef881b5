#!/usr/bin/env python
"""Convert a released FoX checkpoint (the official code's Hugging Face format) into this code's format, or back.

    python scripts/convert_official.py SRC --out DIR [--tokenizer PATH] [--dtype float32]
    python scripts/convert_official.py --to-official RUN_OR_HF_DIR --out DIR

SRC is a local directory holding ``config.json`` and ``model.safetensors`` (or shards with an index), as
downloaded from the hub, or a hub id (``zhixuan-lin/fox-pro-760m-longcrawl64-48b``), downloaded when the machine
is online. DIR is a ``FoXForCausalLM`` directory (config, weights, generation config, tokenizer) that every
evaluation and ``AutoModelForCausalLM.from_pretrained`` (after ``import forgetting_transformer.hf``) loads.

The conversion is strict: every config key must be known (``forgetting_transformer.models.official``), every
tensor used once with the shape the config implies; a setting the decoder cannot compute exactly is refused by
name. The tokenizer is SRC's (the released models ship GPT-2's, ``JSONGPT2Tokenizer``: LongCrawl64's JSON-escaped
text), or ``--tokenizer``; its ``<|endoftext|>`` becomes bos, eos and pad (LongCrawl64's rows start with it).
``--to-official`` writes a run or export of this code in the official format (config.json + model.safetensors).
docs/official.md has the whole walk-through.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
WEIGHT_PATTERNS = ["config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
                   "tokenizer*", "vocab.json", "merges.txt", "special_tokens_map.json"]
DTYPES = ("source", "float32", "bfloat16", "float16")
EOT = "<|endoftext|>"


class ConvertError(Exception):
    """A user error: printed as one line."""


def fetch(src: str, cache_dir: Path | None) -> Path:
    """A local directory as is; a hub id downloaded (config, weights, tokenizer files) into the hub cache."""
    path = Path(src)
    if path.is_dir():
        return path
    if not HUB_ID.match(src):
        raise ConvertError(f"{src}: no such directory, and not a hub id of the form owner/name")
    try:
        from huggingface_hub import snapshot_download
    except ImportError as e:
        raise ConvertError(f"{src}: downloading needs huggingface_hub ({e}); or pass a local directory") from None
    try:
        return Path(snapshot_download(src, allow_patterns=WEIGHT_PATTERNS, cache_dir=cache_dir))
    except Exception as e:  # offline, unknown repo, gated: the hub's own message says which
        raise ConvertError(f"{src}: could not download it ({type(e).__name__}: {str(e).splitlines()[0]}); on a "
                           f"machine without network access, download the directory elsewhere and pass its path"
                           ) from None


def read_tensors(src: Path) -> dict:
    """Every tensor of ``model.safetensors`` or of the shards an index names (official names)."""
    from safetensors.torch import load_file

    index = src / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (src / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise ConvertError(f"{src}: no model.safetensors (nor model.safetensors.index.json); the released "
                           f"checkpoints are safetensors files")
    tensors = {}
    for name in files:
        if not (src / name).is_file():
            raise ConvertError(f"{src / name}: missing (named by {index.name})")
        tensors.update(load_file(str(src / name)))
    return tensors


def read_config(src: Path) -> dict:
    f = src / "config.json"
    if not f.is_file():
        raise ConvertError(f"{src}: no config.json")
    try:
        return json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise ConvertError(f"{f}: not valid JSON ({e})") from None


def _dtype(name: str, tensors: dict):
    import torch

    if name == "source":
        dtypes = {t.dtype for t in tensors.values() if t.is_floating_point()}
        return dtypes.pop() if len(dtypes) == 1 else torch.float32
    return getattr(torch, name)


def convert(src: str, out: Path, *, tokenizer: str | None = None, text_escape: str = "auto", dtype: str = "source",
            bos_id: int | None = None, no_tokenizer: bool = False, overwrite: bool = False,
            cache_dir: Path | None = None) -> Path:
    """The official checkpoint ``src`` → a ``FoXForCausalLM`` directory ``out``; returns ``out``."""
    from forgetting_transformer.hf import FoXConfig, FoXForCausalLM, written_whole
    from forgetting_transformer.models.official import decoder_settings, decoder_state_dict

    path = fetch(src, cache_dir)
    config, tensors = read_config(path), read_tensors(path)
    settings = decoder_settings(config, tensors)
    state = decoder_state_dict(tensors, settings)
    bos = bos_id if bos_id is not None else config.get("bos_token_id")
    tok = None
    if not no_tokenizer:
        tok, bos = official_tokenizer(path, tokenizer, text_escape, settings["vocab_size"], bos)
    model = FoXForCausalLM(FoXConfig(**settings, bos_token_id=bos, eos_token_id=bos, pad_token_id=bos))
    model = model.to(_dtype(dtype, tensors))
    model.model.load_state_dict(state, strict=True)
    gc = model.generation_config
    gc.bos_token_id = gc.eos_token_id = gc.pad_token_id = bos
    with written_whole(out, overwrite) as tmp:
        model.eval().save_pretrained(tmp)
        if tok is not None:
            tok.save_pretrained(str(tmp))
        (tmp / "conversion.json").write_text(json.dumps(
            {"source": src, "model_type": config["model_type"], "name": settings["name"], "bos_id": bos,
             "dtype": str(next(model.parameters()).dtype),
             "tokenizer": tokenizer or ("none" if tok is None else "src"),
             "text_escape": None if tok is None else tok.text_escape}, indent=1) + "\n")
    return out


def official_tokenizer(path: Path, tokenizer: str | None, text_escape: str, vocab_size: int, bos: int | None):
    """The released tokenizer (SRC's files, or ``--tokenizer``) as this code's tokenizer with its escape mode:
    ``auto`` is ``json`` for the official ``JSONGPT2Tokenizer`` (LongCrawl64), else ``none``."""
    from forgetting_transformer.hf.tokenizer import fox_tokenizer

    where = Path(tokenizer) if tokenizer else path
    if text_escape == "auto":
        tok_cfg = where / "tokenizer_config.json"
        cls = json.loads(tok_cfg.read_text()).get("tokenizer_class") if tok_cfg.is_file() else None
        text_escape = "json" if cls == "JSONGPT2Tokenizer" else "none"
    backend = _backend(where)
    if backend.get_vocab_size() > vocab_size:
        raise ConvertError(f"tokenizer {where} has {backend.get_vocab_size()} tokens but the model only "
                           f"vocab_size={vocab_size}")
    if bos is None:
        bos = backend.token_to_id(EOT)
        if bos is None:
            raise ConvertError(f"tokenizer {where} has no {EOT} token and config.json no bos_token_id: pass --bos-id")
    return fox_tokenizer(backend, bos_id=bos, text_escape=text_escape), bos


def _backend(where: Path):
    """A ``tokenizers.Tokenizer`` from a tokenizer.json, or from GPT-2's vocab.json + merges.txt (what the official
    ``JSONGPT2Tokenizer``, a slow GPT-2 tokenizer, saves)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    if where.is_file():
        return Tokenizer.from_file(str(where))
    if (where / "tokenizer.json").is_file():
        return Tokenizer.from_file(str(where / "tokenizer.json"))
    vocab, merges = where / "vocab.json", where / "merges.txt"
    if not (vocab.is_file() and merges.is_file()):
        raise ConvertError(f"{where}: no tokenizer files (tokenizer.json, or vocab.json + merges.txt); pass "
                           f"--tokenizer PATH (e.g. a local copy of GPT-2's tokenizer) or --no-tokenizer")
    tok = Tokenizer(models.BPE.from_file(str(vocab), str(merges)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    if tok.token_to_id(EOT) is not None:  # GPT-2's only special token: one id, never split
        tok.add_special_tokens([EOT])
    return tok


def to_official(src: str, out: Path, *, overwrite: bool = False) -> Path:
    """A run directory or a ``FoXForCausalLM`` directory of this code → the official format in ``out`` (with the
    source's tokenizer files when it has any)."""
    from safetensors.torch import save_file

    from forgetting_transformer.hf import written_whole
    from forgetting_transformer.models.official import official_config, official_state_dict

    model, tok = _load_ours(Path(src))
    settings = vars(model.config.to_model_config())
    config = {**official_config(settings), "torch_dtype": str(next(model.parameters()).dtype).split(".")[-1],
              "bos_token_id": model.config.bos_token_id, "eos_token_id": model.config.eos_token_id}
    tensors = official_state_dict(model.model.state_dict(), settings)
    with written_whole(out, overwrite) as tmp:
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        if tok is not None:
            tok.save_pretrained(tmp)
    return out


def _load_ours(src: Path):
    """(FoXForCausalLM, tokenizer or None) of a run directory or of a directory this code wrote."""
    from eval.common import load_model_and_tokenizer, load_run, to_hf

    if (src / "config.yaml").is_file() or any((src / f).is_file() for f in ("tokenizer.json", "vocab.json")):
        try:
            model, tok, _ = load_model_and_tokenizer(src)
            return model, tok
        except FileNotFoundError:  # a run whose data dir has no tokenizer (e.g. GPT-2 LongCrawl64)
            if not (src / "config.yaml").is_file():
                raise
            model, cfg, _ = load_run(src)
            return to_hf(model, cfg), None
    if not (src / "config.json").is_file():
        raise ConvertError(f"{src}: neither a training run (config.yaml) nor a directory written by this code "
                           f"(config.json)")
    import forgetting_transformer.hf  # noqa: F401  (registers the Auto classes)
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(src)).eval(), None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", help="a released checkpoint: local directory or hub id (with --to-official: a run "
                   "directory or a directory written by this code)")
    p.add_argument("--out", type=Path, required=True, help="the directory to write (absent or empty)")
    p.add_argument("--to-official", action="store_true", help="write SRC (this code's) in the official format")
    p.add_argument("--tokenizer", default=None, help="a tokenizer.json or tokenizer directory (default: SRC's)")
    p.add_argument("--text-escape", choices=("auto", "json", "none"), default="auto",
                   help="the tokenizer's text escape (auto: json for the official JSONGPT2Tokenizer, LongCrawl64)")
    p.add_argument("--no-tokenizer", action="store_true", help="write no tokenizer (the text evaluations need one)")
    p.add_argument("--bos-id", type=int, default=None, help="bos/eos/pad id (default: config's, else <|endoftext|>)")
    p.add_argument("--dtype", choices=DTYPES, default="source", help="weights dtype (default: the checkpoint's)")
    p.add_argument("--cache-dir", type=Path, default=None, help="hub download cache (default: the hub's)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    a = p.parse_args(argv)
    from forgetting_transformer.models.official import OfficialFormatError

    try:
        if a.to_official:
            out = to_official(a.src, a.out, overwrite=a.overwrite)
        else:
            out = convert(a.src, a.out, tokenizer=a.tokenizer, text_escape=a.text_escape, dtype=a.dtype,
                          bos_id=a.bos_id, no_tokenizer=a.no_tokenizer, overwrite=a.overwrite, cache_dir=a.cache_dir)
    except (ConvertError, OfficialFormatError, FileNotFoundError, FileExistsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.to_official:
        print(f"wrote {out} (official format)")
    else:
        info = json.loads((out / "conversion.json").read_text())
        print(f"wrote {out}: {info['name']} ({info['model_type']}), {info['dtype']}, tokenizer text_escape="
              f"{info['text_escape']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
