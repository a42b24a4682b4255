"""`ChatModel`: load what Gym trained and talk to it with the template it was trained with.

Which model and settings: gym.infer.config. Answers come from an inference engine (`infer_backend`:
auto, fast, hf, vllm or llamacpp; gym.infer.engines), so threads that chat with one ChatModel at once share its
forward passes, as API users do. Decoding settings resolve once: the user's keys (or those saved by
training), else the model's generation_config, else Gym's defaults (gym.config.generating).

A vision-language model loads with its processor and is served by gym.infer.vision_engine; a turn's images
(`images=`: paths, data: URLs, bytes or PIL images) go where the messages' `<image>` placeholders are, or before the
first user message's text when the messages have none (as LLaMA-Factory's chat does). The prompt is rendered with
the same chat format as training, then the processor expands each placeholder into the image's tokens.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from gym.config.files import ConfigSource, as_config_dict, model_folder_keys
from gym.config.parser import get_infer_args
from gym.core.errors import ConfigError, GymError, ModelError
from gym.core.names import did_you_mean, split_names
from gym.data.media import PLACEHOLDERS, MediaError, fit_pixels, load_image
from gym.data.multimodal import MediaInputs
from gym.data.templates import get_chat_format
from gym.data.tools import ToolError, ToolFormat, parse_tools
from gym.infer import grammar
from gym.infer.config import refuse_scoring_model, resolve_inference_config
from gym.infer.engines import build_engine, fast_unsupported, multimodal_backend, require_llamacpp, require_vllm
from gym.infer.fast.bank import VariantSource
from gym.infer.fast.direct import DirectModel, load_direct
from gym.infer.grammar import Constraint, GrammarStopped
from gym.infer.requests import Engine, Finished, Media, SamplingParams
from gym.infer.tool_choice import (
    CallStream,
    Reply,
    RequestFieldError,
    ToolChoice,
    answer_or_calls,
    answer_schema,
    calls_grammar,
    offered,
    parse_reply,
)
from gym.models import vision
from gym.models.adapters import attach_adapter
from gym.models.base_quantization import is_quantized
from gym.models.loader import (
    generation_defaults,
    gguf_file,
    load_causal_lm,
    load_gguf_tokenizer,
    load_tokenizer,
    resolve_model_path,
)
from gym.models.quick_tokenizer import full_tokenizer, quick_tokenizer

logger = logging.getLogger(__name__)

Message = dict[str, Any]
"""gym.data.messages' shape: role user, assistant (with `tool_calls`: ToolCall list) or observation, and content."""

Image = Any
"""An image for a turn: a path, a `data:image/...;base64,` URL, raw bytes (checked by gym.data.media.load_image), or
a PIL image the caller already opened and checked."""

IMAGE = PLACEHOLDERS["images"]


@dataclass
class ChatTurn:
    """A chat request made ready for the engine: the prompt ids, what the answer must match (None: free text), and
    the tool format that reads calls back out of the answer (None: the answer is all content)."""

    prompt: list[int]
    constraint: Constraint | None = None
    tool_format: ToolFormat | None = None
    media: Media | None = None  # the images' tensors, for a vision-language model's engine

    def calls(self) -> CallStream:
        """A splitter for one streamed answer: content to show now, calls at the end."""
        return CallStream(self.tool_format)

    def reply(self, finished: Finished) -> Reply:
        """The answer's content and calls; GrammarStopped when the grammar gave up on it."""
        if finished.reason == "error":
            raise GrammarStopped(finished.error, finished.completion_tokens)
        return parse_reply(self.tool_format, finished.text, finished.reason, finished.completion_tokens)


class ReplyStream:
    """An answer's content piece by piece (iterate), then, once it is over, `reply`: the calls it made and why it
    ended. Text that is or may become a call is held back, so it never shows up as content."""

    def __init__(self, pieces: Iterator[str | Finished], turn: ChatTurn) -> None:
        self._pieces, self._turn = pieces, turn
        self.reply: Reply | None = None

    def __iter__(self) -> Iterator[str]:
        calls = self._turn.calls()
        for item in self._pieces:
            if isinstance(item, Finished):
                if item.reason == "error":
                    raise GrammarStopped(item.error, item.completion_tokens)
                rest, found = calls.finish()
                if rest:
                    yield rest
                content = calls.text[:calls.sent] + rest if found else calls.text
                self.reply = Reply(content, found, "tool_calls" if found else item.reason, item.completion_tokens)
                return
            shown = calls.feed(item)
            if shown:
                yield shown


