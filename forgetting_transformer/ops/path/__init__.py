"""PaTH attention's plain-PyTorch reference (``reference.py``), used by ``models/path.py`` on the CPU and as the
oracle of fla's PaTH kernel, which the GPU path runs."""

from .reference import check_path_inputs, path_attention_ref, path_transform_keys

__all__ = ["check_path_inputs", "path_attention_ref", "path_transform_keys"]
