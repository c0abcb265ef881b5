"""One place that turns a training run directory or a Hugging Face export into model + tokenizer for evaluation.

    load_run(run_dir)                   → (DecoderLM, cfg, checkpoint path)      training checkpoints
    load_model_and_tokenizer(path)      → (FoXForCausalLM, PreTrainedTokenizerFast, info)   run dir or HF dir
"""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import OmegaConf

from forgetting_transformer.models import build_model
from forgetting_transformer.training.checkpoint import checkpoint_dirs, load_model_weights


def load_run(run_dir: str | Path, *, step: int | None = None, device: str | torch.device = "cpu"):
    """Build the run's model from ``run_dir/config.yaml`` and load the weights of checkpoint ``step``
    (default: the latest). Returns ``(model, cfg, checkpoint_path)`` with the model in eval mode."""
    run_dir = Path(run_dir)
    cfg_file = run_dir / "config.yaml"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"{cfg_file} not found: pass a run directory written by train.py")
    cfg = OmegaConf.load(cfg_file)
    ckpts = checkpoint_dirs(run_dir / "checkpoints")
    if step is not None:
        ckpts = [c for c in ckpts if c.name == f"step_{step:08d}"]
    if not ckpts:
        what = f"step {step}" if step is not None else "any checkpoint"
        raise FileNotFoundError(f"no complete checkpoint ({what}) under {run_dir / 'checkpoints'}")
    model = build_model(cfg.model)
    load_model_weights(model, ckpts[-1])
    return model.to(device).eval(), cfg, ckpts[-1]


def load_tokenizer(path: str | Path, bos_id: int, vocab_size: int):
    """A ``PreTrainedTokenizerFast`` from a tokenizer.json or HF tokenizer dir, with bos = eos = pad = the token
    ``bos_id``, bos prepended to each text, left padding (what ``generate`` needs)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    path = Path(path)
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


def run_tokenizer(cfg, tokenizer: str | Path | None = None):
    """The tokenizer of a training run: ``tokenizer`` if given, else the run's ``data_dir/tokenizer.json``.
    Returns ``(tokenizer, path)``."""
    path = Path(tokenizer) if tokenizer is not None else Path(cfg.data.data_dir) / "tokenizer.json"
    if tokenizer is None and not path.is_file():
        raise FileNotFoundError(
            f"the run's data dir has no tokenizer.json ({path}; e.g. GPT-2 LongCrawl64): pass --tokenizer PATH "
            f"(a tokenizer.json or a Hugging Face tokenizer directory, e.g. a local copy of gpt2)")
    return load_tokenizer(path, int(cfg.data.bos_id), int(cfg.model.vocab_size)), path


def to_hf(model, cfg):
    """Wrap a trained ``DecoderLM`` as ``FoXForCausalLM`` (same weights) so evaluations can call ``generate``."""
    from forgetting_transformer.models.hf import FoXConfig, FoXForCausalLM

    if cfg.model.arch != "decoder":
        raise NotImplementedError(
            f"model.arch={cfg.model.arch} ({cfg.model.name}) has no decoding cache: generation-based evaluations "
            "(needle-in-a-haystack, LongBench, LM-eval-harness, Hugging Face export) support the decoder models "
            "only; held-out and per-token loss work for every model")
    hf = FoXForCausalLM(FoXConfig.from_model_config(cfg.model))
    hf.model.load_state_dict(model.state_dict())  # strict: the parameter names map 1:1
    bos = int(cfg.data.bos_id)
    hf.generation_config.bos_token_id = hf.generation_config.eos_token_id = hf.generation_config.pad_token_id = bos
    return hf.to(next(model.parameters()).device).eval()


def load_model_and_tokenizer(path: str | Path, *, step: int | None = None, tokenizer: str | Path | None = None,
                             device: str | torch.device = "cpu"):
    """A run directory written by train.py (``config.yaml`` + checkpoints) or a Hugging Face directory written by
    ``scripts/export_hf.py`` → ``(FoXForCausalLM in eval mode, tokenizer, info)``; ``info`` has ``name``,
    ``train_len`` (None when unknown) and ``source``."""
    path = Path(path)
    if (path / "config.yaml").is_file():
        model, cfg, ckpt = load_run(path, step=step, device=device)
        tok, _ = run_tokenizer(cfg, tokenizer)
        return to_hf(model, cfg), tok, {"name": cfg.model.name, "train_len": int(cfg.data.seq_len), "source": str(ckpt)}
    if (path / "config.json").is_file():
        import forgetting_transformer.models.hf  # noqa: F401  (registers the Auto classes)
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(str(path)).to(device).eval()
        tok = AutoTokenizer.from_pretrained(str(tokenizer or path))
        return model, tok, {"name": model.config.name, "train_len": None, "source": str(path)}
    raise FileNotFoundError(f"{path}: neither a training run (config.yaml) nor a Hugging Face directory (config.json)")


def model_tokenizer_file(path: str | Path) -> Path | None:
    """The tokenizer.json a run dir's model was trained with (its data dir's) or a Hugging Face export ships; None
    when there is none (e.g. GPT-2 LongCrawl64 data)."""
    path = Path(path)
    if (path / "config.yaml").is_file():
        f = Path(OmegaConf.load(path / "config.yaml").data.data_dir) / "tokenizer.json"
    else:
        f = path / "tokenizer.json"
    return f if f.is_file() else None


def check_same_tokenizer(model_path: str | Path, data_dir: str | Path) -> str | None:
    """Refuse data tokenized differently from the model: the fingerprints (``tokenizer_fingerprint``) of the
    model's tokenizer and the data dir's tokenizer.json must agree; the error names both. Returns the fingerprint
    (None when either side has no tokenizer.json to compare)."""
    from forgetting_transformer.data.prepare import tokenizer_fingerprint

    model_tok, data_tok = model_tokenizer_file(model_path), Path(data_dir) / "tokenizer.json"
    if model_tok is None or not data_tok.is_file():
        return None
    a, b = tokenizer_fingerprint(model_tok), tokenizer_fingerprint(data_tok)
    if a != b:
        raise ValueError(f"{data_dir} was tokenized with another tokenizer than the model {model_path}: "
                         f"{data_tok} (fingerprint {b}) vs {model_tok} (fingerprint {a}); token ids would mean "
                         "different text. Convert the data with the model's tokenizer: scripts/prepare_corpus.py "
                         f"... --tokenizer {model_tok}")
    return a
