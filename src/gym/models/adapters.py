"""Which parameters train: full, freeze (the last/first n layers), or a peft adapter (LoRA and its variants,
OFT, BOFT).

peft is imported where an adapter is made or attached, not with this module: importing it costs ~3 s on 2 cores
(it imports bitsandbytes and every transformers model it knows), and `gym chat` on a plain model needs none of it.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from gym.config.finetuning import FinetuningArguments
from gym.core.errors import ConfigError, ModelError
from gym.core.files import MANIFEST_FILE
from gym.core.names import did_you_mean
from gym.core.names import split_names as _split
from gym.core.safetensors_files import load_safetensors
from gym.models import unsloth, vision
from gym.models.base_quantization import is_quantized, prepare_for_adapters
from gym.models.loftq import loftq_initialise

logger = logging.getLogger(__name__)

_LAYER_INDEX = re.compile(r"\.layers\.(\d+)\.")
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def trained_base(adapter: str | Path) -> str | None:
    """The base an adapter was trained on: from a Gym run's manifest, else peft's adapter_config.json."""
    for name, key in ((MANIFEST_FILE, "base_model"), ("adapter_config.json", "base_model_name_or_path")):
        try:
            base = json.loads((Path(adapter) / name).read_text(encoding="utf-8")).get(key)
        except (OSError, ValueError, AttributeError):
            continue
        if base:
            return str(base)
    return None


class MissingAdapterWeights(ValueError):
    """peft made a module the adapter's config targets, but the adapter's file holds no weights for it."""


def adapter_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of an adapter's weights file, each checked finite. A run that diverged saves NaN or inf, and peft
    loads them without a word: every answer is then garbage, and an export carries it on. A damaged file is named
    too (gym.core.safetensors_files). One pass over tensors that are small next to the model."""
    tensors = load_safetensors(path)
    for name, tensor in tensors.items():
        # A sum is non-finite whenever an entry is and costs a third of isfinite(); only an overflowing sum of
        # finite values needs the exact check.
        if tensor.is_floating_point() and not torch.isfinite(tensor.sum()) and not bool(torch.isfinite(tensor).all()):
            raise ModelError(f"{path}: the tensor {name} holds NaN or inf values, so the adapter is broken (a run "
                             "that diverged saves them): use an earlier checkpoint, or train again with a lower "
                             "learning_rate.")
    return tensors


def check_adapter_weights(folder: str | Path) -> bool:
    """`adapter_weights`' check of the adapter at `folder` (a folder, or a hub id already in the hub cache), for
    doors that hand the adapter to an engine that loads it itself (vLLM); False where no weights file was found."""
    path = Path(folder).expanduser() / ADAPTER_WEIGHTS
    if not path.is_file():
        if Path(folder).expanduser().exists():
            return False  # a folder without safetensors weights: the loader says what it lacks
        from huggingface_hub import try_to_load_from_cache

        try:
            cached = try_to_load_from_cache(str(folder), ADAPTER_WEIGHTS)
        except ValueError:  # not a hub id either: the loader says what it is not
            return False
        if not isinstance(cached, str):
            return False
        path = Path(cached)
    adapter_weights(path)
    return True


def load_peft_adapter(model: Any, folder: str | Path, **options: Any) -> Any:
    """PeftModel.from_pretrained, where an adapter without weights for a module it targets is an error. peft only
    warns there and leaves those modules at their initial weights (a LoRA's B at zero: no change), so an adapter
    trained on another architecture with the same module names "loaded" and did nothing. Its weights are checked
    first (`adapter_weights`); a hub adapter's once peft has downloaded them."""
    import warnings

    from peft import PeftModel

    checked = check_adapter_weights(folder)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        attached = PeftModel.from_pretrained(model, str(folder), **options)
    if not checked:
        check_adapter_weights(folder)
    for warning in caught:
        text = str(warning.message)
        if "Found missing adapter keys" in text:
            first = re.search(r"\['([^']+)'", text)
            raise MissingAdapterWeights(f"Missing weights for {first.group(1) if first else 'some modules'}")
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    return attached


