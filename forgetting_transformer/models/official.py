"""The released FoX checkpoints' format (the official code's Hugging Face models) ↔ ``DecoderLM``.

The FoX papers' models are public as Hugging Face directories written by the official code
(zhixuan-lin/forgetting-transformer): ``config.json`` + ``model.safetensors``, with ``model_type``

- ``forgetting_transformer-project_fox``: FoX (Pro), FoX (LLaMA), and the Transformer (Pro) (``fgate_type="none"``,
  ``use_rope=true``);
- ``transformer-project_fox``: the Transformer (LLaMA);
- ``mamba2-project_fox``, ``hgrn2-project_fox``, ``delta_net-project_fox``, ``samba-project_fox``: the recurrent
  baselines, which this module refuses (``BASELINE_TYPES`` says why).

This module maps their config and weights onto the decoder's, strictly (every config key known, every tensor
used once, every shape checked), and back for export:

    decoder_settings(config)                       → the decoder's settings (``FoXConfig`` / ``DecoderConfig`` keys)
    decoder_state_dict(tensors, settings)          → a ``DecoderLM`` state dict
    official_config(settings), official_state_dict(state_dict, settings)    the reverse

Plain dicts and tensors: no ``transformers``, no files (``scripts/convert_official.py`` reads and writes them).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from .layers import mlp_width

FOX_TYPE = "forgetting_transformer-project_fox"
TRANSFORMER_TYPE = "transformer-project_fox"
BASELINE_TYPES = {
    "mamba2-project_fox": "Mamba-2", "hgrn2-project_fox": "HGRN2", "delta_net-project_fox": "DeltaNet",
    "samba-project_fox": "Samba",
}
# The official QK-norm is an RMSNorm built without an eps argument, so it takes that class's default.
QK_NORM_EPS = 1e-5
FGATE_TYPES = {"full": "data_dependent", "bias_only": "data_independent", "fixed": "fixed", "none": "none"}

# The official config classes' defaults, for keys a saved config.json may leave out (configs written by earlier
# versions of the official code lack the later keys).
FOX_DEFAULTS = dict(
    hidden_ratio=4, intermediate_size=None, num_kv_heads=None, hidden_act="swish", window_size=None,
    max_position_embeddings=2048, initializer_range=0.02, elementwise_affine=True, norm_eps=1e-6,
    tie_word_embeddings=False, attention_bias=False, fuse_norm=True, fuse_cross_entropy=True, rope_base=500000.0,
    use_rope=False, use_output_gate=False, ogate_act="sigmoid", fgate_type="full", fgate_bias_init=False,
    decay_time_min=None, decay_time_max=None, use_output_norm=False, qk_norm=False,
    qk_norm_share_param_across_head=None, log_pruning_tolerance=None, use_k_shift=False, use_v_shift=False,
)
TRANSFORMER_DEFAULTS = dict(
    hidden_ratio=4, intermediate_size=None, num_kv_heads=None, hidden_act="swish", window_size=None,
    max_position_embeddings=2048, initializer_range=0.02, elementwise_affine=True, norm_eps=1e-6,
    tie_word_embeddings=False, attention_bias=False, fuse_norm=True, fuse_cross_entropy=True, rope_base=500000.0,
    use_rope=True,
)
# Keys every Hugging Face config may hold that the official models do not compute with: the generation and
# bookkeeping settings of PretrainedConfig (transformers 4.x and 5.x), and the kernel choices (fused norm and loss
# kernels, the rotary cache length) that change no output.
NEUTRAL_KEYS = {
    "_name_or_path", "architectures", "model_type", "torch_dtype", "dtype", "transformers_version", "use_cache",
    "bos_token_id", "eos_token_id", "pad_token_id", "output_attentions", "output_hidden_states", "return_dict",
    "auto_map", "_attn_implementation_autoset", "fuse_norm", "fuse_cross_entropy", "max_position_embeddings",
}
REQUIRED_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_heads")


class OfficialFormatError(ValueError):
    """A config or weight of the official format this code cannot map exactly; the message names it."""


def _refuse(key: str, value, why: str):
    raise OfficialFormatError(f"config.json: {key}={value!r} is not supported: {why}")


def official_kind(config: dict) -> str:
    """``fox`` (the FoX class, also the Transformer (Pro)) or ``transformer`` (the Transformer (LLaMA)); a baseline
    or another model type is refused by name."""
    model_type = config.get("model_type")
    if model_type == FOX_TYPE:
        return "fox"
    if model_type == TRANSFORMER_TYPE:
        return "transformer"
    if model_type in BASELINE_TYPES:
        raise OfficialFormatError(
            f"config.json: model_type={model_type!r} ({BASELINE_TYPES[model_type]}) is not supported: the official "
            f"baselines are built from flash-linear-attention@1c5937e layers with their own MLP and norm layout, "
            f"and no weight correspondence with this code's fla 0.6.0 baselines has been verified against the "
            f"official outputs; evaluate them with the official code")
    raise OfficialFormatError(f"config.json: model_type={model_type!r} is not a released FoX model "
                              f"(expected {FOX_TYPE!r} or {TRANSFORMER_TYPE!r})")


def _with_defaults(config: dict, kind: str) -> dict:
    defaults = FOX_DEFAULTS if kind == "fox" else TRANSFORMER_DEFAULTS
    unknown = sorted(set(config) - set(defaults) - NEUTRAL_KEYS - set(REQUIRED_KEYS))
    if unknown:
        raise OfficialFormatError(f"config.json: unknown or unsupported key(s) {unknown} for model_type="
                                  f"{config['model_type']!r}; refusing to guess what they change")
    for key in REQUIRED_KEYS:
        if config.get(key) is None:
            raise OfficialFormatError(f"config.json: {key} is missing")
    return {**defaults, **config}


def _check_common(c: dict) -> None:
    """The settings both official classes share that the decoder computes only one way."""
    if c["hidden_size"] % c["num_heads"]:
        _refuse("num_heads", c["num_heads"], f"must divide hidden_size={c['hidden_size']}")
    if c["hidden_act"] != "swish":
        _refuse("hidden_act", c["hidden_act"], "the decoder's MLP is SwiGLU (hidden_act='swish')")
    if c["window_size"] is not None:
        _refuse("window_size", c["window_size"], "sliding-window attention is not a decoder model")
    if not c["elementwise_affine"]:
        _refuse("elementwise_affine", c["elementwise_affine"], "the decoder's norms have weights")
    if c["attention_bias"]:
        _refuse("attention_bias", c["attention_bias"], "the decoder's projections have no bias")
    if c["tie_word_embeddings"]:
        _refuse("tie_word_embeddings", c["tie_word_embeddings"], "the decoder's LM head is untied")


def official_mlp_width(hidden_size: int, hidden_ratio: float | None, intermediate_size: int | None) -> int:
    """The official MLP width: ``intermediate_size``, else ``256 * ceil(int(d * r * 2/3) / 256)`` (r default 4)."""
    if intermediate_size is not None:
        return int(intermediate_size)
    width = int(hidden_size * (4 if hidden_ratio is None else hidden_ratio) * 2 / 3)
    return 256 * ((width + 256 - 1) // 256)


def decoder_settings(config: dict, tensors: dict[str, torch.Tensor] | None = None) -> dict:
    """The decoder's settings (the keys of ``hf.MODEL_DEFAULTS``) that compute the official model of ``config``
    (a config.json as a dict). ``tensors``, when given, decides what an older config leaves open (whether the
    QK-norm weights are shared across heads)."""
    kind = official_kind(config)
    c = _with_defaults(config, kind)
    _check_common(c)
    d, heads = int(c["hidden_size"]), int(c["num_heads"])
    width = official_mlp_width(d, c["hidden_ratio"], c["intermediate_size"])
    s = dict(arch="decoder", mixer="softmax", vocab_size=int(c["vocab_size"]), n_layers=int(c["num_hidden_layers"]),
             d_model=d, head_dim=d // heads, n_heads=heads, n_kv_heads=c["num_kv_heads"],
             mlp_hidden_ratio=(4 if c["hidden_ratio"] is None else c["hidden_ratio"]) * 2 / 3,
             mlp_multiple_of=256, mlp_hidden_size=width, rope=bool(c["use_rope"]), rope_base=float(c["rope_base"]),
             norm_eps=float(c["norm_eps"]), init_std=float(c["initializer_range"]), fgate="none", fgate_init=None,
             qk_norm=False, qk_norm_eps=None, output_gate=False, output_norm=False, output_norm_per_head=False,
             kv_shift=False, acp=False, acp_eviction=False)
    if kind == "fox":
        s.update(_fox_settings(c, tensors))
    s["name"] = settings_name(s)
    return s


def _fox_settings(c: dict, tensors) -> dict:
    """The FoX class's switches (also the Transformer (Pro): ``fgate_type="none"``)."""
    if c["num_kv_heads"] is not None:
        _refuse("num_kv_heads", c["num_kv_heads"], "the official FoX layer has no grouped-query attention")
    if c["fgate_type"] not in FGATE_TYPES:
        _refuse("fgate_type", c["fgate_type"], f"expected one of {sorted(FGATE_TYPES)}")
    if c["use_output_gate"] and c["ogate_act"] != "sigmoid":
        _refuse("ogate_act", c["ogate_act"], "the decoder's output gate is a sigmoid")
    if c["use_k_shift"] != c["use_v_shift"]:
        _refuse("use_k_shift", c["use_k_shift"], f"the decoder shifts keys and values together (use_v_shift="
                f"{c['use_v_shift']})")
    s = dict(fgate=FGATE_TYPES[c["fgate_type"]], output_gate=bool(c["use_output_gate"]),
             output_norm=bool(c["use_output_norm"]), output_norm_per_head=bool(c["use_output_norm"]),
             kv_shift=bool(c["use_k_shift"]), qk_norm=bool(c["qk_norm"]))
    if c["fgate_bias_init"] or c["fgate_type"] == "fixed":
        if c["decay_time_min"] is None or c["decay_time_max"] is None:
            _refuse("fgate_bias_init", c["fgate_bias_init"], "needs decay_time_min and decay_time_max")
        s["fgate_init"] = [float(c["decay_time_min"]), float(c["decay_time_max"])]
    if c["qk_norm"]:
        shared = c["qk_norm_share_param_across_head"]
        if shared is None and tensors is not None:  # configs of earlier official versions: the weights tell
            q_norm = tensors.get("model.layers.0.attn.q_norm.weight")
            shared = q_norm is not None and q_norm.numel() == c["hidden_size"] // c["num_heads"]
        if not shared:
            _refuse("qk_norm_share_param_across_head", c["qk_norm_share_param_across_head"],
                    "the decoder's QK-norm weights are shared across heads, as in the released models")
        s["qk_norm_eps"] = QK_NORM_EPS
    if c["log_pruning_tolerance"] is not None:
        s.update(acp=True, acp_eps=math.exp(float(c["log_pruning_tolerance"])))
    return s


