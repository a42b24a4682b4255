"""The `gym merge` config: mergekit's YAML shape (merge_method, base_model, models with per-model parameters,
global parameters, dtype), read strictly before any model loads.

Defaults follow mergekit, so a mergekit recipe means the same here: weight 1, density 1, lambda 1, rescale on,
normalize on for linear and ties and off for task_arithmetic, dare and dare_ties. Global `parameters:` may
also hold weight and density, the default of every model that does not set its own.

Numbers are read as `gym train` reads them (gym.config.coerce): YAML 1.1 leaves `1.0e308` or `1e-3` a string,
and the command line's `parameters.lambda=1e-3` too. A merge that cannot be finite is refused here, before any
model loads: numbers beyond float32 (the arithmetic's type), a density too small to rescale by, and a
normalization that divides by weights summing to (nearly) zero. What only the tensors can tell (a result beyond
the saved dtype's range) is checked after the merge, before anything is written (gym.merge.run).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gym.config.coerce import coerce
from gym.core.errors import ConfigError
from gym.core.names import did_you_mean


class MergeMethod(str, enum.Enum):
    LINEAR = "linear"
    TASK_ARITHMETIC = "task_arithmetic"
    TIES = "ties"
    DARE = "dare"
    DARE_TIES = "dare_ties"

    @property
    def needs_base(self) -> bool:
        """Every method but linear works on deltas, which only a base defines."""
        return self is not MergeMethod.LINEAR

    @property
    def trims(self) -> bool:
        return self is MergeMethod.TIES

    @property
    def drops(self) -> bool:
        return self in (MergeMethod.DARE, MergeMethod.DARE_TIES)

    @property
    def elects_sign(self) -> bool:
        return self in (MergeMethod.TIES, MergeMethod.DARE_TIES)


METHOD_ALIASES = {"dare_linear": MergeMethod.DARE}  # mergekit's name for DARE without sign election
# mergekit's other methods: named as not implemented rather than as unknown (or matched to a look-alike).
MERGEKIT_ONLY = ("slerp", "nuslerp", "multislerp", "della", "della_linear", "breadcrumbs", "breadcrumbs_ties",
                 "model_stock", "passthrough", "karcher", "sce", "nearswap", "arcee_fusion")
NORMALIZE_DEFAULT = {MergeMethod.LINEAR: True, MergeMethod.TIES: True}
TOP_KEYS = ("merge_method", "base_model", "models", "parameters", "dtype", "output_dir", "seed", "overwrite",
            "out_dtype", "tokenizer_source")
MODEL_KEYS = ("model", "parameters")
MODEL_PARAMETERS = ("weight", "density")
GLOBAL_PARAMETERS = ("normalize", "lambda", "rescale", *MODEL_PARAMETERS)
DTYPES = ("auto", "float32", "float16", "bfloat16")
FLOAT32_MAX = 3.4028234663852886e38  # the merge runs in float32: a larger number is inf there
MIN_DENSITY = 1e-6  # dare multiplies what it keeps by 1/density; below this the merge is noise or inf
CANCELLING = 1e-6  # normalize divides by the weights' sum: below this share of their size, float32 rounding rules
# mergekit keys with no meaning here: refused with the reason rather than matched to a look-alike key.
UNSUPPORTED = {
    "slices": "layer slicing (frankenmerges) is not supported; list whole models under `models`",
    "tokenizer": "the tokenizer is the base model's (the first model's when there is no base)",
    "chat_template": "the chat template comes with the tokenizer, or is the template the models were trained with",
}


@dataclass
class MergeModel:
    model: str
    """A full fine-tune folder (or hub id), or a LoRA adapter folder (holding adapter_config.json)."""
    weight: float = 1.0
    density: float = 1.0
    """ties: the fraction of this model's delta kept (largest magnitudes); dare: the chance each entry is kept."""


@dataclass
class MergeConfig:
    merge_method: MergeMethod
    models: list[MergeModel]
    output_dir: str
    base_model: str | None = None
    normalize: bool = False
    """Divide by the sum of the weights (ties: of the weights whose sign agrees, per entry)."""
    lambda_: float = 1.0
    """Scales the merged delta (mergekit's `lambda`)."""
    rescale: bool = True
    """dare: divide the kept entries by density, so each delta keeps its expected value."""
    dtype: str = "auto"
    """The saved dtype; auto: the dtype the base (or first model) was saved in. The merge itself runs in float32."""
    seed: int = 0
    overwrite: bool = False

    def describe(self) -> dict[str, Any]:
        """The config as mergekit would write it, for the output's manifest."""
        return {"merge_method": self.merge_method.value, "base_model": self.base_model,
                "models": [{"model": m.model, "parameters": {"weight": m.weight, "density": m.density}}
                           for m in self.models],
                "parameters": {"normalize": self.normalize, "lambda": self.lambda_, "rescale": self.rescale},
                "dtype": self.dtype, "seed": self.seed}


