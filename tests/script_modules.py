"""Import a file of scripts/ (or train.py) as a module by its path, as ``python scripts/<name>.py`` would run it:
registered under its bare name, so a script's import of a sibling script (loaded first) resolves. The repository
root stays off ``sys.path``: the package comes from its installation (``pip install -e .``)."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_script(name: str, path: Path | None = None):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path or ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up by name
    spec.loader.exec_module(module)
    return module
