"""The lm-eval model ``fox``: any training run dir or Hugging Face export (``eval.common.load_model_and_tokenizer``)
as an ``lm_eval.api.model.TemplateLM``.

    import eval.lm_eval_harness.model  # registers "fox"
    import lm_eval
    lm_eval.simple_evaluate(model="fox", model_args="path=outputs/run_a,batch_size=8", tasks=["piqa"])

model_args: ``path`` (required; ``pretrained`` is the same), ``step`` (checkpoint step, default latest),
``tokenizer`` (tokenizer.json or HF tokenizer dir, default the run's), ``device`` (default cuda if available),
``batch_size`` (default 8),
``max_length`` (default 16384 tokens: our models have no position limit, so this only bounds memory; longer
inputs keep their last ``max_length`` tokens), ``max_gen_toks`` (default 256), ``dtype`` (``auto`` = bfloat16
autocast on CUDA, float32 on CPU; or ``float32`` / ``bfloat16``), ``add_bos_token`` (default true: every input
starts with the model's bos token, as in training), ``max_logit_tokens`` (default 32768: a batch holds at most this
many scored positions, rows x longest continuation, so (rows, positions, vocab) float32 logits stay bounded; e.g.
wikitext windows of 16384 tokens go two at a time).

Inputs are batched longest first and left-padded (what ``FoXForCausalLM`` supports); results do not depend on
the batch composition (tests/eval/test_lm_eval.py checks them against unpadded forwards).
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from eval.common import load_model_and_tokenizer
from forgetting_transformer.training.progress import progress


def _bool(v) -> bool:
    return v if isinstance(v, bool) else str(v).strip().lower() in ("1", "true", "yes", "y")


@register_model("fox")
class FoXLM(TemplateLM):
    backend = "causal"

    def __init__(self, path: str, step: int | None = None, tokenizer: str | None = None, device: str | None = None,
                 batch_size: int | str = 8, max_length: int = 16384, max_gen_toks: int = 256, dtype: str = "auto",
                 add_bos_token: bool | str = True, max_logit_tokens: int = 32768):
        super().__init__()
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self._device = torch.device(device)
        step = None if step in (None, "", "None") else int(step)
        self.model, self.tokenizer, self.info = load_model_and_tokenizer(path, step=step, tokenizer=tokenizer,
                                                                          device=self._device)
        if dtype == "bfloat16":
            self.model = self.model.to(torch.bfloat16)
        elif dtype not in ("auto", "float32"):
            raise ValueError(f"dtype must be auto, float32 or bfloat16; got {dtype!r}")
        self.autocast = dtype == "auto" and self._device.type == "cuda"
        self.batch_size = int(str(batch_size).split(":")[0]) if str(batch_size) != "auto" else 8
        self.max_length = int(max_length)
        self.max_gen_toks = int(max_gen_toks)
        self.max_logit_tokens = int(max_logit_tokens)
        self.add_bos_token = _bool(add_bos_token)
        bos = self.tokenizer.bos_token_id
        self.bos_id = int(bos if bos is not None else self.model.generation_config.bos_token_id)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.bos_id

    # --- lm-eval plumbing -------------------------------------------------------------------------------------
    @classmethod
    def create_from_arg_obj(cls, arg_dict, additional_config=None):
        """model_args (``pretrained=`` is lm-eval's usual name for ``path``; an unknown key is an error naming the
        known ones) win over the CLI's / simple_evaluate's generic settings. The CLI's ``device`` defaults to
        cuda:0: where no CUDA device exists the model runs on the CPU and says so."""
        args = cls.checked_model_args(arg_dict)
        known = set(inspect.signature(cls.__init__).parameters) - {"self"}
        extra = {k: v for k, v in (additional_config or {}).items()
                 if v is not None and k in known and k not in args}
        if str(extra.get("device", "")).startswith("cuda") and not torch.cuda.is_available():
            print(f"lm-eval's device {extra['device']} does not exist here (no CUDA): running on cpu")
            extra["device"] = "cpu"
        return cls(**args, **extra)

    @classmethod
    def checked_model_args(cls, arg_dict) -> dict:
        """model_args with ``pretrained`` renamed ``path``; a key ``__init__`` does not take is an error naming it
        and the known ones."""
        args = dict(arg_dict)
        if "pretrained" in args:
            if "path" in args:
                raise ValueError("model_args: give path= or pretrained= (the same thing), not both")
            args["path"] = args.pop("pretrained")
        known = set(inspect.signature(cls.__init__).parameters) - {"self"}
        unknown = sorted(set(args) - known)
        if unknown:
            raise ValueError(f"model_args: unknown key(s) {', '.join(unknown)} for model fox; known: "
                             f"{', '.join(sorted(known | {'pretrained'}))}")
        return args

    @classmethod
    def create_from_arg_string(cls, arg_string, additional_config=None):
        from lm_eval.utils import simple_parse_args_string

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    @property
    def device(self):
        return self._device

    @property
    def eot_token_id(self) -> int:
        return self.bos_id  # our corpora: bos = eos = the document separator

    @property
    def prefix_token_id(self) -> int:
        return self.bos_id

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tokenizer, "name_or_path", "fox")).replace("/", "__")

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        ids = self.tokenizer(string, add_special_tokens=False).input_ids
        add = self.add_bos_token if add_special_tokens is None else add_special_tokens
        return [self.bos_id] + ids if add else ids

    def tok_decode(self, ids) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    # --- scoring ----------------------------------------------------------------------------------------------
    def _forward_logits(self, batch: list[list[int]], keep: int) -> torch.Tensor:
        """Left-padded forward of token lists; returns float32 logits (B, keep, V) of each row's last positions."""
        T = max(len(x) for x in batch)
        ids = torch.full((len(batch), T), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), T), dtype=torch.long)
        for i, x in enumerate(batch):
            ids[i, T - len(x):] = torch.tensor(x, dtype=torch.long)
            mask[i, T - len(x):] = 1
        ids, mask = ids.to(self._device), mask.to(self._device)
        with torch.no_grad(), torch.autocast(self._device.type, dtype=torch.bfloat16, enabled=self.autocast):
            out = self.model(input_ids=ids, attention_mask=None if bool(mask.all()) else mask,
                             logits_to_keep=min(keep, T))
        return out.logits.float()

    def _batches(self, prepared):
        """Consecutive chunks of at most ``batch_size`` rows whose logits (rows x longest continuation) stay within
        ``max_logit_tokens`` positions (a lone row may exceed it)."""
        chunk, keep = [], 0
        for r in prepared:
            k = max(keep, len(r[2]))
            if chunk and (len(chunk) >= self.batch_size or (len(chunk) + 1) * k > self.max_logit_tokens):
                yield chunk
                chunk, k = [], len(r[2])
            chunk.append(r)
            keep = k
        if chunk:
            yield chunk

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """requests: ((context, continuation), context_enc, continuation_enc) → (sum log p(cont), is_greedy)."""
        results: list[tuple[float, bool] | None] = [None] * len(requests)
        prepared = []
        for idx, (_, ctx, cont) in enumerate(requests):
            if not cont:
                results[idx] = (0.0, True)
                continue
            cont = cont[-self.max_length:]
            inp = (ctx + cont)[-(self.max_length + 1):][:-1]
            prepared.append((idx, inp, cont))
        prepared.sort(key=lambda r: -len(r[1]))  # longest first: an OOM shows up at once, padding stays small
        for chunk in progress(list(self._batches(prepared)), "loglikelihood", "batch", enabled=not disable_tqdm):
            keep = max(len(c) for _, _, c in chunk)
            logits = self._forward_logits([inp for _, inp, _ in chunk], keep)  # (B, keep, V) float32
            for row, (idx, _, cont) in zip(logits, chunk):
                lp = F.log_softmax(row[-len(cont):], dim=-1)  # (n, V): the last n positions predict the continuation
                target = torch.tensor(cont, device=lp.device)
                score = float(lp.gather(-1, target[:, None]).sum())
                greedy = bool((lp.argmax(-1) == target).all())
                results[idx] = (score, greedy)
                if self.cache_hook is not None and requests[idx][0] is not None:
                    self.cache_hook.add_partial("loglikelihood", requests[idx][0], (score, greedy))
            del logits
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Whole-document log-likelihood: windows of ``max_length`` tokens (one window unless the document is
        longer), the first conditioned on bos."""
        windows, owner = [], []
        for i, req in enumerate(requests):
            (string,) = req.args
            ids = self.tok_encode(string, add_special_tokens=False)
            for ctx, cont in map(make_disjoint_window, get_rolling_token_windows(
                    token_list=ids, prefix_token=self.prefix_token_id, max_seq_len=self.max_length, context_len=1)):
                windows.append((None, ctx, cont))
                owner.append(i)
        scores = self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm)
        totals = [0.0] * len(requests)
        for i, (s, _) in zip(owner, scores):
            totals[i] += s
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    # --- generation -------------------------------------------------------------------------------------------
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy (or sampled, per gen_kwargs) continuation of each context, cut before the first ``until``
        string; batches share gen_kwargs and are left-padded."""
        results: list[str | None] = [None] * len(requests)
        groups: dict[str, list[int]] = {}
        for i, req in enumerate(requests):
            groups.setdefault(repr(sorted(req.args[1].items(), key=lambda kv: kv[0])), []).append(i)
        for idxs in groups.values():
            kwargs = dict(requests[idxs[0]].args[1])
            until = kwargs.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            eos_text = self.tok_decode([self.eot_token_id])
            stops = until + ([eos_text] if eos_text not in until else [])
            max_new = int(kwargs.pop("max_gen_toks", self.max_gen_toks))
            temperature = float(kwargs.pop("temperature", 0.0))
            do_sample = bool(kwargs.pop("do_sample", temperature > 0.0))
            gen_kwargs = dict(do_sample=do_sample, **({"temperature": temperature} if do_sample else {}), **kwargs)
            enc = [(i, self.tok_encode(requests[i].args[0])[-(self.max_length - max_new):]) for i in idxs]
            enc.sort(key=lambda r: -len(r[1]))
            for b in progress(range(0, len(enc), self.batch_size), "generate_until", "batch",
                              enabled=not disable_tqdm):
                chunk = enc[b:b + self.batch_size]
                T = max(len(x) for _, x in chunk)
                ids = torch.full((len(chunk), T), self.pad_id, dtype=torch.long)
                mask = torch.zeros_like(ids)
                for r, (_, x) in enumerate(chunk):
                    ids[r, T - len(x):] = torch.tensor(x)
                    mask[r, T - len(x):] = 1
                stopper = _StopOnStrings(self.tokenizer, stops, T)
                with torch.no_grad(), torch.autocast(self._device.type, dtype=torch.bfloat16, enabled=self.autocast):
                    out = self.model.generate(input_ids=ids.to(self._device), attention_mask=mask.to(self._device),
                                              max_new_tokens=max_new, stopping_criteria=[stopper],
                                              pad_token_id=self.pad_id, eos_token_id=self.eot_token_id,
                                              **gen_kwargs)
                for (i, _), row in zip(chunk, out[:, T:].tolist()):
                    text = cut_at(self.tok_decode(row), stops)
                    results[i] = text
                    self.cache_hook.add_partial("generate_until", requests[i].args, text)
        return results


def cut_at(text: str, stops: list[str]) -> str:
    """``text`` up to (not including) the earliest of the ``stops`` strings."""
    end = len(text)
    for s in stops:
        if s:
            k = text.find(s)
            if k != -1:
                end = min(end, k)
    return text[:end]


class _StopOnStrings:
    """transformers stopping criterion: a row is done once its generated text contains one of ``stops``."""

    def __init__(self, tokenizer, stops: list[str], prompt_len: int):
        self.tokenizer, self.stops, self.prompt_len = tokenizer, [s for s in stops if s], prompt_len

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        done = [any(s in self.tokenizer.decode(row[self.prompt_len:].tolist()) for s in self.stops)
                for row in input_ids]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)
