"""A model fine-tuned on the demo task's answer key scores clearly above chance; `eval_tasks:` after training
writes both reports, and scores the base once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gym.eval.mc import heading, letter_prompt, read_items
from gym.workflows.training import run_exp

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_answer_key_fine_tune_beats_chance_and_base(train_config, data_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("GYM_HOME", str(tmp_path / "home"))  # a fresh base-score cache
    items = [i for i in read_items("mc_demo", str(REPO / "data"))]
    subset = [i for n, i in enumerate(items) if n % 60 < 4]  # the first 4 questions of each of the 5 subjects
    rows = [{"instruction": f"{heading(i.subject)}\n\n{letter_prompt(i)}", "input": "", "output": "ABCD"[i.answer]}
            for i in subset]
    (data_dir / "key.json").write_text(json.dumps(rows))
    (data_dir / "mc_demo_test.json").write_text((REPO / "data" / "mc_demo_test.json").read_text())
    info = json.loads((data_dir / "dataset_info.json").read_text())
    info.update({"key": {"file_name": "key.json"}, "mc_demo": {"file_name": "mc_demo_test.json"}})
    (data_dir / "dataset_info.json").write_text(json.dumps(info))
    config = train_config(dataset="key", finetuning_type="full", cutoff_len=256, max_steps=250, learning_rate=3e-3,
                          per_device_train_batch_size=5, eval_tasks=["mc_demo", "ppl:key"])
    from gym.eval import after_training

    original = after_training.EvalArguments

    def zero_shot_first_four(**kwargs):
        return original(**kwargs, limit=4, n_shot=0)

    monkeypatch.setattr(after_training, "EvalArguments", zero_shot_first_four)
    result = run_exp(config)
    out = Path(result.output_dir)
    trained = json.loads((out / "eval_results.json").read_text())
    base = json.loads((out / "eval_base.json").read_text())
    tuned_acc = trained["results"]["mc_demo"]["metrics"]["acc"]
    base_acc = base["results"]["mc_demo"]["metrics"]["acc"]
    assert trained["results"]["mc_demo"]["items"] == 20 and trained["results"]["mc_demo"]["prompt"] == "chat"
    assert tuned_acc >= 0.7 > 0.25 + 0.2 and tuned_acc > base_acc + 0.3, (tuned_acc, base_acc)
    assert result.metrics["eval_mc_demo_acc"] == tuned_acc and result.metrics["eval_base_mc_demo_acc"] == base_acc
    assert f"Scores: eval_mc_demo_acc {tuned_acc:.4g}, eval_base_mc_demo_acc {base_acc:.4g}," in result.summary()
    assert trained["model"]["fingerprint"] != base["model"]["fingerprint"]
    assert trained["results"]["ppl:key"]["metrics"]["loss"] < base["results"]["ppl:key"]["metrics"]["loss"]
    # The base was scored once: a second run on the same base reads its report from the cache.
    cached = list((tmp_path / "home" / "eval_cache").glob("*.json"))
    assert len(cached) == 1
    stamp = cached[0].stat().st_mtime_ns
    run_exp({**config, "output_dir": str(tmp_path / "second"), "max_steps": 1})
    assert cached[0].stat().st_mtime_ns == stamp
    second = json.loads((tmp_path / "second" / "eval_base.json").read_text())
    assert second["results"]["mc_demo"]["metrics"]["acc"] == base_acc


@pytest.mark.parametrize("task, message", [("mc_dmeo", "Did you mean 'mc_demo'?"), ("ppl:nowhere", "nowhere")])
def test_a_misspelt_eval_task_fails_before_training(train_config, tmp_path, monkeypatch, task, message):
    # It failed only once the run had trained, which may be hours.
    from gym.core.errors import GymError
    from gym.workflows import training

    monkeypatch.setattr(training, "run_training", lambda args: pytest.fail("trained before the eval_tasks were read"))
    with pytest.raises(GymError, match=message):
        run_exp(train_config(eval_tasks=[task]))
    assert not (tmp_path / "out").exists()


def test_a_cache_that_cannot_be_written_still_gives_the_base_report(tiny_model_dir, mc_dir, tmp_path, monkeypatch):
    # A read-only GYM_HOME failed the evaluation after training over the base's cache, a convenience.
    from gym.eval import after_training
    from gym.eval.config import EvalArguments

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setattr(after_training, "_cache_dir", lambda: blocker / "eval_cache")
    args = EvalArguments(tasks=["mc:quiz"], dataset_dir=str(mc_dir), n_shot=0, limit=1)
    report = after_training.base_report({"model_name_or_path": str(tiny_model_dir)}, args)
    assert report["results"]["mc:quiz"]["items"] == 2


def test_the_base_cache_is_not_read_across_versions(tiny_model_dir, mc_dir, tmp_path, monkeypatch):
    # Base scores kept by an earlier Gym were compared with the fine-tune's scores from the new one.
    from gym.eval import after_training
    from gym.eval.config import EvalArguments

    monkeypatch.setattr(after_training, "_cache_dir", lambda: tmp_path / "eval_cache")
    args = EvalArguments(tasks=["mc:quiz"], dataset_dir=str(mc_dir), n_shot=0, limit=1)
    config = {"model_name_or_path": str(tiny_model_dir)}
    after_training.base_report(config, args)
    after_training.base_report(config, args)
    assert len(list((tmp_path / "eval_cache").iterdir())) == 1  # the same versions: read back
    monkeypatch.setattr("gym.core.version.__version__", "0.0.1-older")
    after_training.base_report(config, args)
    assert len(list((tmp_path / "eval_cache").iterdir())) == 2
