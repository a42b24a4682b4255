"""The alignment data kinds: pairwise (rm, dpo family), feedback (kto) and prompt (grpo, rloo, ppo).

Rows go through the real registry, converter and processors with the embedded tokenizer's own chat
template, and every malformed row must be reported with its file, its row and the field at fault.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gym.config.data import DataArguments
from gym.core.errors import DataError
from gym.data.loader import get_dataset, load_examples
from gym.data.registry import get_dataset_attrs
from gym.data.templates import get_chat_format

REPO_DATA = Path(__file__).resolve().parents[2] / "data"

PAIRS_ALPACA = {"file_name": "pairs.json", "ranking": True,
                "columns": {"prompt": "instruction", "query": "input", "chosen": "chosen", "rejected": "rejected"}}
PAIRS_SHAREGPT = {"file_name": "pairs_chat.json", "ranking": True, "formatting": "sharegpt",
                  "columns": {"messages": "conversations", "chosen": "chosen", "rejected": "rejected"}}
FEEDBACK = {"file_name": "feedback.json", "formatting": "sharegpt",
            "columns": {"messages": "messages", "kto_tag": "label"},
            "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}}
PROMPTS = {"file_name": "prompts.json", "columns": {"prompt": "instruction", "answer": "answer"}}
PROMPTS_CHAT = {"file_name": "prompts_chat.json", "formatting": "sharegpt",
                "columns": {"messages": "conversations", "answer": "answer"}}


@pytest.fixture(scope="module")
def chat(tokenizer):
    return get_chat_format(tokenizer)


def _write(folder: Path, entries: dict[str, dict], files: dict[str, list]) -> Path:
    for name, rows in files.items():
        (folder / name).write_text(json.dumps(rows))
    (folder / "dataset_info.json").write_text(json.dumps(entries))
    return folder


def _examples(folder, name, kind):
    (attr,) = get_dataset_attrs(name, folder)
    return load_examples(attr, kind)


def _tokenized(folder, name, chat, kind, **data):
    args = DataArguments(dataset=name, dataset_dir=str(folder), cutoff_len=data.pop("cutoff_len", 256), **data)
    return get_dataset(args, chat, kind)


def _generation_prompt(tokenizer, messages):
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def _decode(tokenizer, ids):
    return tokenizer.decode(ids, skip_special_tokens=False)


# ---------------------------------------------------------------- pairwise


def test_pairwise_alpaca_rows_become_prompt_chosen_rejected(tmp_path, chat, tokenizer):
    rows = [{"instruction": "Name a colour.", "input": "One word.", "chosen": "Blue.", "rejected": "Seven."}]
    _write(tmp_path, {"pairs": PAIRS_ALPACA}, {"pairs.json": rows})
    (ex,) = _examples(tmp_path, "pairs", "pairwise")
    assert ex.messages == [{"role": "user", "content": "Name a colour.\nOne word."}]
    assert (ex.chosen, ex.rejected) == ("Blue.", "Seven.")

    (row,) = _tokenized(tmp_path, "pairs", chat, "pairwise").train
    assert set(row) == {"prompt_ids", "chosen_ids", "rejected_ids"}
    expected_prompt = _generation_prompt(tokenizer, [{"role": "user", "content": "Name a colour.\nOne word."}])
    assert expected_prompt.endswith("<|im_start|>assistant\n")
    assert _decode(tokenizer, row["prompt_ids"]) == expected_prompt
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for key, text in (("chosen_ids", "Blue."), ("rejected_ids", "Seven.")):
        # The answer exactly as the chat template renders an assistant turn, end-of-turn included.
        assert _decode(tokenizer, row[key]) == f"{text}<|im_end|>\n"
        assert end_of_turn in row[key][-2:]
    # prompt + chosen is the whole conversation as the tokenizer's template renders it.
    full = tokenizer.apply_chat_template([{"role": "user", "content": "Name a colour.\nOne word."},
                                          {"role": "assistant", "content": "Blue."}], tokenize=False)
    assert _decode(tokenizer, row["prompt_ids"] + row["chosen_ids"]) == full


def test_pairwise_sharegpt_puts_the_history_in_the_prompt(tmp_path, chat, tokenizer):
    rows = [{
        "conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "Hi."},
                          {"from": "gpt", "value": "Hello."}, {"from": "human", "value": "Capital of France?"}],
        "chosen": {"from": "gpt", "value": "Paris."},
        "rejected": {"from": "gpt", "value": "Rome."},
    }]
    _write(tmp_path, {"pairs": PAIRS_SHAREGPT}, {"pairs_chat.json": rows})
    (ex,) = _examples(tmp_path, "pairs", "pairwise")
    assert ex.system == "Be brief." and [m["role"] for m in ex.messages] == ["user", "assistant", "user"]

    (row,) = _tokenized(tmp_path, "pairs", chat, "pairwise").train
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi."},
               {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Capital of France?"}]
    prompt = _decode(tokenizer, row["prompt_ids"])
    assert prompt == _generation_prompt(tokenizer, history)
    assert "Hello." in prompt and "Be brief." in prompt
    assert _decode(tokenizer, row["chosen_ids"]) == "Paris.<|im_end|>\n"
    assert _decode(tokenizer, row["rejected_ids"]) == "Rome.<|im_end|>\n"


def test_pairwise_answers_given_as_message_lists_use_the_last_message(tmp_path):
    rows = [{"conversations": [{"from": "human", "value": "Q"}],
             "chosen": [{"from": "gpt", "value": "good"}], "rejected": [{"from": "gpt", "value": "bad"}]}]
    _write(tmp_path, {"pairs": PAIRS_SHAREGPT}, {"pairs_chat.json": rows})
    (ex,) = _examples(tmp_path, "pairs", "pairwise")
    assert (ex.chosen, ex.rejected) == ("good", "bad")


@pytest.mark.parametrize(
    ("entry", "file", "row", "field"),
    [
        (PAIRS_ALPACA, "pairs.json", {"instruction": "Q", "input": "", "chosen": "A"}, "rejected"),
        (PAIRS_ALPACA, "pairs.json", {"instruction": "Q", "input": "", "chosen": "  ", "rejected": "B"}, "chosen"),
        (PAIRS_SHAREGPT, "pairs_chat.json",
         {"conversations": [{"from": "human", "value": "Q"}], "chosen": {"from": "gpt", "value": ""},
          "rejected": {"from": "gpt", "value": "B"}}, "chosen.value"),
        (PAIRS_SHAREGPT, "pairs_chat.json",
         {"conversations": [{"from": "human", "value": "Q"}, {"from": "gpt", "value": "A"}],
          "chosen": {"from": "gpt", "value": "A"}, "rejected": {"from": "gpt", "value": "B"}}, "conversations"),
    ],
    ids=["missing-rejected", "empty-chosen", "empty-chosen-message", "ends-with-assistant"],
)
def test_malformed_pairwise_rows_name_file_row_and_field(tmp_path, entry, file, row, field):
    good = ({"instruction": "Fine", "input": "", "chosen": "A", "rejected": "B"} if entry is PAIRS_ALPACA else
            {"conversations": [{"from": "human", "value": "Fine"}], "chosen": {"from": "gpt", "value": "A"},
             "rejected": {"from": "gpt", "value": "B"}})
    _write(tmp_path, {"pairs": entry}, {file: [good, good, row]})
    with pytest.raises(DataError, match=re.escape(f"{file}, row 3")) as info:
        _examples(tmp_path, "pairs", "pairwise")
    message = str(info.value)
    assert f"{file}, row 3" in message
    assert f"'{field}'" in message


def test_dataset_without_pairs_for_a_pairwise_stage_says_how_to_fix_dataset_info(data_dir):
    with pytest.raises(DataError, match="tiny_alpaca") as info:
        _examples(data_dir, "tiny_alpaca", "pairwise")
    message = str(info.value)
    assert "tiny_alpaca" in message and "dataset_info.json" in message
    assert '"ranking": true' in message and "chosen" in message and "rejected" in message


@pytest.mark.parametrize("kind", ["supervised", "feedback"])
def test_preference_pairs_for_a_stage_that_wants_answers_name_the_stages_that_read_them(tmp_path, kind):
    """LLaMA-Factory refuses a ranking dataset outside its preference stages too; the message said
    'for DataKind.SUPERVISED data' about the row's last message."""
    _write(tmp_path, {"pairs": PAIRS_ALPACA}, {"pairs.json": [{"instruction": "Hi", "chosen": "a", "rejected": "b"}]})
    with pytest.raises(DataError, match=r"Dataset 'pairs' holds preference pairs .* train it with a preference stage "
                       r"\(dpo, orpo, simpo, cpo, rm\)") as info:
        _examples(tmp_path, "pairs", kind)
    assert "DataKind" not in str(info.value)


