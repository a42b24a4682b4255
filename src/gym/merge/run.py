"""`gym merge`: config -> base -> models -> merged weights -> a model folder, written under a temporary name and
renamed into place (gym.delta.apply.save_model_folder), with the base's tokenizer and gym_manifest.json.

Two paths, chosen per merge and recorded in the manifest as `merged_with`:

- peft: every model is a plain LoRA adapter (no DoRA, rsLoRA, modules_to_save or LoRA bias) and the method is
  task_arithmetic, or linear whose weights sum to 1 or are normalized. peft's add_weighted_adapter with
  combination_type "cat" stacks the adapters' A matrices (each times w_i * scale_i) and their B matrices, so the
  merged adapter's B A is exactly sum_i w_i scale_i B_i A_i; it is then merged into the base. This needs one
  copy of the base, not one per adapter. peft's own linear/ties/dare_* combinations are not used: they combine
  A and B separately, which is not a merge of the deltas (B A gains cross terms B_i A_j).
- state dicts: everything else (full fine-tunes, ties, dare, a mix of adapters and full models). Each adapter is
  folded into the base first and taken as a delta, so an adapter merges exactly like the full fine-tune it
  equals, as mergekit does with `model+lora`. Parameters are merged one at a time (gym.merge.methods).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
import yaml
from peft import PeftModel
from transformers import AutoConfig

from gym.config.files import ConfigSource, as_config_dict
from gym.core.errors import ConfigError
from gym.core.files import CONFIG_FILE, refuse_output_over_input, refuse_overwrite
from gym.data.chat_jinja import jinja_chat_template
from gym.data.templates import get_chat_format
from gym.delta.apply import save_model_folder
from gym.merge.config import MergeConfig, MergeMethod, parse_merge_config
from gym.merge.methods import merge_parameter
from gym.merge.sources import (
    FoldedAdapter,
    FullModel,
    Unchanged,
    adapter_config,
    check_adapter_base,
    is_adapter,
    loading_error,
    open_source,
)
from gym.models.loader import load_causal_lm, load_tokenizer, resolve_model_path

logger = logging.getLogger(__name__)

PEFT_PATH = "peft add_weighted_adapter (cat)"
STATE_DICT_PATH = "state dicts"


def merge_models(config: ConfigSource) -> Path:
    """Merge what `config` (a dict, or a YAML/JSON file in mergekit's shape) lists; returns the output folder."""
    args = parse_merge_config(as_config_dict(config))
    refuse_output_over_input(args.output_dir, [args.base_model, *(m.model for m in args.models)])
    refuse_overwrite(args.output_dir, args.overwrite, how="overwrite: true", folder=True)  # before the work
    if args.base_model is not None and is_adapter(args.base_model):
        # Loaded as the base it would be a peft-wrapped model whose tensor names no fine-tune has.
        trained_on = adapter_config(args.base_model).get("base_model_name_or_path")
        raise ConfigError(f"base_model {args.base_model} is a LoRA adapter, not a model: set base_model to the model "
                          f"it was trained on{f' ({trained_on})' if trained_on else ''}, and list the adapter under "
                          "models to merge it.")
    adapters = [m.model for m in args.models if is_adapter(m.model)]
    if adapters and args.base_model is None:
        raise ConfigError(f"{adapters[0]} is a LoRA adapter: set base_model to the model it was trained on "
                          f"({adapter_config(adapters[0]).get('base_model_name_or_path') or 'see its manifest'}).")
    skeleton_ref = args.base_model or args.models[0].model
    skeleton_path = resolve_model_path(skeleton_ref)
    for ref in adapters:
        check_adapter_base(ref, skeleton_ref, skeleton_path)
    skeleton = load_causal_lm(skeleton_path, dtype=torch.float32).eval().requires_grad_(False)
    weights = cat_weights(args, adapters)
    if weights is not None:
        model, path = merge_with_peft(skeleton, adapters, weights), PEFT_PATH
    else:
        model, path = merge_state_dicts(skeleton, args, skeleton_ref), STATE_DICT_PATH
    tokenizer = load_tokenizer(skeleton_path)
    template = trained_template([m.model for m in args.models])
    if template is not None:
        chat = get_chat_format(tokenizer, *template)
        assert chat.template is not None  # a named template was given
        tokenizer.chat_template = jinja_chat_template(chat.template, tokenizer.eos_token or "", chat.default_system,
                                                      chat.enable_thinking, chat.tool_format)
    check_finite(model, args, "float32")  # the merge itself
    model = model.to(saved_dtype(args.dtype, skeleton_path))
    check_finite(model, args, str(model.dtype).removeprefix("torch."))  # and what would be saved
    manifest = {"made_by": "gym merge", "base_model": skeleton_ref, "merge": args.describe(), "merged_with": path,
                "chat_template": template[0] if template else None, "dtype": str(model.dtype).removeprefix("torch.")}
    out = save_model_folder(model, tokenizer, args.output_dir, manifest, overwrite=args.overwrite)
    logger.info("Merged %d models (%s, via %s) into %s.", len(args.models), args.merge_method.value, path, out)
    return out


def check_finite(model: Any, args: MergeConfig, dtype: str) -> None:
    """Refuse, before anything is written, a merge with inf or NaN in it: the weights, lambda and densities
    (each finite, checked by parse_merge_config) can still multiply a delta past float32, or past the saved dtype's
    range (float16 ends at 65504), and such a model only ever outputs NaN."""
    bad = [name for name, param in model.named_parameters() if not bool(torch.isfinite(param).all())]
    if not bad:
        return
    where = f"{bad[0]}{f' and {len(bad) - 1} more tensors' if len(bad) > 1 else ''}"
    settings = (f"weights {', '.join(f'{m.weight:g}' for m in args.models)}, lambda {args.lambda_:g}, densities "
                f"{', '.join(f'{m.density:g}' for m in args.models)}")
    if dtype == "float32":
        raise ConfigError(f"The {args.merge_method.value} merge gives inf or NaN in {where} ({settings}); nothing "
                          "was written. Lower lambda or the weights.")
    largest = torch.finfo(getattr(torch, dtype)).max
    raise ConfigError(f"The merged values of {where} exceed {dtype}'s largest number ({largest:.4g}) and would be "
                      f"saved as inf ({settings}); nothing was written. Save in float32 (dtype: float32), or lower "
                      "lambda or the weights.")


def cat_weights(args: MergeConfig, adapters: list[str]) -> list[float] | None:
    """The weight of each adapter's B A in peft's exact `cat` combination, or None where the merge needs the
    state-dict path (a full model among the models, a method that trims or drops, or an adapter kind whose
    merged form `cat` does not reproduce)."""
    if len(adapters) != len(args.models) or not all(_plain_lora(adapter_config(ref)) for ref in adapters):
        return None
    weights = [m.weight for m in args.models]
    total = sum(weights)
    if args.merge_method is MergeMethod.LINEAR:
        if args.normalize:
            return [w / total for w in weights]
        # Unnormalized weights that do not sum to 1 scale the base as well, which an adapter cannot express.
        return weights if abs(total - 1) < 1e-9 else None
    if args.merge_method is MergeMethod.TASK_ARITHMETIC:
        scale = args.lambda_ / (total if args.normalize and abs(total) > 1e-12 else 1.0)
        return [w * scale for w in weights]
    return None


def _plain_lora(config: dict[str, Any]) -> bool:
    # rsLoRA: the merged adapter would inherit alpha/sqrt(r) scaling with alpha = r, i.e. sqrt(r), not 1.
    # DoRA's magnitudes, modules_to_save and LoRA biases are not combined by `cat` at all.
    return (config.get("peft_type") == "LORA" and isinstance(config.get("target_modules"), list)
            and not any(config.get(key) for key in ("use_dora", "use_rslora", "modules_to_save", "lora_bias",
                                                    "target_parameters")))


def merge_with_peft(skeleton: Any, adapters: list[str], weights: list[float]) -> Any:
    names = [f"merge_{i}" for i in range(len(adapters))]
    model: Any = None
    for name, ref in zip(names, adapters):
        try:
            folder = str(Path(ref).expanduser())
            if model is None:
                model = PeftModel.from_pretrained(skeleton, folder, adapter_name=name)
            else:
                model.load_adapter(folder, adapter_name=name)
        except (ValueError, RuntimeError, KeyError) as exc:
            raise ConfigError(f"The LoRA adapter {ref} does not fit the base: {loading_error(exc)}") from None
    model.add_weighted_adapter(names, weights, "merged", combination_type="cat")
    return model.merge_and_unload(adapter_names=["merged"])


def merge_state_dicts(skeleton: Any, args: MergeConfig, skeleton_ref: str) -> Any:
    """Merge every parameter of `skeleton` in place: the base's value and each model's in, the merge out."""
    label = f"the base {skeleton_ref}" if args.base_model else f"the first model {skeleton_ref}"
    # Every source is opened (and every adapter folded into a copy) before the skeleton changes.
    sources: list[Unchanged | FullModel | FoldedAdapter] = [
        Unchanged() if args.base_model is None and i == 0 else open_source(m.model, skeleton, label)
        for i, m in enumerate(args.models)]
    params = list(skeleton.named_parameters())
    with torch.no_grad():
        for step, (name, param) in enumerate(params, 1):
            values = [source.weight(name, param) for source in sources]
            if args.merge_method.needs_base and all(v is None for v in values):
                continue  # no model changed it (a LoRA leaves most parameters alone): the base's value stands
            tensors = [param if v is None else v for v in values]
            param.copy_(merge_parameter(args, name, param if args.base_model else None, tensors))
            if step * 10 // len(params) != (step - 1) * 10 // len(params):
                logger.info("Merged %d/%d tensors.", step, len(params))
    return skeleton


def trained_template(refs: list[str]) -> tuple[str, str | None, bool] | None:
    """(template, default_system, enable_thinking) the Gym runs among `refs` were trained with, when they agree:
    the merged model is then prompted as they were. None when no run names a template, or runs disagree."""
    found: set[tuple[str, str | None, bool]] = set()
    for ref in refs:
        file = Path(ref).expanduser() / CONFIG_FILE
        try:
            run = yaml.safe_load(file.read_text(encoding="utf-8")) if file.is_file() else None
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(run, dict) and run.get("template"):
            system = run.get("default_system")
            found.add((str(run["template"]), str(system) if system else None, bool(run.get("enable_thinking", True))))
    if len(found) > 1:
        logger.warning("The models were trained with different chat templates (%s); the merged model keeps the "
                       "base tokenizer's own.", ", ".join(sorted(t[0] for t in found)))
    return found.pop() if len(found) == 1 else None


def saved_dtype(choice: str, model_path: str) -> torch.dtype:
    if choice != "auto":
        dtype: torch.dtype = getattr(torch, choice)
        return dtype
    saved = getattr(AutoConfig.from_pretrained(model_path), "dtype", None)
    if isinstance(saved, str):
        saved = getattr(torch, saved, None)
    return saved if isinstance(saved, torch.dtype) else torch.float32
