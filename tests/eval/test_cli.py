"""`gym eval` on the command line: the table and result file, --compare with its test, and the errors a user
can make (exit status 2, one line)."""

from __future__ import annotations

import json

import pytest
from tests.gym_cli import gym_process

from gym.cli import main
from gym.eval.results import _binomial_two_sided, compare, significance


def test_eval_writes_table_and_result_file(tiny_model_dir, mc_dir, tmp_path, capsys):
    out = tmp_path / "r.json"
    status = main(["eval", f"model_name_or_path={tiny_model_dir}", "--task", "mc:quiz", "--task", "mc:quiz_dev",
                   "--n_shot", "0", "--dataset_dir", str(mc_dir), "-o", str(out), "--log_samples"])
    assert status == 0
    table = capsys.readouterr().out
    assert "mc:quiz" in table and "acc_norm" in table and "colors" in table and f"Wrote {out}" in table
    report = json.loads(out.read_text())
    assert report["settings"]["tasks"] == ["mc:quiz", "mc:quiz_dev"] and report["seed"] == 42
    assert len(report["model"]["fingerprint"]) == 64 and report["versions"]["torch"]
    assert len(report["results"]["mc:quiz"]["samples"]) == 8
    assert report["results"]["mc:quiz"]["prompt"] == "chat"  # the tiny model carries SmolLM2's chat template
    # the file is not silently replaced
    assert main(["eval", f"model_name_or_path={tiny_model_dir}", "--task", "mc:quiz", "--dataset_dir", str(mc_dir),
                 "-o", str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err


def _report(path, accs, stderr=None):
    samples = [{"source": f"row {i}", "acc": a} for i, a in enumerate(accs)]
    mean = sum(accs) / len(accs)
    result = {"metrics": {"acc": mean, "acc_stderr": stderr}, "items": len(accs), "samples": samples}
    path.write_text(json.dumps({"results": {"t": result}}))
    return result


def test_compare_uses_mcnemar_on_paired_items(tmp_path, capsys):
    a = _report(tmp_path / "a.json", [0] * 10 + [1] * 10)
    b = _report(tmp_path / "b.json", [1] * 10 + [1] * 10)  # right on 10 items A got wrong, wrong on none
    p, test = significance(a, b, "acc")
    assert test == "McNemar exact" and p == pytest.approx(2 / 2 ** 10)
    assert _binomial_two_sided(3, 10) == pytest.approx(2 * (1 + 10 + 45 + 120) / 1024)
    text = compare(str(tmp_path / "a.json"), str(tmp_path / "b.json"))
    assert "+0.5000" in text and "McNemar exact *" in text
    assert main(["eval", "--compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0


@pytest.mark.parametrize("extra", [["c.json"], ["--task", "mc_demo"]])
def test_compare_refuses_what_it_would_ignore(tmp_path, capsys, extra):
    # A third file, or a task, was ignored without a word: the table compared the first two only.
    for name in ("a.json", "b.json", "c.json"):
        _report(tmp_path / name, [1, 0])
    argv = ["eval", "--compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"),
            *[str(tmp_path / e) if e.endswith(".json") else e for e in extra]]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("gym: error:") == 1 and "--compare takes two result files and nothing else" in err


def test_compare_without_samples_uses_the_standard_errors(tmp_path):
    a = {"metrics": {"acc": 0.50, "acc_stderr": 0.02}}
    b = {"metrics": {"acc": 0.60, "acc_stderr": 0.02}}
    p, test = significance(a, b, "acc")
    assert test == "z" and p == pytest.approx(0.000406, abs=2e-5)  # z = 0.1 / sqrt(0.0008) = 3.54


@pytest.mark.parametrize("argv, message", [
    (["--task", "mc_dem"], "Unknown eval task 'mc_dem'. Did you mean 'mc_demo'"),
    (["--task", "mc:no_such_data"], "no_such_data"),
    (["--task", "mc_demo", "--eval_template", "chatty"], "eval_template must be one of auto, chat, plain, got "
                                                          "'chatty'. Did you mean 'chat'?"),
    (["--task", "mc_demo", "--variant", "nouser"], "variant: write STORE:USER"),
    ([], "No tasks to run"),
    (["--task", "mmlu"], "Dataset 'mmlu' (hub dataset cais/mmlu) lives on the Hugging Face Hub"),  # offline
])
def test_user_errors_exit_2_with_one_line(tiny_model_dir, argv, message, capsys):
    assert main(["eval", f"model_name_or_path={tiny_model_dir}", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_bad_data_as_a_subprocess(tiny_model_dir, tmp_path):
    (tmp_path / "bad.json").write_text(json.dumps([{"question": "q", "A": "x", "B": "y", "answer": 7}]))
    done = gym_process("eval", f"model_name_or_path={tiny_model_dir}", "--task", f"mc:{tmp_path / 'bad.json'}",
                       env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 2, done.stderr
    assert "bad.json, row 1, field 'answer'" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(("flag", "named"), [("--limt", "--limit"), ("--n_shto", "--n_shot"), ("--taks", "--tasks")])
def test_a_misspelt_eval_option_names_the_eval_option_before_the_model_loads(tiny_model_dir, capsys, flag, named):
    assert main(["eval", f"model_name_or_path={tiny_model_dir}", "--task", "mc_demo", flag, "2"]) == 2
    assert f"Did you mean '{named}'?" in capsys.readouterr().err
