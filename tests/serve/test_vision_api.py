"""`gym api` with a vision-language model (issue #41, serving): image_url parts reach the model, each image gets its
own trained answer, and every hostile or forbidden image is a one-line 400 in OpenAI's error shape."""

from __future__ import annotations

import base64
import functools
import http.server
import io
import json
import random
import struct
import threading
import time
import zlib
from pathlib import Path

import httpx
import openai
import pytest
from PIL import Image

from gym.serve.media import MediaPolicy

# What tests/conftest.py's taught_vlm was taught (its VLM_QUESTION without the placeholder, and VLM_ANSWERS).
QUESTION = "Who is in the picture?"
VLM_ANSWERS = {"1.jpg": "They're Kane and Gretzka from Bayern Munich.",
               "2.jpg": "He's Thomas Muller from Bayern Munich."}
MAX_REMOTE = 200_000  # the remote-enabled server's per-image limit (the demo images are ~20-60 KB)


def _jpeg_bytes(size=(64, 64)) -> bytes:  # as tests/data/test_media.py makes them
    rng = random.Random(0)  # noise, so the scan data is long enough to cut in the middle
    image = Image.frombytes("RGB", size, bytes(rng.randrange(256) for _ in range(size[0] * size[1] * 3)))
    out = io.BytesIO()
    image.save(out, "JPEG", quality=90)
    return out.getvalue()


def _bomb_png(width=20_000, height=20_000) -> bytes:  # as tests/data/test_media.py makes it
    """A real 1x1 PNG whose header claims width x height (CRC fixed): a few bytes that decode to 400 MB."""
    out = io.BytesIO()
    Image.new("L", (1, 1)).save(out, "PNG")
    data = bytearray(out.getvalue())
    ihdr = 8
    data[ihdr + 8:ihdr + 16] = struct.pack(">II", width, height)
    data[ihdr + 21:ihdr + 25] = struct.pack(">I", zlib.crc32(bytes(data[ihdr + 4:ihdr + 21])))
    return bytes(data)


def data_url(data: bytes, mime: str = "image/jpeg") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def ask(url: str, text: str = QUESTION) -> list[dict]:
    parts = [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}]
    return [{"role": "user", "content": parts}]


@pytest.fixture(scope="module")
def images(taught_vlm) -> Path:
    return taught_vlm.parent / "imgs"


@pytest.fixture(scope="module")
def vlm(taught_vlm):
    from gym.infer.chat import ChatModel

    model = ChatModel({"model_name_or_path": str(taught_vlm), "max_new_tokens": 16}, max_waiting=8)
    yield model
    model.close()


