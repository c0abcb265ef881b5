"""Prompts of different lengths as one left-padded batch: token ids (B, T) and each row's first real token."""

from __future__ import annotations

import torch


def seq_start_from_mask(attention_mask: torch.Tensor, allow_right_padding: bool = False) -> torch.Tensor | None:
    """(B, T) 0/1 mask → (B,) index of each row's first real token (T for an all-pad row), or None when no row
    starts with padding.

    Every row must be 0…0 1…1 (left padding) or, with ``allow_right_padding``, 0…0 1…1 0…0: trailing pads cannot
    affect earlier tokens of a causal model, so a forward pass without a cache needs no masking for them. A cache
    (and so generation) would put pads before later tokens, so it needs left padding. Padding between real
    tokens raises.
    """
    if attention_mask.dim() != 2:
        raise ValueError(f"attention_mask must be (batch, seq_len) 0/1; got shape {tuple(attention_mask.shape)}")
    mask = attention_mask.to(torch.int64)
    if bool(((mask != 0) & (mask != 1)).any()):
        raise ValueError(f"attention_mask must hold only 0 and 1; got values {mask.unique().tolist()}")
    T = mask.shape[1]
    ones = mask.sum(dim=1)  # (B,)
    first = mask.argmax(dim=1)  # first real token (argmax returns the first maximum)
    last = T - 1 - mask.flip(1).argmax(dim=1)  # last real token
    inner = (ones > 0) & (last - first + 1 != ones)
    right = (ones > 0) & (last < T - 1)
    bad = inner if allow_right_padding else inner | right
    if bool(bad.any()):
        row = int(bad.nonzero()[0])
        where = "between real tokens" if bool(inner[row]) else "at the end (right padding)"
        allowed = "0…0 1…1 0…0 without a cache" if allow_right_padding else "0…0 1…1"
        raise ValueError(f"attention_mask row {row} has padding {where} (its {int(ones[row])} real tokens lie "
                         f"between positions {int(first[row])} and {int(last[row])} of {T}): the model needs "
                         f"each row {allowed}; cached decoding and generate() need left padding (set "
                         f"tokenizer.padding_side = 'left')")
    start = torch.where(ones > 0, first, T)
    return start if bool((start > 0).any()) else None


def left_pad(prompts, pad_token_id: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """A list of 1-D token sequences (lists or tensors, lengths may differ) → ids (B, T) int64 left-padded with
    ``pad_token_id`` and the attention mask (B, T), T the longest prompt."""
    rows = [torch.as_tensor(p, dtype=torch.int64).flatten() for p in prompts]
    if not rows or any(len(r) == 0 for r in rows):
        raise ValueError("input_ids as a list needs at least one prompt, each of at least one token")
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), pad_token_id, dtype=torch.int64)
    mask = torch.zeros(len(rows), T, dtype=torch.int64)
    for i, r in enumerate(rows):
        ids[i, T - len(r):] = r
        mask[i, T - len(r):] = 1
    return ids.to(device), mask.to(device)


def batch_prompts(input_ids, attention_mask, pad_token_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``input_ids`` (B, T) with an optional left-padding ``attention_mask``, or a list of prompts → ids (B, T)
    on ``device`` and seq_start (B,) int64, each row's first real token."""
    if isinstance(input_ids, (list, tuple)):
        if attention_mask is not None:
            raise ValueError("attention_mask goes with input_ids as a (batch, seq_len) tensor; a list of prompts "
                             "is padded here")
        input_ids, attention_mask = left_pad(input_ids, pad_token_id)
    if not (torch.is_tensor(input_ids) and input_ids.dim() == 2 and input_ids.shape[1] > 0):
        raise ValueError(f"input_ids must be a (batch, seq_len) tensor with seq_len >= 1 or a list of prompts; got "
                         f"{tuple(input_ids.shape) if torch.is_tensor(input_ids) else type(input_ids).__name__}")
    ids = input_ids.to(device=device, dtype=torch.int64)
    B, T = ids.shape
    start = None
    if attention_mask is not None:
        if tuple(attention_mask.shape) != (B, T):
            raise ValueError(f"attention_mask must be (batch, seq_len) = {(B, T)}; got {tuple(attention_mask.shape)}")
        start = seq_start_from_mask(attention_mask)
    if start is None:
        return ids, torch.zeros(B, dtype=torch.int64, device=device)
    if bool((start == T).any()):
        raise ValueError(f"attention_mask row {int((start == T).nonzero()[0])} has no real token")
    return ids, start.to(device=device, dtype=torch.int64)
