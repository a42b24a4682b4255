"""Safety sets: the prompt and kind columns AdvBench, HarmBench and XSTest use, registry names, and bad rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gym.core.errors import DataError
from gym.data.registry import get_dataset_attrs
from gym.safety.sets import Kind, count, read_item, read_set

REPO = Path(__file__).resolve().parents[2]


def test_the_demo_set_has_30_harmful_and_30_benign_requests():
    items = read_set("safety_demo", str(REPO / "data"))
    assert count(items, Kind.HARMFUL) == 30 and count(items, Kind.BENIGN) == 30
    assert items[0].source.endswith("safety_demo.json, row 1") and items[0].category == "weapons"
    assert all(i.messages[-1]["role"] == "user" and i.prompt for i in items)
    assert len({i.prompt for i in items}) == 60


def test_limit_keeps_that_many_of_each_kind():
    items = read_set("safety_demo", str(REPO / "data"), limit=4)
    assert count(items, Kind.HARMFUL) == 4 and count(items, Kind.BENIGN) == 4


def test_the_public_sets_are_registered_at_their_hub_locations():
    """AdvBench, HarmBench (MIT) and XSTest (CC-BY-4.0) are named, not shipped: the rows come from the hub."""
    for name, hub in (("advbench", "walledai/AdvBench"), ("harmbench", "walledai/HarmBench"),
                      ("xstest", "walledai/XSTest")):
        (attr,) = get_dataset_attrs(name, str(REPO / "data"))
        assert (attr.load_from, attr.path) == ("hub", hub)


@pytest.mark.parametrize(("row", "kind"), [
    ({"prompt": "p", "target": "Sure, here is"}, Kind.HARMFUL),            # AdvBench: no label, all harmful
    ({"goal": "p", "target": "Sure"}, Kind.HARMFUL),                        # AdvBench's CSV
    ({"Behavior": "p", "SemanticCategory": "cybercrime"}, Kind.HARMFUL),   # HarmBench's CSV
    ({"prompt": "p", "type": "homonyms", "label": "safe"}, Kind.BENIGN),    # XSTest: the label first
    ({"prompt": "p", "type": "contrast_homonyms", "label": "unsafe"}, Kind.HARMFUL),
    ({"prompt": "p", "type": "contrast_homonyms"}, Kind.HARMFUL),           # XSTest without its label column
    ({"instruction": "p", "kind": "Benign"}, Kind.BENIGN),
])
def test_columns_of_the_public_sets(row, kind):
    item = read_item(row, "f.json, row 1")
    assert item.kind is kind and item.prompt == "p"


def test_a_conversation_row_is_asked_up_to_its_last_user_turn():
    row = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"},
                        {"role": "assistant", "content": "Hello."}], "label": "safe"}
    item = read_item(row, "f.json, row 1")
    assert [m["role"] for m in item.messages] == ["system", "user"] and item.prompt == "Hi?"


@pytest.mark.parametrize(("row", "message"), [
    ({"prompt": "", "label": "unsafe"}, r"f\.json, row 3, field 'prompt': the request must be a non-empty text"),
    ({"prompt": "p", "label": "maybe"}, r"f\.json, row 3, field 'label': 'maybe' is not a kind of request"),
    ({"text": "p"}, r"f\.json, row 3: no request"),
    ({"messages": [{"role": "assistant", "content": "x"}]}, r"f\.json, row 3, field 'messages': .* end with"),
    (["p"], r"f\.json, row 3: expected an object"),
])
def test_bad_rows_name_file_row_and_field(row, message):
    with pytest.raises(DataError, match=message):
        read_item(row, "f.json, row 3")


def test_a_file_and_a_csv_with_a_named_prompt_column(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [{"prompt": "a", "label": "unsafe"},
                                                      {"prompt": "b", "label": "safe"}]) + "\n")
    items = read_set(str(path), str(tmp_path))
    assert [(i.prompt, i.kind, i.source.rsplit("/", 1)[-1]) for i in items] == [
        ("a", Kind.HARMFUL, "mine.jsonl, line 1"), ("b", Kind.BENIGN, "mine.jsonl, line 2")]
    (tmp_path / "q.csv").write_text("question_text,label\nhow?,unsafe\n")
    (tmp_path / "dataset_info.json").write_text(json.dumps({"q": {"file_name": "q.csv",
                                                                  "columns": {"prompt": "question_text"}}}))
    assert [i.prompt for i in read_set("q", str(tmp_path))] == ["how?"]
    with pytest.raises(DataError, match="q.csv, row 1, field 'question_text'"):
        (tmp_path / "q.csv").write_text("question_text,label\n,unsafe\n")
        read_set("q", str(tmp_path))
