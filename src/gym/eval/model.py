"""The model an evaluation scores: loaded once, then shared by every task of the run.

Whatever `gym chat` can load is evaluated the same way: a short name, hub id or folder (an exported one
too), a training run's output_dir, LoRA/OFT adapters (merged; kept beside a quantized base, as QLoRA
serves), plus a delta file (`delta:`) or a personalized variant (`variant: STORE:USER`) applied to the base.
Log-likelihood tasks read the transformers model directly; generation tasks decode through the same
engines as chat and the API. Unless the config says otherwise the engine decodes in float32, so a score
measures the model, not a serving format (set infer_dtype: int8 to score the model as served).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from gym.config.files import as_config_dict
from gym.config.parser import get_infer_args
from gym.core.errors import ConfigError, ModelError
from gym.core.names import split_names
from gym.data.templates import ChatFormat, get_chat_format
from gym.delta.apply import apply_delta
from gym.delta.format import fingerprint, load_delta
from gym.infer.config import resolve_inference_config
from gym.infer.engines import build_engine
from gym.infer.requests import Engine, SamplingParams
from gym.models.adapters import attach_adapter
from gym.models.base_quantization import is_quantized
from gym.models.loader import generation_defaults, load_causal_lm, load_tokenizer, resolve_model_path
from gym.models.vision import is_multimodal

logger = logging.getLogger(__name__)


@dataclass
class EvalModel:
    model: Any
    tokenizer: Any
    chat_format: ChatFormat | None
    """None when the model has no chat template (a base model): its tasks are prompted as plain text."""
    model_args: Any
    model_path: str
    decoding: dict[str, Any]
    description: dict[str, Any]
    max_batch_size: int = 8
    _engine: Engine | None = field(default=None, repr=False)
    _fingerprint: str | None = field(default=None, repr=False)

    @property
    def pad_id(self) -> int:
        for candidate in (self.tokenizer.pad_token_id, self.tokenizer.eos_token_id):
            if candidate is not None:
                return int(candidate)
        return 0

    @property
    def fingerprint(self) -> str:
        """sha256 over sampled weights: two result files with one fingerprint scored the same model."""
        if self._fingerprint is None:
            self._fingerprint = fingerprint(self.model.state_dict())
        return self._fingerprint

    @property
    def _merged(self) -> bool:
        """Whether adapters, a delta or a variant changed the weights from the files at model_path."""
        return any(self.description.get(key) for key in ("adapters", "delta", "variant"))

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            stops = self.chat_format.stop_token_ids() if self.chat_format else [self.pad_id]
            self._engine = build_engine(self.model_args, model=self.model, tokenizer=self.tokenizer,
                                        model_path=self.model_path, adapters=[], stop_token_ids=stops,
                                        weights_folder=None if self._merged else self.model_path,
                                        max_batch_size=self.max_batch_size, max_waiting=1 << 16)
        return self._engine

    def sampling_params(self, **overrides: Any) -> SamplingParams:
        return SamplingParams(**{**self.decoding, **{k: v for k, v in overrides.items() if v is not None}})

    def close(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None


def load_eval_model(config: Any, *, delta: str | None = None, variant: str | None = None,
                    batch_size: int = 8, tokenizer_from: str | None = None) -> EvalModel:
    """`tokenizer_from`: where the tokenizer comes from when the model folder has none (a fine-tune saved
    without it is scored with its base's)."""
    config = as_config_dict(config)
    if variant is not None:
        from gym.personalization.store import variant_source

        files = variant_source(variant)
        delta, config["model_name_or_path"] = files.delta, files.base
        if files.adapter is not None:
            config["adapter_name_or_path"] = files.adapter
    resolved = resolve_inference_config(config)
    resolved.setdefault("infer_dtype", "float32")
    model_args, data_args, _, generating = get_infer_args({k: v for k, v in resolved.items() if k != "output_dir"})
    if model_args.infer_backend in ("vllm", "llamacpp"):
        raise ConfigError(f"gym eval scores a transformers model (log-likelihoods need its logits); infer_backend: "
                          f"{model_args.infer_backend} cannot be evaluated here. Use infer_backend: auto.")
    model_path = resolve_model_path(model_args.model_name_or_path)
    if is_multimodal(model_path, model_args):  # else transformers' "Unrecognized configuration class" for its config
        raise ConfigError(f"gym eval evaluates text models, and {model_args.model_name_or_path} is a vision-language "
                          "model, which it does not load (its tasks, safety sets included, read a causal LM). Answer "
                          "a dataset with it through gym infer (images included).")
    try:
        tokenizer = load_tokenizer(model_path, model_args)
    except ModelError:
        if tokenizer_from is None:
            raise
        tokenizer = load_tokenizer(resolve_model_path(tokenizer_from), model_args)
    dtype = torch.float32
    if torch.cuda.is_available():
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    model = load_causal_lm(model_path, model_args, dtype=dtype)
    adapters = split_names(model_args.adapter_name_or_path)
    if is_quantized(model):
        model = attach_adapter(model, adapters[0], model_args.model_name_or_path, merge=False) if adapters else model
    else:
        for adapter in adapters:
            model = attach_adapter(model, adapter, model_args.model_name_or_path)
    if delta is not None:
        entries, header = load_delta(delta)
        model = apply_delta(model, entries, header, delta)
    if torch.cuda.is_available() and not is_quantized(model):
        model = model.to("cuda")
    try:
        chat: ChatFormat | None = get_chat_format(tokenizer, data_args.template, data_args.default_system,
                                                  data_args.enable_thinking,
                                                  tool_format=data_args.tool_format)
    except ConfigError:
        chat = None
        logger.info("%s has no chat template: every task is prompted as plain text.", model_path)
    description = {"model_name_or_path": model_args.model_name_or_path, "adapters": adapters, "delta": delta,
                   "variant": variant, "template": chat.name if chat else None}
    return EvalModel(model.eval(), tokenizer, chat, model_args, model_path,
                     generating.resolve(generation_defaults(model_path)), description, max_batch_size=batch_size)