@pytest.fixture(scope="module")
def remote_files(tmp_path_factory, images):
    """A local web server (http.server in a thread) with a demo image and a body over MAX_REMOTE."""
    root = tmp_path_factory.mktemp("web")
    (root / "1.jpg").write_bytes((images / "1.jpg").read_bytes())
    (root / "big.jpg").write_bytes(b"\xff" * (MAX_REMOTE * 2))

    class Files(http.server.SimpleHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/unsized":
                return super().do_GET()
            # A body with no Content-Length (HTTP/1.0, ended by closing): only counting the bytes can stop it.
            self.send_response(200)
            self.send_header("Content-Type", "image/jpeg")
            self.end_headers()
            for _ in range(8):
                self.wfile.write(b"\xff" * (MAX_REMOTE // 2))

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Files, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def strict_url(serve_app, vlm, images):
    """The server as `gym api --media-dir IMGS` starts it: remote URLs off."""
    return serve_app(vlm, "vlm", media=MediaPolicy(images))


@pytest.fixture(scope="module")
def open_url(serve_app, vlm, images):
    """`gym api --media-dir IMGS --allow-remote-media --max_media_bytes 200000`."""
    return serve_app(vlm, "vlm", media=MediaPolicy(images, allow_remote=True, max_bytes=MAX_REMOTE))


def complete(base_url: str, messages: list[dict], **extra) -> tuple[int, dict]:
    body = {"model": "vlm", "messages": messages, "temperature": 0, "max_tokens": 16, **extra}
    response = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=120)
    return response.status_code, response.json()


def refused(base_url: str, messages: list[dict], *needles: str) -> str:
    status, body = complete(base_url, messages)
    assert status == 400, body
    message = body["error"]["message"]
    assert body["error"]["type"] == "invalid_request_error"
    assert "\n" not in message and "Traceback" not in message, message
    for needle in needles:
        assert needle in message, message
    return message


def test_each_image_gets_its_trained_answer_through_the_openai_client(strict_url, images):
    """The must-show: the same text with 1.jpg and with 2.jpg as base64 data URLs, greedy -> two different answers,
    each the one taught for its image."""
    client = openai.OpenAI(base_url=f"{strict_url}/v1", api_key="none", max_retries=0, timeout=120)
    answers = {}
    for name in VLM_ANSWERS:
        reply = client.chat.completions.create(model="vlm", messages=ask(data_url((images / name).read_bytes())),
                                               temperature=0, max_tokens=16)
        answers[name] = reply.choices[0].message.content
        assert reply.usage.prompt_tokens > 16  # the image's 16 tokens are in the prompt
    for name, expected in VLM_ANSWERS.items():
        assert answers[name].startswith(expected), (name, answers[name])
    assert answers["1.jpg"] != answers["2.jpg"]


def test_streaming_gives_the_same_answer(strict_url, images):
    client = openai.OpenAI(base_url=f"{strict_url}/v1", api_key="none", max_retries=0, timeout=120)
    stream = client.chat.completions.create(model="vlm", messages=ask(data_url((images / "2.jpg").read_bytes())),
                                            temperature=0, max_tokens=16, stream=True)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text.startswith(VLM_ANSWERS["2.jpg"])


def test_hostile_images_are_one_line_400s(strict_url, tmp_path):
    cut = _jpeg_bytes()
    start = time.perf_counter()
    refused(strict_url, ask(data_url(_bomb_png(), "image/png")), "messages.0.content.1.image_url",
            "decompression-bomb")
    assert time.perf_counter() - start < 5  # refused from the header, not after decoding 400 MB
    refused(strict_url, ask(data_url(cut[: len(cut) // 2])), "messages.0.content.1.image_url", "truncated")
    refused(strict_url, ask(data_url(b"just some text, not a picture\n" * 20)), "not an image")
    refused(strict_url, ask("data:image/jpeg;base64,@@@"), "not valid base64")
    refused(strict_url, ask("file:///etc/passwd"), "outside the folder", "--media-dir")
    refused(strict_url, ask("/etc/passwd"), "data: URL")


def test_file_urls_only_inside_the_media_dir(strict_url, images, tmp_path):
    status, body = complete(strict_url, ask((images / "1.jpg").as_uri()))
    assert status == 200 and body["choices"][0]["message"]["content"].startswith(VLM_ANSWERS["1.jpg"])
    outside = tmp_path / "secret.jpg"
    outside.write_bytes((images / "2.jpg").read_bytes())
    link = images / "link.jpg"
    link.symlink_to(outside)
    try:
        refused(strict_url, ask(link.as_uri()), "outside the folder")  # the link's target decides
    finally:
        link.unlink()
    refused(strict_url, ask(f"file://{images}/../{images.name}/../../etc/passwd"), "outside the folder")
    refused(strict_url, ask((images / "nothere.jpg").as_uri()), "no such image file")


def test_file_urls_are_off_without_a_media_dir(serve_app, vlm, images):
    base = serve_app(vlm, "vlm")
    refused(base, ask((images / "1.jpg").as_uri()), "file:// URLs are off", "--media-dir")


def test_remote_urls_need_the_flag(strict_url, remote_files):
    refused(strict_url, ask(f"{remote_files}/1.jpg"), "--allow-remote-media")


def test_remote_urls_with_the_flag(open_url, remote_files):
    status, body = complete(open_url, ask(f"{remote_files}/1.jpg"))
    assert status == 200 and body["choices"][0]["message"]["content"].startswith(VLM_ANSWERS["1.jpg"])
    refused(open_url, ask(f"{remote_files}/big.jpg"), "400,000 bytes, over the image size limit of 200,000")
    refused(open_url, ask(f"{remote_files}/unsized"), "over the image size limit of 200,000 bytes")
    refused(open_url, ask(f"{remote_files}/missing.jpg"), "HTTP 404")


def test_images_only_in_user_messages(strict_url, images):
    url = data_url((images / "1.jpg").read_bytes())
    messages = [*ask(url), {"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": url}}]},
                {"role": "user", "content": "And now?"}]
    refused(strict_url, messages, "messages.1", "images go in user messages")


def test_placeholder_count_must_match(strict_url, images):
    url = data_url((images / "1.jpg").read_bytes())
    refused(strict_url, ask(url, text="<image> twice"), "1 image(s) given but the prompt has 2")


def test_tokenize_counts_the_image_tokens(strict_url, images):
    body = {"messages": ask(data_url((images / "1.jpg").read_bytes()))}
    tokens = httpx.post(f"{strict_url}/tokenize", json=body, timeout=60).json()
    text = httpx.post(f"{strict_url}/tokenize", json={"messages": [{"role": "user", "content": QUESTION}]},
                      timeout=60).json()
    assert tokens["count"] == text["count"] + 16  # tiny-llava: a 56x56 image is 16 image tokens


def test_a_text_model_refuses_images(serve_app, tiny_chat, images):
    base = serve_app(tiny_chat, "tiny")
    body = {"model": "tiny", "messages": ask(data_url((images / "1.jpg").read_bytes())), "max_tokens": 2}
    response = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400
    assert "the model is a text model" in response.json()["error"]["message"]
    assert json.loads(response.text)["error"]["param"] == "messages.0.content.1.image_url"


def test_gym_api_media_flags(monkeypatch, tmp_path, capsys):
    import gym.serve.server
    from gym.cli import main

    seen: dict = {}
    monkeypatch.setattr(gym.serve.server, "serve", lambda config, **options: seen.update(options))
    assert main(["api", "--model_name_or_path", "x", "--media-dir", str(tmp_path), "--allow-remote-media",
                 "--max_media_bytes", "1000"]) == 0
    assert seen["media"] == MediaPolicy(tmp_path.resolve(), allow_remote=True, max_bytes=1000)
    assert main(["api", "--model_name_or_path", "x"]) == 0
    assert seen["media"] == MediaPolicy()  # data: URLs only, unless the operator says otherwise
    assert main(["api", "--model_name_or_path", "x", "--media-dir", str(tmp_path / "nope")]) == 2
    assert "--media-dir" in capsys.readouterr().err


def test_context_length_is_the_language_models(strict_url, images):
    status, body = complete(strict_url, ask(data_url((images / "1.jpg").read_bytes())), max_tokens=10**7)
    assert status == 400 and body["error"]["code"] == "context_length_exceeded", body
