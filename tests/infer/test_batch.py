"""`gym infer`: batch answers equal one-at-a-time answers, the output is resumable, and bad input exits 2."""

from __future__ import annotations

import json

import pytest

from gym.cli import main
from gym.infer.batch import load_rows, run_infer
from gym.infer.chat import ChatModel

GREEDY = {"do_sample": False, "max_new_tokens": 6}


@pytest.fixture()
def config(tiny_model_dir):
    return {"model_name_or_path": str(tiny_model_dir), **GREEDY}


def test_batched_answers_equal_answers_one_at_a_time(config, data_dir, tmp_path):
    rows = load_rows("tiny_alpaca,tiny_chat", str(data_dir), max_samples=3)
    assert rows[0]["reference"] == "0 + 1 = 1." and rows[3]["messages"][-1]["role"] == "user"
    out = tmp_path / "batched.jsonl"
    # Prompts of different lengths decoded together: left padding must not change any answer.
    run_infer(config, "tiny_alpaca,tiny_chat", out, str(data_dir), batch_size=3, max_samples=3, progress=False)
    batched = [json.loads(line)["prediction"] for line in out.read_text().splitlines()]
    model = ChatModel(config)
    try:
        alone = [model.chat(row["messages"], row["system"]).strip() for row in rows]
    finally:
        model.close()
    assert len(batched) == 6 and batched == alone


def test_sampled_rows_do_not_depend_on_their_batch(tiny_model_dir, data_dir, tmp_path):
    """Row i samples with seed + i: the same answers whether rows run 1 or 4 at a time."""
    config = {"model_name_or_path": str(tiny_model_dir), "do_sample": True, "temperature": 1.0, "max_new_tokens": 6}
    answers = []
    for batch_size in (1, 4):
        out = tmp_path / f"sampled-{batch_size}.jsonl"
        run_infer(config, "tiny_alpaca", out, str(data_dir), batch_size=batch_size, max_samples=5, progress=False)
        answers.append([json.loads(line)["prediction"] for line in out.read_text().splitlines()])
    assert answers[0] == answers[1] and len(set(answers[0])) > 1


def test_output_lines_and_resume(config, data_dir, tmp_path):
    out = tmp_path / "preds.jsonl"
    run_infer(config, "tiny_alpaca", out, str(data_dir), batch_size=4, max_samples=6, progress=False)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["index"] for line in lines] == list(range(6))
    assert lines[2]["messages"] == [{"role": "user", "content": "Add 2 and 3."}]
    assert lines[2]["reference"] == "2 + 3 = 5." and isinstance(lines[2]["prediction"], str)

    # An interrupted run: two rows done, the third cut off mid-line.
    text = out.read_text().splitlines(keepends=True)
    out.write_text("".join(text[:2]) + text[2][:15])
    run_infer(config, "tiny_alpaca", out, str(data_dir), batch_size=4, max_samples=6, progress=False)
    resumed = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(line["index"] for line in resumed) == list(range(6))
    assert resumed[:2] == lines[:2]
    assert {r["index"]: r["prediction"] for r in resumed} == {r["index"]: r["prediction"] for r in lines}


def test_prompt_only_rows_use_the_answer_column(tmp_path):
    (tmp_path / "q.jsonl").write_text(json.dumps({"instruction": "What is 2 + 2?", "answer": "4"}) + "\n")
    (row,) = load_rows(str(tmp_path / "q.jsonl"), str(tmp_path), None)
    assert row["messages"] == [{"role": "user", "content": "What is 2 + 2?"}] and row["reference"] == "4"


def test_cli(tiny_model_dir, data_dir, tmp_path, capsys):
    out = tmp_path / "cli.jsonl"
    args = ["infer", "--model_name_or_path", str(tiny_model_dir), "--max_new_tokens", "4", "--dataset", "tiny_chat",
            "--dataset_dir", str(data_dir), "-o", str(out), "--batch_size", "3"]
    assert main(args) == 0
    assert len(out.read_text().splitlines()) == 8 and f"Wrote {out}" in capsys.readouterr().out
    assert main(["infer", "--model_name_or_path", str(tiny_model_dir), "-o", str(out)]) == 2
    assert "needs --dataset" in capsys.readouterr().err
    assert main(["infer", "--dataset", "nope", "--dataset_dir", str(data_dir), "-o", str(tmp_path / "x.jsonl")]) == 2
    assert "Dataset 'nope' not found" in capsys.readouterr().err and not (tmp_path / "x.jsonl").exists()


def test_cli_samples_with_the_configs_seed_and_reads_its_dataset_dir(tiny_model_dir, data_dir, tmp_path, capsys):
    # The config's dataset_dir, as `gym train` reads it; `seed=` chooses the draws (row i: seed + i).
    def answers(name: str, *keys: str) -> list[str]:
        out = tmp_path / f"{name}.jsonl"
        args = ["infer", "--model_name_or_path", str(tiny_model_dir), "--dataset", "tiny_alpaca", "--max_samples", "4",
                "-o", str(out), f"dataset_dir={data_dir}", "do_sample=true", "temperature=1.0", "max_new_tokens=6",
                *keys]
        assert main(args) == 0, capsys.readouterr().err
        return [json.loads(line)["prediction"] for line in out.read_text().splitlines()]

    first, again, other = answers("s1", "seed=1"), answers("s1-again", "seed=1"), answers("s2", "seed=2")
    assert first == again and first != other
    assert main(["infer", "--model_name_or_path", str(tiny_model_dir), "--dataset", "tiny_alpaca", "-o",
                 str(tmp_path / "bad.jsonl"), f"dataset_dir={data_dir}", "seed=-1"]) == 2
    assert "seed must be a whole number of at least 0, got -1" in capsys.readouterr().err