# How the caller names the base option with a value, in the hints below: a flag followed by the value
# (`--base saves/m`), or a function of the value for a door whose callers write keywords (Trainer.export's
# `model_name_or_path='saves/m'`), which this layer cannot know.
BaseOption = str | Callable[[str], str]


def _base_option(flag: BaseOption, value: str | Path) -> str:
    return f"{flag} {value}" if isinstance(flag, str) else flag(str(value))


def _check_adapter_folder(folder: str | Path, flag: BaseOption) -> None:
    """What is at `folder`, when it is no adapter: peft would say "can't find adapter_config.json", which the
    caller then reported as an adapter that does not fit the base."""
    path = Path(folder).expanduser()
    if path.is_file():
        kind = " (a delta file: apply it with --delta)" if path.suffix == ".safetensors" else ""
        raise ConfigError(f"{folder} is a file{kind}; an adapter is a folder holding adapter_config.json.")
    if path.is_dir() and not (path / "adapter_config.json").is_file():
        if (path / "config.json").is_file():
            raise ConfigError(f"{folder} is a model folder, not an adapter (it has no adapter_config.json): pass it "
                              f"as {_base_option(flag, folder)}.")
        raise ConfigError(f"{folder} holds no adapter_config.json: not a LoRA adapter folder.")
    local = str(folder).startswith((".", "/", "~")) or str(folder).count("/") != 1 or path.parent.is_dir()
    if not path.exists() and local:  # `saves/nope` beside an existing saves/: a folder, not a hub adapter's id
        raise ConfigError(f"Adapter folder not found: {folder}")


def attach_adapter(model: Any, folder: str | Path, base_ref: str | None, *, merge: bool = True,
                   flag: BaseOption = "model_name_or_path") -> Any:
    """`model` with the LoRA adapter at `folder` merged in (or beside it, `merge=False`, for a quantized base). An
    adapter trained on another base (other shapes, other modules) is a ConfigError naming the first tensor that
    differs and, where known, the base to use (`flag`: how the command names the base), not peft's traceback:
    every door that loads an adapter (chat, api, eval, infer, export, delta) says the same line."""
    _check_adapter_folder(folder, flag)
    try:
        attached = load_peft_adapter(model, folder)
        return attached.merge_and_unload() if merge else attached
    except (ValueError, RuntimeError, KeyError) as exc:
        text = str(exc)
        detail = next((line.strip() for line in text.splitlines() if "mismatch" in line or "Missing" in line),
                      text.splitlines()[0] if text else type(exc).__name__)
        trained_on = trained_base(folder)
        hint = f" It was trained on {trained_on}: pass {_base_option(flag, trained_on)}." if trained_on else ""
        raise ConfigError(f"The adapter {folder} does not fit the base {base_ref} ({detail}).{hint}") from None


def setup_full(model: Any) -> Any:
    for param in model.parameters():
        param.requires_grad_(True)
    return model


def setup_freeze(model: Any, args: FinetuningArguments) -> Any:
    """Train only the last n layers (or the first n when n < 0), optionally only some modules in them."""
    num_layers = model.config.get_text_config().num_hidden_layers  # a multimodal model's decoder
    n = args.freeze_trainable_layers
    if n == 0 or abs(n) > num_layers:
        raise ConfigError(f"'freeze_trainable_layers' must be in 1..{num_layers} or -{num_layers}..-1, got {n}.")
    if args.use_llama_pro:
        # Block expansion adds n layers, one after each equal stretch of the original ones: train those.
        if n <= 0 or num_layers % n:
            raise ConfigError(f"use_llama_pro: freeze_trainable_layers ({n}) must be positive and divide the "
                              f"model's {num_layers} layers (one new layer per stretch).")
        stride = num_layers // n
        layers = set(range(stride - 1, num_layers, stride))
    else:
        layers = set(range(num_layers - n, num_layers)) if n > 0 else set(range(-n))
    modules = _split(args.freeze_trainable_modules)
    extra = _split(args.freeze_extra_modules)
    _check_freeze_names(model, modules, extra, layers)
    if is_sequence_classifier(model):
        extra.append("score")  # a reward model's new head always trains
    # Every name of a shared weight counts: a tied lm_head is the embedding's parameter under a second name.
    # `norm` is model.norm, not each layer's input_layernorm that contains the word.
    extra_ids = {id(param) for name, param in model.named_parameters(remove_duplicate=False)
                 if any(f".{m}." in f".{name}" for m in extra)}
    trainable = 0
    for name, param in model.named_parameters():
        match = _LAYER_INDEX.search(name)
        in_layer = match is not None and int(match.group(1)) in layers
        in_module = "all" in modules or any(f".{m}." in name or name.endswith(f".{m}") for m in modules)
        param.requires_grad_((in_layer and in_module) or id(param) in extra_ids)
        trainable += param.numel() if param.requires_grad else 0
    if trainable == 0:
        raise ConfigError(f"freeze_trainable_modules={args.freeze_trainable_modules!r} matched no parameters in "
                          f"the trainable layers; use module names like mlp, self_attn or 'all'.")
    return model