def test_pairwise_cutoff_drops_long_prompts_and_cuts_answers(tmp_path, chat, tokenizer):
    long_prompt = " ".join(f"word{i}" for i in range(200))
    long_answer = " ".join(f"answer{i}" for i in range(200))
    rows = [{"instruction": long_prompt, "input": "", "chosen": "A", "rejected": "B"},
            {"instruction": "Short?", "input": "", "chosen": long_answer, "rejected": "No."}]
    _write(tmp_path, {"pairs": PAIRS_ALPACA}, {"pairs.json": rows})
    cutoff = 96
    data = _tokenized(tmp_path, "pairs", chat, "pairwise", cutoff_len=cutoff)
    assert data.stats["rows"] == 2 and data.stats["dropped"] == 1
    (row,) = data.train
    expected = _generation_prompt(tokenizer, [{"role": "user", "content": "Short?"}])
    assert _decode(tokenizer, row["prompt_ids"]) == expected
    assert len(row["prompt_ids"]) + len(row["chosen_ids"]) == cutoff  # the long answer is cut to fit exactly
    assert _decode(tokenizer, row["chosen_ids"]).startswith("answer0 answer1")
    assert _decode(tokenizer, row["rejected_ids"]) == "No.<|im_end|>\n"  # the short one is kept whole
    # Only the over-long prompt: nothing left at all.
    _write(tmp_path, {"pairs": PAIRS_ALPACA}, {"pairs.json": rows[:1]})
    with pytest.raises(DataError, match="cutoff_len=96"):
        _tokenized(tmp_path, "pairs", chat, "pairwise", cutoff_len=cutoff)