def test_a_mistyped_chat_command_is_named_and_not_sent(tiny_model_dir, capsys, monkeypatch):
    from gym.cli.chat import _interactive

    model = ChatModel({"model_name_or_path": str(tiny_model_dir), **GREEDY})
    lines = iter(["/exti", "/exit"])
    monkeypatch.setattr("builtins.input", lambda prompt: next(lines))
    try:
        assert _interactive(model) == 0
    finally:
        model.close()
    out = capsys.readouterr().out
    assert "Unknown command /exti. Did you mean '/exit'?" in out and "Assistant:" not in out


def test_gym_chat_with_a_seed_answers_the_same_twice(tiny_model_dir, capsys):
    def answer(seed: int) -> str:
        assert main(["chat", "--model_name_or_path", str(tiny_model_dir), "--prompt", "Hello", "do_sample=true",
                     "temperature=1.0", "max_new_tokens=8", f"seed={seed}"]) == 0
        return capsys.readouterr().out

    assert answer(3) == answer(3) != answer(4)


@pytest.mark.parametrize("content", ['{"a": 1}\n{"b": 2}\nplain notes\n', "user data", None])
def test_an_output_that_is_not_an_earlier_runs_is_refused_untouched(content, config, data_dir, tmp_path):
    # Resuming dropped every line that was not a row: a user's file named by -o was emptied, with exit 0.
    from gym.core.errors import DataError

    out = tmp_path / "notes.jsonl"
    if content is None:
        out.mkdir()
    else:
        out.write_text(content)
    with pytest.raises(DataError, match="is a folder" if content is None else "is not a gym infer row"):
        run_infer(config, "tiny_alpaca", out, str(data_dir), max_samples=2, progress=False)
    assert out.is_dir() if content is None else out.read_text() == content


@pytest.mark.parametrize("max_samples", [0, -1])
def test_max_samples_below_one_is_named(max_samples, config, data_dir, tmp_path):
    # It was refused as "Dataset 'tiny_alpaca' has no rows", which sent the user to a dataset with 24.
    from gym.core.errors import DataError

    with pytest.raises(DataError, match=rf"--max_samples must be at least 1.*got {max_samples}\."):
        run_infer(config, "tiny_alpaca", tmp_path / "preds.jsonl", str(data_dir), max_samples=max_samples,
                  progress=False)


def test_resuming_into_another_datasets_output_is_refused_untouched(config, data_dir, tmp_path):
    # Rows were known by index alone: -o naming tiny_alpaca's predictions for tiny_chat answered nothing, kept
    # alpaca's answers as the chat rows', and exited 0.
    from gym.core.errors import DataError

    out = tmp_path / "preds.jsonl"
    run_infer(config, "tiny_alpaca", out, str(data_dir), batch_size=2, max_samples=2, progress=False)
    before = out.read_text()
    with pytest.raises(DataError, match="answers another dataset: line 1 \\(row 0\\)"):
        run_infer(config, "tiny_chat", out, str(data_dir), max_samples=2, progress=False)
    assert out.read_text() == before
    # the same dataset with more rows resumes, and rows a larger --max_samples answered are kept
    run_infer(config, "tiny_alpaca", out, str(data_dir), batch_size=2, max_samples=3, progress=False)
    run_infer(config, "tiny_alpaca", out, str(data_dir), batch_size=2, max_samples=1, progress=False)
    assert [json.loads(line)["index"] for line in out.read_text().splitlines()] == [0, 1, 2]
    assert out.read_text().startswith(before)


def test_an_output_under_a_file_is_one_line(tiny_model_dir, data_dir, tmp_path, capsys):
    # mkdir raised FileExistsError with a traceback, after the dataset was read.
    (tmp_path / "notes").write_text("mine")
    args = ["infer", "--model_name_or_path", str(tiny_model_dir), "--dataset", "tiny_alpaca", "--dataset_dir",
            str(data_dir), "-o", str(tmp_path / "notes" / "preds.jsonl")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "its parent" in err and "is a file" in err and "Traceback" not in err
    assert (tmp_path / "notes").read_text() == "mine"


def test_a_batch_size_above_the_rows_is_the_rows(config, data_dir, tmp_path):
    # The engine sized its KV cache by --batch_size: 10**11 on three rows asked for petabytes and crashed.
    out = tmp_path / "preds.jsonl"
    run_infer(config, "tiny_alpaca", out, str(data_dir), batch_size=10**11, max_samples=3, progress=False)
    assert [json.loads(line)["index"] for line in out.read_text().splitlines()] == [0, 1, 2]
