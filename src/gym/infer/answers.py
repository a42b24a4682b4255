"""A loaded model answering a list of conversations, greedily, through the engine every generation in Gym uses.

The safety evaluation (`gym eval --task safety:...`) and the safety gates (`gym variants create`, `gym delta
compress`, `gym soup contribute`, the service's fine-tuning jobs) ask a model many requests and judge what it says
(gym.safety); this is how they ask. Each conversation is rendered with the model's own chat format, as `gym chat`
and the API render it, and decoded by the engine (the fast engine where it serves the model, else transformers'),
a batch at a time, with at most `2 x batch_size` requests in flight so that a large set never overfills the
engine's queue.

    answers = ModelAnswers.load("smollm2-135m")            # or ModelAnswers(model, tokenizer, chat_format)
    texts = answers([[{"role": "user", "content": "Hi"}]], max_new_tokens=64)

`ModelAnswers` is gym.safety.gate's AnswerFn. It starts an engine for each call and stops it after, so a job may
change the model's weights in place between two calls (add a delta, take it away) and each call answers with the
weights as they are then.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from gym.core.errors import ConfigError
from gym.data.templates import ChatFormat, get_chat_format
from gym.infer.batch import final_text
from gym.infer.engines import build_engine
from gym.infer.requests import Engine, Request, SamplingParams

Conversation = list[dict[str, Any]]


def _plain(conversation: Conversation) -> str:
    question = "\n\n".join(str(m.get("content") or "") for m in conversation if m.get("role") == "user")
    return f"Question: {question}\nAnswer:"


def answer_all(engine: Engine, tokenizer: Any, chat_format: ChatFormat | None, conversations: Sequence[Conversation],
               params: SamplingParams, *, in_flight: int = 32) -> list[str]:
    """answers[i] to conversations[i] from `engine`, at most `in_flight` requests submitted at a time. Without a chat
    format (a base model) each conversation is asked as "Question: ...\\nAnswer:", stopped at a blank line."""
    if chat_format is None:
        params = replace(params, stop=[*params.stop, "\nQuestion:", "\n\n"])
    answers: list[str] = [""] * len(conversations)
    pending: deque[tuple[int, Request]] = deque()
    for i, conversation in enumerate(conversations):
        if chat_format is not None:
            ids = list(tokenizer.encode(chat_format.render_prompt(conversation, None), add_special_tokens=False))
        else:
            ids = list(tokenizer(_plain(conversation))["input_ids"])
        pending.append((i, engine.submit(ids, params)))
        while len(pending) >= in_flight:
            index, request = pending.popleft()
            answers[index] = final_text(request).strip()
    while pending:
        index, request = pending.popleft()
        answers[index] = final_text(request).strip()
    return answers


class ModelAnswers:
    """A loaded causal LM (transformers) with its tokenizer and chat format, answering conversations greedily.

    `model_args`: the inference keys of the engine (infer_backend, infer_dtype; default: auto, float32, so the
    answers measure the weights and not a serving format); `decoding`: the model's decoding settings (its
    generation_config's, e.g. repetition_penalty) under the greedy choice; `batch_size`: rows decoded together."""

    def __init__(self, model: Any, tokenizer: Any, chat_format: ChatFormat | None, *, model_args: Any = None,
                 decoding: dict[str, Any] | None = None, batch_size: int = 16) -> None:
        if batch_size < 1:
            raise ConfigError(f"batch_size must be at least 1, got {batch_size}.")
        self.model, self.tokenizer, self.chat_format = model, tokenizer, chat_format
        self.model_args = model_args if model_args is not None else _infer_args({})[0]
        self.decoding = dict(decoding or {})
        self.batch_size = batch_size

    @property
    def template(self) -> str:
        """The chat format's name ("tokenizer" for the model's own template; "plain" without one): what a cache of
        this model's answers is keyed by, beside its weights."""
        return self.chat_format.name if self.chat_format is not None else "plain"

    @classmethod
    def load(cls, reference: str, *, template: str | None = None, batch_size: int = 16) -> ModelAnswers:
        """The model `reference` names (a short name, hub id or folder), in float32 (on the GPU when there is one),
        with its tokenizer and chat format (`template`: a named one instead of the tokenizer's)."""
        import torch

        from gym.models.loader import load_causal_lm, resolve_model_path

        model_args = _infer_args({"model_name_or_path": reference})[0]
        model = load_causal_lm(resolve_model_path(reference), model_args, dtype=torch.float32)
        if torch.cuda.is_available():
            model = model.to("cuda")
        return cls.for_model(model.eval().requires_grad_(False), reference, template=template, batch_size=batch_size)

    @classmethod
    def for_model(cls, model: Any, reference: str, *, template: str | None = None,
                  batch_size: int = 16) -> ModelAnswers:
        """A model already loaded (its weights maybe changed since), with the tokenizer, chat format and decoding
        settings of the model `reference` names."""
        from gym.models.loader import generation_defaults, load_tokenizer, resolve_model_path

        keys: dict[str, Any] = {"model_name_or_path": reference}
        if template is not None:
            keys["template"] = template
        model_args, data_args, generating = _infer_args(keys)
        path = resolve_model_path(reference)
        tokenizer = load_tokenizer(path, model_args)
        try:
            chat: ChatFormat | None = get_chat_format(tokenizer, data_args.template, data_args.default_system,
                                                      data_args.enable_thinking)
        except ConfigError:
            chat = None
        decoding = generating.resolve(generation_defaults(path))
        return cls(model, tokenizer, chat, model_args=model_args, decoding=decoding, batch_size=batch_size)

    def __call__(self, conversations: Sequence[Conversation], max_new_tokens: int) -> list[str]:
        if not conversations:
            return []
        stops = self.chat_format.stop_token_ids() if self.chat_format is not None else \
            [t for t in (self.tokenizer.eos_token_id,) if t is not None]
        engine = build_engine(self.model_args, model=self.model, tokenizer=self.tokenizer,
                              model_path=str(getattr(self.model, "name_or_path", "")), adapters=[],
                              stop_token_ids=stops, max_batch_size=self.batch_size, max_waiting=2 * self.batch_size,
                              weights_folder=None)  # the weights may differ from any folder's: pack them afresh
        params = SamplingParams(**{**self.decoding, "do_sample": False, "max_new_tokens": max_new_tokens})
        try:
            return answer_all(engine, self.tokenizer, self.chat_format, conversations, params,
                              in_flight=2 * self.batch_size)
        finally:
            engine.shutdown()


def _infer_args(keys: dict[str, Any]) -> tuple[Any, Any, Any]:
    from gym.config.parser import get_infer_args

    model_args, data_args, _, generating = get_infer_args({"infer_dtype": "float32", **keys})
    return model_args, data_args, generating
