"""One place that turns a training run directory or a Hugging Face export into model + tokenizer for evaluation,
and decodes prompts greedily in batches for the generation-based evaluations (NIAH, LongBench).

    load_run(run_dir)                   → (DecoderLM, cfg, checkpoint path)      training checkpoints
    load_model_and_tokenizer(path)      → (FoXForCausalLM, FoXTokenizerFast, info)   run dir or HF dir
    generate_texts(model, tok, prompts, max_new_tokens, GenerationOptions(...))  → one continuation per prompt
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
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
    found = checkpoint_dirs(run_dir / "checkpoints")
    ckpts = found if step is None else [c for c in found if c.name == f"step_{step:08d}"]
    if not ckpts:
        what = f"step {step}" if step is not None else "any checkpoint"
        steps = ", ".join(str(int(c.name[5:])) for c in found) or "none"
        raise FileNotFoundError(f"no complete checkpoint ({what}) under {run_dir / 'checkpoints'}; the steps it "
                                f"has: {steps}")
    model = build_model(cfg.model)
    load_model_weights(model, ckpts[-1])
    return model.to(device).eval(), cfg, ckpts[-1]


def load_tokenizer(path: str | Path, bos_id: int, vocab_size: int, text_escape: str = "none"):
    """A ``FoXTokenizerFast`` (``hf/tokenizer.py``) from a tokenizer.json or HF tokenizer dir, with bos = eos
    = pad = the token ``bos_id``, bos prepended to each text, left padding (what ``generate`` needs), and the model's
    ``text_escape`` (``json``: texts are JSON-escaped before BPE and unescaped after decoding); a tokenizer dir that
    records another escape is refused."""
    from forgetting_transformer.hf.tokenizer import fox_tokenizer

    tok = fox_tokenizer(path, bos_id=bos_id, text_escape=text_escape)
    if len(tok) > vocab_size:
        raise ValueError(f"tokenizer {path} has {len(tok)} tokens but the model only {vocab_size}")
    return tok


def run_text_escape(cfg) -> str:
    """The text escape a run's model reads: ``data.text_escape`` of its config (``none`` when the config has no such
    key, as those of runs from before it)."""
    from forgetting_transformer.data.tokenizer import text_escape_name

    return text_escape_name(OmegaConf.select(cfg, "data.text_escape", default="none"), "data.text_escape")


def run_tokenizer(cfg, tokenizer: str | Path | None = None):
    """The tokenizer of a training run, with its ``data.text_escape``: ``tokenizer`` if given, else the run's
    ``data_dir/tokenizer.json``. Returns ``(tokenizer, path)``."""
    path = Path(tokenizer) if tokenizer is not None else Path(cfg.data.data_dir) / "tokenizer.json"
    if tokenizer is None and not path.is_file():
        raise FileNotFoundError(
            f"the run's data dir has no tokenizer.json ({path}; e.g. GPT-2 LongCrawl64): pass --tokenizer PATH "
            f"(a tokenizer.json or a Hugging Face tokenizer directory, e.g. a local copy of gpt2)")
    return load_tokenizer(path, int(cfg.data.bos_id), int(cfg.model.vocab_size), run_text_escape(cfg)), path


def to_hf(model, cfg):
    """Wrap a trained ``DecoderLM`` as ``FoXForCausalLM`` (same weights) so evaluations can call ``generate``."""
    from forgetting_transformer.hf import FoXConfig, FoXForCausalLM

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
    ``train_len`` (None when unknown) and ``source``. The tokenizer applies the model's text escape
    (``model_text_escape``), also when ``tokenizer`` overrides the model's own."""
    path = Path(path)
    if (path / "config.yaml").is_file():
        model, cfg, ckpt = load_run(path, step=step, device=device)
        tok, _ = run_tokenizer(cfg, tokenizer)
        return to_hf(model, cfg), tok, {"name": cfg.model.name, "train_len": int(cfg.data.seq_len), "source": str(ckpt)}
    if (path / "config.json").is_file():
        import forgetting_transformer.hf  # noqa: F401  (registers the Auto classes)
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(str(path)).to(device).eval()
        if tokenizer is None:
            tok = AutoTokenizer.from_pretrained(str(path))  # FoXTokenizerFast, with the escape it records
        else:
            tok = _override_tokenizer(model, path, tokenizer)
        return model, tok, {"name": model.config.name, "train_len": None, "source": str(path)}
    raise FileNotFoundError(f"{path}: neither a training run (config.yaml) nor a Hugging Face directory (config.json)")