def _check_freeze_names(model: Any, modules: list[str], extra: list[str], layers: set[int]) -> None:
    """Refuse a freeze module name that matches nothing, with the closest one (as LLaMA-Factory refuses it): each
    list is OR-ed, so a misspelt name beside a good one would train silently without it. Names are matched as
    setup_freeze matches them, against module names (a tied lm_head has no parameter of its own)."""
    names = [f"{name}." for name, _ in model.named_modules() if name]
    in_layers = [name for name in names if (m := _LAYER_INDEX.search(name)) is not None and int(m.group(1)) in layers]
    for key, wanted, pool in (("freeze_trainable_modules", modules, in_layers), ("freeze_extra_modules", extra, names)):
        for module in wanted:
            if key == "freeze_trainable_modules" and module == "all":
                continue
            if not any(f".{module}." in f".{name}" for name in pool):
                parts = {part for name in pool for part in name.split(".") if part and not part.isdigit()}
                hint = did_you_mean(module, parts, f" Module names there are like {', '.join(sorted(parts)[:8])}.")
                raise ConfigError(f"'{key}': no module of the model is named '{module}'.{hint}")


def is_sequence_classifier(model: Any) -> bool:
    return type(model).__name__.endswith("ForSequenceClassification")


def lora_config(args: FinetuningArguments, tied_embeddings: bool = False, task_type: str = "CAUSAL_LM") -> Any:
    from peft import LoraConfig, TaskType

    if args.pissa_init:
        init: Any = "pissa" if args.pissa_iter == -1 else f"pissa_niter_{args.pissa_iter}"
    else:
        init = True
    targets = _split(args.lora_target)
    extra = _split(args.additional_target)
    return LoraConfig(
        # SEQ_CLS makes peft train and save the new score head of a reward model with the adapter.
        task_type=TaskType(task_type),
        r=args.lora_rank,
        lora_alpha=args.lora_alpha or args.lora_rank * 2,
        lora_dropout=args.lora_dropout,
        target_modules="all-linear" if targets == ["all"] else targets,
        modules_to_save=extra or None,
        # Training a tied embedding must keep the LM head tied to it, or merging breaks the model.
        ensure_weight_tying=tied_embeddings and any(m in ("embed_tokens", "lm_head") for m in extra),
        use_rslora=args.use_rslora,
        use_dora=args.use_dora,
        init_lora_weights=init,
    )