def settings_name(s: dict) -> str:
    """The preset name of the settings (``fox_pro``, ``transformer_llama``, ...), or ``official`` for another mix."""
    pro = (True, True, True, True)
    switches = (s["qk_norm"], s["output_gate"], s["output_norm"], s["kv_shift"])
    if switches not in (pro, (False,) * 4):
        return "official"
    family = "fox" if s["fgate"] == "data_dependent" and not s["rope"] else (
        "transformer" if s["fgate"] == "none" and s["rope"] else None)
    if family is None:
        return "official"
    return f"{family}_{'pro' if switches == pro else 'llama'}"


# ------------------------------------------------------------------------------------------------------ weights


def _layer_map(s: dict) -> dict[str, str]:
    """Official name → decoder name for one block's tensors (without the block prefixes), but the MLP's fused
    gate/up projection and the per-head output norm, which ``decoder_state_dict`` reshapes."""
    m = {"attn_norm.weight": "attn_norm.weight", "mlp_norm.weight": "mlp_norm.weight",
         "attn.q_proj.weight": "attn.q_proj.weight", "attn.o_proj.weight": "attn.o_proj.weight",
         "mlp.down_proj.weight": "mlp.w_down.weight"}
    for x in "kv":
        if s["kv_shift"]:
            m[f"attn.{x}_proj.linear.weight"] = f"attn.{x}_proj.weight"
            m[f"attn.{x}_proj.shift_proj.weight"] = f"attn.{x}_shift.proj.weight"
        else:
            m[f"attn.{x}_proj.weight"] = f"attn.{x}_proj.weight"
    if s["fgate"] == "data_dependent":
        m.update({"attn.fgate_proj.weight": "attn.fgate.proj.weight", "attn.fgate_proj.bias": "attn.fgate.proj.bias"})
    elif s["fgate"] != "none":
        m["attn.fgate_bias"] = "attn.fgate.bias"
    if s["output_gate"]:
        m["attn.ogate_proj.weight"] = "attn.g_proj.weight"
    if s["qk_norm"]:
        m.update({"attn.q_norm.weight": "attn.q_norm.weight", "attn.k_norm.weight": "attn.k_norm.weight"})
    return m


