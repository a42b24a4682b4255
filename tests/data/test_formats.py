from __future__ import annotations

import json
import logging

import pytest

from gym.config.data import DataArguments
from gym.core.errors import DataError
from gym.data.loader import get_dataset, load_examples
from gym.data.registry import get_dataset_attrs
from gym.data.templates import get_chat_format


def _examples(data_dir, name, kind="supervised"):
    (attr,) = get_dataset_attrs(name, data_dir)
    return load_examples(attr, kind)


def test_alpaca_becomes_user_then_assistant(data_dir):
    ex = _examples(data_dir, "tiny_alpaca")[0]
    assert ex.messages == [{"role": "user", "content": "Add 0 and 1."}, {"role": "assistant", "content": "0 + 1 = 1."}]
    assert ex.source.endswith("alpaca.json, row 1")


def test_alpaca_history_and_system(tmp_path):
    row = {"instruction": "And 3?", "input": "", "output": "9", "history": [["Square 2", "4"]], "system": "Be terse."}
    (tmp_path / "h.json").write_text(json.dumps([row]))
    (tmp_path / "dataset_info.json").write_text(json.dumps(
        {"h": {"file_name": "h.json", "columns": {"prompt": "instruction", "query": "input", "response": "output",
                                                   "history": "history", "system": "system"}}}))
    ex = _examples(tmp_path, "h")[0]
    assert [m["content"] for m in ex.messages] == ["Square 2", "4", "And 3?", "9"]
    assert ex.system == "Be terse."


def test_sharegpt_multi_turn(data_dir):
    ex = _examples(data_dir, "tiny_chat")[0]
    assert [m["role"] for m in ex.messages] == ["user", "assistant", "user", "assistant"]


def test_openai_messages_file_is_sniffed(tmp_path):
    rows = [{"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"},
                          {"role": "assistant", "content": "Hello"}]}]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (attr,) = get_dataset_attrs(str(path), tmp_path)
    ex = load_examples(attr, "supervised")[0]
    assert attr.formatting == "openai" and ex.system == "S" and len(ex.messages) == 2


@pytest.mark.parametrize(
    ("content", "suffix", "expected"),
    [
        ('[{"instruction": "a", "output": "b"}, {"instruction": "c", "output": 5}]', ".json",
         r"bad.json, row 2: field 'output' must be a string"),
        ('{"instruction": "a", "output": "b"}\n{"instruction": "c"}\n', ".jsonl",
         r"bad.jsonl, line 2: field 'output' is missing"),
        ('{"instruction": "a", "output": "b"}\n{"instruction": "c", "output": \n', ".jsonl",
         r"bad.jsonl, line 2: not valid JSON"),
        ('{"instruction": "a", "output": "b"}\n{"instruction": "c", "output": "d"\n', ".jsonl",
         r"bad.jsonl, line 2: not valid JSON \(column 35\): Expecting ',' delimiter"),  # where the row is cut off
        ("instruction,output\na,b\nc,\n", ".csv", r"bad.csv, row 2: field 'output' is empty"),
        ('[{"instruction": "a", "output": "b"}, "oops"]', ".json", r"bad.json, row 2: expected an object"),
    ],
)
def test_malformed_rows_name_file_row_and_field(tmp_path, content, suffix, expected):
    path = tmp_path / f"bad{suffix}"
    path.write_text(content)
    (attr,) = get_dataset_attrs(str(path), tmp_path)
    with pytest.raises(DataError, match=expected):
        load_examples(attr, "supervised")


def test_sharegpt_turns_must_alternate(tmp_path):
    rows = [{"conversations": [{"from": "human", "value": "a"}, {"from": "human", "value": "b"}]}]
    (tmp_path / "c.json").write_text(json.dumps(rows))
    (tmp_path / "dataset_info.json").write_text(json.dumps({"c": {"file_name": "c.json", "formatting": "sharegpt"}}))
    with pytest.raises(DataError, match=r"c.json, row 1: field 'conversations\[1\].from' is 'human'"):
        _examples(tmp_path, "c")


