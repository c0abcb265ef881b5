"""Hugging Face ``transformers`` (5.x) integration: ``FoXConfig``, ``FoXForCausalLM`` and the KV cache ``FoXCache``.

Importing this module registers the model type ``forgetting_transformer`` with ``AutoConfig`` and
``AutoModelForCausalLM``, and ``FoXTokenizerFast`` (``hf/tokenizer.py``: the tokenizer that applies the training
data's text escape) with ``AutoTokenizer``, so ``AutoModelForCausalLM.from_pretrained(dir)`` and
``AutoTokenizer.from_pretrained(dir)`` work after ``import forgetting_transformer.hf``.
``FoXForCausalLM.model`` is a plain ``DecoderLM``: its state dict is a training checkpoint's with the prefix
``model.``. See docs/hf.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import shutil
from enum import Enum
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from transformers import (AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationMixin, PretrainedConfig,
                          PreTrainedModel)
from transformers import initialization as init
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicCache
from transformers.generation.utils import GenerateDecoderOnlyOutput
from transformers.modeling_outputs import CausalLMOutputWithPast

from ..inference.generate import generate as static_generate
from ..inference.prompts import seq_start_from_mask
from ..models.decoder import DecoderLM, is_path
from ..models.layers import ForgetGate, LayerCache, RMSNorm, decay_bias_init
from ..models.path import PathCache
from .tokenizer import FoXTokenizerFast

MODEL_TYPE = "forgetting_transformer"
# The decoder's settings (the keys of the decoder config schema, forgetting_transformer.config.DecoderConfig, but
# model.attention) with the schema's defaults, and for the keys a run must set, those of a tiny FoX (LLaMA): a
# bare FoXConfig() (tests/models/test_hf.py checks them against the schema).
MODEL_DEFAULTS = dict(
    name="fox_llama", arch="decoder", vocab_size=4096, n_layers=4, d_model=192, head_dim=64, n_heads=None,
    n_kv_heads=None, mlp_hidden_ratio=8 / 3, mlp_multiple_of=64, rope=False, rope_base=500000.0, norm_eps=1e-6,
    init_std=0.02, loss_chunk=4096, mixer="softmax", path_w_rank=32, path_conv_size=3, fgate="data_dependent",
    fgate_init=None, qk_norm=False, qk_norm_eps=None, output_gate=False, output_norm=False,
    output_norm_per_head=False, kv_shift=False, mlp_hidden_size=None, acp=False, acp_eps=4.5399929762484854e-05,
    acp_eviction=False,
)
MODEL_FIELDS = tuple(MODEL_DEFAULTS)
# Keys of a run's model config that from_model_config leaves out: model.attention (the kernels a run used, not a
# property of its weights), and the fla baselines' keys, which the decoder run configs of earlier versions hold at
# their defaults.
_NOT_EXPORTED = {"attention", "state_size", "expand", "conv_size", "linear_head_dim", "window_size", "ssd_kernel",
                 "mamba_mlp_hidden_ratio"}
# transformers 5.24 renamed the cache argument of forward() and generate() from past_key_values to cache (the old
# name is deprecated until 5.40): FoXForCausalLM.forward takes either, and generate() keeps the FoXCache under the
# name the installed version passes on
_CACHE_KWARG = ("cache" if "cache" in inspect.signature(GenerationMixin.prepare_inputs_for_generation).parameters
                else "past_key_values")
# generate() arguments of the static-cache path only (forgetting_transformer.inference.generate)
_STATIC_ARGS = ("acp_eps", "eviction_threshold", "block_size", "cuda_graph", "compile_step")
# GenerationConfig fields the static-cache path follows; every other field must keep its neutral default there
_STATIC_FIELDS = {"max_length", "max_new_tokens", "do_sample", "temperature", "top_k", "top_p", "eos_token_id",
                  "pad_token_id", "bos_token_id", "use_cache", "cache_implementation", "max_cache_len",
                  "return_dict_in_generate", "output_logits", "prefill_chunk_size", "compile_config",
                  "disable_compile", "transformers_version"}


class FoXConfig(PretrainedConfig):
    """Every decoder setting (``MODEL_FIELDS``: the decoder config schema's keys but ``attention``) as a top-level
    attribute, plus the usual ``PretrainedConfig`` ones (``bos_token_id``, ``eos_token_id``, ``pad_token_id``,
    ...)."""

    model_type = MODEL_TYPE
    attribute_map = {"hidden_size": "d_model", "num_hidden_layers": "n_layers"}
    keys_to_ignore_at_inference = ["past_key_values"]

    def __init__(self, **kwargs):
        for name, default in MODEL_DEFAULTS.items():
            value = kwargs.pop(name, default)
            setattr(self, name, list(value) if name == "fgate_init" and value is not None else value)
        kwargs.setdefault("tie_word_embeddings", False)  # DecoderLM's LM head is untied
        super().__init__(**kwargs)

    @classmethod
    def from_model_config(cls, model_cfg, **kwargs) -> "FoXConfig":
        """From a decoder model config (dataclass, OmegaConf node or dict, e.g. a run's ``cfg.model``)."""
        if dataclasses.is_dataclass(model_cfg):
            model_cfg = dataclasses.asdict(model_cfg)
        elif not isinstance(model_cfg, dict):
            from omegaconf import OmegaConf

            model_cfg = OmegaConf.to_container(model_cfg, resolve=True, enum_to_str=True)
        # the schema's Enum members (fgate, arch) as the plain strings config.json holds
        model_cfg = {k: v.value if isinstance(v, Enum) else v for k, v in model_cfg.items() if k not in _NOT_EXPORTED}
        unknown = sorted(set(model_cfg) - set(MODEL_FIELDS))
        if unknown:
            raise ValueError(f"model config has fields FoXConfig does not know: {unknown}")
        return cls(**model_cfg, **kwargs)

    def to_model_config(self) -> SimpleNamespace:
        """The settings ``DecoderLM`` is built from (``MODEL_FIELDS`` as attributes)."""
        return SimpleNamespace(**{name: getattr(self, name) for name in MODEL_FIELDS})

    def to_diff_dict(self) -> dict:
        # Always write every model field, so a saved config does not depend on this code's defaults.
        d = super().to_diff_dict()
        d.update({name: getattr(self, name) for name in MODEL_FIELDS})
        return d


class GrowingLayerOps:
    """What both cache layers share in the ``transformers`` interface: a cache that grows by concatenation (the
    mask spans every cached token plus the new ones; no maximum length), and the batch operations (beam search,
    contrastive search), each applied to every cached tensor by the layer's ``_map_batch(fn)``."""

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._map_batch(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._map_batch(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._map_batch(lambda t: t[indices])


class FoXCacheLayer(GrowingLayerOps, LayerCache, CacheLayerMixin):
    """One layer of ``FoXCache``: a ``LayerCache`` (keys/values (B, Tk, Hkv, D), log forget gates (B, Tk, H),
    KV-shift state) behind the ``transformers`` cache-layer interface.

    With KV-shift it also keeps ``unshifted``: every cached token's key and value before the shift, each
    (B, Tk, Hkv, D). ``crop`` needs them: the shift state of a shorter prefix is its last token's pre-shift k/v,
    which neither the shifted keys (after QK-norm) nor the values give back.
    """

    is_croppable = True

    def __init__(self):
        CacheLayerMixin.__init__(self)
        LayerCache.__init__(self)
        self.unshifted = None

    def lazy_initialization(self, key_states, value_states) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, k, v, log_fgate=None, shift_state=None):
        if not self.is_initialized:
            self.lazy_initialization(k, v)
        if shift_state is not None:
            self.unshifted = shift_state if self.unshifted is None else tuple(
                torch.cat([old, new], dim=1) for old, new in zip(self.unshifted, shift_state))
        return LayerCache.update(self, k, v, log_fgate, shift_state)

    def reset(self) -> None:
        LayerCache.__init__(self)
        self.unshifted = None
        self.is_initialized = False

    def _map_batch(self, fn) -> None:
        # Every cached tensor has the batch in dim 0.
        for name in ("keys", "values", "log_fgate"):
            t = getattr(self, name)
            if t is not None:
                setattr(self, name, fn(t))
        for name in ("shift_state", "unshifted"):
            if getattr(self, name) is not None:
                setattr(self, name, tuple(fn(t) for t in getattr(self, name)))

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last ``-tokens_to_remove`` tokens (transformers 5's convention, as ``DynamicLayer``: a negative
        count; 0 is a no-op), leaving exactly the cache of the shorter prefix."""
        length = self.get_seq_length()
        if tokens_to_remove > 0 or -tokens_to_remove > length:
            raise ValueError(f"crop(tokens_to_remove={tokens_to_remove}): pass minus the number of tokens to remove, "
                             f"between -{length} (the cached tokens) and 0")
        if tokens_to_remove == 0:
            return
        n = length + tokens_to_remove
        self.keys, self.values = self.keys[:, :n], self.values[:, :n]
        if self.log_fgate is not None:
            self.log_fgate = self.log_fgate[:, :n]
        if self.unshifted is not None:
            self.unshifted = tuple(t[:, :n] for t in self.unshifted)
            # The next token's shift mixes in the new last token's pre-shift k/v (x_{-1} = 0 for an empty cache).
            self.shift_state = tuple(t[:, n - 1 : n] for t in self.unshifted) if n else None

    def offload(self):
        raise NotImplementedError("FoXCache does not support offloading")

    def prefetch(self):
        raise NotImplementedError("FoXCache does not support offloading")


class PathCacheLayer(GrowingLayerOps, PathCache, CacheLayerMixin):
    """One layer of ``FoXCache`` for PaTH (``model.mixer=path``): a ``PathCache`` (keys already transformed by every
    later token, values, log forget gates, the convolution and KV-shift states) behind the ``transformers``
    cache-layer interface. The layer fills it itself (``PathAttention.forward``), so ``update`` is never called.

    Not croppable: every decoded token rewrites all cached keys by ``H_t = I - beta_t w_t w_t^T``, which is not
    invertible for ``beta_t = 1``, so a shorter prefix's keys cannot be recovered (assisted decoding needs crop).
    """

    def __init__(self):
        CacheLayerMixin.__init__(self)
        PathCache.__init__(self)

    @property
    def is_initialized(self) -> bool:
        return self.keys is not None

    @is_initialized.setter
    def is_initialized(self, value: bool) -> None:
        pass  # derived from the keys (CacheLayerMixin.__init__ assigns it)

    def lazy_initialization(self, key_states, value_states) -> None:
        pass  # the PaTH layer writes its state on its first call

    def update(self, *args, **kwargs):
        raise TypeError("a PaTH cache layer is filled by PathAttention itself, not through update()")

    def reset(self) -> None:
        PathCache.__init__(self)

    def _map_batch(self, fn) -> None:
        # Every cached tensor has the batch in dim 0.
        for name in ("keys", "values", "log_fgate", "conv_state"):
            if getattr(self, name) is not None:
                setattr(self, name, fn(getattr(self, name)))
        if self.shift_state is not None:
            self.shift_state = tuple(fn(t) for t in self.shift_state)

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("a PaTH cache (model.mixer=path) cannot be cropped: decoding rewrote the cached "
                                  "keys with transforms that are not invertible; assisted decoding is not supported")

    def offload(self):
        raise NotImplementedError("FoXCache does not support offloading")

    def prefetch(self):
        raise NotImplementedError("FoXCache does not support offloading")


class FoXCache(Cache):
    """The ``past_key_values`` of ``FoXForCausalLM``: one ``FoXCacheLayer`` per block (``PathCacheLayer`` with
    ``path=True``, for ``model.mixer=path``), plus ``seq_start`` (B,), the first real token of each left-padded row
    (None: no padding). ``FoXForCausalLM`` creates it when ``use_cache=True``; pass it back as ``past_key_values``
    with the next tokens. ``crop(-n)`` drops the last n tokens (assisted decoding uses it; not with PaTH)."""

    def __init__(self, n_layers: int, path: bool = False):
        super().__init__(layers=[PathCacheLayer() if path else FoXCacheLayer() for _ in range(n_layers)])
        self.seq_start = None

    def reset(self):
        super().reset()
        self.seq_start = None

    def reorder_cache(self, beam_idx: torch.LongTensor):
        super().reorder_cache(beam_idx)
        if self.seq_start is not None:
            self.seq_start = self.seq_start.index_select(0, beam_idx.to(self.seq_start.device))

    def batch_repeat_interleave(self, repeats: int):
        super().batch_repeat_interleave(repeats)
        if self.seq_start is not None:
            self.seq_start = self.seq_start.repeat_interleave(repeats, dim=0)

    def batch_select_indices(self, indices: torch.Tensor):
        super().batch_select_indices(indices)
        if self.seq_start is not None:
            self.seq_start = self.seq_start[indices]


class FoXForCausalLM(PreTrainedModel, GenerationMixin):
    """``DecoderLM`` (FoX, Transformer, PaTH or PaTH-FoX, any config) as a ``transformers`` causal LM with
    ``generate()``.

    ``labels`` follow the Hugging Face convention: pass ``labels = input_ids`` (``-100`` = ignored); they are
    shifted inside, and the loss is the mean next-token cross-entropy over non-ignored targets whose token and
    predicting token are both real under ``attention_mask`` (or the sum over ``num_items_in_batch``). (``DecoderLM``
    itself takes already-shifted targets and returns per-token losses.)
    """

    config_class = FoXConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]

    def __init__(self, config: FoXConfig):
        super().__init__(config)
        self.model = DecoderLM(config.to_model_config())
        # the data-dependent gates' projections: their bias is the gate's (ForgetGate below), not zero
        self._gate_projections = {id(m.proj) for m in self.model.modules()
                                  if isinstance(m, ForgetGate) and m.kind == "data_dependent"}
        self.post_init()

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        # FoX needs more state than a DynamicCache holds: generate() gets a FoXCache from
        # _prepare_cache_for_generation, a direct forward call from use_cache=True.
        return False

    def _prepare_cache_for_generation(self, generation_config, model_kwargs, *args, **kwargs):
        # generate() appends tokens after the last column, so a right-padded prompt would put pads between real
        # tokens: refuse it here, once, also when decoding without a cache (transformers only warns).
        if model_kwargs.get("attention_mask") is not None:
            seq_start_from_mask(model_kwargs["attention_mask"])
        # generate() builds its cache here before the prefill (chunked prefill needs one): always a FoXCache.
        if model_kwargs.get(_CACHE_KWARG) is not None or generation_config.use_cache is False:
            return
        if generation_config.cache_implementation not in (None, "dynamic"):
            raise ValueError(f"cache_implementation={generation_config.cache_implementation!r} is not supported: "
                             f"FoXForCausalLM decodes with its own FoXCache (None or 'dynamic') or its paged "
                             f"static cache ('static')")
        model_kwargs[_CACHE_KWARG] = self._new_cache()

    def generate(self, inputs=None, generation_config=None, **kwargs):
        """transformers' ``generate()`` (``FoXCache``: every feature, eager), or the static path of
        ``forgetting_transformer.inference.generate`` (paged static cache, decode kernel, one CUDA graph per
        step; greedy or sampling with temperature / top-k / top-p, eos, left-padded batches) when
        ``cache_implementation="static"``, ``acp_eviction=True`` or ``config.acp_eviction`` is set. The static
        path also takes ``acp_eps``, ``eviction_threshold``, ``block_size`` and ``cuda_graph``; a setting it does
        not implement (beams, penalties, logits processors, ...) raises naming it. ``acp_eviction=False`` turns
        the config's eviction off for one call. PaTH (``mixer=path``) decodes with the default cache only (the
        static path raises naming the mixer). See docs/generation.md."""
        acp_eviction = kwargs.pop("acp_eviction", None)
        static_args = {k: kwargs.pop(k) for k in _STATIC_ARGS if k in kwargs}
        eviction = self.config.acp_eviction if acp_eviction is None else bool(acp_eviction)
        base = generation_config if generation_config is not None else self.generation_config
        if kwargs.get("cache_implementation", base.cache_implementation) != "static" and not eviction:
            if static_args:
                raise ValueError(f"{sorted(static_args)}: arguments of the static-cache path; pass "
                                 f"cache_implementation='static' (or acp_eviction=True) with them")
            return super().generate(inputs, generation_config, **kwargs)
        return self._generate_static(inputs, generation_config, eviction, static_args, kwargs)

    def _generate_static(self, inputs, generation_config, eviction, static_args, kwargs):
        gc, model_kwargs = self._prepare_generation_config(generation_config, **kwargs)
        input_ids = inputs if inputs is not None else model_kwargs.pop("input_ids", None)
        attention_mask = model_kwargs.pop("attention_mask", None)
        if input_ids is None or model_kwargs:
            raise ValueError(f"generate() with the static cache takes input_ids and attention_mask; got "
                             f"{sorted(model_kwargs) or 'no input_ids'} (inputs_embeds, processors and the like "
                             f"need the default cache)")
        defaults = gc._get_default_generation_params()
        for key, value in gc.to_dict().items():
            if key not in _STATIC_FIELDS and not key.startswith("_") and value not in (None, False, defaults.get(key)):
                raise ValueError(f"generate() with the static cache does not implement {key}={value!r}; use the "
                                 f"default cache (no cache_implementation, acp_eviction=False) for it")
        if attention_mask is None:
            attention_mask = _mask_from_padding(input_ids, gc.pad_token_id, gc.eos_token_id)
        max_new = gc.max_new_tokens if gc.max_new_tokens is not None else gc.max_length - input_ids.shape[1]
        out = static_generate(self, input_ids, attention_mask, max_new_tokens=max_new, do_sample=gc.do_sample,
                              temperature=gc.temperature, top_k=gc.top_k, top_p=gc.top_p,
                              eos_token_id=gc.eos_token_id, pad_token_id=gc.pad_token_id, acp_eviction=eviction,
                              prefill_chunk=gc.prefill_chunk_size, output_logits=bool(gc.output_logits),
                              **static_args)
        if not gc.return_dict_in_generate:
            return out.sequences
        logits = None if out.logits is None else tuple(out.logits.unbind(1))
        return GenerateDecoderOnlyOutput(sequences=out.sequences, logits=logits)

    def _new_cache(self) -> FoXCache:
        return FoXCache(self.config.n_layers, path=is_path(self.config))

    def _init_weights(self, module):
        # DecoderLM.reset_parameters, module by module: transformers runs this on what a checkpoint did not fill
        # (its init functions skip loaded tensors).
        if isinstance(module, (torch.nn.Linear, torch.nn.Embedding, torch.nn.Conv1d)):
            init.normal_(module.weight, mean=0.0, std=self.config.init_std)
            # a gate projection's bias is left to its ForgetGate: an init function leaves a tensor another one
            # has set, so zeroing it here (children come first) would win over the decay init
            if getattr(module, "bias", None) is not None and id(module) not in self._gate_projections:
                init.zeros_(module.bias)
        elif isinstance(module, RMSNorm):
            init.ones_(module.weight)
        elif isinstance(module, ForgetGate):
            bias = module.proj.bias if module.kind == "data_dependent" else module.bias
            if module.init_range is None:
                init.zeros_(bias)
            else:
                init.copy_(bias, decay_bias_init(bias.numel(), *module.init_range).to(bias.dtype))

    def get_input_embeddings(self):
        return self.model.embed

    def set_input_embeddings(self, value):
        self.model.embed = value

    def get_output_embeddings(self):
        return self.model.lm_head

    def set_output_embeddings(self, value):
        self.model.lm_head = value

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: FoXCache | None = None,
        cache: FoXCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int = 0,
        return_dict: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        num_items_in_batch: int | torch.Tensor | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """input_ids (B, T): the tokens after those in the cache (all of them without one); or inputs_embeds
        (B, T, d_model) in their place (exactly one of the two). cache, or past_key_values (its name before
        transformers 5.24; either, not both): a ``FoXCache`` returned by an earlier call.

        attention_mask (B, past + T): 0/1, left padding; without a cache also right padding. position_ids (B, T):
        RoPE positions (default: counted from each row's first real token). use_cache: return a ``FoXCache``
        extended with these tokens (default: only when a cache is given). logits_to_keep: compute
        logits for the last N tokens only (0 = all). num_items_in_batch (with labels; the Trainer passes it under
        gradient accumulation): the loss is the summed token loss divided by it instead of the mean.
        """
        if output_attentions or output_hidden_states:
            raise NotImplementedError("output_attentions / output_hidden_states are not supported")
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds; got "
                             + ("both" if input_ids is not None else "neither"))
        inputs = input_ids if inputs_embeds is None else inputs_embeds
        B, T = inputs.shape[:2]
        if cache is not None and past_key_values is not None and cache is not past_key_values:
            raise ValueError("pass the cache as cache or as past_key_values (its name before transformers 5.24), "
                             "not both")
        cache = self._resolve_cache(past_key_values if cache is None else cache, use_cache)
        past = cache.get_seq_length() if cache is not None else 0
        seq_start = None
        if attention_mask is not None:
            if tuple(attention_mask.shape) != (B, past + T):
                raise ValueError(f"attention_mask must be (batch, cached + new tokens) = {(B, past + T)}; "
                                 f"got {tuple(attention_mask.shape)}")
            attention_mask = attention_mask.to(inputs.device)
            seq_start = seq_start_from_mask(attention_mask, allow_right_padding=cache is None)
        if cache is not None:
            if past and not _same_start(cache.seq_start, seq_start, attention_mask is None):
                raise ValueError("attention_mask disagrees with the padding of the cached tokens")
            seq_start = cache.seq_start if attention_mask is None and past else seq_start
            cache.seq_start = seq_start
        h = self.model.hidden_states(
            input_ids, inputs_embeds=inputs_embeds, cache=None if cache is None else cache.layers,
            seq_start=seq_start, positions=position_ids,
        )  # (B, T, d_model)
        logits = self.model.lm_head(h[:, -logits_to_keep:] if logits_to_keep else h)  # (B, T', V)
        loss = None
        if labels is not None:
            loss = self._loss(logits, labels, attention_mask, num_items_in_batch)
        out = CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=cache)
        return out if return_dict is not False else out.to_tuple()

    @staticmethod
    def _loss(logits, labels, attention_mask, num_items_in_batch) -> torch.Tensor:
        if logits.shape[1] != labels.shape[1]:
            raise ValueError(f"labels {tuple(labels.shape)} need logits for every position; got "
                             f"{logits.shape[1]} (logits_to_keep must be 0)")
        # HF convention: the logits at t predict labels[t + 1].
        targets = labels[:, 1:].to(logits.device)
        if attention_mask is not None:
            # A target counts only if it and the token predicting it are real: pads (left or right) neither predict
            # nor are predicted, so a padded row's loss terms are those of the row alone.
            real = attention_mask[:, -labels.shape[1]:].bool()
            targets = targets.masked_fill(~(real[:, 1:] & real[:, :-1]), -100)
        flat_logits, flat_targets = logits[:, :-1].float().flatten(0, 1), targets.flatten()
        if num_items_in_batch is None:
            return F.cross_entropy(flat_logits, flat_targets, ignore_index=-100)
        # Gradient accumulation: each micro-batch's summed loss over the whole batch's target count, so the
        # accumulated gradient is that of the batch's mean, however the targets split over the micro-batches.
        total = F.cross_entropy(flat_logits, flat_targets, ignore_index=-100, reduction="sum")
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(total.device)
        return total / num_items_in_batch

    def _resolve_cache(self, past_key_values, use_cache) -> FoXCache | None:
        if past_key_values is None:
            return self._new_cache() if use_cache else None
        if isinstance(past_key_values, FoXCache):
            return past_key_values
        # Some transformers versions hand every model an empty DynamicCache; FoX needs more state than it holds.
        if isinstance(past_key_values, DynamicCache) and past_key_values.get_seq_length() == 0:
            return self._new_cache()
        raise TypeError(f"past_key_values must be a FoXCache (returned by FoXForCausalLM); got "
                        f"{type(past_key_values).__name__}")


def _mask_from_padding(input_ids, pad_token_id, eos_token_id) -> torch.Tensor | None:
    """transformers' rule for a missing attention_mask: pad tokens in the prompt are padding, unless pad is eos."""
    eos = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id or [])
    if pad_token_id is None or pad_token_id in eos or not bool((input_ids == pad_token_id).any()):
        return None
    return (input_ids != pad_token_id).long()


def _same_start(cached: torch.Tensor | None, new: torch.Tensor | None, new_absent: bool) -> bool:
    if new_absent or (cached is None and new is None):
        return True
    if cached is None or new is None:
        return False
    return bool(torch.equal(cached.to(new.device), new))


@contextlib.contextmanager
def written_whole(out: str | Path, overwrite: bool = False):
    """A model directory written whole or not at all (``scripts/export_hf.py``, ``scripts/convert_official.py``):
    yields a temporary sibling of ``out`` to write into, which takes the place of ``out`` when the block ends; an
    error in the block removes it and leaves ``out`` as it was. ``out`` must be absent or an empty directory unless
    ``overwrite`` (FileExistsError naming it)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out}: exists and is not a directory")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(f"{out}: not empty; pass --overwrite to replace what is there")
    tmp, old = out.with_name(out.name + ".tmp"), out.with_name(out.name + ".old")
    for stale in (tmp, old):  # left by a process killed in here
        shutil.rmtree(stale, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists():
        out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)


AutoConfig.register(MODEL_TYPE, FoXConfig, exist_ok=True)
AutoModelForCausalLM.register(FoXConfig, FoXForCausalLM, exist_ok=True)
# also makes the class findable by the name tokenizer_config.json records (tokenizer_class: FoXTokenizerFast)
AutoTokenizer.register(FoXConfig, tokenizer_class=FoXTokenizerFast, exist_ok=True)
