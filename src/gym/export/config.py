"""What `gym export` reads besides the model keys: where to write, which format, and how."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gym.config.aliases import EXPORT_KEY_ALIASES
from gym.config.coerce import split_keys
from gym.config.parser import check_keys
from gym.core.errors import ConfigError
from gym.core.names import did_you_mean
from gym.export.spelling import Spelling, current_spelling, option

FORMATS = ("hf", "gguf", "gguf-lora", "ollama", "onnx")
DTYPES = ("auto", "float32", "float16", "bfloat16")
# The CLI's short spellings (`--format gguf`).
ALIASES = {"format": "export_format", "type": "export_type", "overwrite": "export_overwrite", "dtype": "export_dtype",
           **EXPORT_KEY_ALIASES}


@dataclass
class ExportArguments:
    export_dir: str | None = None
    """The folder (or file, for single-file formats) to write."""
    export_format: str = "hf"
    export_type: str | None = None
    """The weight type of the exported file. gguf: the GGUF type (f16 by default); hf or gguf: `bitdelta`, the
    fine-tune as its BitDelta variant serves it (base + 1-bit signs with one scale per row), written at export_dtype /
    as f16."""
    export_size: float = 5.0
    """hf: the largest safetensors shard, in GB (LLaMA-Factory's key)."""
    export_dtype: str = "auto"
    """hf: float32, float16, bfloat16, or auto (the dtype the base model was saved in)."""
    export_overwrite: bool = False
    delta: str | None = None
    """A BitDelta/DeltaQuant file (`gym delta compress`) applied to the base: the export is the rebuilt model."""
    variant: str | None = None
    """STORE:USER, a personalized variant (`gym variants`): the export is its base + 1-bit delta, as it is served."""

    def __post_init__(self) -> None:
        # Case is not part of a name here: Gym writes `...-Q4_0.gguf`, and users type what they read.
        if isinstance(self.export_format, str):
            self.export_format = self.export_format.lower()
        if isinstance(self.export_type, str):
            self.export_type = self.export_type.lower()
        if self.export_format not in FORMATS:
            raise ConfigError(f"Unknown export format {self.export_format!r}."
                              f"{did_you_mean(self.export_format, FORMATS)} Available: {', '.join(FORMATS)}.")
        if self.export_dtype not in DTYPES:
            raise ConfigError(f"export_dtype must be one of {', '.join(DTYPES)}, got {self.export_dtype!r}.")
        if not self.export_size > 0:
            raise ConfigError(f"export_size (GB per shard) must be positive, got {self.export_size}.")
        if self.export_type == "bitdelta":
            if self.export_format == "gguf-lora" or self.delta:
                raise ConfigError("export_type bitdelta exports a fine-tune as its BitDelta variant; it "
                                  "applies to the hf and gguf formats, without a delta.")
        elif self.export_format in ("gguf", "ollama") and self.export_type is not None:
            from gym.export.gguf_file import TYPES

            if self.export_type not in TYPES:
                raise ConfigError(f"Unknown GGUF type {self.export_type!r}."
                                  f"{did_you_mean(self.export_type, TYPES)} Choose one of: {', '.join(TYPES)}.")
        if self.export_format == "gguf-lora" and self.export_type not in (None, "f32", "f16", "bf16", "q8_0"):
            raise ConfigError(f"A gguf-lora adapter is written as f32, f16, bf16 or q8_0, not {self.export_type!r}."
                              f"{did_you_mean(self.export_type, ('f32', 'f16', 'bf16', 'q8_0'))}")
        if self.export_format in ("hf", "onnx") and self.export_type not in (None, "bitdelta"):
            typo = did_you_mean(self.export_type, ["bitdelta"])  # the one type these formats take, misspelt
            if typo:
                raise ConfigError(f"Unknown export_type {self.export_type!r} for the {self.export_format} format."
                                  f"{typo}")
            raise ConfigError("export_type applies to the GGUF formats; an hf export is saved at "
                              "export_dtype (float32, float16 or bfloat16), an onnx export in float32.")
        if self.export_format != "hf" and self.export_dtype not in ("auto", "float32"):
            # only the hf writer casts; the others would write their own type and the asked dtype would be dropped
            hint = ("an onnx export is float32" if self.export_format == "onnx"
                    else f"a GGUF's type is {option('export_type')} (f16, bf16, q8_0, ...)")
            raise ConfigError(f"{option('export_dtype')} {self.export_dtype} applies to {option('export_format', 'hf')}"
                              f"; {hint}.")
        if self.variant is not None and (self.delta or ":" not in self.variant):
            raise ConfigError("variant: write STORE:USER (a `gym variants` store and a user in it), without a delta.")


# The export's own keys, as the Python door (Trainer.export's keywords) spells them; the CLI puts -- before each.
EXPORT_KEYS = (*ExportArguments.__dataclass_fields__, *ALIASES)


def as_given(spelling: Spelling, keys: Iterable[str]) -> Spelling:
    """`spelling`, naming each export option among `keys` (those the caller wrote) as the caller wrote it: an error
    for `--export_dtype float16` names --export_dtype, not the short --dtype."""
    given = {}
    for raw in keys:
        name = str(raw).replace("-", "_")
        if ALIASES.get(name, name) in ExportArguments.__dataclass_fields__:
            given[ALIASES.get(name, name)] = name
    return replace(spelling, names={**spelling.names, **given})


def parse_export(config: dict[str, Any]) -> tuple[ExportArguments, dict[str, Any]]:
    """(the export keys, the rest: the model keys of `gym chat`, checked when the model loads)."""
    export, rest = split_keys(config, ExportArguments, ALIASES)
    # a misspelt export flag is named now, against the export's own keys too, not once the model has loaded
    check_keys(rest, current_spelling().own_keys(EXPORT_KEYS))
    args = ExportArguments(**export)
    if not args.export_dir:
        args.export_dir = _default_export_dir(rest, args.export_format)
    return args, rest


def _default_export_dir(model_keys: dict[str, Any], export_format: str) -> str:
    """`gym export --model saves/run --format gguf` (no export_dir): saves/run-gguf/."""
    for key in ("adapter_name_or_path", "output_dir", "model_name_or_path", "model"):
        source = model_keys.get(key)
        if isinstance(source, str) and Path(source).expanduser().is_dir():
            folder = Path(source).expanduser().resolve()
            return str(folder.with_name(f"{folder.name}-{export_format}"))
    raise ConfigError("Set export_dir: `gym export CONFIG --export_dir DIR` (without it, the export goes next to a "
                      "local model folder: --model saves/run writes saves/run-<format>/).")
