"""Training-Free GRPO's loop with a scripted LLM: which calls are made, what the library becomes, resume and replay."""

from __future__ import annotations

import json
import logging
import shutil

import pytest

from gym.core.errors import ConfigError, DataError, OutputError
from gym.tfgrpo import GRPOConfig, TrainingFreeGRPO
from gym.tfgrpo.library import ExperienceLibrary
from gym.tfgrpo.tasks import Task, tasks_from
from gym.tfgrpo.trainer import CALLS_FILE, LIBRARY_FILE, STATE_FILE

from .conftest import ScriptedLLM, query_of, rows


def config(**overrides) -> GRPOConfig:
    return GRPOConfig(**{"group_size": 4, "max_epochs": 1, "batch_size": 8, "max_concurrency": 4, **overrides})


def test_groups_with_equal_rewards_make_no_calls():
    llm = ScriptedLLM()
    trainer = TrainingFreeGRPO(llm, config())
    library = trainer.train(rows("easy 1", "hard 2", "easy 3"), "accuracy")
    assert dict(llm.calls) == {"rollout": 12}
    assert len(library) == 0 and library.step == 1
    assert trainer.history[0].partial_groups == 0 and trainer.history[0].update_calls == 0


@pytest.mark.parametrize("mixed", [1, 2, 3])
def test_calls_per_step_are_p_times_g_plus_2_plus_1(mixed):
    llm = ScriptedLLM()
    G = 4
    trainer = TrainingFreeGRPO(llm, config(group_size=G))
    queries = [f"mix {i}" for i in range(mixed)] + ["easy a", "hard b"]
    # Pick seeds so each "mix" group really is mixed: the scripted rollout is right for even seeds.
    trainer.train(rows(*queries), "accuracy")
    p = trainer.history[0].partial_groups
    assert p >= 1
    assert llm.calls["rollout"] == len(queries) * G  # counted separately
    assert llm.calls["summary"] == p * G and llm.calls["advantage"] == p and llm.calls["group_update"] == p
    assert llm.calls["batch_update"] == 1
    assert trainer.history[0].update_calls == p * (G + 2) + 1


def test_library_size_after_a_step_follows_the_updater_operations():
    plan = [{"operation": "ADD", "id": None, "content": "new lesson one"},
            {"operation": "ADD", "id": None, "content": "new lesson two"},
            {"operation": "UPDATE", "id": 9, "content": "update of an unknown id"},
            {"operation": "UPDATE", "id": 0, "content": "lesson zero, refined"},
            {"operation": "DELETE", "id": 1, "content": None},
            {"operation": "DELETE", "id": 42, "content": None},
            {"operation": "NONE", "id": 2, "content": None}]
    llm = ScriptedLLM(batch_update=lambda m: json.dumps(plan))
    trainer = TrainingFreeGRPO(llm, config())
    before = ExperienceLibrary(["lesson zero", "lesson one", "lesson two"], step=5)
    after = trainer.step([Task([{"role": "user", "content": "mix"}], "1")], before,
                         _scorer(), seed=1)
    assert len(after) == len(before) + 2 + 1 - 1
    assert after.experiences == ["lesson zero, refined", "lesson two", "new lesson one", "new lesson two",
                                 "update of an unknown id"]
    assert after.step == 6


def _scorer():
    from gym.tfgrpo.tasks import build_scorer

    return build_scorer("accuracy")


def test_an_empty_library_renders_the_baseline_prompt_exactly():
    llm = ScriptedLLM()
    task = Task([{"role": "user", "content": "What is 2+2?"}], "4")
    trainer = TrainingFreeGRPO(llm, config())
    assert trainer.rollout_messages(task, ExperienceLibrary()) == task.messages
    with_system = TrainingFreeGRPO(llm, config(system_prompt="Answer in \\boxed{}."))
    assert with_system.rollout_messages(task, ExperienceLibrary()) == [
        {"role": "system", "content": "Answer in \\boxed{}."}, *task.messages]
    trainer.train([{"question": "easy?", "answer": "1"}], "accuracy")
    assert all(messages == [{"role": "user", "content": "easy?"}] for role, messages in llm.log if role == "rollout")


def test_lessons_reach_the_next_rollouts():
    llm = ScriptedLLM()
    trainer = TrainingFreeGRPO(llm, config(max_epochs=2))
    library = trainer.train(rows("mix 1", "mix 2", "mix 3"), "accuracy")
    assert len(library) >= 1
    systems = [m[0]["content"] for role, m in llm.log if role == "rollout" and m[0]["role"] == "system"]
    assert systems and "[0]. When solving mix" in systems[-1]


