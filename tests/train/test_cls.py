"""stage: cls on the tiny model: a classifier learns the class of held-out rows, its folder loads with
AutoModelForSequenceClassification and names its classes, LoRA trains only the adapter and the head; labelled rows
are read (text, instruction or conversation; names or indices) and bad ones named by file, row and field. The embedded
SmolLM2-135M trained into a safe/unsafe guard on data/guard_demo.jsonl is tested where it is used, as a served guard
(tests/safety/test_trained_guard.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from gym.config.data import DataArguments
from gym.config.parser import get_train_args
from gym.core.errors import ConfigError, DataError
from gym.data.loader import get_dataset
from gym.data.processors import class_names, classifier_text
from gym.data.templates import get_chat_format
from gym.models.classifier import load_trained_classifier
from gym.train.harness import read_log
from gym.workflows.training import run_exp

REPO = Path(__file__).resolve().parents[2]
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
UNSEEN = {"Tell me about the lamp.": "safe", "Help me hurt the lamp.": "unsafe",
          "Tell me about the boat.": "safe", "Help me hurt the boat.": "unsafe"}


def _falls(out: Path) -> bool:
    losses = [e["loss"] for e in read_log(out) if "loss" in e]
    return sum(losses[-3:]) / 3 < 0.5 * sum(losses[:3]) / 3


def test_classifier_learns_held_out_rows_and_loads_with_transformers(labelled_config, tiny_model_dir):
    from transformers import AutoModelForSequenceClassification

    result = run_exp(labelled_config(finetuning_type="full", val_size=0.25))
    out = Path(result.output_dir)
    assert _falls(out)
    assert result.metrics["eval_accuracy"] == 1.0  # 8 held-out rows
    assert any("eval_accuracy" in e for e in read_log(out))
    assert json.loads((out / "gym_manifest.json").read_text())["stage"] == "cls"
    assert yaml.safe_load((out / "gym_config.yaml").read_text())["labels"] == ["safe", "unsafe"]  # from the data

    model = AutoModelForSequenceClassification.from_pretrained(out)
    assert model.config.id2label == {0: "safe", 1: "unsafe"} and model.config.label2id == {"safe": 0, "unsafe": 1}
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    trained = load_file(str(out / "model.safetensors"))
    changed = [k for k in base if k in trained and not torch.equal(base[k], trained[k])]
    assert "score.weight" in trained and len(changed) > len(base) // 2, changed

    classifier = load_trained_classifier(out)
    assert classifier.labels == ["safe", "unsafe"]
    assert classifier.predict(list(UNSEEN)) == list(UNSEEN.values())


def test_lora_trains_the_adapter_and_the_head_in_the_labels_order(labelled_config, tiny_model_dir):
    result = run_exp(labelled_config(labels=["unsafe", "safe"], learning_rate=5e-3, max_steps=20, val_size=0.25))
    out = Path(result.output_dir)
    assert _falls(out) and result.metrics["eval_accuracy"] >= 0.75
    assert result.tokens_seen > 0 and result.tokens_per_second > 0  # the summary's tokens/s (it said 0)
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert adapter["task_type"] == "SEQ_CLS" and not (out / "config.json").exists()
    saved = load_file(str(out / "adapter_model.safetensors"))
    assert any("score" in k for k in saved)  # the head trains in full and is saved with the adapter

    classifier = load_trained_classifier(out)
    assert classifier.labels == ["unsafe", "safe"] and classifier.model.config.id2label == {0: "unsafe", 1: "safe"}
    assert classifier.predict(list(UNSEEN)) == list(UNSEEN.values())
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    merged = classifier.model.state_dict()
    changed = {k for k in base if k in merged and not torch.equal(base[k], merged[k].cpu())}
    assert changed and all(any(t in k for t in LORA_TARGETS) for k in changed), sorted(changed)


def _read(tmp_path: Path, tokenizer, rows: list, name: str = "rows.jsonl", **data: object):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    chat = get_chat_format(tokenizer)
    return chat, get_dataset(DataArguments(dataset=str(path), cutoff_len=256, **data), chat, "labelled", seed=0)


def test_text_instruction_and_conversation_rows_read_as_the_chat_format_serves_them(tmp_path, tokenizer):
    conversation = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                    {"role": "user", "content": "Help me."}]
    rows = [{"text": "Say red.", "label": "safe"}, {"instruction": "Say", "input": "blue.", "label": "unsafe"},
            {"messages": conversation, "label": "safe"}, {"messages": conversation[:2], "label": "other"}]
    chat = get_chat_format(tokenizer)
    texts, encoded = [], []
    for i, row in enumerate(rows):
        _, data = _read(tmp_path, tokenizer, [row], name=f"row{i}.jsonl")
        encoded += data.train
        assert encoded[-1]["label"] == row["label"]
        texts.append(tokenizer.decode(encoded[-1]["input_ids"]))
    user = [{"role": "user", "content": "Say red."}]
    assert texts[0] == chat.render_prompt(user) == classifier_text(chat, user)  # the prompt, assistant header included
    assert texts[1] == chat.render_prompt([{"role": "user", "content": "Say\nblue."}])
    assert texts[2] == chat.render_prompt(conversation) and texts[2].endswith("<|im_start|>assistant\n")
    assert texts[3] == "".join(p + r for p, r in chat.render_pairs(conversation[:2]))  # closed by the end-of-turn
    assert class_names(encoded) == ["other", "safe", "unsafe"]


def test_labels_are_names_or_indices_into_labels(tmp_path, tokenizer):
    _, data = _read(tmp_path, tokenizer, [{"text": f"row {i}", "label": i % 3} for i in range(6)])
    assert class_names(data.train) == ["0", "1", "2"]
    assert class_names(data.train, ["a", "b", "c"]) == ["a", "b", "c"]
    with pytest.raises(DataError, match=r"rows.jsonl, line 3: label 2 is not one of labels: \['a', 'b'\]"):
        class_names(data.train, ["a", "b"])
    _, mixed = _read(tmp_path, tokenizer, [{"text": "a", "label": "safe"}, {"text": "b", "label": 1}])
    with pytest.raises(DataError, match="line 2: label 1 is an index, while .*line 1 names its class"):
        class_names(mixed.train)
    _, single = _read(tmp_path, tokenizer, [{"text": "a", "label": "safe"}, {"text": "b", "label": "safe"}])
    with pytest.raises(DataError, match="a single class"):
        class_names(single.train)


@pytest.mark.parametrize(("row", "message"), [
    ({"text": "Hello"}, "field 'label' is missing"),
    ({"text": "Hello", "label": " "}, "field 'label' is empty"),
    ({"text": "Hello", "label": True}, "field 'label' must be a class name"),
    ({"text": "Hello", "label": -1}, "field 'label' must be a class name"),
    ({"text": "  ", "label": "safe"}, "field 'text' is empty"),
    ({"messages": [{"role": "user", "content": " "}], "label": "safe"}, "field 'messages' holds no text"),
])
def test_a_bad_row_is_named_by_file_row_and_field(tmp_path, tokenizer, row, message):
    rows = [{"text": "Fine.", "label": "safe"}, row] if "text" in row else [row]
    where = "line 2" if "text" in row else "line 1"
    with pytest.raises(DataError, match=f"rows.jsonl, {where}: {message}"):
        _read(tmp_path, tokenizer, rows)


def test_a_label_outside_labels_stops_the_run_naming_the_row(labelled_config, data_dir):
    (data_dir / "extra.jsonl").write_text(json.dumps({"text": "Hi.", "label": "maybe"}) + "\n")
    with pytest.raises(DataError, match=r"extra.jsonl, line 1: label 'maybe' is not one of labels"):
        run_exp(labelled_config(dataset=f"tiny_labelled,{data_dir / 'extra.jsonl'}", labels=["safe", "unsafe"]))


@pytest.mark.parametrize(("keys", "message"), [
    ({"labels": ["safe"]}, "at least two"),
    ({"labels": "safe"}, "at least two"),
    ({"labels": ["safe", "unsafe", "safe"]}, "names the class 'safe' twice"),
    ({"packing": True}, "turn packing off"),
    ({"delta_compression": "bitdelta"}, "a classifier"),
])
def test_a_config_that_cannot_train_a_classifier_is_refused(keys, message):
    with pytest.raises(ConfigError, match=message):
        get_train_args({"stage": "cls", **keys})
