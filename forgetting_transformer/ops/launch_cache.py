"""Kernel launches that skip triton's per-call host work once a kernel's specialisation is known.

``fn[grid](*args, **kwargs)`` re-derives on every call what it compiled for: it binds the arguments, specialises
each one (a tensor's dtype and 16-byte alignment; an int equal to 1, divisible by 16, in int32 or int64 range; a
TMA descriptor's dtype, block shape and layout ``repr``), joins them into a string key, looks the kernel up,
checks the kernel's global variables, builds launch metadata and calls the (empty) launch hooks. On an H100
machine's CPU that costs 27-66 us per Triton launch and 57-146 us per Gluon launch inside an eager call, as much as
the kernels take at small shapes (``python -m benchmarks.attention.breakdown host --functions 40`` shows
where it goes).

``launch(fn, grid, *args, **kwargs)`` is ``fn[grid](*args, **kwargs)``. The first call of a specialisation goes
through triton (binding, compiling if needed, launching) and keeps the compiled kernel under a key of the facts
triton specialises on, each at least as finely: per tensor its dtype and whether its address is 16-byte aligned;
per int whether it is 1, divisible by 16, in int32 and in int64 range; per float, bool or None its type; per TMA
descriptor its type, dtype, block shape and layout; constexpr parameters and keyword arguments by value; the
current device. Later calls with the same key call the compiled kernel's launcher directly, on the current
stream. Everything else takes triton's own path on every call: arguments of other types, functions that are
not ``@triton.jit`` / ``@gluon.jit`` kernels (an autotuner, the CPU interpreter's kernels), and launches while a
launch hook is installed (a profiler's). Triton's knobs that change what a kernel compiles to (``TRITON_DEBUG``,
instrumentation) are taken as fixed for the process.

``launch_keyed(key, fn, grid, *args, **kwargs)`` is ``launch`` for a launcher that names the specialisation
itself: ``key`` is built from what the arguments derive from (shapes, strides, dtypes, constexprs, and the 16-byte
alignment of each tensor the launcher did not allocate), which skips the per-argument key (~30 arguments, 3-4 us of
host time per launch). ``static(key, build)`` keeps what a launcher derives from such a key (its ints, grid and
constexprs), so that a repeated call does not derive them again.

``verify()`` makes every direct launch also ask triton which kernel it would launch and raise if it is another,
and every keyed launch also check that its key finds the kernel the full key finds (the GPU tests run the op under
it).
"""

from __future__ import annotations

import contextlib
import functools

import torch

_CACHE: dict = {}  # (id(fn), device, arg keys, kwargs) -> (launcher, function handle, packed metadata, tail, kernel)
_KEYED: dict = {}  # (id(fn), device, a launcher's key) -> the entry of _CACHE that its first launch found
_STATIC: dict = {}  # a launcher's key -> what ``static`` built for it
# id(fn) -> (fn, positions of its constexpr parameters or None where launches take triton's path); keyed by id, as
# a JITFunction's own hash is that of its source-derived cache key, and fn kept so that its id is never reused
_SPECS: dict = {}
_LAYOUTS: dict = {}  # id(layout) -> (layout, repr): the layout is kept so that its id is never reused
_DEVICE = _STREAM = _RUNTIME = None  # triton's current device and stream, and its runtime knobs (set on first use)
_VERIFYING = None  # under ``verify()``: its counts


class _Uncached(Exception):
    """An argument whose specialisation the key does not cover: the launch takes triton's path."""


