"""Images, videos and audios in dataset rows (issue #41, the data side): read as LLaMA-Factory writes them, checked
when the row is read, and every bad one reported as a DataError naming the file, row and field."""

from __future__ import annotations

import base64
import io
import json
import random
import struct
import time
import zlib

import pytest
from PIL import Image

from gym.config.data import DataArguments
from gym.core.errors import DataError
from gym.data.loader import get_dataset, load_examples
from gym.data.media import MediaError, load_image
from gym.data.registry import get_dataset_attrs

# LLaMA-Factory's data/dataset_info.json entry for its mllm_demo, as it is
MLLM_DEMO = {"file_name": "mllm_demo.json", "formatting": "sharegpt", "columns": {"messages": "messages",
             "images": "images"}, "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                                            "assistant_tag": "assistant"}}


def _png(path, size=(8, 6), color=(200, 30, 30)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path, "PNG")
    return path


def _jpeg_bytes(size=(64, 64)) -> bytes:
    rng = random.Random(0)  # noise, so the scan data is long enough to cut in the middle
    image = Image.frombytes("RGB", size, bytes(rng.randrange(256) for _ in range(size[0] * size[1] * 3)))
    out = io.BytesIO()
    image.save(out, "JPEG", quality=90)
    return out.getvalue()


def _bomb_png(width=20_000, height=20_000) -> bytes:
    """A PNG whose header claims width x height: a real 1x1 PNG with its IHDR rewritten (and its CRC fixed), so
    making it allocates nothing; any reader that decodes it before checking the size would need 400 MB."""
    out = io.BytesIO()
    Image.new("L", (1, 1)).save(out, "PNG")
    data = bytearray(out.getvalue())
    ihdr = 8  # after the signature: length(4) "IHDR"(4) data(13) crc(4)
    data[ihdr + 8:ihdr + 16] = struct.pack(">II", width, height)
    data[ihdr + 21:ihdr + 25] = struct.pack(">I", zlib.crc32(bytes(data[ihdr + 4:ihdr + 21])))
    return bytes(data)


def _write(tmp_path, rows, entry=None, name="rows"):
    entry = entry or MLLM_DEMO
    (tmp_path / entry["file_name"]).write_text(json.dumps(rows))
    (tmp_path / "dataset_info.json").write_text(json.dumps({name: entry}))
    (attr,) = get_dataset_attrs(name, tmp_path)
    return attr


def _read(tmp_path, rows, entry=None, kind="supervised"):
    return load_examples(_write(tmp_path, rows, entry), kind, media=True)


def _chat(*turns):
    return [{"role": role, "content": text} for role, text in zip(("user", "assistant") * len(turns), turns)]


def _fails(tmp_path, rows, *expected, entry=None):
    """The row error: a DataError (never a Pillow or OS traceback type) naming the file, the row and the field."""
    with pytest.raises(DataError) as info:
        _read(tmp_path, rows, entry)
    assert isinstance(info.value, DataError) and "Traceback" not in str(info.value)
    for text in expected:
        assert text in str(info.value), (text, str(info.value))
    return str(info.value)


def test_mllm_demo_shape_reads_with_resolved_paths(tmp_path):
    one, two = _png(tmp_path / "mllm_demo_data" / "1.png"), _png(tmp_path / "mllm_demo_data" / "2.jpg", (5, 5))
    rows = [
        {"messages": _chat("<image>Who are they?", "Two players.", "What are they doing?<image>", "Celebrating."),
         "images": ["mllm_demo_data/1.png", "mllm_demo_data/1.png"]},
        {"messages": _chat("<image>Who is he?", "A player."), "images": ["mllm_demo_data/2.jpg"]},
        {"messages": _chat("No picture here.", "Fine.")},
    ]
    examples = _read(tmp_path, rows)
    assert examples[0].images == [str(one.resolve())] * 2
    assert examples[0].messages[2]["content"] == "What are they doing?<image>"  # placeholders stay in the text
    assert examples[1].images == [str(two.resolve())]
    assert examples[2].images == [] and not examples[2].has_media()


def test_alpaca_with_images_and_a_bare_file(tmp_path):
    _png(tmp_path / "img" / "cat.png")
    rows = [{"instruction": "<image>What animal is this?", "input": "", "output": "A cat.", "images": ["img/cat.png"]}]
    entry = {"file_name": "a.json", "columns": {"prompt": "instruction", "query": "input", "response": "output",
                                                "images": "images"}}
    (example,) = _read(tmp_path, rows, entry)
    assert example.images == [str((tmp_path / "img" / "cat.png").resolve())]
    # a bare file path finds its `images` column by name, as LLaMA-Factory's layout names it
    (attr,) = get_dataset_attrs(str(tmp_path / "a.json"), tmp_path)
    assert load_examples(attr, "supervised", media=True)[0].images == example.images


def test_openai_content_parts_with_data_urls(tmp_path):
    png = io.BytesIO()
    Image.new("RGB", (4, 4)).save(png, "PNG")
    image_url = "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
    audio = base64.b64encode(b"RIFF....WAVEfmt ").decode()
    rows = [{"messages": [
        {"role": "user", "content": [{"type": "text", "text": "Look: "},
                                     {"type": "image_url", "image_url": {"url": image_url}},
                                     {"type": "text", "text": " and listen: "},
                                     {"type": "input_audio", "input_audio": {"data": audio, "format": "wav"}}]},
        {"role": "assistant", "content": "A black square and a short sound."}]}]
    (example,) = _read(tmp_path, rows, {"file_name": "o.json", "formatting": "openai"})
    assert example.messages[0]["content"] == "Look: <image> and listen: <audio>"
    assert example.images == [image_url] and example.audios == [f"data:audio/wav;base64,{audio}"]


def test_placeholder_count_must_match(tmp_path):
    _png(tmp_path / "1.png")
    rows = [{"messages": _chat("<image>Hi", "Hello."), "images": ["1.png"]},
            {"messages": _chat("<image>Who?", "Him.", "And now?", "Still him."), "images": ["1.png", "1.png"]}]
    _fails(tmp_path, rows, "mllm_demo.json, row 2", "'messages'", "2 images given but 1 <image>")


def test_missing_file(tmp_path):
    _png(tmp_path / "1.png")
    rows = [{"messages": _chat("<image><image>Two?", "Yes."), "images": ["1.png", "gone.png"]}]
    _fails(tmp_path, rows, "mllm_demo.json, row 1", "images[1]", "file not found", "gone.png")


def test_a_folder_is_not_called_missing(tmp_path):
    # A folder named as the image was "file not found", though it is there.
    _png(tmp_path / "1.png")
    (tmp_path / "pics").mkdir()
    rows = [{"messages": _chat("<image><image>Two?", "Yes."), "images": ["1.png", "pics"]}]
    _fails(tmp_path, rows, "mllm_demo.json, row 1", "images[1]", "'pics' names a folder", "not a media file")
    with pytest.raises(MediaError, match=r"^--image pics: .*pics is a folder, not an image file"):
        load_image(tmp_path / "pics", where="--image pics")


def test_truncated_jpeg(tmp_path):
    data = _jpeg_bytes()
    (tmp_path / "cut.jpg").write_bytes(data[: len(data) // 2])
    rows = [{"messages": _chat("<image>What is it?", "Noise."), "images": ["cut.jpg"]}]
    _fails(tmp_path, rows, "mllm_demo.json, row 1", "images[0]", "truncated", "cut.jpg")


def test_decompression_bomb_is_refused_without_decoding(tmp_path):
    (tmp_path / "bomb.png").write_bytes(_bomb_png())
    assert (tmp_path / "bomb.png").stat().st_size < 1000
    rows = [{"messages": _chat("<image>What is it?", "Big."), "images": ["bomb.png"]}]
    start = time.perf_counter()
    message = _fails(tmp_path, rows, "mllm_demo.json, row 1", "images[0]", "decompression-bomb", "bomb.png")
    assert time.perf_counter() - start < 1.0, message  # refused from the header, not after decoding 400 MB
    # under Pillow's limit but over the caller's: the caller's limit, with the size
    with pytest.raises(MediaError, match=r"upload: image is 3000 x 3000 = 9,000,000 pixels, over the limit"):
        load_image(_bomb_png(3000, 3000), where="upload", max_pixels=1_000_000)


def test_text_file_named_jpg(tmp_path):
    (tmp_path / "notes.jpg").write_text("this is not a picture\n")
    rows = [{"messages": _chat("<image>What is it?", "Text."), "images": ["notes.jpg"]}]
    _fails(tmp_path, rows, "mllm_demo.json, row 1", "images[0]", "not an image", "notes.jpg")


def test_load_image_for_data_urls(tmp_path):
    png = io.BytesIO()
    Image.new("RGB", (3, 2)).save(png, "PNG")
    image = load_image("data:image/png;base64," + base64.b64encode(png.getvalue()).decode(), where="messages[0]")
    assert image.size == (3, 2)
    with pytest.raises(MediaError, match=r"^messages\[0\]: the data URL's base64 payload is not valid"):
        load_image("data:image/png;base64,@@@", where="messages[0]")
    # a real image under another type was accepted; OpenAI refuses the type
    payload = base64.b64encode(png.getvalue()).decode()
    for declared in ("text/plain", ""):
        with pytest.raises(MediaError, match=r"declares .* not an image type; send data:image/png"):
            load_image(f"data:{declared};base64,{payload}", where="messages[0]")


def test_a_text_model_refuses_media_only_after_rows_are_checked(tmp_path):
    _png(tmp_path / "1.png")
    good = {"messages": _chat("<image>Hi", "Hello."), "images": ["1.png"]}
    _write(tmp_path, [good, {"messages": _chat("<image>Hi", "Hello."), "images": ["nope.png"]}])
    args = DataArguments(dataset="rows", dataset_dir=str(tmp_path), cutoff_len=64)
    with pytest.raises(DataError, match=r"row 2: field 'images\[0\]': file not found"):
        get_dataset(args, chat=None, kind="supervised")  # type: ignore[arg-type]  # fails before any template
    _write(tmp_path, [good])
    with pytest.raises(DataError, match=r"row 1 has images, and the model is a text model.*tiny-llava"):
        get_dataset(args, chat=None, kind="supervised")  # type: ignore[arg-type]


def test_trl_image_parts_take_their_files_from_the_column(tmp_path):
    _png(tmp_path / "pics" / "a.png")
    row = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]},
                        {"role": "assistant", "content": [{"type": "text", "text": "Red."}]}],
           "images": ["a.png"]}
    (tmp_path / "trl.jsonl").write_text(json.dumps(row) + "\n")
    (attr,) = get_dataset_attrs(str(tmp_path / "trl.jsonl"), tmp_path, media_dir=tmp_path / "pics")
    (example,) = load_examples(attr, "supervised", media=True)
    assert example.messages[0]["content"] == "<image>What is it?"
    assert example.images == [str((tmp_path / "pics" / "a.png").resolve())]


def test_audio_and_video_files_are_checked_to_exist(tmp_path):
    (tmp_path / "clip.wav").write_bytes(b"RIFF")
    entry = {**MLLM_DEMO, "columns": {"messages": "messages", "audios": "audios", "videos": "videos"}}
    rows = [{"messages": _chat("<audio>What is said?", "Hello."), "audios": ["clip.wav"]}]
    assert _read(tmp_path, rows, entry)[0].audios == [str((tmp_path / "clip.wav").resolve())]
    rows = [{"messages": _chat("<video>What happens?", "Nothing."), "videos": ["https://example.com/v.mp4"]}]
    _fails(tmp_path, rows, "row 1", "'videos[0]'", "web address", entry=entry)