def same_model(a: str, b: str) -> bool:
    """Whether two references name the same model: one folder however it is written, else equal names."""
    pa, pb = Path(a).expanduser(), Path(b).expanduser()
    if pa.exists() and pb.exists():
        return pa.resolve() == pb.resolve()
    return a.rstrip("/") == b.rstrip("/")


def parse_merge_config(raw: dict[str, Any]) -> MergeConfig:
    raw = _nest_dotted(raw)
    _check_keys(raw, TOP_KEYS, "")
    method = _method(raw.get("merge_method"))
    base = raw.get("base_model")
    if base is not None:
        base = _string("base_model", base)
    if raw.get("tokenizer_source", "base") != "base":
        raise ConfigError("tokenizer_source: only `base` is supported (the base model's tokenizer, or the first "
                          "model's without a base); models with other vocabularies cannot be merged here.")
    globals_ = _mapping("parameters", raw.get("parameters", {}))
    _check_keys(globals_, GLOBAL_PARAMETERS, "parameters.")
    default_weight = _number("parameters.weight", globals_.get("weight", 1.0))
    default_density = _density("parameters.density", globals_.get("density", 1.0))
    models = [_model(entry, i, default_weight, default_density) for i, entry in enumerate(_models(raw))]
    if method.needs_base:
        if base is None:
            raise ConfigError(f"merge_method {method.value} merges deltas from a base: set base_model (the model "
                              "the fine-tunes started from).")
        # mergekit recipes often list the base among the models; its delta is zero, so it only dilutes.
        models = [m for m in models if not same_model(m.model, base)]
        if not models:
            raise ConfigError("models lists only the base model; list the fine-tunes to merge into it.")
    config = MergeConfig(
        merge_method=method, models=models, base_model=base,
        output_dir=_string("output_dir", raw.get("output_dir"), "the folder to write"),
        normalize=_bool("parameters.normalize", globals_.get("normalize", NORMALIZE_DEFAULT.get(method, False))),
        lambda_=_number("parameters.lambda", globals_.get("lambda", 1.0)),
        rescale=_bool("parameters.rescale", globals_.get("rescale", True)),
        # mergekit's out_dtype is the saved dtype; its dtype (the arithmetic's) is the saved one when alone.
        dtype=_choice("dtype", raw.get("out_dtype", raw.get("dtype", "auto")), DTYPES),
        seed=_integer("seed", raw.get("seed", 0)), overwrite=_bool("overwrite", raw.get("overwrite", False)))
    _check_normalize(config)
    return config


def _check_normalize(config: MergeConfig) -> None:
    """normalize divides by a sum of weights; weights that (nearly) cancel make that a division by ~0."""
    if not config.normalize:
        return
    weights = [m.weight for m in config.models]
    method = config.merge_method.value
    if config.merge_method.elects_sign:
        # ties divides each entry by the weights of the models that agree on it: with weights of both signs any
        # subset may agree, and 1 and -0.9999999 divide by 1e-7.
        if min(weights) < 0 < max(weights):
            raise ConfigError(f"{method} with normalize divides each entry by the sum of the weights of the models "
                              f"that agree on it, and with weights of both signs ({', '.join(map(str, weights))}) "
                              "that sum can be 0 or nearly: make the weights all positive (subtract a model with "
                              "task_arithmetic) or set parameters: {normalize: false}.")
    elif abs(sum(weights)) <= CANCELLING * sum(abs(w) for w in weights):
        raise ConfigError(f"{method} with normalize divides by the sum of the weights, which is {sum(weights):.3g} "
                          "here: change the weights or set parameters: {normalize: false}.")


def _nest_dotted(raw: dict[str, Any]) -> dict[str, Any]:
    """`parameters.normalize=false` on the command line -> parameters: {normalize: false}, over the file's."""
    nested = {key: value for key, value in raw.items() if not str(key).startswith("parameters.")}
    dotted = {str(key).removeprefix("parameters."): value for key, value in raw.items()
              if str(key).startswith("parameters.")}
    if dotted:
        nested["parameters"] = {**_mapping("parameters", nested.get("parameters", {})), **dotted}
    return nested