# ---------------------------------------------------------------- feedback


def test_feedback_rows_become_prompt_completion_and_bool_label(tmp_path, chat, tokenizer):
    def row(answer, tag):
        return {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "Sure."},
                             {"role": "user", "content": "So?"}, {"role": "assistant", "content": answer}],
                "label": tag}

    _write(tmp_path, {"fb": FEEDBACK}, {"feedback.json": [row("4.", True), row("5.", False), row("4!", "true")]})
    examples = _examples(tmp_path, "fb", "feedback")
    assert [e.kto_tag for e in examples] == [True, False, True]
    rows = _tokenized(tmp_path, "fb", chat, "feedback").train
    assert [r["label"] for r in rows] == [True, False, True]
    assert all(type(r["label"]) is bool for r in rows)
    first = rows[0]
    assert set(first) == {"prompt_ids", "completion_ids", "label"}
    history = row("", True)["messages"][:3]
    assert _decode(tokenizer, first["prompt_ids"]) == _generation_prompt(tokenizer, history)
    assert _decode(tokenizer, first["completion_ids"]) == "4.<|im_end|>\n"
    assert _decode(tokenizer, rows[1]["completion_ids"]) == "5.<|im_end|>\n"


@pytest.mark.parametrize("bad", ["maybe", 2, None, [True]])
def test_feedback_tag_that_is_not_a_bool_names_file_row_and_field(tmp_path, bad):
    good = {"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}], "label": True}
    bad_row = dict(good, label=bad)
    _write(tmp_path, {"fb": FEEDBACK}, {"feedback.json": [good, bad_row]})
    with pytest.raises(DataError, match=r"feedback\.json, row 2") as info:
        _examples(tmp_path, "fb", "feedback")
    message = str(info.value)
    assert "feedback.json, row 2" in message and "'label'" in message and "true or false" in message


def test_feedback_without_a_tag_column_says_how_to_fix_dataset_info(data_dir):
    with pytest.raises(DataError, match=r"dataset_info\.json.*kto_tag"):
        _examples(data_dir, "tiny_alpaca", "feedback")


# ---------------------------------------------------------------- prompt


def test_prompt_rows_keep_the_answer_as_a_string(tmp_path, chat, tokenizer):
    rows = [{"instruction": "What is 2+3?", "answer": 5}, {"instruction": "Half of 5?", "answer": 2.5},
            {"instruction": "Capital of Peru?", "answer": "Lima"}]
    _write(tmp_path, {"p": PROMPTS}, {"prompts.json": rows})
    data = _tokenized(tmp_path, "p", chat, "prompt")
    assert [r["answer"] for r in data.train] == ["5", "2.5", "Lima"]
    first = data.train[0]
    assert set(first) == {"prompt", "prompt_ids", "answer"}
    expected = _generation_prompt(tokenizer, [{"role": "user", "content": "What is 2+3?"}])
    assert first["prompt"] == expected
    assert _decode(tokenizer, first["prompt_ids"]) == expected


def test_prompt_rows_without_an_answer_column_have_no_answer(data_dir, chat):
    rows = _tokenized(data_dir, "tiny_alpaca", chat, "prompt", max_samples=2).train
    assert len(rows) == 2 and all(set(r) == {"prompt", "prompt_ids"} for r in rows)
    assert all("0 + 1" not in r["prompt"] for r in rows)  # the output column is not part of the prompt


def test_sharegpt_prompt_rows_drop_a_trailing_assistant_answer(tmp_path, chat, tokenizer):
    rows = [{"conversations": [{"from": "human", "value": "Hi."}, {"from": "gpt", "value": "Hello."},
                               {"from": "human", "value": "1+1?"}, {"from": "gpt", "value": "It is 2."}],
             "answer": "2"},
            {"conversations": [{"from": "human", "value": "2+2?"}], "answer": 4}]
    _write(tmp_path, {"p": PROMPTS_CHAT}, {"prompts_chat.json": rows})
    first, second = _tokenized(tmp_path, "p", chat, "prompt").train
    history = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."},
               {"role": "user", "content": "1+1?"}]
    assert first["prompt"] == _generation_prompt(tokenizer, history)
    assert "It is 2." not in first["prompt"] and "Hello." in first["prompt"]
    assert (first["answer"], second["answer"]) == ("2", "4")


