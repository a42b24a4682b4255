"""The Chat tab's messages: Gradio's chat history and an uploaded image -> the OpenAI-shaped messages Gym's models
read, and the checks that a model can read them.

An image travels as an OpenAI content part, `{"type": "image_url", "image_url": {"url": "data:image/...;base64,..."}}`,
placed before the text as LLaVA-style rows put `<image>` before the question. That is the shape `gym api` accepts and
gym.data.media.flatten_parts reads, so the Chat tab sends what an API client would and needs nothing of its own in
the model. The file is checked (gym.data.media.load_image: a real image, not a decompression bomb) before it is
encoded, so a broken upload is one line in the page. A text model refuses an image in one line too: answering
as if it had seen a picture it cannot see would mislead.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from gym.core.errors import GymError
from gym.data.media import flatten_parts, load_image

Message = dict[str, Any]


def image_part(path: str | Path, where: str = "the uploaded image") -> Message:
    """An image file -> an `image_url` content part holding it as a data URL (MediaError naming `where` if the
    file is not a usable image)."""
    from PIL import Image

    with load_image(Path(path), where=where) as image:
        mime = Image.MIME.get(image.format or "", "image/png")
    payload = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{payload}"}}


def user_message(text: str, image: str | Path | None = None) -> Message:
    """The user's turn: plain text, or (with an image) content parts, the image first."""
    if image is None:
        return {"role": "user", "content": text}
    parts = [image_part(image)]
    if text:
        parts.append({"type": "text", "text": text})
    return {"role": "user", "content": parts}


def history_messages(history: list[dict[str, Any]] | None) -> list[Message]:
    """Gradio's chat history (each message's content a list of text and file blocks) -> the model's messages:
    text alone as a string, as before images; images shown in the chat as image_url parts, so a follow-up
    question is asked about the same picture."""
    messages: list[Message] = []
    for message in history or []:
        content = message["content"]
        blocks = content if isinstance(content, list) else [content]
        parts: list[Message] = []
        for block in blocks:
            if isinstance(block, str):
                parts.append({"type": "text", "text": block})
            elif isinstance(block, dict) and block.get("type") == "text":
                parts.append({"type": "text", "text": str(block.get("text", ""))})
            elif isinstance(block, dict) and isinstance(block.get("file"), dict) and block["file"].get("path"):
                parts.append(image_part(block["file"]["path"], where="an image earlier in the chat"))
            elif isinstance(block, dict) and block.get("path"):
                parts.append(image_part(block["path"], where="an image earlier in the chat"))
        if all(part["type"] == "text" for part in parts):
            messages.append({"role": message["role"], "content": "".join(part["text"] for part in parts)})
        else:
            messages.append({"role": message["role"], "content": parts})
    return messages


def has_images(messages: list[Message]) -> bool:
    return any(isinstance(m.get("content"), list) and any(p.get("type") == "image_url" for p in m["content"])
               for m in messages)


def refuse_images(messages: list[Message], takes_images: bool, model_name: str) -> None:
    """A text model given an image: one line saying why not and what to do, instead of an answer about a picture
    it never saw (or a traceback from a template that reads strings)."""
    if takes_images or not has_images(messages):
        return
    raise GymError(f"{model_name} is a text model: it cannot see images. Remove the image (or Clear the chat), or "
                   "load a vision-language model (a LLaVA, Qwen2-VL or Gemma 3 folder, a run trained on one, or "
                   "tiny-llava to try it).")


def as_text(messages: list[Message]) -> list[Message]:
    """Messages with content parts written as text with a placeholder (`<image>`) where each image goes: how the
    Chat tab shows the rendered prompt (the model's processor expands each placeholder into its image tokens)."""
    shown: list[Message] = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if isinstance(content, list):
            text, _ = flatten_parts(content, f"messages[{i}].content")
            message = {**message, "content": text}
        shown.append(message)
    return shown


def split_images(messages: list[Message]) -> tuple[list[Message], list[str]]:
    """Messages with content parts -> (text messages with `<image>` where each image goes, the images' data URLs
    in order): the form ChatModel takes a vision-language turn in."""
    images: list[str] = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if isinstance(content, list):
            images += [str(value) for kind, _, value in flatten_parts(content, f"messages[{i}].content")[1]
                       if kind == "images"]
    return as_text(messages), images


def shown_user_message(text: str, image: str | None) -> Message:
    """The user's turn as the chat shows it: the picture, then the text."""
    if image is None:
        return {"role": "user", "content": text}
    return {"role": "user", "content": [{"path": image}, text] if text else [{"path": image}]}