def _run(tmp_path, name, llm, **overrides):
    trainer = TrainingFreeGRPO(llm, config(batch_size=2, max_epochs=2, **overrides))
    return trainer.train(rows("mix 1", "mix 2", "easy 3", "mix 4", "mix 5"), "accuracy",
                         output_dir=tmp_path / name), trainer


def test_replaying_recorded_answers_gives_the_identical_library(tmp_path):
    first, _ = _run(tmp_path, "first", ScriptedLLM())
    assert len(first) > 0
    (tmp_path / "replay").mkdir()
    shutil.copy(tmp_path / "first" / CALLS_FILE, tmp_path / "replay" / CALLS_FILE)

    def no_calls(messages, seed=0):
        raise AssertionError("a replay must not call the model")
    replayed, trainer = _run(tmp_path, "replay", ScriptedLLM(rollout=no_calls, summary=no_calls, advantage=no_calls,
                                                            group_update=no_calls, batch_update=no_calls))
    assert replayed == first
    assert trainer.usage.roles["rollout"].cached == trainer.usage.roles["rollout"].calls


class Killed(BaseException):
    pass


def test_resume_after_a_kill_mid_batch_gives_the_uninterrupted_library(tmp_path):
    whole, _ = _run(tmp_path, "whole", ScriptedLLM())

    count = {"n": 0}
    limit = 30  # rollouts: 8 + 8 + 4 per epoch, so the 31st is in the second batch of the second epoch

    def dies(messages, seed=0):
        count["n"] += 1
        if count["n"] > limit:
            raise Killed()
        return ScriptedLLM().rollout(messages, seed)
    with pytest.raises(Killed):
        _run(tmp_path, "killed", ScriptedLLM(rollout=dies))
    state = json.loads((tmp_path / "killed" / STATE_FILE).read_text())
    assert state["next"] == [1, 1]  # epoch 2's first batch was saved; its second was cut off mid-rollouts
    resumed, trainer = _run(tmp_path, "killed", ScriptedLLM())
    assert resumed == whole
    assert ExperienceLibrary.load(tmp_path / "killed" / LIBRARY_FILE) == whole
    assert trainer.usage.roles["rollout"].cached > 0  # the calls made before the kill were replayed
    steps = sorted(p.name for p in (tmp_path / "killed" / "steps").iterdir())
    assert steps == [f"step_{i:04d}.json" for i in range(1, 7)]  # one version per step: 3 batches x 2 epochs


def test_a_finished_run_resumes_to_its_result_and_other_settings_are_refused(tmp_path):
    done, _ = _run(tmp_path, "run", ScriptedLLM())
    again, trainer = _run(tmp_path, "run", ScriptedLLM())
    assert again == done and trainer.usage.calls() == 0
    with pytest.raises(OutputError, match="other settings"):
        _run(tmp_path, "run", ScriptedLLM(), group_size=3)
    fresh = TrainingFreeGRPO(ScriptedLLM(), config(batch_size=2, max_epochs=2, group_size=3))
    fresh.train(rows("mix 1", "mix 2", "easy 3", "mix 4", "mix 5"), "accuracy", output_dir=tmp_path / "run",
                overwrite=True)


def test_a_malformed_updater_answer_is_retried_then_skipped(tmp_path, caplog):
    llm = ScriptedLLM(batch_update=lambda m: "Here are my thoughts, but no JSON.")
    trainer = TrainingFreeGRPO(llm, config(max_parse_retries=2))
    with caplog.at_level(logging.WARNING, logger="gym.tfgrpo.trainer"):
        library = trainer.train(rows("mix 1", "mix 2", "mix 3", "mix 4"), "accuracy")
    assert llm.calls["batch_update"] == 3
    assert len(library) == 0
    assert "Skipped the batch_update answer after 3 tries: no JSON list or object" in caplog.text
    retries = [m for role, m in llm.log if role == "batch_update"]
    assert retries[1][-1]["content"].startswith("Your answer could not be read: no JSON list or object")
    assert retries[1][-2] == {"role": "assistant", "content": "Here are my thoughts, but no JSON."}