@functools.lru_cache(maxsize=None)
def _descriptor_types():
    """Triton's TMA descriptor classes (host-side ``TensorDescriptor`` and Gluon's)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor, GluonDescriptor


def _layout_key(layout):
    hit = _LAYOUTS.get(id(layout))
    if hit is None:
        hit = _LAYOUTS[id(layout)] = (layout, repr(layout))
    return hit[1]


def arg_key(a):
    """The part of the key for one runtime argument ``a``; raises ``_Uncached`` for a type it does not cover."""
    t = type(a)
    if t is int:
        return (a == 1, a % 16 == 0, -2 ** 31 <= a < 2 ** 31, -2 ** 63 <= a < 2 ** 63)
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.data_ptr() % 16 == 0)
    if t is float or t is bool or a is None:
        return t
    if t in _descriptor_types():
        layout = getattr(a, "layout", None)
        return (t, a.base.dtype, tuple(a.block_shape), None if layout is None else _layout_key(layout))
    raise _Uncached


def _spec(fn):
    """Positions of ``fn``'s constexpr parameters, or None where ``fn`` takes triton's path on every launch."""
    global _DEVICE, _STREAM, _RUNTIME
    spec = _SPECS.get(id(fn))
    if spec is None:
        from triton.runtime.jit import JITFunction

        ok = isinstance(fn, JITFunction)  # (the interpreter's kernels and autotuners are not)
        if ok and _DEVICE is None:
            from triton import knobs
            from triton.runtime.driver import driver

            _DEVICE, _STREAM = driver.active.get_current_device, driver.active.get_current_stream
            _RUNTIME = knobs.runtime
        spec = _SPECS[id(fn)] = (fn, frozenset(p.num for p in fn.params if p.is_constexpr) if ok else None)
    return spec[1]


def _key(fn, args, kwargs):
    constexprs = _spec(fn)
    if constexprs is None:
        raise _Uncached
    if constexprs:
        parts = tuple((a,) if i in constexprs else arg_key(a) for i, a in enumerate(args))
    else:
        parts = tuple(map(arg_key, args))
    return id(fn), _DEVICE(), parts, tuple(kwargs.items())


def _hooked():
    """Whether a launch hook is installed (a profiler's): then launches take triton's path, which calls it."""
    for hook in (_RUNTIME.launch_enter_hook, _RUNTIME.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):  # (an empty hook chain calls nothing)
            return True
    return False


def _remember(key, fn, kernel, args, kwargs):
    """Keep ``kernel`` (what ``fn[grid]`` returned) and the parameters after the positional ones (keyword
    arguments and defaults; fixed for a key) for direct launches."""
    tail = tuple(kwargs[p.name] if p.name in kwargs else p.default for p in fn.params[len(args):])
    _CACHE[key] = (kernel.run, kernel.function, kernel.packed_metadata, tail, kernel)


def launch(fn, grid, *args, **kwargs):
    """``fn[grid](*args, **kwargs)`` (``grid``: a tuple of 1 to 3 ints), directly once ``fn``'s kernel for these
    arguments' specialisation has been launched through triton (the module docstring says when)."""
    _launch(fn, grid, args, kwargs)


def _launch(fn, grid, args, kwargs):
    try:
        key = _key(fn, args, kwargs)
        hit = _CACHE.get(key)
    except (_Uncached, TypeError):  # (TypeError: an unhashable constexpr)
        fn[grid](*args, **kwargs)
        return
    if hit is None or _hooked():
        kernel = fn[grid](*args, **kwargs)
        if hit is None and kernel is not None:  # (None: triton compiles it asynchronously; nothing to keep yet)
            _remember(key, fn, kernel, args, kwargs)
        return
    run, function, packed, tail, kernel = hit
    if _VERIFYING is not None:
        _check(fn, grid, args, kwargs, kernel)
    g = (*grid, 1, 1)
    run(g[0], g[1], g[2], _STREAM(key[1]), function, packed, None, None, None, *args, *tail)


def launch_keyed(key, fn, grid, *args, **kwargs):
    """``launch(fn, grid, *args, **kwargs)`` where ``key`` (hashable) determines every fact that triton
    specialises ``args`` and ``kwargs`` on: the launcher builds it from the shapes, strides, dtypes and constexprs
    its arguments derive from and the 16-byte alignment of each tensor it did not allocate. The first launch under
    a key takes ``launch``'s path and remembers the kernel that it found."""
    dev = _DEVICE() if _DEVICE is not None else None
    hit = _KEYED.get((id(fn), dev, key))
    if hit is None or _VERIFYING is not None or _hooked():
        _launch_keyed_slow(key, hit, fn, grid, args, kwargs)
        return
    run, function, packed, tail, _ = hit
    g = (*grid, 1, 1)
    run(g[0], g[1], g[2], _STREAM(dev), function, packed, None, None, None, *args, *tail)


def _launch_keyed_slow(key, hit, fn, grid, args, kwargs):
    """A keyed launch through ``launch``: the first under its key (remembered, if ``launch`` kept the kernel), under
    ``verify()`` (the key's entry checked against the full key's) or with a launch hook installed."""
    try:
        full = _key(fn, args, kwargs)
    except (_Uncached, TypeError):
        full = None
    if hit is not None and _VERIFYING is not None and _CACHE.get(full) is not hit:
        raise AssertionError(f"launch_cache: the launcher's key {key!r} finds another {fn.__name__} kernel than its "
                             f"arguments' full key: the launcher's key misses a fact triton specialises on")
    _launch(fn, grid, args, kwargs)
    entry = None if full is None else _CACHE.get(full)
    if hit is None and entry is not None:
        _KEYED[(id(fn), full[1], key)] = entry


def static(key, build):
    """What ``build()`` returned for ``key`` the first time (a launcher's ints, grid and constexprs for a key that
    determines them)."""
    got = _STATIC.get(key)
    if got is None:
        got = _STATIC[key] = build()
    return got


def aligned(*tensors):
    """Whether each tensor's address is 16-byte aligned, as one int of bits (a launcher's key part)."""
    bits = 0
    for t in tensors:
        bits = 2 * bits + (t.data_ptr() % 16 == 0)
    return bits


def _check(fn, grid, args, kwargs, kernel):
    expected = fn.warmup(*args, grid=grid, **kwargs)  # (triton binds and specialises, finds it, launches nothing)
    if expected is not kernel:
        raise AssertionError(f"launch_cache: {fn.__name__} would launch another kernel than triton picks for these "
                             f"arguments; the cache key misses a fact triton specialises on")
    _VERIFYING["direct"] += 1


@contextlib.contextmanager
def verify():
    """Within the context, every direct launch first asks triton (``fn.warmup``) which compiled kernel it would
    launch for the arguments, and raises ``AssertionError`` if that is not the one the cache launches. Yields a
    dict whose ``"direct"`` counts the direct launches checked."""
    global _VERIFYING
    saved, _VERIFYING = _VERIFYING, {"direct": 0}
    try:
        yield _VERIFYING
    finally:
        _VERIFYING = saved


def clear():
    """Forget the kept kernels (the next launch of each specialisation goes through triton again)."""
    _CACHE.clear()
    _KEYED.clear()