def _check_keys(mapping: dict[str, Any], valid: tuple[str, ...], prefix: str) -> None:
    for key in mapping:
        name = f"{prefix}{key}"
        if key in UNSUPPORTED and not prefix:
            raise ConfigError(f"'{key}' is not supported by gym merge: {UNSUPPORTED[key]}.")
        if key not in valid:
            hint = did_you_mean(str(key), valid, f" Valid keys here: {', '.join(valid)}.")
            if prefix.startswith("models[") and key in MODEL_PARAMETERS:
                hint = f" Put it under the model's parameters: {{{key}: ...}}."
            raise ConfigError(f"Unknown merge key '{name}'.{hint}")


def _method(value: Any) -> MergeMethod:
    if value is None:
        raise ConfigError(f"Set merge_method: one of {', '.join(m.value for m in MergeMethod)}.")
    text = str(value)
    if text in METHOD_ALIASES:
        return METHOD_ALIASES[text]
    if text in MERGEKIT_ONLY:
        raise ConfigError(f"merge_method {text} is mergekit's, and gym merge does not implement it; choose one of "
                          f"{', '.join(m.value for m in MergeMethod)} (docs/merge.md, Not supported).")
    try:
        return MergeMethod(text)
    except ValueError:
        names = [m.value for m in MergeMethod]
        raise ConfigError(f"Unknown merge_method {text!r}.{did_you_mean(text, [*names, *METHOD_ALIASES])} "
                          f"Choose one of: {', '.join(names)}.") from None


def _models(raw: dict[str, Any]) -> list[Any]:
    models = raw.get("models")
    if not isinstance(models, list) or not models:
        raise ConfigError("models must list the models to merge, e.g. models: [{model: saves/a}, {model: saves/b}].")
    return models


def _model(entry: Any, index: int, weight: float, density: float) -> MergeModel:
    where = f"models[{index}]"
    if isinstance(entry, str):
        return MergeModel(entry, weight, density)
    entry = _mapping(where, entry)
    _check_keys(entry, MODEL_KEYS, f"{where}.")
    params = _mapping(f"{where}.parameters", entry.get("parameters", {}))
    _check_keys(params, MODEL_PARAMETERS, f"{where}.parameters.")
    return MergeModel(model=_string(f"{where}.model", entry.get("model")),
                      weight=_number(f"{where}.parameters.weight", params.get("weight", weight)),
                      density=_density(f"{where}.parameters.density", params.get("density", density)))


def _mapping(key: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"'{key}' must be a mapping, got {value!r}.")
    return value


def _string(key: str, value: Any, what: str = "a model folder or name") -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"Set '{key}' to {what}.")
    return value


def _number(key: str, value: Any) -> float:
    if isinstance(value, (list, dict)):
        raise ConfigError(f"'{key}' must be one number: per-layer values (mergekit gradients and filters) are "
                          "not supported.")
    number = coerce(key, value, float)
    if not math.isfinite(number):
        raise ConfigError(f"'{key}' must be a finite number, got {value!r}.")
    if abs(number) > FLOAT32_MAX:
        raise ConfigError(f"'{key}' is {number:g}, beyond float32's largest number ({FLOAT32_MAX:.3g}), which the "
                          "merge computes in: every value it touched would be inf. Use a smaller number.")
    return float(number)


def _density(key: str, value: Any) -> float:
    density = _number(key, value)
    if not 0 < density <= 1:
        raise ConfigError(f"'{key}' is the fraction of each delta kept: a number in (0, 1], got {density}.")
    if density < MIN_DENSITY:
        raise ConfigError(f"'{key}' is {density:g}: below {MIN_DENSITY:g}, dare keeps almost nothing and multiplies "
                          "what it keeps by 1/density (inf or noise), and ties keeps nothing. Use a density in "
                          f"[{MIN_DENSITY:g}, 1].")
    return density


def _integer(key: str, value: Any) -> int:
    return int(coerce(key, value, int))


def _bool(key: str, value: Any) -> bool:
    return bool(coerce(key, value, bool))


def _choice(key: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        hint = did_you_mean(str(value), choices)
        raise ConfigError(f"{key} must be one of {', '.join(choices)}, got {value!r}.{hint}")
    return str(value)
