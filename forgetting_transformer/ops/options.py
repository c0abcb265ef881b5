"""How the op picks its kernels: one options object, passed per call or set as the default.

    from forgetting_transformer.ops.forgetting_attention import (AttentionOptions, forgetting_attention,
                                                                 set_default_options, use_options)

    o = forgetting_attention(q, k, v, log_f, options=AttentionOptions(autotune=False))   # one call
    set_default_options(AttentionOptions(fused_backward=False))                           # the process
    with use_options(gluon=False):                                                        # a block of code
        o = forgetting_attention(q, k, v, log_f)

A call without ``options`` takes the default in force when it is made (``default_options()``), and its backward
runs with the options of its forward. A graph traced by ``torch.compile`` keeps the options it was traced with.
The default is one per process (``use_options`` changes it for every thread until the block ends).

The environment variables ``FOX_AUTOTUNE``, ``FOX_GLUON`` and ``FOX_FUSED_BWD`` ("0" turns the feature off) are
read once, when this module is imported, into the process default: they let a shell command (the GPU test script,
a benchmark) pick the kernels without code. ``TRITON_INTERPRET=1`` (read once too; it must be set before triton
is imported) runs the Triton kernels in triton's CPU interpreter.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
from typing import Mapping, Optional

BACKENDS = (None, "triton", "reference")
KINDS = ("fwd", "dq", "dkdv")  # the Triton kernels whose tiles a config sets


_INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") == "1"


def interpreting() -> bool:
    """TRITON_INTERPRET=1 when this module was imported: the Triton kernels run in triton's CPU interpreter (one
    config, no autotuning)."""
    return _INTERPRETING


@dataclasses.dataclass(frozen=True)
class TileConfig:
    """One launch config of a Triton kernel: ``block_m`` query rows by ``block_n`` keys per tile (for the dk/dv
    kernel: query rows per step by keys per program), ``num_warps`` warps, ``num_stages`` pipeline stages."""

    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self):
        for name in ("block_m", "block_n"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 16 and value & (value - 1) == 0):
                raise ValueError(f"TileConfig.{name} must be a power of two >= 16; got {value!r}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"TileConfig.num_warps must be 1, 2, 4, 8 or 16; got {self.num_warps!r}")
        if not (isinstance(self.num_stages, int) and self.num_stages >= 1):
            raise ValueError(f"TileConfig.num_stages must be an int >= 1; got {self.num_stages!r}")

    def meta(self) -> dict:
        """The kernel's constexpr tile sizes."""
        return dict(BLOCK_M=self.block_m, BLOCK_N=self.block_n)


