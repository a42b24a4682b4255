"""`ChatModel`: load what Gym trained and talk to it with the template it was trained with.

The model comes from `model_name_or_path` plus `adapter_name_or_path`; a training config whose
`output_dir` holds a finished run is also enough (its adapter or model is picked up). The chat
template and generation defaults are read from the `gym_config.yaml` saved with the output, so a
model never answers in a format it was not trained on. Keys given explicitly always win.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Iterator
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import torch
import yaml

from gym.config.parser import as_config_dict, get_train_args, split_names
from gym.data.templates import get_chat_format
from gym.errors import ModelError
from gym.models.loader import load_causal_lm, load_tokenizer, resolve_model_path
from gym.train.outputs import CONFIG_FILE, MANIFEST_FILE

logger = logging.getLogger(__name__)

# Keys a saved training config passes on to inference, unless the user sets them.
_INHERITED = ("template", "default_system", "enable_thinking", "do_sample", "temperature", "top_p", "top_k",
              "max_new_tokens", "repetition_penalty")


def _finished_output(config: dict[str, Any]) -> Path | None:
    out = config.get("output_dir")
    if out and not config.get("adapter_name_or_path") and (Path(out) / MANIFEST_FILE).is_file():
        return Path(out)
    return None


def resolve_inference_config(config: dict[str, Any] | str | os.PathLike | None) -> dict[str, Any]:
    """A user config -> the complete inference config: which model, adapters, template and decoding."""
    config = as_config_dict(config)
    trained = _finished_output(config)
    if trained is not None:
        manifest = yaml.safe_load((trained / MANIFEST_FILE).read_text())
        if manifest.get("what") == "lora-adapter":
            config["adapter_name_or_path"] = str(trained)
        else:
            config["model_name_or_path"] = str(trained)
        logger.info("Using the trained model in %s", trained)
    # Settings saved by training (with the first adapter) fill in what the user left unset.
    first_adapter = next(iter(split_names(config.get("adapter_name_or_path"))), "")
    saved_dir = Path(first_adapter) if first_adapter else Path(str(config.get("model_name_or_path") or ""))
    saved = saved_dir / CONFIG_FILE if str(saved_dir) else None
    if saved is not None and saved.is_file():
        saved_config = yaml.safe_load(saved.read_text()) or {}
        for key in _INHERITED:
            if key not in config and key in saved_config:
                config[key] = saved_config[key]
        if first_adapter and "model_name_or_path" not in config:
            config["model_name_or_path"] = saved_config.get("model_name_or_path")
    return config


class ChatModel:
    """Python entry point: `ChatModel(config).chat(messages)` / `.stream_chat(messages)`.

    Answers come from an inference engine (`infer_backend`: hf, with dynamic batching, or vllm), so
    threads that chat with one ChatModel at once share its forward passes, as API users do."""

    def __init__(self, config: dict[str, Any] | str | os.PathLike | None = None, *, max_batch_size: int = 16,
                 max_waiting: int = 256) -> None:
        resolved = resolve_inference_config(config)
        args = get_train_args({k: v for k, v in resolved.items() if k not in ("output_dir",)})
        self.model_args, self.data_args, self.generating_args = args.model, args.data, args.generating
        self.model_path = resolve_model_path(self.model_args.model_name_or_path)
        self.adapters = split_names(self.model_args.adapter_name_or_path)
        for adapter in self.adapters:
            if not (Path(adapter) / "adapter_config.json").is_file():
                raise ModelError(f"{adapter} is not a LoRA adapter folder (no adapter_config.json).")
        self.tokenizer = load_tokenizer(self.model_path, self.model_args)
        self.model: Any = None
        if self.model_args.infer_backend == "hf":
            self.model = self._load_hf_model()
        else:
            from gym.serve.backends import require_vllm

            require_vllm()  # before anything slow, so a missing backend is the first thing the user hears
        self.chat_format = get_chat_format(self.tokenizer, self.data_args.template, self.data_args.default_system,
                                           self.data_args.enable_thinking)
        self._engine_options = {"max_batch_size": max_batch_size, "max_waiting": max_waiting}
        self._engine: Any = None

    def _load_hf_model(self) -> Any:
        from peft import PeftModel

        model = load_causal_lm(self.model_path, self.model_args, dtype=self._dtype())
        for adapter in self.adapters:
            model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
        return model.eval()

    @property
    def engine(self) -> Any:
        """The inference engine, started on first use (a background thread for hf)."""
        if self._engine is None:
            from gym.serve.backends import build_engine

            self._engine = build_engine(self, **self._engine_options)
            # Stop the engine thread before the interpreter tears torch down under it (a thread still
            # inside torch at exit aborts the process), without keeping this ChatModel alive.
            weakref.finalize(self, self._engine.shutdown)
        return self._engine

    def close(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None

    def _dtype(self) -> torch.dtype:
        choice = self.model_args.infer_dtype
        if choice != "auto":
            return getattr(torch, choice)
        if torch.cuda.is_available():
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        # On CPU, bf16 matmuls can be fast but the many small ops of decoding are not: keep float32.
        return torch.float32

    def render(self, messages: list[dict[str, str]], system: str | None = None) -> list[int]:
        """Token ids of the prompt exactly as the model sees it."""
        text = self.chat_format.render_prompt(messages, system)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _generate_kwargs(self, overrides: dict[str, Any]) -> dict[str, Any]:
        """Keyword arguments for `model.generate` (batch inference)."""
        kwargs = self.generating_args.to_generate_kwargs()
        kwargs.update({k: v for k, v in overrides.items() if v is not None})
        if not kwargs.get("do_sample", True):
            for key in ("temperature", "top_p", "top_k"):
                kwargs.pop(key, None)
        kwargs["eos_token_id"] = self.chat_format.stop_token_ids()
        kwargs["pad_token_id"] = self.tokenizer.pad_token_id
        return kwargs

    def sampling_params(self, *, stop: str | list[str] | None = None, seed: int | None = None,
                        **overrides: Any) -> Any:
        """The engine's per-request settings: the generation defaults (saved by training, or the user's),
        with `overrides` (temperature, top_p, top_k, max_new_tokens, do_sample, repetition_penalty) on top."""
        from gym.serve.engine import SamplingParams

        values = {**asdict(self.generating_args), **{k: v for k, v in overrides.items() if v is not None}}
        unknown = set(values) - {f.name for f in fields(SamplingParams)}
        if unknown:
            raise TypeError(f"unknown generation setting(s): {', '.join(sorted(unknown))}")
        stops = [stop] if isinstance(stop, str) else [s for s in stop or [] if s]
        return SamplingParams(**values, stop=stops, seed=seed)

    def stream_chat(self, messages: list[dict[str, str]], system: str | None = None, *,
                    stop: str | list[str] | None = None, seed: int | None = None, **overrides: Any) -> Iterator[str]:
        """The answer, piece by piece. `stop`: strings that end the answer (not included, as in OpenAI's API);
        `seed`: sample reproducibly."""
        from gym.serve.engine import Piece

        request = self.engine.submit(self.render(messages, system), self.sampling_params(stop=stop, seed=seed,
                                                                                          **overrides))
        try:
            for event in request.events():
                if isinstance(event, Piece) and event.text:
                    yield event.text
        finally:
            request.cancel()

    def chat(self, messages: list[dict[str, str]], system: str | None = None, **overrides: Any) -> str:
        return "".join(self.stream_chat(messages, system, **overrides))


class StopFilter:
    """Text in, text out, up to the first stop string (not included, as in OpenAI's API). Text that could
    still turn into a stop string is held back until it cannot, so a stop string is never streamed."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self.longest = max((len(s) for s in self.stops), default=0)
        self.held = ""
        self.stopped = False

    def push(self, piece: str) -> str:
        """The text now safe to emit; after a stop string is seen, `stopped` is set and nothing more passes."""
        if self.stopped:
            return ""
        if not self.stops:
            return piece
        self.held += piece
        found = [i for i in (self.held.find(s) for s in self.stops) if i >= 0]
        if found:
            self.stopped = True
            out, self.held = self.held[: min(found)], ""
            return out
        # Keep the longest tail that is a prefix of some stop string; the rest is safe to emit.
        keep = next((n for n in range(min(self.longest - 1, len(self.held)), 0, -1)
                     if any(s.startswith(self.held[-n:]) for s in self.stops)), 0)
        out, self.held = self.held[: len(self.held) - keep], self.held[len(self.held) - keep:]
        return out

    def flush(self) -> str:
        """What was held back, once the text has ended without a stop string."""
        out, self.held = ("" if self.stopped else self.held), ""
        return out


def cut_at_stop(pieces: Iterator[str], stops: list[str]) -> Iterator[str]:
    """Pass text through until the first stop string, which is not passed (see StopFilter)."""
    stop_filter = StopFilter(stops)
    for piece in pieces:
        out = stop_filter.push(piece)
        if out:
            yield out
        if stop_filter.stopped:
            return
    tail = stop_filter.flush()
    if tail:
        yield tail
