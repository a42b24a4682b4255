"""The Chat tab: the inference playground. One model at a time is loaded in the server (a base, a training
run's output, a LoRA adapter, an exported folder, or a user's variant from a variants store), through the
same ChatModel as `gym chat` and `gym api`; answers stream; the prompt is shown exactly as rendered.

An image uploaded beside the message goes with it as an OpenAI `image_url` part (gym.webui.chat_messages), as
`gym api` receives one; a text model refuses it in one line."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gradio as gr

from gym.core.errors import GymError
from gym.core.files import MANIFEST_FILE
from gym.webui import forms
from gym.webui.chat_messages import (
    Message,
    as_text,
    history_messages,
    refuse_images,
    shown_user_message,
    split_images,
    user_message,
)
from gym.webui.common import UI, user_errors


class Playground:
    """The loaded model, shared by every browser tab (loading a second one replaces it)."""

    def __init__(self) -> None:
        self.model: Any = None
        self.name = ""
        self.takes_images = False  # a vision-language model (its config's type), read once when it loads
        self.lock = threading.Lock()

    def load(self, source: str, adapter: str, template: str, store: str, user: str) -> str:
        from gym.infer.chat import ChatModel

        if not source:
            raise GymError("Pick a model to load.")
        config: dict[str, Any] = {"template": template} if template else {}
        with self.lock:
            self.unload()
            if store and user:
                from gym.personalization.serving import variant_chat_model
                from gym.personalization.store import VariantStore

                self.model = variant_chat_model(VariantStore(store), source, user, **config)
                self.name = f"{user}'s variant of {source}"
            else:
                if (Path(source) / MANIFEST_FILE).is_file() and not adapter:
                    config["output_dir"] = source  # a Gym run: its adapter on its base, its template
                else:
                    config["model_name_or_path"] = source
                if adapter:
                    config["adapter_name_or_path"] = adapter
                self.model = ChatModel(config)
                self.name = source + (f" + {adapter}" if adapter else "")
            self.takes_images = _takes_images(self.model)
        seeing = " It takes images." if self.takes_images else ""
        return f"Loaded **{self.name}** (chat format: {self.model.chat_format.name}).{seeing}"

    def unload(self) -> None:
        if self.model is not None:
            self.model.close()
            self.model = None
            self.name = ""
            self.takes_images = False

    def turn(self, text: str, image: str | None, history: list[dict[str, Any]] | None,
             system: str | None) -> tuple[list[Message], str]:
        """The messages to send (the history, then the user's text and image) and the prompt as the chat format
        renders it, with `<image>` where each image goes; a GymError for what cannot be sent."""
        if self.model is None:
            raise GymError("Load a model first.")
        if not text.strip() and image is None:
            raise GymError("Type a message.")
        messages = [*history_messages(history), user_message(text, image)]
        refuse_images(messages, self.takes_images, self.name)
        return messages, self.model.chat_format.render_prompt(as_text(messages), system)


def build(ui: UI, demo: gr.Blocks) -> None:
    playground = Playground()
    with gr.Row():
        source = gr.Dropdown(forms.local_models([ui.store.root]), value=forms.EMBEDDED_MODEL, allow_custom_value=True,
                             label="model", scale=3, elem_id="chat-model",
                             info="a base, a run's output folder, an exported folder, or a hub id")
        adapter = gr.Textbox(label="adapter (optional)", placeholder="a LoRA adapter folder")
        template = gr.Textbox(label="template", placeholder="auto")
    with gr.Row():
        store = gr.Textbox(label="variants store (optional)", placeholder="a folder made by gym variants create")
        user = gr.Textbox(label="user", placeholder="whose variant answers")
        load = gr.Button("Load", variant="primary", elem_id="chat-load")
        unload = gr.Button("Unload")
    loaded = gr.Markdown("No model loaded.", elem_id="chat-loaded")
    with gr.Row():
        system = gr.Textbox(label="system prompt", scale=3)
        temperature = gr.Slider(0, 2, value=0.0, step=0.05, label="temperature (0: greedy)")
        top_p = gr.Slider(0.05, 1, value=1.0, step=0.05, label="top_p")
        max_new_tokens = gr.Number(128, label="max_new_tokens", precision=0)
    chatbot = gr.Chatbot(label="chat", height=360, elem_id="chat-box")
    with gr.Row():
        message = gr.Textbox(label="message", scale=5, elem_id="chat-input", placeholder="Enter sends")
        image = gr.Image(type="filepath", label="image (vision-language models)", sources=["upload", "clipboard"],
                         height=120, scale=1, elem_id="chat-image")
        send = gr.Button("Send", variant="primary", elem_id="chat-send")
        clear = gr.Button("Clear")
    rendered = gr.Code(label="the prompt as rendered (what the model reads)", language=None, interactive=False)

    @user_errors
    def on_load(*values: str) -> str:
        return playground.load(*values)

    def on_unload() -> str:
        playground.unload()
        return "No model loaded."

    @user_errors
    def on_send(text: str, image: str | None, history: list[dict[str, Any]], system_prompt: str, temp: float,
                p: float, tokens: float | None) -> Iterator[tuple[list[dict[str, Any]], str, None, str]]:
        model = playground.model  # the one this answer comes from, even if another is loaded meanwhile
        messages, prompt = playground.turn(text, image, history, system_prompt or None)
        sampling = {"max_new_tokens": int(tokens or 128), "do_sample": temp > 0, "top_p": p}
        if temp > 0:
            sampling["temperature"] = temp
        answer = ""
        shown = [*(history or []), shown_user_message(text, image), {"role": "assistant", "content": ""}]
        yield shown, "", None, prompt
        text_messages, images = split_images(messages)
        for piece in model.stream_chat(text_messages, system_prompt or None, images=images, **sampling):
            answer += piece
            shown[-1] = {"role": "assistant", "content": answer}
            yield shown, "", None, prompt

    load.click(on_load, [source, adapter, template, store, user], loaded)
    unload.click(on_unload, None, loaded)
    for event in (send.click, message.submit):
        event(on_send, [message, image, chatbot, system, temperature, top_p, max_new_tokens],
              [chatbot, message, image, rendered])
    clear.click(lambda: ([], ""), None, [chatbot, rendered])
    demo.load(lambda: gr.update(choices=forms.local_models([ui.store.root])), None, source)


def _takes_images(model: Any) -> bool:
    """Whether the loaded model reads images: its config's type is a vision-language one (a GGUF served by
    llama.cpp has no such config, and is read as text)."""
    from gym.models.vision import is_multimodal

    return is_multimodal(str(model.model_path), getattr(model, "model_args", None))
