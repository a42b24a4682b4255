"""sft on a vision-language model (issue #41): images change what the model learns, LLaMA-Factory's mllm data
trains as is, the vision tower and projector stay frozen unless asked, and what cannot work says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tests.conftest import REPO, VLM_ANSWERS, VLM_QUESTION, write_two_image_dataset
from tests.gym_cli import assert_one_line_error, gym_here, gym_process

from gym.config.parser import get_train_args
from gym.core.errors import ConfigError, DataError
from gym.data.multimodal import MediaInputs
from gym.data.processors import IGNORE_INDEX, encode_supervised
from gym.data.templates import get_chat_format
from gym.models import vision
from gym.models.loader import resolve_model_path

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


@pytest.fixture(scope="module")
def tiny_vlm() -> str:
    return resolve_model_path("tiny-llava")


@pytest.fixture(scope="module")
def processor(tiny_vlm):
    return vision.load_processor(tiny_vlm)


def _greedy(model, processor, image_path: Path, question: str = VLM_QUESTION) -> str:
    """tiny-llava's processor expands `<image>` itself, so the question goes in as the rows have it."""
    from PIL import Image

    text = processor.tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                                   add_generation_prompt=True)
    inputs = processor(text=[text], images=[Image.open(image_path).convert("RGB")], add_special_tokens=False,
                       return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=16, do_sample=False)
    return str(processor.tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))


def _sft(dataset_dir: Path, out: Path, dataset: str = "who", model: str = "tiny-llava", **overrides) -> dict:
    config = {"model_name_or_path": model, "stage": "sft", "finetuning_type": "lora", "dataset": dataset,
              "dataset_dir": str(dataset_dir), "output_dir": str(out), "max_steps": 2,
              "per_device_train_batch_size": 2, "learning_rate": 1e-3, "save_strategy": "no", "report_to": "none",
              "cutoff_len": 512, "disable_tqdm": True, "bf16": False}
    config.update(overrides)
    return config


def test_the_answer_depends_on_the_image(taught_vlm, tiny_vlm, processor):
    """Rows with the same text and different images, each with its own answer: a model that ignored the images
    could give only one answer to both. Greedy output differs per image and is that image's trained answer."""
    from peft import PeftModel

    model = PeftModel.from_pretrained(vision.load_multimodal(tiny_vlm), str(taught_vlm)).eval()
    images = taught_vlm.parent / "imgs"
    answers = {name: _greedy(model, processor, images / name) for name in VLM_ANSWERS}
    assert answers["1.jpg"] != answers["2.jpg"]
    for name, expected in VLM_ANSWERS.items():
        assert answers[name].startswith(expected), (name, answers[name])


def test_lora_trains_the_language_model_only_and_saves_the_processor(taught_vlm):
    adapter = json.loads((taught_vlm / "adapter_config.json").read_text())
    weights = load_file(str(taught_vlm / "adapter_model.safetensors"))
    assert weights and all(".language_model." in name for name in weights)
    assert not any("vision_tower" in name or "multi_modal_projector" in name for name in weights)
    assert "language_model" in adapter["target_modules"] and not adapter["modules_to_save"]
    saved = vision.load_processor(str(taught_vlm))  # the run's folder loads as a processor on its own
    assert type(saved).__name__ == "LlavaProcessor" and saved.tokenizer.convert_tokens_to_ids("<image>") > 0


def test_rows_expand_each_image_to_its_tokens_and_labels_never_cover_them(tmp_path, tiny_vlm, processor):
    from gym.data.loader import load_examples
    from gym.data.registry import get_dataset_attrs

    write_two_image_dataset(tmp_path)
    (attr,) = get_dataset_attrs("who", tmp_path)
    example = load_examples(attr, "supervised", media=True)[0]
    media = MediaInputs.for_processor(processor, "tiny-llava")
    chat = get_chat_format(processor.tokenizer, None)
    row = encode_supervised(example, chat, cutoff_len=512, train_on_prompt=True, media=media)
    assert row is not None
    image_id = processor.tokenizer.convert_tokens_to_ids("<image>")
    positions = [i for i, t in enumerate(row["input_ids"]) if t == image_id]
    assert len(positions) == 16  # a 56-pixel image in 14-pixel patches, CLIP's class token dropped
    assert all(row["labels"][i] == IGNORE_INDEX for i in positions)  # even with train_on_prompt
    assert row["images"] == example.images

    from gym.data.collators import MediaCollator

    batch = MediaCollator(pad_token_id=processor.tokenizer.pad_token_id, media=media)([row, row])
    assert batch["pixel_values"].shape == (2, 3, 56, 56)
    assert int((batch["input_ids"] == image_id).sum()) == 32


