"""Inference: every generation in Gym (chat, the HTTP API, batch inference) goes through here.

    from gym.infer import ChatModel
    ChatModel({"adapter_name_or_path": "saves/quickstart"}).chat([{"role": "user", "content": "Hi"}])

config (which model, template, decoding) -> ChatModel -> an engine (hf: dynamic batching on
transformers; vllm) -> events; batch inference submits rows to the same engine.
"""

from gym.infer.chat import ChatModel
from gym.infer.requests import SamplingParams

__all__ = ["ChatModel", "SamplingParams"]