# The roles a conversation given to the chat methods may hold (gym.data.messages' own, as training reads them).
CHAT_ROLES = ("user", "assistant", "system", "observation", "function")


class ChatModel:
    """Python entry point: `ChatModel(config).chat(messages)` / `.stream_chat(messages)`."""

    def __init__(self, config: ConfigSource = None, *, max_batch_size: int = 16, max_waiting: int = 256,
                 variants: VariantSource | None = None, **keys: Any) -> None:
        """`config`: a dict, a YAML/JSON file, or a folder (a finished run, an adapter, a model: as `gym chat
        FOLDER` takes it); `keys`: config keys as keyword arguments (model_name_or_path="smollm2-135m"), over the
        config's. `variants`: per-user variants of the model a request may ask for (`variant=` in the generation
        settings), served in the same batches (the fast engine; gym.infer.fast.deltas)."""
        if isinstance(config, (str, os.PathLike)) and Path(config).is_dir():
            config = model_folder_keys(Path(config))
        resolved = resolve_inference_config({**as_config_dict(config), **keys})
        refuse_scoring_model(resolved)
        self.model_args, self.data_args, _, generating = get_infer_args(
            {k: v for k, v in resolved.items() if k != "output_dir"})
        self.adapters = split_names(self.model_args.adapter_name_or_path)
        self._model: Any = None  # what the engine is built from: model, or the fast engine's DirectModel
        self.media: MediaInputs | None = None  # a vision-language model's processor and placeholders
        if self.model_args.infer_backend == "llamacpp":
            self.model_path, self.tokenizer = self._gguf_source()
        else:
            for adapter in self.adapters:
                if not (Path(adapter) / "adapter_config.json").is_file():
                    raise ModelError(f"{adapter} is not a LoRA adapter folder (no adapter_config.json).")
            self.model_path = resolve_model_path(self.model_args.model_name_or_path)
            self.media = self._media_inputs()
            if self.model_args.infer_backend not in ("auto", "fast", "hf"):
                require_vllm()  # before anything slow, so a missing backend is the first thing the user hears
            direct = self._direct_model(variants)
            self.tokenizer = self.media.tokenizer if self.media else self._tokenizer(quick=direct is not None)
            if self.model_args.infer_backend in ("auto", "fast", "hf"):
                self._model = direct if direct is not None else self._load_hf_model()
        self.chat_format = get_chat_format(self.tokenizer, self.data_args.template, self.data_args.default_system,
                                           self.data_args.enable_thinking,
                                           tool_format=self.data_args.tool_format)
        self.decoding: dict[str, Any] = generating.resolve(generation_defaults(self.model_path))
        self._engine_options: dict[str, Any] = {"max_batch_size": max_batch_size, "max_waiting": max_waiting,
                                                "variants": variants}
        self._engine: Engine | None = None
        self._engine_lock = threading.Lock()  # threads asking for the engine at once must get one engine, not one each

    def _media_inputs(self) -> MediaInputs | None:
        """A vision-language model's processor (None for a text model), after checking the backend can serve it."""
        if not vision.is_multimodal(self.model_path, self.model_args):
            return None
        multimodal_backend(self.model_args, self.model_path)  # before anything slow loads
        processor = vision.load_processor(self.model_path, self.model_args)
        return MediaInputs.for_processor(processor, self.model_path, image_max_pixels=self.model_args.image_max_pixels,
                                         image_min_pixels=self.model_args.image_min_pixels)

    @property
    def model(self) -> Any:
        """The model as transformers loads it (None for the vllm and llamacpp backends, which load their own). Where
        the fast engine reads the model's files itself (gym.infer.fast.direct), the first use loads it; when that
        is before the engine starts, the engine serves this model, whatever was changed in it (a delta added)."""
        if isinstance(self._model, DirectModel):
            with self._engine_lock:
                if isinstance(self._model, DirectModel):
                    self._model = self._load_hf_model()
                    # What takes the model (lm-eval, transformers' generate) takes transformers' tokenizer too.
                    self.tokenizer = full_tokenizer(self.tokenizer)
        return self._model

    @property
    def model_config(self) -> Any:
        """The model's config (None for vllm and llamacpp), without loading anything more."""
        return getattr(self._model, "config", None)

    def _tokenizer(self, *, quick: bool) -> Any:
        """The model's tokenizer. `quick`: where only the fast engine will use it, read without importing
        transformers when the folder allows (gym.models.quick_tokenizer: ~0.8 s of a start), transformers' own
        behind it for anything else."""
        def full() -> Any:
            return load_tokenizer(self.model_path, self.model_args)

        quick_one = quick_tokenizer(self.model_path, full) if quick else None
        return quick_one if quick_one is not None else full()

    def _direct_model(self, variants: VariantSource | None) -> Any:
        """The model read straight from its folder's files (gym.infer.fast.direct), where only the fast engine on the
        CPU will use it as the files hold it: no adapter, variant, quantization on load, RoPE scaling or GPU. It
        skips importing transformers' model classes and building their model (~2 s of a start). None: load it with
        transformers (also when GYM_DIRECT_LOAD=0)."""
        args = self.model_args
        if (args.infer_backend not in ("auto", "fast") or self.adapters or self.media is not None
                or variants is not None or args.use_unsloth or args.quantization_bit is not None
                or args.rope_scaling is not None or not Path(self.model_path).is_dir() or torch.cuda.is_available()
                or os.environ.get("GYM_DIRECT_LOAD", "1").strip().lower() in ("0", "false", "no", "off")):
            return None
        model, reason = load_direct(self.model_path, self._dtype())
        if model is None:
            logger.debug("Loading %s with transformers: the fast engine's own loader does not read it, as %s.",
                         self.model_path, reason)
            return None
        if (unsupported := fast_unsupported(model)) is not None:
            logger.debug("Loading %s with transformers: the fast engine cannot serve it (%s).", self.model_path,
                         unsupported)
            return None
        return model

    def _load_hf_model(self) -> Any:
        loader = vision.load_multimodal if self.media is not None else load_causal_lm
        model = loader(self.model_path, self.model_args, dtype=self._dtype())
        if is_quantized(model):
            # Merging would round the adapter into the base's few bits; QLoRA serves it beside the base, as
            # it trained (the config allows one adapter here). Merge onto the unquantized base instead by
            # chatting without quantization_bit.
            base = self.model_args.model_name_or_path
            return (attach_adapter(model, self.adapters[0], base, merge=False) if self.adapters else model).eval()
        for adapter in self.adapters:
            model = attach_adapter(model, adapter, self.model_args.model_name_or_path)
        if torch.cuda.is_available() and self.model_args.infer_dtype not in ("int8", "int4"):
            # The engines run where the model is; int8/int4 are the CPU engine's formats, so they stay there.
            model = model.to("cuda")
        return model.eval()

    def _gguf_source(self) -> tuple[str, Any]:
        """llamacpp serves a GGUF file: the one model_name_or_path names (the embedded model's own file, for
        its short name), with that file's tokenizer (the converted folder's, when Gym already made one)."""
        require_llamacpp()
        reference = self.model_args.model_name_or_path
        gguf = gguf_file(reference)
        if gguf is None:
            raise ConfigError(f"infer_backend: llamacpp serves a GGUF file, and model_name_or_path {reference!r} is "
                              "not one: give a .gguf file, or use infer_backend: auto for this model.")
        if reference is None or not reference.endswith(".gguf"):
            tokenizer = load_tokenizer(resolve_model_path(reference), self.model_args)
        else:
            tokenizer = load_gguf_tokenizer(gguf)
        return str(gguf), tokenizer

    @property
    def engine(self) -> Engine:
        """The inference engine, started on first use (a background thread for hf)."""
        if self._engine is not None:
            return self._engine
        with self._engine_lock:
            if self._engine is not None:
                return self._engine
            engine = build_engine(self.model_args, model=self._model, tokenizer=self.tokenizer,
                                  model_path=self.model_path, adapters=self.adapters,
                                  stop_token_ids=self.chat_format.stop_token_ids(), multimodal=self.media is not None,
                                  weights_folder=None if self.adapters else self.model_path,
                                  **self._engine_options)
            # Stop the engine thread before the interpreter tears torch down under it (a thread still
            # inside torch at exit aborts the process), without keeping this ChatModel alive.
            weakref.finalize(self, engine.shutdown)
            self._engine = engine
        return self._engine

    def start(self) -> None:
        """Start the engine now instead of on the first request, so that what it reports while starting
        (its weight format, how long it took) is said before an answer begins, not in the middle of one."""
        self.engine  # noqa: B018 (the property starts it)

    def close(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None

    def _dtype(self) -> torch.dtype:
        choice = self.model_args.infer_dtype
        if choice in ("int8", "int4"):
            return torch.float32  # the fast engine quantizes from the float weights
        if choice != "auto":
            return getattr(torch, choice)
        if torch.cuda.is_available():
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        # On CPU, bf16 matmuls can be fast but the many small ops of decoding are not: keep float32.
        return torch.float32

    def render(self, messages: list[Message], system: str | None = None,
               tools: list[dict[str, Any]] | None = None) -> list[int]:
        """Token ids of the prompt exactly as the model sees it; `tools` (OpenAI-shaped) are described in it in the
        template family's words."""
        text = self.chat_format.render_prompt(messages, system, tools=tools)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def encode(self, messages: list[Message], system: str | None = None, tools: list[dict[str, Any]] | None = None,
               images: Sequence[Image] = ()) -> tuple[list[int], Media | None]:
        """The prompt's ids and, for a vision-language model, its media tensors (None without images). Raises
        RequestFieldError for images a text model was given, placeholders that do not match the images, or an
        image that cannot be used (the field names it: `images[1]`)."""
        if self.media is None:
            if images:
                raise RequestFieldError("messages", f"the model is a text model ({self.model_path}); it takes no "
                                                    "images. Serve a vision-language model to send images.")
            return self.render(messages, system, tools), None
        messages = _place_images(messages, len(images))
        text = self.chat_format.render_prompt(messages, system, tools=tools)
        found = text.count(IMAGE)
        if found != len(images):
            raise RequestFieldError("messages", f"{len(images)} image(s) given but the prompt has {found} {IMAGE} "
                                                f"placeholder(s); put one {IMAGE} where each image goes.")
        if not images:
            return list(self.tokenizer.encode(text, add_special_tokens=False)), None
        decoded = []
        for i, image in enumerate(images):
            try:
                opened = image if hasattr(image, "convert") else load_image(image, where=f"images[{i}]")
                _decode_small(opened, self.media.image_max_pixels)
                decoded.append(fit_pixels(opened, self.media.image_max_pixels, self.media.image_min_pixels))
            except MediaError as e:
                raise RequestFieldError(e.where, e.problem) from None
            except OSError as e:  # a checked image whose pixels still fail to decode
                raise RequestFieldError(f"images[{i}]", f"the image cannot be decoded: {e}") from None
        try:
            out = self.media._run(text, {"images": decoded})
        except (ValueError, RuntimeError, TypeError) as e:
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise RequestFieldError("messages", f"the model's processor refused the images: {reason}") from None
        ids: list[int] = out["input_ids"][0].tolist()
        media = {key: value for key, value in out.items()
                 if key not in ("input_ids", "attention_mask") and hasattr(value, "is_floating_point")}
        return ids, media

    def tool_format(self) -> ToolFormat | None:
        """How this model's template writes tools and calls (None: its own template writes them in a family Gym does
        not know, so calls are not read back); RequestFieldError, naming the fix, when it cannot render tools."""
        try:
            return self.chat_format.require_tools("This request")
        except GymError as e:
            raise RequestFieldError("tools", str(e)) from None

    def prepare(self, messages: list[Message], system: str | None = None, *, tools: Any = None,
                tool_choice: Any = None, parallel_tool_calls: bool = True, response_format: Any = None,
                images: Sequence[Image] = ()) -> ChatTurn:
        """A chat turn with OpenAI's tool and output options (gym.infer.tool_choice says what each means). Raises
        RequestFieldError naming the option that cannot be used."""
        try:
            listed = parse_tools(tools) if tools else []
        except ToolError as e:
            raise RequestFieldError("tools", str(e)) from None
        names = [tool["function"]["name"] for tool in listed]
        twice = next((name for i, name in enumerate(names) if name in names[:i]), None)
        if twice is not None:  # a call names its function: which of the two would it be
            raise RequestFieldError("tools", f"two tools are named {twice!r}; tool names must be unique.")
        choice = ToolChoice.parse(tool_choice, listed)
        schema = answer_schema(response_format)
        tool_format = self.tool_format() if listed else None
        if choice.forced and tool_format is None:
            raise RequestFieldError("tool_choice", "this model's chat template writes calls in a format Gym does not "
                                                   "know, so they cannot be forced; name it (tool_format: ...).")
        try:
            prompt, media = self.encode(messages, system, listed or None, images)
        except RequestFieldError:
            raise
        except GymError as e:  # calls in the history of a template that cannot render them
            raise RequestFieldError("messages", str(e)) from None
        turn = ChatTurn(prompt, tool_format=tool_format if choice.mode != "none" else None, media=media)
        if schema is not None and not choice.forced:
            try:  # alone first, so that a bad schema is blamed on response_format and not on the tools beside it
                turn.constraint = grammar.json_schema(schema)
            except ConfigError as e:
                raise RequestFieldError("response_format", str(e)) from None
        if tool_format is not None and (choice.forced or (turn.constraint is not None and choice.mode == "auto"
                                                          and answer_or_calls(tool_format.layout))):
            text = calls_grammar(tool_format.layout, offered(listed, choice), parallel=parallel_tool_calls,
                                 answer=None if choice.forced else schema)
            try:
                turn.constraint = grammar.lark(text)
            except ConfigError as e:
                raise RequestFieldError("tools", f"a function's parameters are not a usable JSON schema: {e}") from None
        return turn

    def reply(self, messages: list[Message], system: str | None = None, *, tools: Any = None,
              tool_choice: Any = None, parallel_tool_calls: bool = True, response_format: Any = None,
              stop: str | list[str] | None = None, seed: int | None = None, images: Sequence[Image] = (),
              **overrides: Any) -> Reply:
        """The whole answer with its calls parsed (`tools`, `tool_choice`, ... as in OpenAI's API)."""
        stream = self.stream_reply(messages, system, tools=tools, tool_choice=tool_choice,
                                   parallel_tool_calls=parallel_tool_calls, response_format=response_format,
                                   stop=stop, seed=seed, images=images, **overrides)
        for _ in stream:
            pass
        assert stream.reply is not None
        return stream.reply

    @staticmethod
    def checked(messages: Any) -> list[Message]:
        """`messages` as the chat methods take them: a list of {"role", "content"} objects, or a string for one
        user message. Anything else is a ConfigError naming the message and the field, here and not as a library's
        AttributeError from deep in the template (or, for a misspelt role, an answer to a conversation not sent)."""
        if isinstance(messages, str):
            return [{"role": "user", "content": messages}]
        if isinstance(messages, dict):
            raise ConfigError("messages: give a list of messages ([{\"role\": \"user\", \"content\": ...}]), "
                              "not one message object.")
        if not isinstance(messages, list) or not messages:
            raise ConfigError(f"messages: give a non-empty list of {{role, content}} messages, got {messages!r:.60}.")
        for i, message in enumerate(messages):
            if not isinstance(message, dict):
                raise ConfigError(f"messages[{i}]: expected an object with role and content, got {message!r:.60}.")
            role = message.get("role")
            if role not in CHAT_ROLES:
                raise ConfigError(f"messages[{i}].role: {role!r} is not a role.{did_you_mean(str(role), CHAT_ROLES)} "
                                  f"The roles: {', '.join(CHAT_ROLES)}.")
            content = message.get("content")
            if content is None and not message.get("tool_calls"):
                raise ConfigError(f"messages[{i}] has no content.")
            if content is not None and not isinstance(content, str):
                raise ConfigError(f"messages[{i}].content must be a string, got {type(content).__name__} "
                                  f"{content!r:.60}.")
        return messages

    def stream_reply(self, messages: list[Message], system: str | None = None, *, tools: Any = None,
                     tool_choice: Any = None, parallel_tool_calls: bool = True, response_format: Any = None,
                     stop: str | list[str] | None = None, seed: int | None = None, images: Sequence[Image] = (),
                     **overrides: Any) -> ReplyStream:
        """The answer's content piece by piece, then its calls (`.reply` once iterated; see ReplyStream)."""
        turn = self.prepare(self.checked(messages), system, tools=tools, tool_choice=tool_choice,
                            parallel_tool_calls=parallel_tool_calls, response_format=response_format, images=images)
        params = self.sampling_params(stop=stop, seed=seed, constraint=turn.constraint, **overrides)
        return ReplyStream(self._events(turn.prompt, params, turn.media), turn)

    def _events(self, prompt: list[int], params: SamplingParams, media: Media | None = None
                ) -> Iterator[str | Finished]:
        # media only where there are some: a text turn reaches the engine exactly as before images existed
        request = self.engine.submit(prompt, params, media=media) if media else self.engine.submit(prompt, params)
        try:
            for event in request.events():
                if isinstance(event, Finished):
                    yield event
                elif event.text:
                    yield event.text
        finally:
            request.cancel()

    def sampling_params(self, *, stop: str | list[str] | None = None, seed: int | None = None,
                        **overrides: Any) -> SamplingParams:
        """The engine's per-request settings: the resolved decoding settings with `overrides` (temperature,
        top_p, top_k, max_new_tokens, do_sample, repetition_penalty) on top."""
        values = {**self.decoding, **{k: v for k, v in overrides.items() if v is not None}}
        known = [f.name for f in fields(SamplingParams)]
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ConfigError(f"Unknown generation setting '{unknown[0]}'.{did_you_mean(unknown[0], known)} The "
                              "settings: max_new_tokens, temperature, top_p, top_k, repetition_penalty, do_sample, "
                              "stop, seed.")
        if stop is not None and not isinstance(stop, (str, list, tuple)):
            raise ConfigError(f"stop must be a string or a list of strings, got {stop!r}.")
        stops = [stop] if isinstance(stop, str) else [s for s in stop or [] if s]
        return SamplingParams(**values, stop=stops, seed=seed)

    def stream_chat(self, messages: list[Message], system: str | None = None, *,
                    stop: str | list[str] | None = None, seed: int | None = None, images: Sequence[Image] = (),
                    **overrides: Any) -> Iterator[str]:
        """The answer, piece by piece. `stop`: strings that end the answer (not included, as in OpenAI's API);
        `seed`: sample reproducibly; `images`: for a vision-language model (see the module's docstring)."""
        params = self.sampling_params(stop=stop, seed=seed, **overrides)
        prompt, media = self.encode(self.checked(messages), system, images=images)
        for piece in self._events(prompt, params, media):
            if isinstance(piece, str):
                yield piece

    def chat(self, messages: list[Message], system: str | None = None, **overrides: Any) -> str:
        return "".join(self.stream_chat(messages, system, **overrides))


def _place_images(messages: list[Message], count: int) -> list[Message]:
    """Images given without any placeholder go before the first user message's text (one placeholder each)."""
    if not count or any(IMAGE in str(m.get("content") or "") for m in messages):
        return messages
    first = next((i for i, m in enumerate(messages) if m["role"] == "user"), None)
    if first is None:
        return messages
    placed = list(messages)
    placed[first] = {**messages[first], "content": IMAGE * count + str(messages[first].get("content") or "")}
    return placed


def _decode_small(image: Any, max_pixels: int) -> None:
    """A JPEG over the pixel limit is decoded at a reduced scale (its DCT decodes 1/2, 1/4 or 1/8 of the size
    directly), so a large photo sent to the server never takes its full size in memory before being shrunk."""
    width, height = image.size
    if getattr(image, "format", None) == "JPEG" and width * height > max_pixels:
        factor = (max_pixels / (width * height)) ** 0.5
        image.draft("RGB", (max(1, int(width * factor)), max(1, int(height * factor))))
