"""Which model to serve, and how: a user's config completed from what training saved.

The model comes from `model_name_or_path` plus `adapter_name_or_path`; a training config whose
`output_dir` holds a finished run is also enough (its adapter or model is picked up). The chat
template and decoding keys are read from the `gym_config.yaml` saved with the output, so a model
never answers in a format it was not trained on. Keys given explicitly always win.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import yaml

from gym.config.files import Config, ConfigSource, as_config_dict
from gym.core.errors import ConfigError
from gym.core.files import CONFIG_FILE, MANIFEST_FILE
from gym.core.names import split_names

logger = logging.getLogger(__name__)

# Keys a saved training config passes on to inference, unless the user sets them.
_INHERITED = ("template", "default_system", "enable_thinking", "do_sample", "temperature", "top_p", "top_k",
              "max_new_tokens", "repetition_penalty", "rope_scaling", "model_max_length",
              # An adapter trained on a quantized base is served on that base (LoftQ's only makes sense there);
              # give quantization_bit: null to merge it onto the unquantized model instead.
              "quantization_bit", "quantization_method", "quantization_type", "double_quantization",
              "quantization_group_size")


_TRAIN_FIRST = "train it first (gym train CONFIG), or export the base itself with --model_name_or_path"


def _finished_output(config: dict[str, Any]) -> Path | None:
    out = config.get("output_dir")
    if out and not config.get("adapter_name_or_path") and (Path(out) / MANIFEST_FILE).is_file():
        return Path(out)
    return None


def resolve_inference_config(config: ConfigSource, *, untrained: str = "warn",
                             how: str = _TRAIN_FIRST) -> Config:
    """A user config -> the complete inference config: which model, adapters, template and decoding. `untrained`:
    what a training config whose run is not there gets: "warn" (chat, eval: the base answers, and it is said) or
    "refuse" (export: a copy of the base under the run's name is never what was meant), saying `how` to go on in
    the caller's words (Trainer.export's caller trains with trainer.train(), not `gym train`)."""
    config = as_config_dict(config)
    for key in ("model_name_or_path", "model"):
        ref = config.get(key)
        if isinstance(ref, str) and not config.get("adapter_name_or_path") and not config.get("output_dir") and \
                (Path(ref) / MANIFEST_FILE).is_file() and (Path(ref) / "adapter_config.json").is_file():
            # `--model saves/run` naming a LoRA run (`gym export --model`): the run, on its base
            config["output_dir"] = config.pop(key)
        elif isinstance(ref, str) and not config.get("adapter_name_or_path") and \
                (Path(ref) / "adapter_config.json").is_file() and not (Path(ref) / "config.json").is_file():
            # a bare peft adapter folder named as the model: loaded as one, its tokenizer load failed with a
            # message about tokenizer files
            config["adapter_name_or_path"] = config.pop(key)
    trained = _finished_output(config)
    if trained is not None:
        manifest = yaml.safe_load((trained / MANIFEST_FILE).read_text())
        if manifest.get("what") in ("lora-adapter", "adapter"):  # a peft adapter (LoRA, OFT, BOFT)
            config["adapter_name_or_path"] = str(trained)
        else:
            config["model_name_or_path"] = str(trained)
        logger.info("Using the trained model in %s", trained)
    elif config.get("output_dir") and not config.get("adapter_name_or_path"):
        # A training config whose run is not there (not trained yet, or another output_dir): what answers is the
        # base, and a score or a chat would otherwise pass for the fine-tune's.
        if untrained == "refuse":
            raise ConfigError(f"output_dir {config['output_dir']} holds no finished run: {how}.")
        logger.warning("output_dir %s holds no finished run (train it first: gym train CONFIG); using the base "
                       "model %s as it is.", config["output_dir"],
                       config.get("model_name_or_path") or config.get("model") or "smollm2-135m")
    # Settings saved by training (with the first adapter) fill in what the user left unset.
    first_adapter = next(iter(split_names(config.get("adapter_name_or_path"))), "")
    saved_dir = Path(first_adapter) if first_adapter else Path(str(config.get("model_name_or_path") or ""))
    saved = saved_dir / CONFIG_FILE if str(saved_dir) else None
    if saved is not None and saved.is_file():
        saved_config = yaml.safe_load(saved.read_text()) or {}
        unquantized = "quantization_bit" in config and config["quantization_bit"] is None
        for key in _INHERITED:
            if unquantized and key.startswith(("quantization_", "double_")):
                continue  # how the saved base was quantized, and the user asked for it unquantized
            if key not in config and key in saved_config:
                config[key] = saved_config[key]
        if first_adapter and "model_name_or_path" not in config:
            config["model_name_or_path"] = saved_config.get("model_name_or_path")
    if first_adapter and not config.get("model_name_or_path") and not config.get("model"):
        # A peft adapter saved outside Gym (no gym_config.yaml) names its base in adapter_config.json. Without it
        # the default model was loaded under it: an adapter of another base of the same shapes (SmolLM2-135M's
        # instruct model on the embedded base) was scored, or served, on the wrong weights without a word.
        base = _adapter_base(Path(first_adapter))
        if base:
            config["model_name_or_path"] = base
    return config


def _adapter_base(adapter: Path) -> str | None:
    try:
        base = json.loads((adapter / "adapter_config.json").read_text(encoding="utf-8")).get("base_model_name_or_path")
    except (OSError, ValueError, AttributeError):
        return None
    return str(base) if base else None


# Stages whose models score text instead of writing it: a value head or class scores on top of the model.
SCORING_STAGES = {"rm": "a reward model (stage rm): it scores answers (PPO's reward_model reads it)",
                  "cls": "a classifier (stage cls): it labels text (serve it as a guard: gym api --guard)"}


def refuse_scoring_model(config: Config) -> None:
    """A reward model or classifier loaded as a chat model writes text from a head it was not trained with: refused,
    saying what it is for. `config`: resolve_inference_config's."""
    for source in (*split_names(config.get("adapter_name_or_path")), str(config.get("model_name_or_path") or "")):
        manifest = Path(source) / MANIFEST_FILE if source else None
        if manifest is None or not manifest.is_file():
            continue
        stage = (yaml.safe_load(manifest.read_text()) or {}).get("stage")
        if stage in SCORING_STAGES:
            raise ConfigError(f"{source} is {SCORING_STAGES[stage]}; it does not chat. Chat with an sft, dpo or "
                              "other generating run.")