def setup_adapter(model: Any, args: FinetuningArguments, adapters: list[str] | None = None) -> Any:
    """Add a trainable peft adapter (LoRA, OFT or BOFT). Given existing adapters, all but the last are merged
    into the model and training continues on the last one."""
    from peft import LoraConfig, PeftConfig, get_peft_model

    adapters = adapters or []
    if unsloth.is_unsloth(model) and not adapters:
        return unsloth.add_lora(model, args)  # Unsloth prepares its own quantized base
    if is_quantized(model):
        model = prepare_for_adapters(model)
    for path in adapters[:-1]:
        model = attach_adapter(model, path, getattr(model, "name_or_path", None), flag="model_name_or_path")
    if adapters:
        config = PeftConfig.from_pretrained(adapters[-1])
        if isinstance(config, LoraConfig):
            # The saved config may name an initialisation (PiSSA's, on a quantized base); the weights are the
            # adapter's own, so loading must not initialise them again.
            config.init_lora_weights = True
        try:
            return load_peft_adapter(model, adapters[-1], is_trainable=True, config=config)
        except MissingAdapterWeights as exc:
            trained_on = trained_base(adapters[-1])
            hint = f" It was trained on {trained_on}: pass model_name_or_path {trained_on}." if trained_on else ""
            raise ConfigError(f"The adapter {adapters[-1]} does not fit the base ({exc}).{hint}") from None
    task = "SEQ_CLS" if is_sequence_classifier(model) else "CAUSAL_LM"
    check_module_names(model, args)
    if args.finetuning_type == "lora":
        config = lora_config(args, bool(getattr(model.config, "tie_word_embeddings", False)), task)
    else:
        config = orthogonal_config(args, task)
    if vision.is_multimodal_model(model):
        # The adapter goes on the parts that train (the language model by default), never on a frozen vision tower;
        # an unfrozen projector trains in full beside it.
        targets = _split(args.lora_target if args.finetuning_type == "lora" else args.oft_target)
        config.target_modules, projectors = vision.adapter_targets(model, args, targets)
        if projectors:
            config.modules_to_save = [*(config.modules_to_save or []), *projectors]
    try:
        peft_model = get_peft_model(model, config)
    except ValueError as exc:  # peft names the module it could not find, or the size that does not divide
        name = {"lora": "LoRA", "oft": "OFT", "boft": "BOFT"}[args.finetuning_type]
        raise ConfigError(f"{name} setup failed: {exc}") from None
    if args.loftq_init:
        loftq_initialise(peft_model, str(model.config._name_or_path))
    return peft_model


def check_module_names(model: Any, args: FinetuningArguments) -> None:
    """Refuse a target module name that matches no module of the model, with the closest one: peft says so for
    lora_target without a suggestion, and skips a misspelt additional_target silently (the run then trains without
    it)."""
    keys = ["lora_target", "additional_target"] if args.finetuning_type == "lora" else ["oft_target"]
    module_names = [name for name, _ in model.named_modules() if name]
    suffixes = {part for name in module_names for part in name.split(".") if not part.isdigit()}
    for key in keys:
        for target in _split(getattr(args, key)):
            if key != "additional_target" and target == "all":
                continue
            if not any(name == target or name.endswith(f".{target}") for name in module_names):
                hint = did_you_mean(target, suffixes, " Module names are like q_proj, mlp, embed_tokens.")
                raise ConfigError(f"'{key}': no module of the model is named '{target}'.{hint}")


def orthogonal_config(args: FinetuningArguments, task_type: str = "CAUSAL_LM") -> Any:
    """OFT/BOFT: each target weight W becomes R W with R orthogonal and learned (block-diagonal for OFT, a
    product of butterfly factors for BOFT), so the angles between neurons, W's "hyperspherical energy", stay."""
    from peft import BOFTConfig, OFTConfig, TaskType

    targets = _split(args.oft_target)
    target_modules: Any = "all-linear" if targets == ["all"] else targets
    if args.finetuning_type == "boft":
        return BOFTConfig(task_type=TaskType(task_type), boft_block_size=args.boft_block_size,
                          boft_n_butterfly_factor=args.boft_n_butterfly_factor, target_modules=target_modules)
    return OFTConfig(task_type=TaskType(task_type), r=args.oft_rank, oft_block_size=args.oft_block_size,
                     target_modules=target_modules)


def setup_finetuning(model: Any, args: FinetuningArguments, adapters: list[str] | None = None) -> Any:
    if args.finetuning_type in ("full", "freeze"):
        model = setup_full(model) if args.finetuning_type == "full" else setup_freeze(model, args)
        if vision.is_multimodal_model(model):
            vision.freeze_parts(model, args)
        return model
    return setup_adapter(model, args, adapters)


def count_parameters(model: torch.nn.Module) -> tuple[int, int]:
    # A parameter DeepSpeed ZeRO-3 partitioned while loading is an empty placeholder; ds_numel is its real size.
    def size(p: torch.nn.Parameter) -> int:
        return int(getattr(p, "ds_numel", p.numel()))

    trainable = sum(size(p) for p in model.parameters() if p.requires_grad)
    total = sum(size(p) for p in model.parameters())
    return trainable, total