def _override_tokenizer(model, path: Path, tokenizer: str | Path):
    """``--tokenizer`` for a Hugging Face dir: read with the dir's bos id and text escape."""
    bos = model.generation_config.bos_token_id
    if bos is None:
        raise ValueError(f"{path}/generation_config.json has no bos_token_id, which --tokenizer {tokenizer} needs")
    return load_tokenizer(tokenizer, int(bos), int(model.config.vocab_size), model_text_escape(path))


def model_text_escape(path: str | Path) -> str:
    """The text escape the model at ``path`` reads: a run dir's ``data.text_escape`` (``run_text_escape``), a Hugging
    Face dir's ``text_escape`` in tokenizer_config.json (``none`` when it records none, as exports from before the
    key)."""
    path = Path(path)
    if (path / "config.yaml").is_file():
        return run_text_escape(OmegaConf.load(path / "config.yaml"))
    from forgetting_transformer.hf.tokenizer import saved_text_escape

    return saved_text_escape(path) or "none"


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
    """Refuse data tokenized differently from the model: the text escape the data dir's meta.json records must be
    the model's (``model_text_escape``), and the fingerprints (``tokenizer_fingerprint``, escape included) of the
    model's tokenizer and the data dir's tokenizer.json must agree; each error names both sides. A data dir without
    meta.json records no escape (a LongCrawl64 download): its escape is not checked, only its tokenizer.json if
    any. What could not be checked is named in a note on stderr. Returns the fingerprint (None when either side
    has no tokenizer.json to compare)."""
    from forgetting_transformer.data.longcrawl64 import data_text_escape
    from forgetting_transformer.data.prepare import tokenizer_fingerprint

    mode, data_mode = model_text_escape(model_path), data_text_escape(data_dir)
    if data_mode is not None and data_mode != mode:
        raise ValueError(f"{data_dir} holds text escaped with text_escape={data_mode} (its meta.json) but the model "
                         f"{model_path} reads text_escape={mode}; token ids would mean different text. Convert the "
                         f"data as the model's was: scripts/prepare_corpus.py ... --text-escape {mode}")
    model_tok, data_tok = model_tokenizer_file(model_path), Path(data_dir) / "tokenizer.json"
    _note_unchecked(model_path, data_dir, data_mode is not None, data_tok.is_file(), model_tok is not None)
    if model_tok is None or not data_tok.is_file():
        return None
    # the data's escape is the model's here, or the data records none
    a, b = tokenizer_fingerprint(model_tok, mode), tokenizer_fingerprint(data_tok, mode)
    if a != b:
        escape_flag = f" --text-escape {mode}" if mode != "none" else ""
        raise ValueError(f"{data_dir} was tokenized with another tokenizer than the model {model_path}: "
                         f"{data_tok} (fingerprint {b}) vs {model_tok} (fingerprint {a}); token ids would mean "
                         "different text. Convert the data with the model's tokenizer: scripts/prepare_corpus.py "
                         f"... --tokenizer {model_tok}{escape_flag}")
    return a


