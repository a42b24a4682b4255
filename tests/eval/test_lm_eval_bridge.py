"""lm-evaluation-harness on the model Gym loaded: on the same task definition its acc equals Gym's, item by item."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("lm_eval", reason="lm-evaluation-harness is not installed (pip install 'zoo-gym[eval]')")

from gym.eval.loglik import LoglikScorer
from gym.eval.mc import MCSettings, MCTask, read_items

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_lm_eval_agrees_with_gym_on_the_demo_task(tiny_eval_model):
    from gym.eval.lm_eval_bridge import run_lm_eval

    data = str(REPO / "data")
    ours = MCTask("mc_demo", read_items("mc_demo", data)[:60]).run(  # lm-eval's limit: the first 60 rows
        tiny_eval_model, MCSettings(n_shot=0, chat=False, log_samples=True),
        LoglikScorer(tiny_eval_model.model, 16, pad_id=tiny_eval_model.pad_id))
    theirs = run_lm_eval(tiny_eval_model, ["mc_demo"], n_shot=0, limit=60, batch_size=16, dataset_dir=data,
                         include=None, chat=False, seed=0, log_samples=True)["lm_eval:gym_mc_demo"]
    assert theirs["items"] == ours["items"] == 60
    assert theirs["metrics"]["acc"] == pytest.approx(ours["metrics"]["acc"])
    by_doc = sorted(theirs["samples"], key=lambda s: s["doc_id"])
    assert [s["acc"] for s in by_doc] == [s["acc"] for s in ours["samples"]]
    for sample, mine in zip(by_doc[:20], ours["samples"]):
        assert sample["logprobs"] == pytest.approx(mine["letter_logprobs"], abs=1e-3)


def test_unknown_lm_eval_task_is_a_clear_error(tiny_eval_model):
    from gym.core.errors import ConfigError
    from gym.eval.lm_eval_bridge import run_lm_eval

    with pytest.raises(ConfigError, match="lm_eval: unknown task 'hellaswagg'. Did you mean 'hellaswag'"):
        run_lm_eval(tiny_eval_model, ["hellaswagg"], n_shot=0, limit=1, batch_size=1, dataset_dir=str(REPO / "data"),
                    include=None, chat=False, seed=0, log_samples=False)


def test_a_misspelt_lm_eval_task_exits_2_before_the_model_loads_offering_gym_datasets_too(capsys):
    # It failed only when its turn came, after the model loaded and the tasks before it ran; and a misspelt Gym
    # dataset was offered lm-eval's names only (mc_dmeo -> 'arc_de').
    from gym.cli import main

    # the model named does not exist: the task is refused before anything loads
    assert main(["eval", "model_name_or_path=/nonexistent", f"dataset_dir={REPO / 'data'}",
                 "--task", "lm_eval:mc_dmeo"]) == 2
    err = capsys.readouterr().err
    assert err.count("gym: error:") == 1 and "Traceback" not in err
    assert "lm_eval: unknown task 'mc_dmeo'. Did you mean 'mc_demo'?" in err
