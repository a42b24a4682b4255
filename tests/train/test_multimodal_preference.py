"""Preference stages with images (issue #41) on tiny-llava: dpo and kto rows carry `images`, the prompt's `<image>`
expands through the processor while the answers stay text, and the pixels reach the vision tower in the policy's
forward and in the reference's (a forward hook counts the tower's calls with and without grad). Stages whose trainer
shows the model text alone refuse such rows, naming themselves."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from gym.core.errors import DataError
from gym.models import vision
from gym.workflows.training import run_exp

REPO = Path(__file__).resolve().parents[2]
QUESTION = "<image>Who is in the picture?"
ANSWERS = {"1.jpg": "They're Kane and Gretzka from Bayern Munich.", "2.jpg": "He's Thomas Muller from Bayern Munich."}
TAGS = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}


def _write_image_preferences(folder: Path) -> Path:
    """sharegpt pairwise rows (LLaMA-Factory's layout: the prompt's messages, chosen and rejected messages, images),
    alpaca pairwise rows, and sharegpt feedback rows with a kto_tag; each image's own answer is the good one."""
    (folder / "imgs").mkdir(parents=True)
    pairs, alpaca, feedback = [], [], []
    for name, answer in ANSWERS.items():
        shutil.copy(REPO / "data" / "mllm_demo_data" / name, folder / "imgs" / name)
        other = next(a for n, a in ANSWERS.items() if n != name)
        image = [f"imgs/{name}"]
        pairs.append({"messages": [{"role": "user", "content": QUESTION}],
                      "chosen": {"role": "assistant", "content": answer},
                      "rejected": {"role": "assistant", "content": other}, "images": image})
        alpaca.append({"instruction": QUESTION, "input": "", "chosen": answer, "rejected": other, "images": image})
        for text, good in ((answer, True), (other, False)):
            feedback.append({"messages": [{"role": "user", "content": QUESTION},
                                          {"role": "assistant", "content": text}], "kto_tag": good, "images": image})
    # A text row first: Dataset.from_list takes its columns from the first row.
    text_pair = {"instruction": "Say hi.", "input": "", "chosen": "Hi.", "rejected": "No.", "images": []}
    drawn = {**pairs[0], "chosen": {"role": "assistant", "content": "<image>"}}
    files = {"who_pairs": pairs * 2, "who_alpaca_pairs": [text_pair, *alpaca], "who_feedback": feedback,
             "drawn_answer": [drawn]}
    for name, rows in files.items():
        (folder / f"{name}.json").write_text(json.dumps(rows))
    (folder / "dataset_info.json").write_text(json.dumps({
        "who_pairs": {"file_name": "who_pairs.json", "formatting": "sharegpt", "ranking": True, "tags": TAGS,
                      "columns": {"messages": "messages", "chosen": "chosen", "rejected": "rejected",
                                  "images": "images"}},
        "who_alpaca_pairs": {"file_name": "who_alpaca_pairs.json", "ranking": True,
                             "columns": {"prompt": "instruction", "query": "input", "chosen": "chosen",
                                         "rejected": "rejected", "images": "images"}},
        "drawn_answer": {"file_name": "drawn_answer.json", "formatting": "sharegpt", "ranking": True, "tags": TAGS,
                         "columns": {"messages": "messages", "chosen": "chosen", "rejected": "rejected",
                                     "images": "images"}},
        "who_feedback": {"file_name": "who_feedback.json", "formatting": "sharegpt", "tags": TAGS,
                         "columns": {"messages": "messages", "kto_tag": "kto_tag", "images": "images"}},
    }))
    return folder


@pytest.fixture()
def vlm_config(tmp_path):
    root = _write_image_preferences(tmp_path / "data")

    def make(**overrides: Any) -> dict[str, Any]:
        return {"model_name_or_path": "tiny-llava", "finetuning_type": "lora", "lora_rank": 8, "dataset_dir": str(root),
                "output_dir": str(tmp_path / "out"), "max_steps": 2, "per_device_train_batch_size": 2,
                "learning_rate": 1e-2, "save_strategy": "no", "report_to": "none", "cutoff_len": 128,
                "disable_tqdm": True, "bf16": False, "seed": 0, "logging_steps": 1, **overrides}

    return make


@pytest.fixture()
def tower_calls(monkeypatch):
    """The images each call of the vision tower saw, and whether it ran with grad (the policy's pass) or without (the
    reference's, and KTO's KL pass): filled while the run trains."""
    calls: list[tuple[int, bool]] = []
    load = vision.load_multimodal

    def load_and_watch(*args: Any, **kwargs: Any) -> Any:
        model = load(*args, **kwargs)
        tower = next(module for name, module in model.named_modules() if name.endswith("vision_tower"))
        tower.register_forward_hook(
            lambda module, inputs, output: calls.append((inputs[0].shape[0], torch.is_grad_enabled())))
        return model

    monkeypatch.setattr(vision, "load_multimodal", load_and_watch)
    return calls


def _assert_adapter_trained(out: Path) -> None:
    adapter = load_file(str(out / "adapter_model.safetensors"))
    lora_b = [v for k, v in adapter.items() if "lora_B" in k]
    assert lora_b and all(v.abs().sum() > 0 for v in lora_b), "every lora_B starts at zero and must have trained"
    assert not any("vision_tower" in k for k in adapter), "the vision tower stays frozen under LoRA"