def test_unknown_dataset_suggests(data_dir):
    with pytest.raises(DataError, match="Did you mean 'tiny_alpaca'"):
        get_dataset_attrs("tiny_alpacca", data_dir)


def test_parquet_and_csv_read(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"instruction": "p", "output": "q"}]), tmp_path / "d.parquet")
    (tmp_path / "d.csv").write_text("instruction,output\nx,y\n")
    for name in ("d.parquet", "d.csv"):
        (attr,) = get_dataset_attrs(str(tmp_path / name), tmp_path)
        assert load_examples(attr, "supervised")[0].messages[-1]["role"] == "assistant"


def test_a_text_file_reads_like_llamafactorys_wiki_demo(tmp_path, tokenizer):
    """LLaMA-Factory's `"wiki_demo": {"file_name": "wiki_demo.txt", "columns": {"prompt": "text"}}`: one pt example
    per line (split as datasets' text builder splits: \\n, \\r\\n and \\r), blank lines skipped, the rest kept."""
    (tmp_path / "wiki.txt").write_bytes(b"First doc.\n\nSecond doc.\r\n   \n  Third, indented.\rFourth\n")
    (tmp_path / "dataset_info.json").write_text(json.dumps(
        {"wiki_demo": {"file_name": "wiki.txt", "columns": {"prompt": "text"}}}))
    (attr,) = get_dataset_attrs("wiki_demo", tmp_path)
    texts = [ex.messages[0]["content"] for ex in load_examples(attr, "unsupervised")]
    assert texts == ["First doc.", "Second doc.", "  Third, indented.", "Fourth"]
    data = get_dataset(DataArguments(dataset="wiki_demo", dataset_dir=str(tmp_path), cutoff_len=64),
                       get_chat_format(tokenizer), "unsupervised")
    assert data.stats["rows"] == 4 and len(data.train) == 4
    assert tokenizer.decode(data.train[1]["input_ids"], skip_special_tokens=True).strip() == "Second doc."


def test_text_files_as_paths_and_folders(tmp_path):
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("alpha\n")
    (tmp_path / "corpus" / "b.txt").write_text("beta\ngamma\n")
    (attr,) = get_dataset_attrs(str(tmp_path / "corpus" / "b.txt"), tmp_path)  # a bare file: sniffed as text
    assert [ex.messages[0]["content"] for ex in load_examples(attr, "unsupervised")] == ["beta", "gamma"]
    (attr,) = get_dataset_attrs(str(tmp_path / "corpus"), tmp_path)  # a folder of text files is a corpus
    assert [ex.messages[0]["content"] for ex in load_examples(attr, "unsupervised")] == ["alpha", "beta", "gamma"]
    # Notes beside structured rows are not data, as before .txt was read at all.
    (tmp_path / "rows").mkdir()
    (tmp_path / "rows" / "d.jsonl").write_text(json.dumps({"instruction": "p", "output": "q"}) + "\n")
    (tmp_path / "rows" / "README.txt").write_text("how this data was made\n")
    (attr,) = get_dataset_attrs(str(tmp_path / "rows"), tmp_path)
    assert len(load_examples(attr, "supervised")) == 1


def test_a_text_file_for_sft_names_the_missing_field(tmp_path):
    (tmp_path / "notes.txt").write_text("just text\n")
    (tmp_path / "dataset_info.json").write_text(json.dumps({"notes": {"file_name": "notes.txt"}}))
    (attr,) = get_dataset_attrs("notes", tmp_path)
    with pytest.raises(DataError, match=r"notes.txt, line 1: field 'instruction' is missing"):
        load_examples(attr, "supervised")


