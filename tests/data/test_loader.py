"""The pipeline's steps between reading rows and tokenizing them: mixing several datasets, the evaluation split."""

from __future__ import annotations

import json

import pytest

from gym.config.data import DataArguments
from gym.config.parser import get_train_args
from gym.core.errors import ConfigError, DataError
from gym.data.loader import get_dataset, mix
from gym.data.templates import get_chat_format


@pytest.mark.parametrize("strategy", ["interleave_under", "interleave_over"])
@pytest.mark.parametrize("probs", [None, [0.2, 0.5, 0.3], [0.7, 0.2, 0.1]])
@pytest.mark.parametrize("seed", [0, 42])
def test_interleaving_draws_the_rows_datasets_interleave_datasets_draws(strategy, probs, seed):
    """LLaMA-Factory mixes with datasets.interleave_datasets: the same config picks the same rows here."""
    import datasets

    parts = [[f"a{i}" for i in range(3)], [f"b{i}" for i in range(2)], [f"c{i}" for i in range(4)]]
    theirs = datasets.interleave_datasets(
        [datasets.Dataset.from_dict({"x": part}) for part in parts], probabilities=probs, seed=seed,
        stopping_strategy="first_exhausted" if strategy == "interleave_under" else "all_exhausted")["x"]
    assert mix(parts, strategy, probs, seed) == theirs  # type: ignore[arg-type]


def _two_datasets(folder):
    (folder / "a.json").write_text(json.dumps([{"instruction": f"a{i}", "output": "x"} for i in range(2)]))
    (folder / "b.json").write_text(json.dumps([{"instruction": f"b{i}", "output": "x"} for i in range(5)]))
    (folder / "dataset_info.json").write_text(json.dumps({"a": {"file_name": "a.json"}, "b": {"file_name": "b.json"}}))
    return folder


@pytest.mark.parametrize("strategy, first_words", [
    ("concat", ["a0", "a1", "b0", "b1", "b2", "b3", "b4"]),
    ("interleave_under", ["a0", "b0", "a1", "b1"]),
    ("interleave_over", ["a0", "b0", "a1", "b1", "a0", "b2", "a1", "b3", "a0", "b4"]),
])
def test_mix_strategy_decides_which_rows_train(tmp_path, tokenizer, strategy, first_words):
    chat = get_chat_format(tokenizer, "chatml")
    args = get_train_args({"dataset": "a,b", "dataset_dir": str(_two_datasets(tmp_path)), "mix_strategy": strategy,
                           "streaming": True, "buffer_size": 128, "max_steps": 5})
    train = get_dataset(args.data, chat, "supervised").train
    prompts = [tokenizer.decode(row["input_ids"]).split("user\n")[1].split("<|im_end|>")[0] for row in train]
    assert prompts == first_words


@pytest.mark.parametrize("config, match", [
    ({"interleave_probs": "0.5,0.5"}, "'interleave_probs' applies to mix_strategy: interleave_under or"),
    ({"mix_strategy": "interleave_under", "interleave_probs": "0.5,0.3"}, "summing to 1, got \\[0.5, 0.3\\]"),
    ({"mix_strategy": "interleave_under", "interleave_probs": "0.5,0.5,0"}, "3 chances and 'dataset' names 2"),
    ({"mix_strategy": "interleave_over", "interleave_probs": "1,0"}, "never drawn and interleave_over .* never end"),
    ({"mix_strategy": "interleave_under", "interleave_probs": "0.5,0.5", "eval_dataset": "a,b,a"},
     "'eval_dataset' names 3"),
    ({"mix_strategy": "interleve_under"}, "Did you mean 'interleave_under'"),
])
def test_a_mix_that_cannot_work_is_refused_when_the_config_is_read(config, match):
    with pytest.raises(ConfigError, match=match):
        get_train_args({"dataset": "a,b", **config})


def test_interleave_probs_are_read_as_llamafactory_writes_them():
    data = get_train_args({"dataset": "a,b", "mix_strategy": "interleave_over", "interleave_probs": "0.7, 0.3",
                           "eval_dataset": "c"}).data
    assert data.interleave_probs == [0.7, 0.3]
    assert DataArguments().mix_strategy == "concat"


def test_an_evaluation_set_truncated_to_nothing_is_refused_before_training(tmp_path, tokenizer):
    """It was returned empty, and the run failed or reported no evaluation only after training."""
    _two_datasets(tmp_path)
    (tmp_path / "long.json").write_text(json.dumps([{"instruction": "word " * 100, "output": "x"}] * 2))
    (tmp_path / "dataset_info.json").write_text(json.dumps({"a": {"file_name": "a.json"},
                                                            "long": {"file_name": "long.json"}}))
    chat = get_chat_format(tokenizer, "chatml")
    args = DataArguments(dataset="a", eval_dataset="long", dataset_dir=str(tmp_path), cutoff_len=32)
    with pytest.raises(DataError, match="all 2 rows of eval_dataset 'long' were dropped: no answer token to learn "
                                        "fits .* cutoff_len=32"):
        get_dataset(args, chat, "supervised")
    with pytest.raises(DataError, match="all 2 rows were dropped: no prompt leaves room for a generated answer"):
        get_dataset(DataArguments(dataset="long", dataset_dir=str(tmp_path), cutoff_len=32), chat, "prompt")