def test_dpo_feeds_the_images_to_policy_and_reference(vlm_config, tower_calls):
    result = run_exp(vlm_config(stage="dpo", dataset="who_pairs"))
    assert result.global_step == 2
    _assert_adapter_trained(Path(result.output_dir))
    # Per step: one policy pass (with grad) and one reference pass (adapter disabled, no grad), each on both rows'
    # chosen and rejected sequences, so 2 x 2 images.
    assert [n for n, _ in tower_calls] == [4] * 4
    assert sorted(grad for _, grad in tower_calls) == [False, False, True, True]


def test_kto_feeds_the_images_to_every_pass(vlm_config, tower_calls):
    result = run_exp(vlm_config(stage="kto", dataset="who_feedback"))
    assert result.global_step == 2
    _assert_adapter_trained(Path(result.output_dir))
    # Per step: the policy's pass (grad), and without grad the policy's KL pass, the reference's KL pass and the
    # reference's pass; each on the batch's 2 rows, each row with its own image.
    assert [n for n, _ in tower_calls] == [2] * 8
    assert sum(grad for _, grad in tower_calls) == 2


def _pairwise_rows(vlm_config: Any, dataset: str) -> tuple[Any, list[dict[str, Any]]]:
    from gym.config.data import DataArguments
    from gym.data.loader import get_dataset
    from gym.data.multimodal import MediaInputs
    from gym.data.templates import get_chat_format
    from gym.models.loader import resolve_model_path

    processor = vision.load_processor(resolve_model_path("tiny-llava"))
    media = MediaInputs.for_processor(processor, "tiny-llava")
    data_args = DataArguments(dataset=dataset, dataset_dir=vlm_config()["dataset_dir"], cutoff_len=128)
    return media, get_dataset(data_args, get_chat_format(processor.tokenizer), "pairwise", media=media).train


def test_pairs_expand_the_prompt_keep_the_answers_text_and_batch_beside_text_rows(vlm_config):
    from datasets import Dataset
    from trl.trainer.dpo_trainer import DataCollatorForPreference

    from gym.train.media_rows import media_collator, trl_rows

    media, rows = _pairwise_rows(vlm_config, "who_alpaca_pairs")
    image_id = media.tokenizer.convert_tokens_to_ids(media.processor.image_token)
    assert "images" not in rows[0] and image_id not in rows[0]["prompt_ids"]
    for row in rows[1:]:
        assert row["prompt_ids"].count(image_id) == 16  # a 56x56 image is 16 patches
        assert image_id not in row["chosen_ids"] + row["rejected_ids"]
        assert len(row["images"]) == 1 and row["images"][0].endswith(".jpg")
    # The text row and an image row in one DPO batch: chosen rows, then rejected rows, each image once per row.
    dataset = Dataset.from_list(trl_rows(rows))
    collate = media_collator(DataCollatorForPreference(pad_token_id=media.tokenizer.pad_token_id), media, repeats=2)
    batch = collate([dataset[0], dataset[1]])
    assert batch["input_ids"].shape[0] == 4 and batch["pixel_values"].shape[0] == 2
    assert (batch["input_ids"] == image_id).sum(dim=1).tolist() == [0, 16, 0, 16]


def test_a_media_placeholder_in_an_answer_is_refused(vlm_config):
    with pytest.raises(DataError, match=r"drawn_answer.json, row 1: the chosen answer holds a media placeholder"):
        _pairwise_rows(vlm_config, "drawn_answer")


@pytest.mark.parametrize(("overrides", "named"), [({"stage": "rm"}, "stage 'rm'"),
                                                   ({"stage": "orpo"}, "stage 'orpo'"),
                                                   ({"stage": "dpo", "pref_loss": "simpo"}, "pref_loss 'simpo'")])
def test_a_stage_that_shows_text_alone_refuses_images(vlm_config, overrides, named):
    with pytest.raises(DataError, match=r"who_pairs.json, row 1 has images, and " + named) as caught:
        run_exp(vlm_config(dataset="who_pairs", **overrides))
    if "stage" in named:
        assert "dpo, kto, sft, tdpo" in str(caught.value)


def test_per_token_types_reach_every_id_tensor_of_the_batch():
    """A family whose processor marks image tokens (Gemma 3's token_type_ids) gets the marks on KTO's KL sequences
    too, which are as wide as their own answers; the media are repeated as the batch repeats its rows."""
    from gym.data.collators import MediaBatchCollator

    class MarkingProcessor:  # what MediaInputs gives a collator, for a family that marks its image token (9)
        def decode(self, kind: str, items: list[str], where: str) -> list[str]:
            return items

        def features(self, media: dict[str, list[str]], input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"pixel_values": torch.zeros(len(media["images"]), 3), "token_type_ids": (input_ids == 9).long()}

    def ids(rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        assert all("media_images" not in row for row in rows)
        return {"input_ids": torch.tensor([[1, 9, 9, 2]]), "KL_input_ids": torch.tensor([[1, 9, 9, 3, 3]])}

    collate = MediaBatchCollator(ids, MarkingProcessor(), repeats=2, column="media_{kind}")  # type: ignore[arg-type]
    batch = collate([{"prompt_ids": [1], "media_images": ["a.jpg"]}])
    assert batch["pixel_values"].shape[0] == 2
    assert batch["token_type_ids"].tolist() == [[0, 1, 1, 0]]
    assert batch["KL_token_type_ids"].tolist() == [[0, 1, 1, 0, 0]]