@dataclasses.dataclass(frozen=True)
class AttentionOptions:
    """The kernel choices of ``forgetting_attention``. Every field has the default users get.

    backend: ``None`` (CUDA bf16 / fp16 tensors run the kernels; CPU tensors, and fp32 on CUDA, the PyTorch
        reference), ``"triton"`` (the kernels on any device; on a CPU under ``TRITON_INTERPRET=1``) or
        ``"reference"``. A call's ``backend=`` argument overrides it.
    autotune: autotune the Triton kernels on a GPU over the configs that fit the device's shared memory (one
        benchmark per shape class, then its pick); False: one config per kernel from the head dim.
    gluon: on Hopper, run the warp-specialised Gluon kernels where they apply (head dims 64 and 128, no documents
        or padding); False: the Triton kernels everywhere.
    fused_backward: on Hopper at head dim 64, the one-kernel backward (dq added by TMA reduce-adds, whose order
        varies); False: the dq and dk/dv kernels.
    deterministic: a bitwise-reproducible backward (the dq and dk/dv kernels); also in force while
        ``torch.use_deterministic_algorithms(True)`` is.
    triton_configs: ``{"fwd" | "dq" | "dkdv": TileConfig or (block_m, block_n, num_warps, num_stages)}``: the
        Triton kernels named launch with these tiles instead of autotuning or the head dim's config (a config
        that does not fit the device's shared memory is refused before launch). Kept as a sorted tuple of
        (kind, TileConfig) pairs (``triton_config(kind)`` reads it), so that the options stay hashable.
    acp_grid: ``(GM, GN)``, the grid on which ACP's pruned region is defined; None: the op's grid for the head
        dim (``acp.grid``). The kernels prune exactly the region of the grid whatever their tiles.

    ``token`` (not a field) is the options as a JSON string, the form the ``torch.library`` ops take them in
    (``from_token`` reads it back).
    """

    backend: Optional[str] = None
    autotune: bool = True
    gluon: bool = True
    fused_backward: bool = True
    deterministic: bool = False
    triton_configs: Mapping[str, TileConfig] = dataclasses.field(default_factory=dict)
    acp_grid: Optional[tuple[int, int]] = None

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be None, 'triton' or 'reference'; got {self.backend!r}")
        for name in ("autotune", "gluon", "fused_backward", "deterministic"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"AttentionOptions.{name} must be a bool; got {getattr(self, name)!r}")
        configs = {}
        for kind, cfg in dict(self.triton_configs).items():
            if kind not in KINDS:
                raise ValueError(f"triton_configs: kind must be one of {KINDS}; got {kind!r}")
            configs[kind] = cfg if isinstance(cfg, TileConfig) else TileConfig(*cfg)
        # a sorted tuple of pairs: frozen, hashable, and equal for equal contents
        object.__setattr__(self, "triton_configs", tuple(sorted(configs.items())))
        if self.acp_grid is not None:
            grid = tuple(self.acp_grid)
            if len(grid) != 2 or not all(isinstance(g, int) and g >= 1 for g in grid):
                raise ValueError(f"acp_grid must be None or two positive ints (GM, GN); got {self.acp_grid!r}")
            object.__setattr__(self, "acp_grid", grid)
        # the options as a string (a JSON object), the form the torch.library ops take them in; formed here, once,
        # since torch.compile traces an attribute read but not json.dumps
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        fields["triton_configs"] = {k: dataclasses.astuple(c) for k, c in self.triton_configs}
        object.__setattr__(self, "token", json.dumps(fields, sort_keys=True))

    def triton_config(self, kind: str) -> Optional[TileConfig]:
        """The fixed config of the Triton kernel ``kind``, or None."""
        for k, cfg in self.triton_configs:
            if k == kind:
                return cfg
        return None

    def replace(self, **changes) -> "AttentionOptions":
        """A copy with ``changes``."""
        return dataclasses.replace(self, **changes)


@functools.lru_cache(maxsize=256)
def from_token(token: str) -> AttentionOptions:
    """The options of ``AttentionOptions.token`` (cached: the ops' implementations read them on every call)."""
    fields = json.loads(token)
    if fields["acp_grid"] is not None:
        fields["acp_grid"] = tuple(fields["acp_grid"])
    return AttentionOptions(**fields)


def _from_environment() -> AttentionOptions:
    """The defaults with the ``FOX_*`` overrides of the environment this module is imported in."""
    env = {name: os.environ.get(var, "1") != "0"
           for name, var in (("autotune", "FOX_AUTOTUNE"), ("gluon", "FOX_GLUON"), ("fused_backward", "FOX_FUSED_BWD"))}
    return AttentionOptions(**env)


# A module global, not a context variable: torch.compile traces a global's read, not ContextVar.get
_DEFAULT = _from_environment()


def default_options() -> AttentionOptions:
    """The options a call without ``options`` takes: those of the innermost ``use_options`` block, else those of
    ``set_default_options`` (initially the dataclass defaults with the environment's overrides)."""
    return _DEFAULT


def _resolve(options, changes) -> AttentionOptions:
    if options is not None and not isinstance(options, AttentionOptions):
        raise TypeError(f"options must be an AttentionOptions; got {type(options).__name__}")
    base = default_options() if options is None else options
    return base.replace(**changes) if changes else base


def set_default_options(options: Optional[AttentionOptions] = None, **changes) -> AttentionOptions:
    """Set the default to ``options`` (or to the current default with ``changes``, e.g.
    ``set_default_options(autotune=False)``); returns the previous default."""
    global _DEFAULT
    previous = _DEFAULT
    _DEFAULT = _resolve(options, changes)
    return previous


@contextlib.contextmanager
def use_options(options: Optional[AttentionOptions] = None, **changes):
    """Within the block, calls without ``options`` (in every thread) take ``options`` (or the current default with
    ``changes``); the previous default is restored at its end. Yields the options."""
    previous = set_default_options(options, **changes)
    try:
        yield _DEFAULT
    finally:
        set_default_options(previous)