def test_llamafactorys_mllm_demo_trains_one_step_as_is(tmp_path):
    """examples/sft_vlm.yaml as written (tiny-llava on LLaMA-Factory's mllm_demo from data/), one step."""
    from gym.config.files import parse_cli_args
    from gym.workflows.training import run_exp

    config = parse_cli_args([str(REPO / "examples" / "sft_vlm.yaml")])
    config.update(dataset_dir=str(REPO / "data"), output_dir=str(tmp_path / "out"), max_steps=1, save_strategy="no",
                  disable_tqdm=True)
    result = run_exp(config)
    assert result.global_step == 1 and result.final_loss is not None


def test_a_second_family_gemma3_expands_its_own_way_and_trains(tmp_path):
    """Gemma 3's processor expands its begin-of-image marker (not `<image>`) into marker + soft tokens + end marker,
    and the model needs token_type_ids marking the soft tokens: the same rows and code path serve it."""
    from gym.data.collators import MediaCollator
    from gym.data.loader import load_examples
    from gym.data.registry import get_dataset_attrs
    from gym.workflows.training import run_exp

    processor = vision.load_processor(resolve_model_path("tiny-gemma3"))
    media = MediaInputs.for_processor(processor, "tiny-gemma3")
    assert media.placeholders["images"] == "<start_of_image>" and "videos" in media.refused
    (attr,) = get_dataset_attrs("who", write_two_image_dataset(tmp_path / "data"))
    example = load_examples(attr, "supervised", media=True)[0]
    row = encode_supervised(example, get_chat_format(processor.tokenizer, None), cutoff_len=512, media=media)
    assert row is not None
    soft = processor.tokenizer.convert_tokens_to_ids("<image_soft_token>")
    assert row["input_ids"].count(soft) == 4  # mm_tokens_per_image
    assert all(label == IGNORE_INDEX for t, label in zip(row["input_ids"], row["labels"]) if t in media.media_ids)
    batch = MediaCollator(pad_token_id=processor.tokenizer.pad_token_id, media=media)([row])
    assert batch["token_type_ids"].tolist()[0] == [int(t == soft) for t in row["input_ids"]]

    result = run_exp(_sft(REPO / "data", tmp_path / "out", dataset="mllm_demo", model="tiny-gemma3", max_steps=1,
                          freeze_multi_modal_projector=False))
    assert result.global_step == 1
    names = set(load_file(str(Path(result.output_dir) / "adapter_model.safetensors")))
    assert any("multi_modal_projector" in n for n in names) and not any("vision_tower" in n for n in names)


@pytest.mark.parametrize(("dataset", "what"), [("mllm_video_demo", "takes no videos"),
                                                ("mllm_audio_demo", "takes no audio")])
def test_video_and_audio_demos_name_what_the_model_lacks(dataset, what, tmp_path):
    from gym.workflows.training import run_exp

    with pytest.raises(DataError, match=rf"row 1: field '\w+': tiny-llava {what} .*Use a model that does \(Qwen2"):
        run_exp(_sft(REPO / "data", tmp_path / "out", dataset=dataset, max_steps=1))


def _changed(before: dict[str, torch.Tensor], model) -> set[str]:
    after = dict(model.named_parameters())
    return {name for name, value in before.items() if not torch.equal(value, after[name].detach())}