def _take(tensors: dict, used: set, name: str, shape: tuple) -> torch.Tensor:
    if name not in tensors:
        raise OfficialFormatError(f"model.safetensors: {name} is missing (the config says the model has it)")
    t = tensors[name]
    if tuple(t.shape) != tuple(shape):
        raise OfficialFormatError(f"model.safetensors: {name} has shape {tuple(t.shape)}; the config implies "
                                  f"{tuple(shape)}")
    used.add(name)
    return t


def _rotary_buffers(tensors: dict, used: set, s: dict) -> None:
    """A rotary ``inv_freq`` saved with the weights must be the one the decoder computes from rope_base."""
    D = s["head_dim"]
    want = s["rope_base"] ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    for name in [n for n in tensors if n.endswith("rotary.inv_freq")]:
        got = tensors[name].double()
        if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-6, atol=0):
            raise OfficialFormatError(f"model.safetensors: {name} differs from rope_base={s['rope_base']}'s "
                                      f"frequencies")
        used.add(name)


def decoder_state_dict(tensors: dict[str, torch.Tensor], s: dict) -> dict[str, torch.Tensor]:
    """The official checkpoint's ``tensors`` (official names) → a ``DecoderLM`` state dict for settings ``s``
    (``decoder_settings``). Every tensor must be used and have the shape the settings imply."""
    d, V, H, D = s["d_model"], s["vocab_size"], s["n_heads"], s["head_dim"]
    Hkv = s["n_kv_heads"] or H
    I = s["mlp_hidden_size"]
    shapes = {"attn_norm.weight": (d,), "mlp_norm.weight": (d,), "attn.q_proj.weight": (H * D, d),
              "attn.o_proj.weight": (d, H * D), "mlp.w_down.weight": (d, I), "attn.k_proj.weight": (Hkv * D, d),
              "attn.v_proj.weight": (Hkv * D, d), "attn.k_shift.proj.weight": (H, d),
              "attn.v_shift.proj.weight": (H, d), "attn.fgate.proj.weight": (H, d), "attn.fgate.proj.bias": (H,),
              "attn.fgate.bias": (H,), "attn.g_proj.weight": (H * D, d), "attn.q_norm.weight": (D,),
              "attn.k_norm.weight": (D,)}
    used: set[str] = set()
    out = {"embed.weight": _take(tensors, used, "model.embeddings.weight", (V, d)),
           "norm.weight": _take(tensors, used, "model.norm.weight", (d,)),
           "lm_head.weight": _take(tensors, used, "lm_head.weight", (V, d))}
    layer_map = _layer_map(s)
    for i in range(s["n_layers"]):
        src, dst = f"model.layers.{i}.", f"blocks.{i}."
        for a, b in layer_map.items():
            out[dst + b] = _take(tensors, used, src + a, shapes[b])
        gate_up = _take(tensors, used, src + "mlp.gate_proj.weight", (2 * I, d))
        out[dst + "mlp.w_gate.weight"], out[dst + "mlp.w_up.weight"] = gate_up[:I], gate_up[I:]  # chunk(2): gate, up
        if s["output_norm"]:
            out[dst + "attn.o_norm.weight"] = _take(tensors, used, src + "attn.output_norm.weight", (H * D,)).view(H, D)
    _rotary_buffers(tensors, used, s)
    unused = sorted(set(tensors) - used)
    if unused:
        raise OfficialFormatError(f"model.safetensors: {len(unused)} tensor(s) the config does not account for, "
                                  f"e.g. {unused[:3]}")
    return {k: v.contiguous() for k, v in out.items()}


