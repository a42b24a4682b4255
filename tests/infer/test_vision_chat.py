"""Vision-language models in chat (issue #41, serving): a taught tiny LLaVA answers each image its own answer
through ChatModel and `gym chat --image`, on the transformers engine; the text-only engines say what they serve."""

from __future__ import annotations

import pytest

from gym.core.errors import ConfigError
from gym.infer.chat import ChatModel
from gym.infer.tool_choice import RequestFieldError

# What tests/conftest.py's taught_vlm was taught (its VLM_QUESTION without the placeholder, and VLM_ANSWERS).
QUESTION = "Who is in the picture?"
VLM_ANSWERS = {"1.jpg": "They're Kane and Gretzka from Bayern Munich.",
               "2.jpg": "He's Thomas Muller from Bayern Munich."}


@pytest.fixture(scope="module")
def vlm_chat(taught_vlm):
    model = ChatModel({"model_name_or_path": str(taught_vlm), "do_sample": False, "max_new_tokens": 16})
    yield model
    model.close()


def test_each_image_gets_its_trained_answer(vlm_chat, taught_vlm):
    images = taught_vlm.parent / "imgs"
    answers = {name: vlm_chat.chat([{"role": "user", "content": QUESTION}], images=[str(images / name)])
               for name in VLM_ANSWERS}
    for name, expected in VLM_ANSWERS.items():
        assert answers[name].startswith(expected), (name, answers[name])
    assert answers["1.jpg"] != answers["2.jpg"]


def test_the_engine_answers_as_generate_does(vlm_chat, taught_vlm):
    """Gym's sampling drives transformers' generate: greedy, the tokens are generate's own."""
    import torch

    image = str(taught_vlm.parent / "imgs" / "2.jpg")
    prompt, media = vlm_chat.encode([{"role": "user", "content": "<image>" + QUESTION}], images=[image])
    assert media is not None and "pixel_values" in media
    with torch.no_grad():
        out = vlm_chat.model.generate(input_ids=torch.tensor([prompt]), **media, max_new_tokens=16, do_sample=False,
                                      eos_token_id=vlm_chat.chat_format.stop_token_ids(),
                                      pad_token_id=vlm_chat.tokenizer.pad_token_id)
    expected = vlm_chat.tokenizer.decode(out[0, len(prompt):], skip_special_tokens=True)
    assert vlm_chat.chat([{"role": "user", "content": QUESTION}], images=[image]) == expected


def test_concurrent_requests_run_one_after_another_with_their_own_images(vlm_chat, taught_vlm):
    from concurrent.futures import ThreadPoolExecutor

    images = taught_vlm.parent / "imgs"
    names = sorted(VLM_ANSWERS) * 2
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda name: vlm_chat.chat([{"role": "user", "content": QUESTION}],
                                                             images=[str(images / name)]), names))
    for name, answer in zip(names, answers):
        assert answer.startswith(VLM_ANSWERS[name]), (name, answer)


def test_sampling_settings_and_stops_are_honoured(vlm_chat, taught_vlm):
    image = str(taught_vlm.parent / "imgs" / "1.jpg")
    question = [{"role": "user", "content": QUESTION}]
    assert vlm_chat.chat(question, images=[image], stop="Gretzka") == "They're Kane and "
    hot = {"do_sample": True, "temperature": 2.0, "top_k": 0, "top_p": 1.0}
    first = vlm_chat.chat(question, images=[image], seed=7, **hot)
    assert first == vlm_chat.chat(question, images=[image], seed=7, **hot)  # a seed reproduces the draw


def test_structured_output_holds_with_an_image(vlm_chat, taught_vlm):
    """The grammar's mask runs in the same sampling step, so a VLM's answer is held to JSON like a text model's."""
    image = str(taught_vlm.parent / "imgs" / "1.jpg")
    reply = vlm_chat.reply([{"role": "user", "content": QUESTION}], images=[image],
                           response_format={"type": "json_object"}, max_new_tokens=8)
    assert reply.content.lstrip().startswith("{"), reply.content


def test_placeholders_must_match_the_images(vlm_chat, taught_vlm):
    image = str(taught_vlm.parent / "imgs" / "1.jpg")
    with pytest.raises(RequestFieldError, match="2 image"):
        vlm_chat.chat([{"role": "user", "content": "<image>" + QUESTION}], images=[image, image])
    with pytest.raises(RequestFieldError, match="0 image"):  # a literal tag without its image never reaches the model
        vlm_chat.chat([{"role": "user", "content": "<image>" + QUESTION}])
    with pytest.raises(RequestFieldError, match=r"images\[0\]: image file not found"):
        vlm_chat.chat([{"role": "user", "content": QUESTION}], images=[str(taught_vlm / "missing.jpg")])


def test_text_only_turns_of_a_vlm_are_answered(vlm_chat):
    assert isinstance(vlm_chat.chat([{"role": "user", "content": "Hello"}], max_new_tokens=4), str)


@pytest.mark.parametrize("backend", ["fast", "vllm"])
def test_text_only_backends_refuse_a_vlm(taught_vlm, backend):
    with pytest.raises(ConfigError, match=f"infer_backend: {backend} serves text models only.*infer_backend: hf"):
        ChatModel({"model_name_or_path": str(taught_vlm), "infer_backend": backend})


def test_int8_is_refused_for_a_vlm(taught_vlm):
    with pytest.raises(ConfigError, match="infer_dtype: int8 .* text models only"):
        ChatModel({"model_name_or_path": str(taught_vlm), "infer_dtype": "int8"})