@pytest.mark.parametrize(("keys", "trains"), [
    ({}, {"language"}),
    ({"freeze_vision_tower": False}, {"language", "encoder"}),
    ({"freeze_multi_modal_projector": False, "freeze_language_model": True}, {"projector"}),
])
def test_full_tuning_trains_the_parts_the_freeze_keys_leave(keys, trains, tmp_path):
    from gym.workflows.training import run_exp

    base = vision.load_multimodal(resolve_model_path("tiny-llava"))
    before = {name: p.detach().clone() for name, p in base.named_parameters()}
    data = write_two_image_dataset(tmp_path / "data")
    result = run_exp(_sft(data, tmp_path / "out", finetuning_type="full", **keys))
    changed = _changed(before, vision.load_multimodal(result.output_dir))
    assert {vision.part_of(name) for name in changed} == trains


def test_lora_with_unfrozen_tower_and_projector(tmp_path):
    from gym.workflows.training import run_exp

    data = write_two_image_dataset(tmp_path / "data")
    out = Path(run_exp(_sft(data, tmp_path / "out", freeze_vision_tower=False,
                            freeze_multi_modal_projector=False)).output_dir)
    names = set(load_file(str(out / "adapter_model.safetensors")))
    assert any("vision_tower" in n and "lora_A" in n for n in names)
    assert any("multi_modal_projector" in n and "lora" not in n for n in names)  # trained in full, saved whole
    assert any("language_model" in n and "lora_A" in n for n in names)


def test_freezing_everything_is_refused(tmp_path):
    from gym.workflows.training import run_exp

    data = write_two_image_dataset(tmp_path / "data")
    with pytest.raises(ConfigError, match="nothing would train"):
        run_exp(_sft(data, tmp_path / "out", freeze_language_model=True))


def test_packing_with_images_is_refused_with_the_reason(tmp_path):
    from gym.workflows.training import run_exp

    data = write_two_image_dataset(tmp_path / "data")
    with pytest.raises(DataError, match="packing cannot take it"):
        run_exp(_sft(data, tmp_path / "out", packing=True))


@pytest.mark.parametrize("mask_history", [False, True])  # mask_history cuts the row's start, not its end
def test_a_cutoff_through_the_image_tokens_is_a_row_error(tmp_path, mask_history):
    from gym.workflows.training import run_exp

    data = write_two_image_dataset(tmp_path / "data")
    with pytest.raises(DataError, match=r"row 1: cutoff_len=8 would cut through the row's media tokens"):
        run_exp(_sft(data, tmp_path / "out", cutoff_len=8, mask_history=mask_history))


def test_image_pixel_limits_are_llamafactorys_keys(tmp_path):
    args = get_train_args(_sft(tmp_path, tmp_path / "out", image_max_pixels=4096, image_min_pixels=1024))
    assert (args.model.image_max_pixels, args.model.image_min_pixels) == (4096, 1024)
    with pytest.raises(ConfigError, match="'image_min_pixels' .* is above 'image_max_pixels'"):
        get_train_args(_sft(tmp_path, tmp_path / "out", image_max_pixels=100, image_min_pixels=1000))


def test_image_max_pixels_scales_images_down_before_the_processor(tmp_path):
    from PIL import Image

    from gym.data.media import fit_pixels

    big = fit_pixels(Image.new("RGB", (400, 100)), max_pixels=10_000, min_pixels=100)
    assert big.size == (200, 50)
    small = fit_pixels(Image.new("L", (4, 4)), max_pixels=10_000, min_pixels=64)
    assert small.size == (8, 8) and small.mode == "RGB"


@pytest.mark.parametrize("bad", ["truncated", "bomb", "text"])
def test_a_hostile_image_in_a_training_row_is_one_line_and_exit_2(bad, tmp_path, capfd):
    from tests.data.test_media import _bomb_png, _jpeg_bytes

    data = write_two_image_dataset(tmp_path / "data")
    payload = {"truncated": _jpeg_bytes()[:2000], "bomb": _bomb_png(), "text": b"not an image at all\n"}[bad]
    (data / "imgs" / "2.jpg").write_bytes(payload)
    config = tmp_path / "train.json"
    config.write_text(json.dumps(_sft(data, tmp_path / "out")))
    # One as a real process (seconds of imports): the exit code and stderr a shell sees. The others through the
    # same entry point in this process: the same code decides the message.
    done = gym_process("train", config) if bad == "bomb" else gym_here("train", config, capfd=capfd)
    assert_one_line_error(done, "row 2: field 'images[0]'", "2.jpg")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