# ------------------------------------------------------------------------------------------------------ export


def official_config(s: dict) -> dict:
    """The official config.json (its model keys) computing the decoder of settings ``s``; refuses what the
    official classes cannot express, naming the setting."""
    def need(cond: bool, key: str, why: str):
        if not cond:
            raise OfficialFormatError(f"model.{key}={s.get(key)!r} has no official equivalent: {why}")

    need(s.get("mixer", "softmax") == "softmax", "mixer", "the official code has no PaTH attention")
    llama = not any((s["qk_norm"], s["output_gate"], s["output_norm"], s["kv_shift"])) and s["fgate"] == "none"
    base = dict(vocab_size=s["vocab_size"], hidden_size=s["d_model"], num_hidden_layers=s["n_layers"],
                num_heads=s["n_heads"] or s["d_model"] // s["head_dim"], hidden_ratio=s["mlp_hidden_ratio"] * 3 / 2,
                intermediate_size=_width(s), hidden_act="swish", window_size=None, initializer_range=s["init_std"],
                elementwise_affine=True, norm_eps=s["norm_eps"], tie_word_embeddings=False, attention_bias=False,
                rope_base=s["rope_base"], use_rope=bool(s["rope"]))
    need(base["num_heads"] * s["head_dim"] == s["d_model"], "head_dim",
         "the official layers use head_dim = hidden_size / num_heads")
    if llama:
        return dict(model_type=TRANSFORMER_TYPE, architectures=["TransformerForCausalLM"],
                    num_kv_heads=s["n_kv_heads"], **base)
    need(s["n_kv_heads"] in (None, base["num_heads"]), "n_kv_heads", "the official FoX layer has no GQA")
    need(not s["qk_norm"] or _qk_eps(s) == QK_NORM_EPS, "qk_norm_eps",
         f"the official QK-norm's eps is {QK_NORM_EPS}")
    fgate = {v: k for k, v in FGATE_TYPES.items()}[s["fgate"]]
    init = s.get("fgate_init")
    c = dict(model_type=FOX_TYPE, architectures=["ForgettingTransformerForCausalLM"], num_kv_heads=None, **base,
             use_output_gate=bool(s["output_gate"]), ogate_act="sigmoid", fgate_type=fgate,
             fgate_bias_init=init is not None, decay_time_min=None if init is None else float(init[0]),
             decay_time_max=None if init is None else float(init[1]), use_output_norm=bool(s["output_norm"]),
             qk_norm=bool(s["qk_norm"]), qk_norm_share_param_across_head=True,
             log_pruning_tolerance=math.log(s["acp_eps"]) if s.get("acp") else None,
             use_k_shift=bool(s["kv_shift"]), use_v_shift=bool(s["kv_shift"]))
    need(fgate != "full" or init is None, "fgate_init", "the official data-dependent gate has no bias init")
    return c