def _note_unchecked(model_path, data_dir, data_meta: bool, data_tokenizer: bool, model_tokenizer: bool) -> None:
    """One line on stderr naming what ``check_same_tokenizer`` could not compare, and why: a notice, not an error,
    as a LongCrawl64 download has neither a tokenizer.json nor a meta.json."""
    what = ([] if data_tokenizer and model_tokenizer else ["tokenizer"]) + ([] if data_meta else ["text escape"])
    if not what:
        return
    missing = [name for name, present in (("tokenizer.json", data_tokenizer), ("meta.json", data_meta)) if not present]
    why = [f"{data_dir} has no {' and no '.join(missing)}"] if missing else []
    if data_tokenizer and not model_tokenizer:
        why.append(f"the model {model_path} has no tokenizer.json")
    print(f"note: the {' and '.join(what)} of {data_dir} could not be checked against the model's: {'; '.join(why)}",
          file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- batched greedy generation

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
TRANSFORMER_PREFILL_CHUNK = 4096


@dataclass(frozen=True)
class GenerationOptions:
    """How the generation-based evaluations (NIAH, LongBench) decode; the flags of ``eval.cli.add_generation_args``.

    batch_size: prompts per ``generate()`` call (``--batch-size``). max_batch_tokens: at most this many padded prompt
    tokens per call (``--max-batch-tokens``; None: no cap). dtype: the model's weights (``--dtype``; auto: bfloat16
    on CUDA, float32 elsewhere). prefill_chunk: prompt tokens per prefill forward (``--prefill-chunk``; None:
    ``TRANSFORMER_PREFILL_CHUNK`` for Transformers, whose attention over a padded prompt builds a (T, T) mask per
    row, the whole prompt for FoX, whose kernel takes the padding as an argument). acp_eviction: ``--acp-eviction``
    (None: the model config's). compile_step: ``--compile-step``, ``generate()``'s ``compile_step`` (default off:
    an evaluation generates a few dozen tokens per prompt, and compiling the decoding step costs tens of seconds
    once per process for a slightly faster step; see docs/generation.md). autotune: ``--autotune``, the attention
    kernel's autotuning in the prefill (``ops.use_options(autotune=...)``; default off: a left-padded group's
    prefill runs the Triton forward, whose autotuning compiles its configs for each new shape class, tens of
    seconds per process, and measured no faster afterwards; docs/generation.md)."""

    batch_size: int = 8
    max_batch_tokens: int | None = None
    dtype: str = "auto"
    prefill_chunk: int | None = None
    acp_eviction: bool | None = None
    compile_step: bool = False
    autotune: bool = False

    def __post_init__(self):
        for name in ("batch_size", "max_batch_tokens", "prefill_chunk"):
            value = getattr(self, name)
            if (value is not None or name == "batch_size") and not (
                    isinstance(value, int) and not isinstance(value, bool) and value >= 1):
                raise ValueError(f"{name} (--{name.replace('_', '-')}) must be an integer >= 1; got {value!r}")
        if self.dtype not in ("auto", *DTYPES):
            raise ValueError(f"dtype (--dtype) must be auto or one of {sorted(DTYPES)}; got {self.dtype!r}")
        for name in ("compile_step", "autotune"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} (--{name.replace('_', '-')}) must be True or False; "
                                 f"got {getattr(self, name)!r}")

    @classmethod
    def from_args(cls, args) -> "GenerationOptions":
        """From the namespace of a parser that ``eval.cli.add_generation_args`` extended."""
        return cls(batch_size=args.batch_size, max_batch_tokens=args.max_batch_tokens, dtype=args.dtype,
                   prefill_chunk=args.prefill_chunk, acp_eviction=args.acp_eviction, compile_step=args.compile_step,
                   autotune=args.autotune)

    def torch_dtype(self, device) -> torch.dtype:
        if self.dtype == "auto":
            return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
        return DTYPES[self.dtype]

    def dtype_name(self, device) -> str:
        """The weights' dtype on ``device`` as the result files record it (e.g. ``"bfloat16"``)."""
        return str(self.torch_dtype(device)).removeprefix("torch.")

    def chunk_for(self, lm) -> int | None:
        """The ``prefill_chunk`` to pass to ``generate()`` for the ``DecoderLM`` ``lm``."""
        if self.prefill_chunk is not None:
            return self.prefill_chunk
        return TRANSFORMER_PREFILL_CHUNK if lm.cfg.fgate == "none" else None

    def check_model(self, lm) -> None:
        """Refuse ``--acp-eviction`` for a model it cannot apply to, naming the flag (``generate()`` would raise
        naming its own argument)."""
        if not self.acp_eviction:
            return
        from forgetting_transformer.models.decoder import is_path

        if is_path(lm.cfg):
            raise ValueError(f"--acp-eviction evicts keys from the paged cache, which {lm.cfg.name} "
                             f"(model.mixer=path, PaTH) does not decode with")
        if lm.cfg.fgate == "none":
            raise ValueError(f"--acp-eviction needs a forget gate to evict keys by; {lm.cfg.name} is a Transformer "
                             f"(model.fgate=none)")
        if not lm.cfg.qk_norm:
            raise ValueError(f"--acp-eviction bounds attention scores by the QK-norm weights; {lm.cfg.name} has no "
                             f"QK-norm (model.qk_norm=false)")


