"""Which tokenizer class transformers' AutoTokenizer picks for a local model folder, remembered across starts.

To pick it, AutoTokenizer builds the model's config, and importing a config class imports transformers' model-loading
code (torch.distributed.tensor among it): ~0.7 of the ~0.9 s a tokenizer takes to load, in a `gym chat` start that
the fast engine otherwise gets to first token in ~2 s. The pick depends only on the folder's small files (config.json,
tokenizer_config.json, ...) and on transformers' version, so it is remembered under $GYM_HOME/tokenizers, keyed by
those (name, size and modification time of every file in the folder except the weights). A later load of the same
folder calls that class's own `from_pretrained` as AutoTokenizer does. Only classes defined inside transformers are
remembered: a tokenizer brought by the model's own code (auto_map) always goes through AutoTokenizer.

GYM_TOKENIZER_MEMO=0 turns it off.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from gym.core.errors import OutputError
from gym.core.files import temp_path
from gym.core.home import gym_home

logger = logging.getLogger(__name__)

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".lock")


def enabled() -> bool:
    return os.environ.get("GYM_TOKENIZER_MEMO", "1").strip().lower() not in ("0", "false", "no", "off")


def _key(folder: Path) -> str:
    import transformers

    digest = hashlib.sha256(f"{transformers.__version__}|{folder.resolve()}".encode())
    for file in sorted(folder.iterdir()):
        if file.is_file() and not file.name.endswith(WEIGHT_SUFFIXES):
            stat = file.stat()
            digest.update(f"|{file.name}|{stat.st_size}|{stat.st_mtime_ns}".encode())
    return digest.hexdigest()


def memo_file(folder: Path) -> Path:
    return gym_home() / "tokenizers" / f"{hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:16]}.json"


def remembered(folder: str | os.PathLike[str]) -> Any:
    """The class AutoTokenizer picked for this folder as it is now, or None (not a folder, never loaded, changed)."""
    path = Path(folder)
    if not enabled() or not path.is_dir():
        return None
    try:
        memo = json.loads(memo_file(path).read_text())
        if memo.get("key") != _key(path):
            return None
        module, _, name = str(memo["class"]).rpartition(".")
        if not module.startswith("transformers."):
            return None
        found = getattr(importlib.import_module(module), name)
    except (OSError, ValueError, KeyError, TypeError, ImportError, AttributeError):
        return None
    return found if isinstance(found, type) else None


def remember(folder: str | os.PathLike[str], tokenizer: Any) -> None:
    """Note the class AutoTokenizer picked for `folder`, when it is transformers' own."""
    path = Path(folder)
    cls = type(tokenizer)
    if not enabled() or not path.is_dir() or not cls.__module__.startswith("transformers."):
        return
    target = memo_file(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = temp_path(target)
        temporary.write_text(json.dumps({"key": _key(path), "class": f"{cls.__module__}.{cls.__qualname__}",
                                         "folder": str(path.resolve())}))
        os.replace(temporary, target)
    except (OSError, OutputError) as exc:  # a read-only home: every start then asks AutoTokenizer, as before
        logger.debug("Cannot remember the tokenizer class of %s: %s", path, exc)