def _width(s: dict) -> int:
    return mlp_width(SimpleNamespace(**s))


def _qk_eps(s: dict) -> float:
    return s["norm_eps"] if s.get("qk_norm_eps") is None else s["qk_norm_eps"]


def official_state_dict(sd: dict[str, torch.Tensor], s: dict) -> dict[str, torch.Tensor]:
    """A ``DecoderLM`` state dict → the official tensors (``official_config(s)`` names them). A shared output norm
    (``output_norm_per_head=false``) is written per head, each head a copy: the same function."""
    H, D = s["n_heads"] or s["d_model"] // s["head_dim"], s["head_dim"]
    out = {"model.embeddings.weight": sd["embed.weight"], "model.norm.weight": sd["norm.weight"],
           "lm_head.weight": sd["lm_head.weight"]}
    layer_map = _layer_map(s)
    for i in range(s["n_layers"]):
        src, dst = f"blocks.{i}.", f"model.layers.{i}."
        for a, b in layer_map.items():
            out[dst + a] = sd[src + b]
        out[dst + "mlp.gate_proj.weight"] = torch.cat([sd[src + "mlp.w_gate.weight"], sd[src + "mlp.w_up.weight"]])
        if s["output_norm"]:
            w = sd[src + "attn.o_norm.weight"]
            out[dst + "attn.output_norm.weight"] = (w if w.dim() == 2 else w.expand(H, D)).reshape(H * D)
    used = {f"blocks.{i}.{b}" for i in range(s["n_layers"]) for b in layer_map.values()}
    missing = sorted(k for k in sd if k.startswith("blocks.") and k not in used and not
                     k.endswith(("w_gate.weight", "w_up.weight", "o_norm.weight")))
    if missing:
        raise OfficialFormatError(f"no official name for {missing[:3]}")
    return {k: v.detach().contiguous() for k, v in out.items()}