def test_a_malformed_answer_that_is_fixed_on_retry_is_used():
    answers = iter(['```json\n[{"operation": "ADD", "content": "unclosed"\n```',
                    '[{"operation": "ADD", "id": null, "content": "Check twice."}]'])
    llm = ScriptedLLM(batch_update=lambda m: next(answers))
    library = TrainingFreeGRPO(llm, config()).train(rows("mix 1", "mix 2", "mix 3", "mix 4"), "accuracy")
    assert library.experiences == ["Check twice."]
    assert llm.calls["batch_update"] == 2


def test_an_unreadable_group_is_skipped_without_a_crash():
    llm = ScriptedLLM(advantage=lambda m: "no lessons here")
    trainer = TrainingFreeGRPO(llm, config(max_parse_retries=1))
    library = trainer.train(rows("mix 1", "mix 2", "mix 3", "mix 4"), "accuracy")
    assert len(library) == 0
    assert llm.calls["advantage"] == 2 * trainer.history[0].partial_groups
    assert llm.calls["group_update"] == 0 and llm.calls["batch_update"] == 0


def test_judge_reward_and_python_rewards():
    judge_llm = ScriptedLLM(judge=lambda m: "Looks right.\nSCORE: 0.5")
    trainer = TrainingFreeGRPO(judge_llm, config())
    result = trainer.evaluate(rows("mix 1"), reward_fn="judge", k=2)
    assert result.mean_at_k == 0.5 and judge_llm.calls["judge"] == 2

    def per_answer(completion, answer):
        return float(answer in completion)

    def batch(prompts, completions, answer, **columns):
        return [1.0] * len(completions)
    llm = ScriptedLLM()
    t = TrainingFreeGRPO(llm, config())
    assert t.evaluate(rows("easy"), reward_fn=per_answer, k=3).mean_at_k == 1.0
    assert t.evaluate(rows("hard"), reward_fn=per_answer, k=3).mean_at_k == 0.0
    assert t.evaluate(rows("hard"), reward_fn=[per_answer, batch], reward_weights=[1, 3], k=3).mean_at_k == 0.75


def test_mean_and_pass_at_k():
    llm = ScriptedLLM()
    trainer = TrainingFreeGRPO(llm, config())
    result = trainer.evaluate(rows("easy", "hard", "mix"), reward_fn="accuracy", k=8)
    mixed = sum(s for s in result.scores[2]) / 8
    assert 0 < mixed < 1
    assert result.mean_at_k == pytest.approx((8 + 0 + 8 * mixed) / 24)
    assert result.pass_at_k == pytest.approx(2 / 3)
    assert llm.calls["rollout"] == 24


def test_datasets_in_every_shape(tmp_path):
    columns = {"question": ["a?", "b?"], "answer": ["1", "2"]}  # what hf_dataset[:2] returns
    assert [t.answer for t in tasks_from(columns)] == ["1", "2"]
    assert tasks_from(["plain query"])[0].messages == [{"role": "user", "content": "plain query"}]
    with pytest.raises(DataError, match="row 1: no query; put it under one of: prompt, question"):
        tasks_from([{"question": "ok", "answer": "1"}, {"text": "?", "answer": "2"}])
    file = tmp_path / "q.json"
    file.write_text(json.dumps([{"instruction": "What is 1+1?", "answer": "2"}]))
    (tmp_path / "dataset_info.json").write_text(json.dumps(
        {"q": {"file_name": "q.json", "columns": {"prompt": "instruction", "answer": "answer"}}}))
    [task] = tasks_from("q", str(tmp_path))
    assert task.messages == [{"role": "user", "content": "What is 1+1?"}] and task.answer == "2"


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="'group_size' must be at least 2"):
        GRPOConfig(group_size=1)
    with pytest.raises(ConfigError, match="'temperature_train' must be in"):
        GRPOConfig(temperature_train=5)
    with pytest.raises(ConfigError, match="prices.rollout"):
        GRPOConfig(prices={"rollout": [1.0]})
    with pytest.raises(ConfigError, match="With base_url, name the endpoint's model"):
        TrainingFreeGRPO(None, GRPOConfig(base_url="http://127.0.0.1:9/v1"))


def test_infer_uses_the_trained_library():
    llm = ScriptedLLM(rollout=lambda m, seed: m[0]["content"] if m[0]["role"] == "system" else "no lessons")
    trainer = TrainingFreeGRPO(llm, config())
    assert trainer.infer("q") == "no lessons"
    trainer.library = ExperienceLibrary(["Check the units."])
    assert trainer.infer("q").endswith("[0]. Check the units.")
    assert trainer.infer("q", ExperienceLibrary()) == "no lessons"
    assert query_of(llm.log[-1][1]) == "q"
