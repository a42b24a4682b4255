"""`gym export` of a vision-language model: --format hf is the merged model with its processor, answering as base +
adapter does on an image; the formats that would need a separate vision file (llama.cpp's mmproj) say so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor

from gym.cli import main
from gym.core.files import MANIFEST_FILE
from gym.data.templates import get_chat_format
from gym.models.loader import resolve_model_path
from gym.models.vision import load_multimodal, load_processor

REPO = Path(__file__).resolve().parents[2]
QUESTION = "<image>Who is in the picture?"


def _inputs(processor, text, image_path):
    with Image.open(image_path) as image:
        return processor(text=[text], images=[image.convert("RGB")], return_tensors="pt", add_special_tokens=False)


def _greedy(model, inputs, eos):
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=16, do_sample=False, eos_token_id=eos)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


def test_a_vlm_lora_exports_merged_with_its_processor_and_answers_as_base_plus_adapter(taught_vlm, tmp_path):
    out = tmp_path / "export"
    assert main(["export", "--output_dir", str(taught_vlm), "--export_dir", str(out)]) == 0
    assert {"processor_config.json", "tokenizer.json", "chat_template.jinja"} <= {p.name for p in out.iterdir()}
    assert json.loads((out / MANIFEST_FILE).read_text())["processor"] == "LlavaProcessor"

    exported = AutoModelForImageTextToText.from_pretrained(out).eval()
    processor = AutoProcessor.from_pretrained(out)
    assert not any("lora" in name for name, _ in exported.named_parameters())  # merged, not attached
    base_path = resolve_model_path("tiny-llava")
    served = PeftModel.from_pretrained(load_multimodal(base_path), str(taught_vlm)).eval()
    reference = load_processor(base_path)

    # transformers alone renders the prompt Gym trained on, and the processor prepares the image as Gym did
    text = processor.apply_chat_template([{"role": "user", "content": QUESTION}], add_generation_prompt=True,
                                         tokenize=False)
    assert text == get_chat_format(reference.tokenizer, None).render_prompt([{"role": "user", "content": QUESTION}])
    image = taught_vlm.parent / "imgs" / "1.jpg"
    inputs, expected_inputs = _inputs(processor, text, image), _inputs(reference, text, image)
    assert torch.equal(inputs["input_ids"], expected_inputs["input_ids"])
    assert torch.equal(inputs["pixel_values"], expected_inputs["pixel_values"])

    eos = exported.generation_config.eos_token_id  # the chat format's end-of-turn tokens
    got = _greedy(exported, inputs, eos)
    assert got == _greedy(served, expected_inputs, eos)
    assert processor.tokenizer.decode(got, skip_special_tokens=True).startswith("They're Kane and Gretzka")


def test_a_named_template_takes_image_content_parts(tmp_path):
    """Gym's templates read a string per message; the exported one also takes the processor's content parts, each
    image becoming the placeholder the processor expands (16 image tokens on tiny-llava)."""
    out = tmp_path / "qwen"
    assert main(["export", "--model_name_or_path", "tiny-llava", "--template", "qwen2_vl",
                 "--export_dir", str(out)]) == 0
    processor = AutoProcessor.from_pretrained(out)
    chat = get_chat_format(processor.tokenizer, "qwen2_vl")
    parts = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Who is in the picture?"}]}]
    text = processor.apply_chat_template(parts, add_generation_prompt=True, tokenize=False)
    assert text == chat.render_prompt([{"role": "user", "content": QUESTION}])
    assert text == processor.apply_chat_template([{"role": "user", "content": QUESTION}], add_generation_prompt=True,
                                                 tokenize=False)  # Gym's `<image>` in plain text, as in its rows
    assert "You are a helpful assistant." in text
    image_id = processor.tokenizer.convert_tokens_to_ids("<image>")
    ids = _inputs(processor, text, REPO / "data" / "mllm_demo_data" / "1.jpg")
    assert (ids["input_ids"] == image_id).sum() == 16


@pytest.mark.parametrize(("export_format", "why"), [
    ("gguf", "mmproj"), ("ollama", "mmproj"), ("gguf-lora", "mmproj"), ("onnx", "text decoder")])
def test_formats_without_the_vision_part_are_refused_before_anything_loads(taught_vlm, tmp_path, capsys,
                                                                           export_format, why):
    out = tmp_path / "x"
    assert main(["export", "--output_dir", str(taught_vlm), "--format", export_format,
                 "--export_dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert "vision-language model" in err and why in err and "Traceback" not in err
    assert "--format hf" in err and "convert_hf_to_gguf.py" in err and "--mmproj" in err
    assert not out.exists()


def test_delta_and_bitdelta_of_a_vlm_are_refused(taught_vlm, tmp_path, capsys):
    assert main(["export", "--output_dir", str(taught_vlm), "--type", "bitdelta",
                 "--export_dir", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "vision-language model" in err and "bitdelta" in err and "Traceback" not in err