@pytest.mark.parametrize("bad", [True, None, {"x": 1}])
def test_prompt_answer_of_the_wrong_type_names_file_row_and_field(tmp_path, bad):
    rows = [{"instruction": "Q", "answer": "1"}, {"instruction": "Q", "answer": bad}]
    _write(tmp_path, {"p": PROMPTS}, {"prompts.json": rows})
    with pytest.raises(DataError, match=r"prompts\.json, row 2") as info:
        _examples(tmp_path, "p", "prompt")
    assert "prompts.json, row 2" in str(info.value) and "'answer'" in str(info.value)


def test_prompt_longer_than_cutoff_is_dropped(tmp_path, chat):
    rows = [{"instruction": " ".join(f"w{i}" for i in range(300)), "answer": "1"}, {"instruction": "Q?", "answer": "2"}]
    _write(tmp_path, {"p": PROMPTS}, {"prompts.json": rows})
    data = _tokenized(tmp_path, "p", chat, "prompt", cutoff_len=96)
    assert data.stats["dropped"] == 1 and [r["answer"] for r in data.train] == ["2"]


# ---------------------------------------------------------------- bare files are sniffed


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_bare_pairwise_files_are_sniffed(tmp_path, chat, tokenizer):
    alpaca = _jsonl(tmp_path / "pairs.jsonl", [{"instruction": "Q?", "chosen": "Yes.", "rejected": "No."}] * 2)
    (attr,) = get_dataset_attrs(alpaca, tmp_path)
    assert attr.ranking and attr.column("chosen") == "chosen" and attr.column("rejected") == "rejected"
    ex = load_examples(attr, "pairwise")[1]
    assert (ex.chosen, ex.rejected) == ("Yes.", "No.") and ex.source.endswith("pairs.jsonl, line 2")

    sharegpt = _jsonl(tmp_path / "chat_pairs.jsonl", [{"conversations": [{"from": "human", "value": "Q?"}],
                                                       "chosen": {"from": "gpt", "value": "Yes."},
                                                       "rejected": {"from": "gpt", "value": "No."}}])
    (attr,) = get_dataset_attrs(sharegpt, tmp_path)
    assert attr.formatting == "sharegpt" and attr.ranking
    (row,) = get_dataset(DataArguments(dataset=sharegpt, dataset_dir=str(tmp_path)), chat, "pairwise").train
    assert _decode(tokenizer, row["chosen_ids"]) == "Yes.<|im_end|>\n"