def _decoder(model):
    """The ``DecoderLM`` of a ``DecoderLM`` or a ``FoXForCausalLM`` (``decoder_of`` refuses PaTH, which the static
    path cannot run; the evaluations decode it with its own cache, ``_greedy_path``)."""
    from forgetting_transformer.inference.generate import decoder_of
    from forgetting_transformer.models.decoder import is_path

    inner = getattr(model, "model", model)
    return inner if is_path(getattr(inner, "cfg", None)) else decoder_of(model)


def prepare_for_generation(model, options: GenerationOptions, device):
    """The model in ``options``' dtype, after checking that the options apply to it."""
    options.check_model(_decoder(model))
    return model.to(options.torch_dtype(device))


def generation_groups(lengths: list[int], batch_size: int, max_batch_tokens: int | None = None) -> list[list[int]]:
    """Indices of prompts of these token ``lengths`` grouped for batched generation. Sorted longest first (similar
    lengths pad little, and a group too large for memory fails at the start, not hours in; ties keep the input
    order); at most ``batch_size`` prompts per group; a prompt joins a group only if it is longer than half the
    group's longest (left padding at most doubles a row's prefill; at NIAH's doubling lengths no group mixes
    lengths, so its prefill runs unpadded, on the attention kernel for whole sequences); and, with
    ``max_batch_tokens``, at most that many padded prompt tokens per group (prompts × the group's longest; a prompt
    longer than the cap runs alone)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    for i in order:
        group = groups[-1] if groups else None
        if group is None or len(group) == batch_size or 2 * lengths[i] <= lengths[group[0]] or (
                max_batch_tokens is not None and (len(group) + 1) * lengths[group[0]] > max_batch_tokens):
            groups.append([i])
        else:
            group.append(i)
    return groups


def until_eos(tokens: list[int], eos: set[int]) -> list[int]:
    """The new tokens of one row up to and including its first eos (``generate()`` pads the rest of the row)."""
    for n, t in enumerate(tokens):
        if t in eos:
            return tokens[:n + 1]
    return tokens


def eos_and_pad(model) -> tuple[list[int] | None, int | None]:
    """The eos ids and pad id of the model's generation config, as one-at-a-time ``model.generate`` uses them."""
    gc = model.generation_config
    eos = gc.eos_token_id
    eos = None if eos is None else [eos] if isinstance(eos, int) else list(eos)
    return eos, gc.pad_token_id if gc.pad_token_id is not None else (eos[0] if eos else None)


@contextlib.contextmanager
def watch_steps(lm, batch: str, prompt_len: int, max_new_tokens: int, on_stage, observe: bool):
    """Name ``batch`` to ``on_stage(batch, None)`` (progress) and, with ``observe``, each forward pass of it, seen
    by a pre-hook on the embedding: ``on_stage(batch, "prefill of 16,384 tokens")``, then ``on_stage(batch,
    "decoding token 7 of at most 32")``. Steps replayed from a CUDA graph or run as torch.compile's code do not
    call the hook, so there (``observe=False``) the batch alone is named."""
    if on_stage is None:
        yield
        return
    on_stage(batch, None)
    fed = 0  # tokens fed so far: the prompt's, then one per decoding step

    def hook(module, args):
        nonlocal fed
        n = args[0].shape[-1]
        if fed < prompt_len:
            part = f" (tokens {fed + 1:,}-{fed + n:,})" if n < prompt_len else ""
            on_stage(batch, f"prefill of {prompt_len:,} tokens{part}")
        else:  # the prefill chose the first new token; the k-th step feeds token k and chooses token k + 1
            on_stage(batch, f"decoding token {fed - prompt_len + 2} of at most {max_new_tokens}")
        fed += n

    handle = lm.embed.register_forward_pre_hook(hook) if observe else None
    try:
        yield
    finally:
        if handle is not None:
            handle.remove()


