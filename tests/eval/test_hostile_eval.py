"""Issue #39, `gym eval`: hostile task files and result files end in one `gym: error:` line and exit status 2,
and `--compare` on tens of thousands of paired items answers at once."""

from __future__ import annotations

import json
import math
import re
import time

import pytest

from gym.cli import main
from gym.core.errors import DataError
from gym.eval.mc import LETTERS, read_items
from gym.eval.results import EXACT_BELOW, _binomial_two_sided, compare, mcnemar, significance

# ---------------------------------------------------------------- McNemar on many items


def _paired(path, accs):
    samples = [{"source": f"row {i}", "acc": a} for i, a in enumerate(accs)]
    result = {"metrics": {"acc": sum(accs) / len(accs), "acc_stderr": 0.01}, "items": len(accs), "samples": samples}
    path.write_text(json.dumps({"results": {"t": result}}))
    return result


def test_compare_on_60000_paired_items_takes_under_a_second(tmp_path, capsys):
    n = 60_000
    a = [1.0 if i % 2 else 0.0 for i in range(n)]  # 30,000 right
    b = [1.0 if i % 3 else 0.0 for i in range(n)]  # 40,000 right: 15,000 + 25,000 discordant items
    _paired(tmp_path / "a.json", a)
    _paired(tmp_path / "b.json", b)
    started = time.perf_counter()
    assert main(["eval", "--compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    assert time.perf_counter() - started < 1.0  # reading both files included; the exact sum took minutes
    out = capsys.readouterr().out
    assert "McNemar chi-square *" in out and "+0.1667" in out


@pytest.mark.parametrize(("only_a", "only_b", "expected"), [
    # scipy.stats.chi2.sf(max(|b - c| - 1, 0) ** 2 / (b + c), 1), computed once with scipy 1.17
    (30, 10, 0.002663119259138558), (100, 130, 0.055850113675743426), (15000, 15400, 0.022112960856908098),
    (20, 5, 0.005110260660855866), (13, 12, 1.0), (200, 200, 1.0),
])
def test_mcnemar_above_25_discordant_items_is_the_corrected_chi_square(only_a, only_b, expected):
    assert only_a + only_b >= EXACT_BELOW
    p, test = mcnemar(only_a, only_b)
    assert test == "McNemar chi-square" and p == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("n", range(0, EXACT_BELOW))
def test_mcnemar_below_25_is_the_exact_binomial(n):
    for only_a in range(n + 1):
        k = min(only_a, n - only_a)
        exact = 1.0 if n == 0 else min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n)
        assert mcnemar(only_a, n - only_a) == (pytest.approx(exact, rel=1e-12), "McNemar exact")
        assert _binomial_two_sided(only_a, n) == pytest.approx(exact, rel=1e-12)


def test_the_switch_keeps_small_samples_exact_through_significance():
    a = {"metrics": {"acc": 0.5}, "samples": [{"source": i, "acc": float(i < 10)} for i in range(20)]}
    b = {"metrics": {"acc": 1.0}, "samples": [{"source": i, "acc": 1.0} for i in range(20)]}
    assert significance(a, b, "acc") == (pytest.approx(2 / 2 ** 10), "McNemar exact")


# ---------------------------------------------------------------- result files that are not one

GOOD = {"results": {"t": {"metrics": {"acc": 0.5, "acc_stderr": 0.1},
                          "samples": [{"source": "r1", "acc": 1.0}, {"source": "r2", "acc": 0.0}]}}}


def _with(**result) -> dict:
    return {"results": {"t": {**GOOD["results"]["t"], **result}}}


BROKEN = {
    "an_int": (b"7", "it has no 'results'"),
    "a_list": (b"[1, 2]", "it has no 'results'"),
    "results_a_list": (b'{"results": [1]}', "results: expected an object of {task: result}, got list"),
    "a_binary_file": (b"\x89PNG\r\n\x1a\n\x00\xff\xfe", "not JSON text"),
    "stderr_a_string": (json.dumps(_with(metrics={"acc": 0.5, "acc_stderr": "0.1"})).encode(),
                        "results.t.metrics.acc_stderr: a standard error is a number or null, got '0.1'"),
    "samples_of_ints": (json.dumps(_with(samples=[1, 2])).encode(),
                        "results.t.samples[0]: expected an object (one item's scores), got int 1"),
    "samples_an_object": (json.dumps(_with(samples={"r1": 1})).encode(),
                          "results.t.samples: expected a list (one object per item), got dict"),
    "a_result_a_string": (json.dumps({"results": {"t": "acc 0.5"}}).encode(),
                          "results.t: expected an object with 'metrics'"),
    "metrics_a_list": (json.dumps(_with(metrics=[0.5])).encode(), "results.t: expected an object with 'metrics'"),
    "too_many_digits": (b'{"results": {"t": {"metrics": {"acc": 1' + b"0" * 5000 + b"}}}}", "not JSON text"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_compare_refuses_what_is_not_a_result_file(tmp_path, capsys, case):
    content, fragment = BROKEN[case]
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(GOOD))
    bad.write_bytes(content)
    for pair in ([str(good), str(bad)], [str(bad), str(good)]):
        assert main(["eval", "--compare", *pair]) == 2
        err = capsys.readouterr().err
        assert err.count("gym: error:") == 1 and "Traceback" not in err
        assert f"{bad}" in err and fragment in err


def test_compare_refuses_a_folder(tmp_path, capsys):
    (tmp_path / "good.json").write_text(json.dumps(GOOD))
    assert main(["eval", "--compare", str(tmp_path / "good.json"), str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("gym: error:") == 1 and f"{tmp_path} is a folder" in err


def test_samples_with_odd_scores_are_left_out_of_the_pairing(tmp_path):
    a = _with(samples=[{"source": "r1", "acc": "yes"}, {"source": "r2", "loss": None, "nll": "x", "tokens": 0}])
    b = _with(samples=[{"source": "r1", "acc": 1.0}, {"source": "r2", "acc": 0.0}])
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    text = compare(str(tmp_path / "a.json"), str(tmp_path / "b.json"))
    assert "acc" in text and " z" in text  # the items do not pair, so the standard errors decide


# ---------------------------------------------------------------- task files that are not one

def _mc(tmp_path, rows, name="quiz.json"):
    (tmp_path / name).write_text(json.dumps(rows))
    return f"mc:{tmp_path / name}"


def _row(choices, answer=0):
    return {"question": "Which one?", "choices": choices, "answer": answer}


@pytest.mark.parametrize(("rows", "fragment"), [
    ([_row(["a", "b"]), _row(["", ""])], "quiz.json, row 2, field 'choices': choice A is empty"),
    ([_row(["a", "  "])], "quiz.json, row 1, field 'choices': choice B is '  '"),
    ([_row(["a", None])], "quiz.json, row 1, field 'choices': choice B is empty"),
    ([_row(["a", {"text": "b"}])], "quiz.json, row 1, field 'choices': choice B is {'text': 'b'}"),
    ([_row([f"c{i}" for i in range(27)])], "quiz.json, row 1, field 'choices': 27 choices; at most 26 (A-Z)"),
    ([{"question": "Which?", "A": "x", "B": "", "answer": "A"}], "quiz.json, row 1, columns A-B: choice B is empty"),
    ([_row(["a", "b"], answer=True)],
     "quiz.json, row 1, field 'answer': expected a letter (A-B) or a 0-based index (0-1), got True (bool)"),
    ([_row(["a", "b"], answer=None)], "got None (NoneType)"),
    ([_row(["a", "b"], answer=2.0)], "got 2.0 (float)"),
    ([{"question": "Which?", "A": "x", "B": "y", "D": "z", "answer": "A"}],
     "quiz.json, row 1: column C is missing but D is there"),
])
def test_bad_multiple_choice_rows_name_file_row_and_field(tmp_path, rows, fragment):
    with pytest.raises(DataError, match=re.escape(fragment)):
        read_items(_mc(tmp_path, rows)[3:], str(tmp_path))


def test_eleven_choices_and_more_are_scored(tiny_model_dir, tmp_path):
    rows = [_row([f"option {i}" for i in range(n)], answer=n - 1) for n in (11, 26)]
    out = tmp_path / "r.json"
    assert main(["eval", f"model_name_or_path={tiny_model_dir}", "--task", _mc(tmp_path, rows), "--n_shot", "0",
                 "-o", str(out), "--log_samples"]) == 0
    samples = next(iter(json.loads(out.read_text())["results"].values()))["samples"]
    assert [s["answer"] for s in samples] == ["K", "Z"] and len(samples[1]["letter_logprobs"]) == 26
    assert all(s["pred"] in LETTERS for s in samples)


def test_a_bad_row_exits_2_with_one_line(tiny_model_dir, tmp_path, capsys):
    task = _mc(tmp_path, [_row(["a", "b"]), _row(["", ""])])
    assert main(["eval", f"model_name_or_path={tiny_model_dir}", "--task", task, "--n_shot", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("gym: error:") == 1 and "Traceback" not in err
    assert "quiz.json, row 2, field 'choices': choice A is empty" in err


@pytest.mark.parametrize("kind", ["mc", "ppl", "gen"])
@pytest.mark.parametrize("suffix", [".json", ".jsonl", ".csv"])
def test_a_binary_task_file_exits_2_before_the_model_loads(tmp_path, capsys, kind, suffix):
    path = tmp_path / f"task{suffix}"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe" + bytes(range(256)))
    # the model named does not exist: the file is refused before anything loads
    assert main(["eval", "model_name_or_path=/nonexistent", "--task", f"{kind}:{path}"]) == 2
    err = capsys.readouterr().err
    assert err.count("gym: error:") == 1 and "Traceback" not in err
    assert f"{path}: not UTF-8 text, so not a {suffix} dataset" in err


def test_a_csv_task_with_a_field_over_the_csv_limit_exits_2(tmp_path, capsys):
    path = tmp_path / "task.csv"
    path.write_text('question,answer\n"' + "x" * 200_000 + '",1\n')  # csv's field_size_limit is 131,072
    assert main(["eval", "model_name_or_path=/nonexistent", "--task", f"gen:{path}"]) == 2
    err = capsys.readouterr().err
    assert err.count("gym: error:") == 1 and f"{path}: not a readable CSV file" in err


@pytest.mark.parametrize(("task", "fragment"), [
    ("lm_eval:,", "names nothing after 'lm_eval:': give lm-eval task names"),
    ("lm_eval: , ", "names nothing after 'lm_eval:'"),
    ("ppl:", "names nothing after 'ppl:': give a dataset name or file"),
])
def test_a_task_that_names_nothing_exits_2_before_the_model_loads(capsys, task, fragment):
    # `lm_eval:,` reached lm-eval with no task, which raised a ValueError traceback after the model loaded
    assert main(["eval", "model_name_or_path=/nonexistent", "--task", task]) == 2
    err = capsys.readouterr().err
    assert err.count("gym: error:") == 1 and "Traceback" not in err and fragment in err


@pytest.mark.parametrize(("content", "fragment"), [(None, "Delta file not found"),
                                                   (b"\x00" * 64, "is not a readable delta file")])
def test_a_missing_or_damaged_delta_exits_2_before_the_model_loads(tmp_path, capsys, content, fragment):
    # it was read only after the base model had loaded (here the model does not exist, which was the error)
    delta = tmp_path / "d.safetensors"
    if content is not None:
        delta.write_bytes(content)
    assert main(["eval", "model_name_or_path=/nonexistent", "--task", "mc_demo", "--delta", str(delta)]) == 2
    err = capsys.readouterr().err
    assert err.count("gym: error:") == 1 and "Traceback" not in err and fragment in err


def test_lm_eval_task_lists_drop_empty_names():
    from gym.eval.config import parse_task

    assert parse_task("lm_eval:hellaswag,,arc_easy,").target == "hellaswag,arc_easy"


def test_overwrite_never_replaces_a_file_of_the_model_or_the_tasks_data(tiny_model_dir, tmp_path, capsys):
    import shutil

    model = tmp_path / "model"
    # the shared tiny model may hold the fast engine's pack cache (a folder), made by a test before this one
    shutil.copytree(tiny_model_dir, model, ignore=shutil.ignore_patterns(".*"))
    data = tmp_path / "text.jsonl"
    data.write_text('{"text": "one two three"}\n{"text": "four five"}\n')
    before = {f.name: f.read_bytes() for f in model.iterdir()}
    for out in (model / "config.json", model / "model.safetensors", data):
        assert main(["eval", f"model_name_or_path={model}", "--task", f"ppl:{data}", "-o", str(out),
                     "--overwrite"]) == 2
        err = capsys.readouterr().err
        assert err.count("gym: error:") == 1 and "Traceback" not in err
    assert {f.name: f.read_bytes() for f in model.iterdir()} == before
    assert data.read_text().startswith('{"text": "one two three"}')
    # An earlier report in the model's folder is still replaced.
    report = model / "results.json"
    for _ in range(2):
        assert main(["eval", f"model_name_or_path={model}", "--task", f"ppl:{data}", "-o", str(report),
                     "--overwrite"]) == 0
    assert json.loads(report.read_text())["made_by"] == "gym eval"


@pytest.mark.parametrize(("flags", "fragment"), [
    (["--temperature", ".nan", "--num_samples", "2"], "'temperature' must be a number >= 0, got nan"),
    (["--num_samples", "2"], "num_samples: 2 answers per item need sampling: set temperature > 0"),
])
def test_sampling_settings_that_cannot_work_exit_2_before_the_model_loads(tmp_path, capsys, flags, fragment):
    data = tmp_path / "gen.jsonl"
    data.write_text('{"instruction": "1+1?", "output": "2"}\n')
    # the model named does not exist: the settings are refused before anything loads (NaN used to be sampled with)
    assert main(["eval", "model_name_or_path=/nonexistent", "--task", f"gen:{data}", *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("gym: error:") == 1 and "Traceback" not in err and fragment in err


def test_an_output_that_cannot_be_written_exits_2_before_the_model_loads(tmp_path, capsys, monkeypatch):
    # It failed only once every task had run, with a traceback, and the scores were lost.
    from pathlib import Path

    data = tmp_path / "text.jsonl"
    data.write_text('{"text": "one two three"}\n')
    out = tmp_path / "locked" / "r.json"

    def denied(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "touch", denied)
    # the model named does not exist: the output is refused before anything loads
    assert main(["eval", "model_name_or_path=/nonexistent", "--task", f"ppl:{data}", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("gym: error:") == 1 and "Traceback" not in err
    assert f"Cannot write the results to {out}: Permission denied" in err and not out.exists()


def test_a_report_that_fails_to_land_leaves_no_temporary_file(tmp_path, monkeypatch):
    import os

    from gym.core.errors import OutputError
    from gym.eval.results import write_report

    def full(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(OutputError, match="Cannot write the results to .*r.json: No space left on device"):
        write_report(tmp_path / "r.json", {"made_by": "gym eval", "results": {}})
    assert list(tmp_path.iterdir()) == []