def test_bare_trl_style_prompt_chosen_rejected_file_is_sniffed(tmp_path):
    path = _jsonl(tmp_path / "trl_pairs.jsonl", [{"prompt": "Q?", "chosen": "Yes.", "rejected": "No."}])
    (attr,) = get_dataset_attrs(path, tmp_path)
    (ex,) = load_examples(attr, "pairwise")
    assert ex.messages == [{"role": "user", "content": "Q?"}] and (ex.chosen, ex.rejected) == ("Yes.", "No.")


def test_bare_feedback_and_answer_files_are_sniffed(tmp_path):
    openai = _jsonl(tmp_path / "kto.jsonl", [{"messages": [{"role": "user", "content": "Q"},
                                                           {"role": "assistant", "content": "A"}], "kto_tag": False}])
    (attr,) = get_dataset_attrs(openai, tmp_path)
    assert attr.formatting == "openai" and attr.column("kto_tag") == "kto_tag"
    assert load_examples(attr, "feedback")[0].kto_tag is False

    labelled = _jsonl(tmp_path / "labelled.jsonl", [{"instruction": "Q", "output": "A", "label": True}])
    (attr,) = get_dataset_attrs(labelled, tmp_path)
    assert attr.column("kto_tag") == "label" and load_examples(attr, "feedback")[0].kto_tag is True

    # A non-bool `label` is not a desirability tag (it could be a class id): not sniffed.
    classes = _jsonl(tmp_path / "classes.jsonl", [{"instruction": "Q", "output": "A", "label": 3}])
    (attr,) = get_dataset_attrs(classes, tmp_path)
    assert attr.column("kto_tag") is None

    for column in ("answer", "solution"):
        path = _jsonl(tmp_path / f"{column}.jsonl", [{"instruction": "1+1?", column: 2}])
        (attr,) = get_dataset_attrs(path, tmp_path)
        assert attr.column("answer") == column and load_examples(attr, "prompt")[0].answer == "2"


# ---------------------------------------------------------------- the shipped demo datasets


@pytest.mark.parametrize(
    ("name", "kind", "keys"),
    [("dpo_en_demo", "pairwise", {"prompt_ids", "chosen_ids", "rejected_ids"}),
     ("dpo_alpaca_demo", "pairwise", {"prompt_ids", "chosen_ids", "rejected_ids"}),
     ("kto_en_demo", "feedback", {"prompt_ids", "completion_ids", "label"}),
     ("arithmetic_demo", "prompt", {"prompt", "prompt_ids", "answer"})],
)
def test_shipped_demo_datasets_load_completely(chat, name, kind, keys):
    rows_on_disk = len(json.loads((REPO_DATA / f"{name}.json").read_text()))
    data = get_dataset(DataArguments(dataset=name, dataset_dir=str(REPO_DATA), cutoff_len=1024), chat, kind)
    assert data.stats["rows"] == rows_on_disk and data.stats["dropped"] == 0
    assert len(data.train) == rows_on_disk
    assert all(set(r) == keys for r in data.train)
    if kind == "pairwise":
        assert all(r["chosen_ids"] and r["rejected_ids"] and r["chosen_ids"] != r["rejected_ids"] for r in data.train)
    if kind == "feedback":
        labels = {r["label"] for r in data.train}
        assert labels == {True, False}, "a KTO demo needs both desirable and undesirable answers"
    if kind == "prompt":
        assert all(isinstance(r["answer"], str) and r["answer"] for r in data.train)
