"""Images in the web UI: the Train tab's preview shows the rows' pictures (and, for a vision-language model, the
text as training tokenizes it); the Chat tab sends an uploaded image as an OpenAI image_url part, and a text model
refuses one in one line."""

from __future__ import annotations

import base64
from pathlib import Path
from types import SimpleNamespace

import gradio as gr
import pytest
from PIL import Image

from gym.core.errors import DataError, GymError
from gym.data.media import MediaError, flatten_parts, resolve_item
from gym.data.templates import get_chat_format
from gym.models.loader import resolve_model_path
from gym.models.vision import load_processor
from gym.webui import preview
from gym.webui.app import build_app
from gym.webui.chat_messages import as_text, history_messages, user_message
from gym.webui.tab_chat import Playground, _takes_images

REPO = Path(__file__).resolve().parents[2]
DEMO_IMAGE = REPO / "data" / "mllm_demo_data" / "1.jpg"


def test_the_preview_of_mllm_demo_shows_its_pictures_and_the_expanded_placeholders():
    shown = preview.preview_rows("tiny-llava", "mllm_demo", str(REPO / "data"), "sft", rows=2)
    # Row 1 holds two images (two <image> placeholders, both 1.jpg), row 2 one.
    assert [caption for _, caption in shown.images] == ["mllm_demo · row 1 · image 1", "mllm_demo · row 1 · image 2",
                                                        "mllm_demo · row 2 · image 1"]
    assert all(max(image.size) <= preview.THUMBNAIL[0] for image, _ in shown.images)
    with Image.open(DEMO_IMAGE) as original:
        width, height = original.size
    first = shown.images[0][0]
    assert first.mode == "RGB" and abs(first.size[0] / first.size[1] - width / height) < 0.02  # the picture, shrunk
    prompt = "".join(text for text, label in shown.segments if label == "prompt")
    trained = "".join(text for text, label in shown.segments if label == "trained")
    # tiny-llava's processor expands each <image> into 16 tokens, shown once with the count; none is trained on.
    assert prompt.count("<image>×16") == 3 and "<image>" not in trained and "Who are they?" in prompt


def test_a_text_model_refuses_a_preview_with_images_as_training_does(tiny_model_dir):
    with pytest.raises(DataError, match="text model"):
        preview.preview_rows(str(tiny_model_dir), "mllm_demo", str(REPO / "data"), "sft", rows=1)


def test_an_uploaded_image_becomes_an_image_url_part_that_gyms_parsing_reads():
    message = user_message("Who is in the picture?", str(DEMO_IMAGE))
    image, text = message["content"]
    assert text == {"type": "text", "text": "Who is in the picture?"} and image["type"] == "image_url"
    url = image["image_url"]["url"]
    assert url.startswith("data:image/jpeg;base64,")
    assert base64.b64decode(url.partition(",")[2]) == DEMO_IMAGE.read_bytes()
    flat, media = flatten_parts(message["content"], "messages[0].content")
    assert flat == "<image>Who is in the picture?" and [kind for kind, _, _ in media] == ["images"]
    assert resolve_item("images", media[0][2], where=media[0][1], media_dir=None) == url  # checked as a row's image
    assert user_message("Hi") == {"role": "user", "content": "Hi"}  # no image: plain text, as before


def test_a_file_that_is_not_an_image_is_one_line(tmp_path):
    fake = tmp_path / "notes.png"
    fake.write_text("not a picture")
    with pytest.raises(MediaError, match="the uploaded image: not an image"):
        user_message("Who?", str(fake))


def test_the_chat_history_keeps_its_images_and_its_plain_text():
    history = [{"role": "user", "content": [{"type": "file", "file": {"path": str(DEMO_IMAGE)}},
                                            {"type": "text", "text": "Who?"}], "metadata": None, "options": None},
               {"role": "assistant", "content": [{"type": "text", "text": "Kane."}], "metadata": None}]
    asked, answered = history_messages(history)
    assert asked["content"][0]["type"] == "image_url" and asked["content"][1] == {"type": "text", "text": "Who?"}
    assert answered == {"role": "assistant", "content": "Kane."}
    assert as_text([asked])[0]["content"] == "<image>Who?"


def test_a_vision_language_model_gets_the_image_with_the_message():
    path = resolve_model_path("tiny-llava")
    chat = get_chat_format(load_processor(path).tokenizer, None)
    playground = Playground()
    playground.model = SimpleNamespace(chat_format=chat, model_path=path, model_args=None)
    playground.name, playground.takes_images = "tiny-llava", _takes_images(playground.model)
    assert playground.takes_images
    messages, prompt = playground.turn("Who is in the picture?", str(DEMO_IMAGE), [], None)
    assert messages[-1]["content"][0]["type"] == "image_url"
    assert "<image>Who is in the picture?" in prompt  # where the processor puts the image's tokens


def _handler(demo, name):
    return next(block.fn for block in demo.fns.values() if getattr(block.fn, "__name__", "") == name)


def test_a_text_model_refuses_an_uploaded_image_in_one_line(tiny_model_dir, tmp_path):
    demo = build_app(str(tmp_path / "runs"))
    loaded = _handler(demo, "on_load")(str(tiny_model_dir), "", "", "", "")
    assert "Loaded" in loaded and "takes images" not in loaded
    send = _handler(demo, "on_send")
    try:
        with pytest.raises(gr.Error, match="is a text model: it cannot see images") as refused:
            next(send("Who is in the picture?", str(DEMO_IMAGE), [], "", 0.0, 1.0, 4))
        assert "vision-language model" in str(refused.value) and "Traceback" not in str(refused.value)
        # Without the image the same message is answered.
        *_, (shown, _, _, prompt) = send("Who is in the picture?", None, [], "", 0.0, 1.0, 4)
        assert "Who is in the picture?" in prompt and shown[-1]["role"] == "assistant"
    finally:
        _handler(demo, "on_unload")()


def test_the_chat_tab_answers_each_picture_with_a_taught_vision_language_model(taught_vlm, tmp_path):
    """The real Chat tab, loaded with the taught tiny-llava adapter: the same question about two uploaded pictures
    gets each picture's trained answer, so the image reached the model."""
    from tests.conftest import VLM_ANSWERS

    demo = build_app(str(tmp_path / "runs"))
    loaded = _handler(demo, "on_load")("tiny-llava", str(taught_vlm), "", "", "")
    assert "takes images" in loaded
    send = _handler(demo, "on_send")
    try:
        for name, expected in VLM_ANSWERS.items():
            *_, (shown, _, _, prompt) = send("Who is in the picture?", str(taught_vlm.parent / "imgs" / name), [],
                                            "", 0.0, 1.0, 16)
            assert "<image>Who is in the picture?" in prompt
            assert shown[-1]["content"].startswith(expected), (name, shown[-1]["content"])
    finally:
        _handler(demo, "on_unload")()


def test_an_empty_message_is_still_refused():
    playground = Playground()
    playground.model = SimpleNamespace(chat_format=None)
    with pytest.raises(GymError, match="Type a message"):
        playground.turn("  ", None, [], None)