def test_everything_truncated_away_is_an_error_that_says_why(data_dir, tokenizer):
    chat = get_chat_format(tokenizer)
    args = DataArguments(dataset="tiny_alpaca", dataset_dir=str(data_dir), cutoff_len=8)
    with pytest.raises(DataError, match="cutoff_len=8"):
        get_dataset(args, chat, "supervised")


def test_val_size_holds_out_rows(data_dir, tokenizer):
    chat = get_chat_format(tokenizer)
    data = get_dataset(DataArguments(dataset="tiny_alpaca", dataset_dir=str(data_dir), val_size=0.25), chat,
                       "supervised")
    assert len(data.train) == 18 and len(data.eval) == 6


def test_shipped_demo_datasets_load(tokenizer):
    from pathlib import Path

    repo_data = Path(__file__).resolve().parents[2] / "data"
    chat = get_chat_format(tokenizer)
    for name, kind in [("alpaca_en_demo", "supervised"), ("identity", "supervised"), ("chat_en_demo", "supervised"),
                       ("pt_demo", "unsupervised"), ("wiki_demo", "unsupervised")]:
        data = get_dataset(DataArguments(dataset=name, dataset_dir=str(repo_data), cutoff_len=512), chat, kind)
        assert len(data.train) >= 30, name


def _entry(tmp_path, entry: dict, rows: list, name: str = "rows.json") -> None:
    (tmp_path / name).write_text(json.dumps(rows))
    (tmp_path / "dataset_info.json").write_text(json.dumps({"d": {"file_name": name, **entry}}))


ALPACA_ROW = {"instruction": "What is 1+1?", "input": "Answer briefly", "output": "2", "system": "You are terse.",
              "history": [["hi", "hello"]]}


@pytest.mark.parametrize("columns, misspelt, suggestion", [
    ({"prompt": "instruction", "query": "inptu", "response": "output"}, "'query' to the column 'inptu'", "input"),
    ({"system": "sytem"}, "'system' to the column 'sytem'", "system"),
    ({"history": "histroy"}, "'history' to the column 'histroy'", "history"),
])
def test_a_misspelt_column_is_refused_where_it_would_drop_a_field_from_every_row(tmp_path, columns, misspelt,
                                                                                  suggestion):
    _entry(tmp_path, {"columns": columns}, [ALPACA_ROW])
    with pytest.raises(DataError, match=rf"maps {misspelt}, which no row has\. Did you mean '{suggestion}'\?"):
        _examples(tmp_path, "d")


def test_a_column_only_later_rows_have_is_read_and_a_usual_name_may_be_absent(tmp_path):
    rows = [{"instruction": "a", "output": "b"}, {"instruction": "c", "output": "d", "sys": "Be brief."}]
    _entry(tmp_path, {"columns": {"system": "sys", "query": "input"}}, rows)  # `input`: the usual name, in no row
    assert [ex.system for ex in _examples(tmp_path, "d")] == [None, "Be brief."]


def test_a_misspelt_kto_tag_column_is_named_as_missing_not_as_a_bad_value(tmp_path):
    rows = [{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "label": True}]
    _entry(tmp_path, {"formatting": "openai", "columns": {"kto_tag": "lable"}}, rows)
    with pytest.raises(DataError, match=r"maps 'kto_tag' to the column 'lable', which no row has\. Did you mean "
                                        r"'label'\?"):
        _examples(tmp_path, "d", kind="feedback")


def test_a_bare_alpaca_file_keeps_its_system_prompt_and_history(tmp_path):
    path = tmp_path / "alp.json"
    path.write_text(json.dumps([ALPACA_ROW]))
    (attr,) = get_dataset_attrs(str(path), tmp_path)
    example = load_examples(attr, "supervised")[0]
    assert example.system == "You are terse."
    assert [m["content"] for m in example.messages] == ["hi", "hello", "What is 1+1?\nAnswer briefly", "2"]