def test_a_text_model_says_it_takes_no_images(tiny_model_dir, taught_vlm):
    model = ChatModel({"model_name_or_path": str(tiny_model_dir), "max_new_tokens": 2})
    try:
        with pytest.raises(RequestFieldError, match="the model is a text model"):
            model.chat([{"role": "user", "content": "Hi"}], images=[str(taught_vlm.parent / "imgs" / "1.jpg")])
        assert isinstance(model.chat([{"role": "user", "content": "Hi"}]), str)  # text turns as before
    finally:
        model.close()


@pytest.mark.parametrize("name", sorted(VLM_ANSWERS))
def test_gym_chat_with_an_image(taught_vlm, name, capsys):
    from gym.cli import main

    image = str(taught_vlm.parent / "imgs" / name)
    assert main(["chat", "--model_name_or_path", str(taught_vlm), "--image", image, "--prompt", QUESTION,
                 "--do_sample", "false", "--max_new_tokens", "16"]) == 0
    out = capsys.readouterr().out
    assert f"User: {QUESTION}\nAssistant: {VLM_ANSWERS[name]}" in out


def test_gym_chat_image_errors_are_one_line(taught_vlm, tiny_model_dir, tmp_path, capsys):
    from gym.cli import main

    (tmp_path / "notes.jpg").write_text("not a picture")
    assert main(["chat", "--model_name_or_path", str(taught_vlm), "--image", str(tmp_path / "notes.jpg"),
                 "--prompt", QUESTION]) == 2
    err = capsys.readouterr().err
    assert "--image " in err and "not an image" in err and "Traceback" not in err
    image = str(taught_vlm.parent / "imgs" / "1.jpg")
    assert main(["chat", "--model_name_or_path", str(tiny_model_dir), "--image", image, "--prompt", "Hi"]) == 2
    err = capsys.readouterr().err
    assert "the model is a text model" in err and "Traceback" not in err


def test_gym_infer_answers_an_mllm_dataset_with_its_images(taught_vlm, tmp_path):
    """Rows with an `images` column (the taught dataset itself, LLaMA-Factory's mllm layout) are answered with their
    images: each row's prediction is its own image's answer."""
    import json

    from gym.cli import main

    out = tmp_path / "preds.jsonl"
    assert main(["infer", "--model_name_or_path", str(taught_vlm), "--dataset", "who", "--dataset_dir",
                 str(taught_vlm.parent), "--max_samples", "2", "-o", str(out), "--do_sample", "false",
                 "--max_new_tokens", "16"]) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 2
    for line in lines:
        assert line["prediction"].startswith(line["reference"]), line
        assert line["images"][0].endswith(("1.jpg", "2.jpg"))
    assert lines[0]["prediction"] != lines[1]["prediction"]


def test_gym_infer_refuses_images_for_a_text_model(taught_vlm, tiny_model_dir, tmp_path, capsys):
    from gym.cli import main

    assert main(["infer", "--model_name_or_path", str(tiny_model_dir), "--dataset", "who", "--dataset_dir",
                 str(taught_vlm.parent), "--max_samples", "1", "-o", str(tmp_path / "p.jsonl")]) == 2
    assert "the model is a text model" in capsys.readouterr().err


def test_a_large_photo_is_shrunk_while_it_decodes(vlm_chat, tmp_path):
    """A JPEG over image_max_pixels is decoded at a reduced DCT scale, never at full size, then fitted."""
    from PIL import Image

    from gym.infer.chat import _decode_small

    Image.new("RGB", (4000, 3000), (40, 90, 200)).save(tmp_path / "big.jpg", quality=80)
    with Image.open(tmp_path / "big.jpg") as image:
        _decode_small(image, 768 * 768)
        image.load()
        assert image.size == (1000, 750)  # 1/4 scale: the smallest DCT scale still over the limit's sides
    prompt, media = vlm_chat.encode([{"role": "user", "content": QUESTION}], images=[str(tmp_path / "big.jpg")])
    assert media is not None and media["pixel_values"].shape[-2:] == (56, 56)


def test_a_chat_turn_that_cannot_be_sent_keeps_the_conversation(vlm_chat, taught_vlm, capsys, monkeypatch):
    # A turn whose placeholders miss the images ended the whole terminal conversation with `gym: error`.
    from gym.cli.chat import _interactive

    lines = iter(["<image><image>" + QUESTION, QUESTION, "/exit"])
    monkeypatch.setattr("builtins.input", lambda prompt: next(lines))
    assert _interactive(vlm_chat, images=[str(taught_vlm.parent / "imgs" / "1.jpg")]) == 0
    out = capsys.readouterr().out
    assert "1 image(s) given but the prompt has 2 <image> placeholder(s)" in out and "was not sent" in out
    assert f"Assistant: {VLM_ANSWERS['1.jpg']}" in out  # the next message went with the image, as a first one


def test_gym_chat_prompt_placeholders_are_checked_before_the_model_loads(tmp_path, capsys):
    from PIL import Image

    from gym.cli import main

    image = str(tmp_path / "1.png")
    Image.new("RGB", (8, 8)).save(image)
    assert main(["chat", "--model_name_or_path", str(tmp_path / "no-model"), "--image", image,
                 "--prompt", "<image><image>Who?"]) == 2
    err = capsys.readouterr().err
    assert "--prompt has 2 <image> placeholder(s) for 1 --image file(s)" in err and "Traceback" not in err