@torch.no_grad()
def generate_batched(model, prompts: list[list[int]], max_new_tokens: int, options: GenerationOptions, *,
                     eos_token_id: list[int] | None = None, pad_token_id: int | None = None,
                     on_group=None, on_stage=None) -> list[list[int]]:
    """Greedy continuations of ``prompts`` (token id lists), in their order: ``generation_groups`` of them run as
    left-padded batches through ``forgetting_transformer.inference.generate``, and each row's new tokens (up to
    and including its first eos) are put back at its prompt's index. ``on_group(n)`` is called after each group
    of ``n`` prompts, ``on_stage(batch, step)`` with what runs (``watch_steps``; both for progress). A PaTH model
    (model.mixer=path), which the static path does not run, decodes each group through its own cache
    (``_greedy_path``)."""
    from forgetting_transformer.inference import generate
    from forgetting_transformer.models.decoder import is_path
    from forgetting_transformer.ops.forgetting_attention import use_options

    lm = _decoder(model)
    eos = set(eos_token_id or ())
    chunk = options.chunk_for(lm)
    # eager forwards only: on a GPU the static path replays its steps from a CUDA graph
    observe = is_path(lm.cfg) or (lm.embed.weight.device.type != "cuda" and not options.compile_step)
    answers: list[list[int] | None] = [None] * len(prompts)
    groups = generation_groups([len(p) for p in prompts], options.batch_size, options.max_batch_tokens)
    for n, group in enumerate(groups):
        longest = max(len(prompts[i]) for i in group)
        batch = f"batch {n + 1} of {len(groups)} ({len(group)} prompts of up to {longest:,} tokens)"
        with watch_steps(lm, batch, longest, max_new_tokens, on_stage, observe):
            if is_path(lm.cfg):
                rows = _greedy_path(lm, [prompts[i] for i in group], max_new_tokens, eos)
            else:
                with use_options(autotune=options.autotune):
                    out = generate(model, [prompts[i] for i in group], max_new_tokens=max_new_tokens,
                                   do_sample=False, eos_token_id=eos_token_id, pad_token_id=pad_token_id,
                                   acp_eviction=options.acp_eviction, prefill_chunk=chunk,
                                   compile_step=options.compile_step)
                rows = out.sequences[:, longest:].tolist()
        for i, row in zip(group, rows):
            answers[i] = until_eos(row, eos)
        if on_group is not None:
            on_group(len(group))
    return answers


def _greedy_path(lm, prompts: list[list[int]], max_new_tokens: int, eos: set[int]) -> list[list[int]]:
    """Greedy new tokens of a group of prompts by a PaTH ``DecoderLM`` (model.mixer=path) through its own decoding
    cache (``new_cache``): the left-padded prompts in parallel (``seq_start`` masks the pads; fla's kernel, which
    has no mask, runs a padded batch row by row), then one token per row per step, until every row has produced
    an eos or ``max_new_tokens`` (rows past their eos keep decoding; ``until_eos`` cuts them)."""
    device = lm.embed.weight.device
    T = max(len(p) for p in prompts)
    starts = [T - len(p) for p in prompts]
    ids = torch.tensor([[0] * s + p for s, p in zip(starts, prompts)], device=device)  # (B, T), pads masked
    seq_start = torch.tensor(starts, device=device) if any(starts) else None
    eos_ids = torch.tensor(sorted(eos), device=device, dtype=torch.long)
    cache, new = lm.new_cache(), []
    done = torch.zeros(len(prompts), dtype=torch.bool, device=device)
    for _ in range(max_new_tokens):
        logits = lm.lm_head(lm.hidden_states(ids, cache=cache, seq_start=seq_start)[:, -1])  # last token only
        nxt = logits.argmax(-1)  # (B,)
        new.append(nxt)
        done |= torch.isin(nxt, eos_ids)
        if bool(done.all()):
            break
        ids = nxt[:, None]  # (B, 1)
    return torch.stack(new, dim=1).tolist()


def generate_texts(model, tokenizer, prompts: list[list[int]], max_new_tokens: int, options: GenerationOptions, *,
                   desc: str, unit: str, progress: bool = True) -> list[str]:
    """``generate_batched`` with the model's eos and pad ids, decoded without special tokens (what
    ``tokenizer.decode(model.generate(ids)[0, len(ids):], skip_special_tokens=True)`` gives one prompt at a time),
    with a progress line counting prompts done at least every ~10 s, also inside a long batch (a heartbeat
    thread), naming the batch that runs and, where ``watch_steps`` sees them, its prefill or decoding step."""
    from forgetting_transformer.training.progress import Progress, heartbeat

    eos, pad = eos_and_pad(model)
    with Progress(len(prompts), desc, unit, enabled=progress) as bar, heartbeat(bar):
        new = generate_batched(model, prompts, max_new_tokens, options, eos_token_id=eos, pad_token_id=pad,
                               on_group=bar.update, on_stage=bar.working_on)
    return [tokenizer.decode(t, skip_special_tokens=True) for t in new]