def test_num_samples_draws_at_random_every_row_once_before_any_twice(tmp_path):
    rows = [{"instruction": f"q{i}", "output": f"a{i}"} for i in range(20)]
    _entry(tmp_path, {"num_samples": 5}, rows)
    (attr,) = get_dataset_attrs("d", tmp_path)

    def drawn(**options) -> list[str]:
        return [ex.messages[0]["content"] for ex in load_examples(attr, "supervised", **options)]

    five = drawn(seed=1)
    assert len(set(five)) == 5 and five != [f"q{i}" for i in range(5)]  # a random subset, not the first rows
    assert drawn(seed=1) == five and drawn(seed=2) != five  # the run's seed decides
    assert drawn(seed=1, max_samples=2) == five[:2]  # max_samples then keeps the first of them
    attr.num_samples = 45
    many = drawn(seed=1)
    assert len(many) == 45 and set(many) == {f"q{i}" for i in range(20)}  # all 20, then 25 drawn again


@pytest.mark.parametrize("entry, message", [
    ({"ranking": "false"}, r"'d'\.ranking must be true or false \(without quotes\), got 'false'"),
    ({"num_samples": "5"}, r"'d'\.num_samples must be a whole number of at least 1, got '5'"),
    ({"num_samples": 0}, r"'d'\.num_samples must be a whole number of at least 1, got 0"),
    ({"file_name": 5}, r"'d'\.file_name must be a non-empty string, got 5"),  # was a TypeError traceback
    ({"split": ["train"]}, r"'d'\.split must be a non-empty string, got \['train'\]"),
    ({"columns": {"prompt": 5}}, r"'d'\.columns\.prompt must be a column's name \(a string\), "
     "or null for none, got 5"),
    ({"formatting": "sharegpt", "tags": {"role_tag": None}},
     r"'d'\.tags\.role_tag must be a non-empty string, got None"),
])
def test_entry_values_of_the_wrong_type_are_refused(tmp_path, entry, message):
    _entry(tmp_path, entry, [ALPACA_ROW])
    with pytest.raises(DataError, match=message):
        get_dataset_attrs("d", tmp_path)


@pytest.mark.parametrize("split, message", [
    ("test", r"'d'\.split is 'test', but a local file \(file_name\) has only the train split; remove 'split'"),
    ("train[:10]", r"'d'\.split is 'train\[:10\]': slicing a local file's rows is not supported"),
])
def test_a_local_file_has_only_the_train_split(tmp_path, split, message):
    """LLaMA-Factory fails on such an entry (datasets: "Unknown split"); reading it whole trained on every row."""
    _entry(tmp_path, {"split": split}, [ALPACA_ROW])
    with pytest.raises(DataError, match=message):
        get_dataset_attrs("d", tmp_path)
    _entry(tmp_path, {"split": "train"}, [ALPACA_ROW])
    assert get_dataset_attrs("d", tmp_path)[0].split == "train"


def test_a_subset_on_a_local_file_warns_that_it_has_no_effect(tmp_path, caplog):
    """LLaMA-Factory passes no subset to a local file's loader, so an entry with one still runs there: a warning,
    not an error. On a hub dataset it chooses the configuration, and nothing is said."""
    _entry(tmp_path, {"subset": "en"}, [ALPACA_ROW])
    with caplog.at_level(logging.WARNING, logger="gym.data.registry"):
        get_dataset_attrs("d", tmp_path)
    assert "'d'.subset ('en') has no effect on a local file" in caplog.text
    caplog.clear()
    (tmp_path / "dataset_info.json").write_text(json.dumps({"h": {"hf_hub_url": "org/set", "subset": "en"}}))
    with caplog.at_level(logging.WARNING, logger="gym.data.registry"):
        assert get_dataset_attrs("h", tmp_path)[0].subset == "en"
    assert "subset" not in caplog.text


