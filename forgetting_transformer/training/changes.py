"""What a resume may change in a run's config, and the record of what it changed.

A resumed run continues the computation its ``config.yaml`` describes. The keys of ``FREE`` leave that computation
as it is (where the run writes and how often, when it stops, what a NaN does, its evaluation, wandb, the attention
kernels, FSDP's two communication knobs, which are tested to train identically): a resume may change them. A
change of any other key is refused by ``check_resume``, naming each key with its old and new value, unless
``resume_changes=allow``. ``record_changes`` then writes each change, with the first step it applies to, into
``config_changes.jsonl`` and makes config.yaml the config in force: config.yaml always describes the newest state
(the evaluation tools build the model from it), and the config of an earlier step is config.yaml with the later
changes undone. Like metrics.jsonl, config_changes.jsonl keeps the rows of the state a run resumes from.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import yaml
from omegaconf import OmegaConf

from ..config import ConfigError
from .rundir import write_atomic

CONFIG, CHANGES = "config.yaml", "config_changes.jsonl"
FREE = ("output_dir", "cache_dir", "resume", "overwrite", "resume_changes", "train.log_every", "train.checkpoint_every",
        "train.keep_checkpoints", "train.max_steps", "train.nonfinite", "train.peak_tflops", "eval", "wandb",
        "model.attention", "strategy.reshard_after_forward", "strategy.fsdp_prefetch")
ABSENT = object()  # a key one of two configs lacks (one written before the key existed)


def flat(tree: dict, prefix: str = "") -> dict:
    """``{dotted key: value}`` of a nested config (a list is one value)."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def nested(config: dict) -> dict:
    """The nested config of a ``flat`` one."""
    tree: dict = {}
    for key, value in config.items():
        *parents, last = key.split(".")
        node = tree
        for name in parents:
            node = node.setdefault(name, {})
        node[last] = value
    return tree


def config_of(cfg) -> dict:
    """The flat plain values of a run's config (Enums as their names, as config.yaml holds them)."""
    return flat(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))


def stored_config(out: Path) -> dict | None:
    """The flat config of the run in ``out`` (its config.yaml); None when it has none."""
    path = out / CONFIG
    if not path.is_file():
        return None
    try:
        return flat(OmegaConf.to_container(OmegaConf.load(path), resolve=True))
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"{path} does not read ({str(e).splitlines()[0]}): it is the run's config; restore it, "
                          "or start a new run") from e


def is_free(key: str) -> bool:
    return any(key == k or key.startswith(f"{k}.") for k in FREE)


def differences(old: dict, new: dict) -> list[tuple[str, object, object]]:
    """``(key, old value, new value)`` of each key outside ``FREE`` whose value differs (``ABSENT``: not there)."""
    keys = dict.fromkeys([*old, *new])
    return [(k, old.get(k, ABSENT), new.get(k, ABSENT)) for k in keys
            if not is_free(k) and old.get(k, ABSENT) != new.get(k, ABSENT)]


def show(value) -> str:
    return "(absent)" if value is ABSENT else json.dumps(value)


def check_resume(stored: dict | None, cfg, out: Path) -> None:
    """Refuse a resume whose config changes the run's computation, its ``differences`` from the run's config.yaml
    (``stored``, flat), unless ``resume_changes=allow``: one ConfigError naming each key, old → new."""
    if stored is None or cfg.resume_changes == "allow":
        return
    changed = differences(stored, config_of(cfg))
    if changed:
        listed = ", ".join(f"{key} {show(a)} → {show(b)}" for key, a, b in changed)
        raise ConfigError(f"resume=true would change the run's computation: {listed} (against {out / CONFIG}); "
                          "resume with the run's values, or pass resume_changes=allow to apply them from the step "
                          f"it resumes at (recorded in {CHANGES})")


def _set(config: dict, key: str, row: dict, side: str) -> None:
    if side in row:
        config[key] = row[side]
    else:
        config.pop(key, None)


def record_changes(out: Path, cfg, step: int, say: Callable[[str], None]) -> None:
    """Once a resume has loaded the state of ``step``: the rows of config_changes.jsonl from later steps (a state
    not resumed) are dropped and undone on config.yaml; each difference of ``cfg`` from that config becomes a row
    applying from step ``step + 1``, said through ``say``; config.yaml becomes the config in force. Writes only what
    changes (the rows first: a crash between the two writes leaves rows that the next resume redoes). Rank 0."""
    stored, path = stored_config(out), out / CHANGES  # claim_run_dir has written config.yaml
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    kept, config = [r for r in rows if r["from_step"] <= step], dict(stored)
    for row in reversed([r for r in rows if r["from_step"] > step]):
        _set(config, row["key"], row, "old")
    added = [{"from_step": step + 1, "key": key, **({} if a is ABSENT else {"old": a}),
              **({} if b is ABSENT else {"new": b})} for key, a, b in differences(config, config_of(cfg))]
    for row in added:
        _set(config, row["key"], row, "new")
        say(f"config change from step {step + 1}: {row['key']} {show(row.get('old', ABSENT))} → "
            f"{show(row.get('new', ABSENT))} (recorded in {path})")
    if kept + added != rows:
        write_atomic(path, "".join(json.dumps(r) + "\n" for r in kept + added))
    if config != stored:
        write_atomic(out / CONFIG, OmegaConf.to_yaml(OmegaConf.create(nested(config))))