@pytest.mark.parametrize("kind", ["unsupervised", "labelled"])
def test_preference_pairs_are_refused_for_plain_text_and_classifier_stages_too(tmp_path, kind):
    _entry(tmp_path, {"ranking": True, "columns": {"chosen": "chosen", "rejected": "rejected"}},
           [{"instruction": "q", "chosen": "a", "rejected": "b"}])
    with pytest.raises(DataError, match=r"holds preference pairs .* train it with a preference stage"):
        _examples(tmp_path, "d", kind=kind)


def test_an_empty_last_answer_in_a_conversation_is_refused_as_an_empty_output_is(tmp_path):
    rows = [{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": " "}]}]
    _entry(tmp_path, {"formatting": "sharegpt"}, rows)
    with pytest.raises(DataError, match=r"rows.json, row 1: field 'conversations\[1\].value' is empty"):
        _examples(tmp_path, "d")


def test_plain_text_rows_in_an_entry_without_columns_are_told_how_to_map_them(tmp_path):
    _entry(tmp_path, {}, [{"text": "Some text."}])
    with pytest.raises(DataError, match=r"field 'instruction' is missing \(the row's keys: 'text'\)\. For plain "
                                        r"text, map it in dataset_info.json: `\"columns\": \{\"prompt\": \"text\"\}`"):
        _examples(tmp_path, "d", kind="unsupervised")


def test_a_json_array_under_a_jsonl_name_is_read(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps([{"instruction": "a", "output": "b"}, {"instruction": "c", "output": "d"}], indent=2))
    (attr,) = get_dataset_attrs(str(path), tmp_path)
    examples = load_examples(attr, "supervised")
    assert [ex.messages[1]["content"] for ex in examples] == ["b", "d"] and examples[1].source.endswith("row 2")


@pytest.mark.parametrize("messages, message", [
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
     r"field 'messages\[0\]' has no 'from' key \(its keys: 'role', 'content'\); say which keys hold the role"),
    ([{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}, {"from": "system", "value": "s"},
      {"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}],
     r"field 'messages\[2\]\.from' is a system message after the first"),
])
def test_role_problems_say_what_is_wrong(tmp_path, messages, message):
    _entry(tmp_path, {"formatting": "sharegpt", "columns": {"messages": "messages"}}, [{"messages": messages}])
    with pytest.raises(DataError, match=message):
        _examples(tmp_path, "d")


def test_a_demo_set_asked_for_away_from_the_repository_says_where_the_demo_sets_are(tmp_path):
    with pytest.raises(DataError, match=r"No dataset_info.json in '.*nowhere' \(the demo sets are in the repository's "
                                        r"data/ folder"):
        get_dataset_attrs("alpaca_en_demo", tmp_path / "nowhere")


@pytest.mark.parametrize("suffix, encoding", [
    (".json", "utf-8-sig"), (".jsonl", "utf-8-sig"), (".csv", "utf-8-sig"), (".json", "utf-16"), (".csv", "utf-16"),
    (".jsonl", "utf-32"),
])
def test_files_with_a_byte_order_mark_are_read_without_it(tmp_path, suffix, encoding):
    """Excel's "CSV UTF-8" and Windows editors start a file with a byte-order mark: read as plain UTF-8 it made the
    first column '\\ufeffinstruction' (so 'instruction' was "missing") and JSON invalid."""
    rows = [{"instruction": "p", "output": "q"}, {"instruction": "ü", "output": "ß"}]
    text = {".json": json.dumps(rows, ensure_ascii=False), ".jsonl": "\n".join(json.dumps(r) for r in rows),
            ".csv": "instruction,output\np,q\nü,ß\n"}[suffix]
    (tmp_path / f"d{suffix}").write_bytes(text.encode(encoding))
    (tmp_path / "dataset_info.json").write_bytes(json.dumps({"d": {"file_name": f"d{suffix}"}}).encode("utf-8-sig"))
    (attr,) = get_dataset_attrs("d", tmp_path)
    assert [ex.messages for ex in load_examples(attr, "supervised")] == [
        [{"role": "user", "content": "p"}, {"role": "assistant", "content": "q"}],
        [{"role": "user", "content": "ü"}, {"role": "assistant", "content": "ß"}]]


def test_a_text_file_with_a_byte_order_mark_does_not_train_on_it(tmp_path, tokenizer):
    (tmp_path / "w.txt").write_bytes("first line\nsecond line\n".encode("utf-8-sig"))
    (attr,) = get_dataset_attrs(str(tmp_path / "w.txt"), tmp_path)
    assert [ex.messages[0]["content"] for ex in load_examples(attr, "unsupervised")] == ["first line", "second line"]


def test_arrow_files_and_folders_save_to_disk_wrote_are_read(tmp_path):
    """LLaMA-Factory reads .arrow files; a `Dataset.save_to_disk` folder was read as rows from its dataset_info.json
    and state.json ("field 'instruction' is missing (the row's keys: 'citation', ...")."""
    import datasets
    import pyarrow as pa
    import pyarrow.feather as feather

    rows = [{"instruction": f"q{i}", "output": f"a{i}"} for i in range(3)]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"), num_shards=2)
    feather.write_feather(pa.Table.from_pylist(rows), str(tmp_path / "f.arrow"))  # pyarrow's file format
    (tmp_path / "dataset_info.json").write_text(json.dumps({"saved": {"file_name": "saved"},
                                                            "shard": {"file_name": "saved/data-00001-of-00002.arrow"},
                                                            "feather": {"file_name": "f.arrow"}}))
    prompts = {name: [ex.messages[0]["content"] for ex in _examples(tmp_path, name)]
               for name in ("saved", "shard", "feather")}
    assert prompts == {"saved": ["q0", "q1", "q2"], "shard": ["q2"], "feather": ["q0", "q1", "q2"]}
    (tmp_path / "broken.arrow").write_bytes(b"not arrow")
    with pytest.raises(DataError, match=r"broken.arrow: not a readable Arrow file"):
        _examples(tmp_path, str(tmp_path / "broken.arrow"))


def test_a_glob_reads_the_matching_files_in_name_order(tmp_path):
    (tmp_path / "shards").mkdir()
    for i in (2, 0, 1):
        (tmp_path / "shards" / f"part-{i}.jsonl").write_text(json.dumps({"instruction": f"q{i}", "output": "a"}))
    (tmp_path / "shards" / "notes.jsonl.bak").write_text("not data")
    (tmp_path / "dataset_info.json").write_text(json.dumps({"g": {"file_name": "shards/part-*.jsonl"},
                                                            "none": {"file_name": "shards/*.csv"}}))
    for name in ("g", "shards/part-*.jsonl", str(tmp_path / "shards" / "*.jsonl")):  # an entry, or a bare pattern
        assert [ex.messages[0]["content"] for ex in _examples(tmp_path, name)] == ["q0", "q1", "q2"]
    with pytest.raises(DataError, match=r"shards/\*\.csv matches no .json/.jsonl/.csv"):
        _examples(tmp_path, "none")


@pytest.mark.parametrize("formatting, rows", [("alpaca", [ALPACA_ROW]),
                                              ("sharegpt", [{"conversations": [{"from": "human", "value": "a"}]}])])
def test_rows_in_a_list_under_a_key_are_pointed_out(tmp_path, formatting, rows):
    """`{"data": [rows]}` is read as one row (as `datasets` reads it without `field=`): the error said only that
    the row lacked 'instruction'."""
    _entry(tmp_path, {"formatting": formatting}, {"data": rows}, name="d.json")
    with pytest.raises(DataError, match=r"d.json, row 1: field '(instruction|conversations)' is missing \(the row's "
                                        r"keys: 'data'\): the file is one JSON object holding its rows in a list under "
                                        r"'data'\. A \.json dataset is an array of rows"):
        _examples(tmp_path, "d")
