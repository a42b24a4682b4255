"""Generation tasks: answers from a scripted engine, scored by the reward registry's verifiers."""

from __future__ import annotations

import json

import pytest

from gym.eval.generation import GenSettings, generate_task, pass_at_k
from gym.infer.requests import Finished, Request


class ScriptedEngine:
    """Answers each prompt (by its decoded text) with the next scripted answer; records the settings."""

    def __init__(self, tokenizer, answers: dict[str, list[str]]) -> None:
        self.tokenizer, self.answers, self.params = tokenizer, answers, []

    def submit(self, prompt_ids, params, sink=None):
        text = self.tokenizer.decode(prompt_ids)
        key = next(k for k in self.answers if k in text)
        request = Request(prompt_ids, params)
        request.emit(Finished("stop", len(prompt_ids), 1, self.answers[key].pop(0)))
        self.params.append(params)
        return request

    def shutdown(self) -> None:
        pass


@pytest.fixture()
def qa_dir(tmp_path):
    rows = [{"question": "What is 6 x 7?", "answer": "42"}, {"question": "What is 10 + 5?", "answer": "15"},
            {"question": "Capital of Peru?", "answer": "Lima"}]
    (tmp_path / "qa.json").write_text(json.dumps(rows))
    (tmp_path / "dataset_info.json").write_text(json.dumps({"qa": {"file_name": "qa.json", "columns": {
        "prompt": "question", "answer": "answer"}}}))
    return tmp_path


def test_greedy_accuracy_with_scripted_answers(tiny_eval_model, qa_dir):
    engine = ScriptedEngine(tiny_eval_model.tokenizer, {
        "6 x 7": ["6 times 7 is \\boxed{42}."], "10 + 5": ["The answer is 16."], "Peru": ["lima."]})
    tiny_eval_model._engine = engine
    try:
        result = generate_task(tiny_eval_model, "qa", str(qa_dir),
                               GenSettings(rewards=["accuracy"], chat=True, log_samples=True, max_new_tokens=32))
    finally:
        tiny_eval_model._engine = None
    assert [s["correct"] for s in result["samples"]] == [1, 0, 1]
    assert result["metrics"]["acc"] == pytest.approx(2 / 3)
    assert all(p.greedy and p.max_new_tokens == 32 for p in engine.params)


def test_sampled_pass_at_k_and_mean_at_k(tiny_eval_model, qa_dir):
    engine = ScriptedEngine(tiny_eval_model.tokenizer, {
        "6 x 7": ["41", "42", "43", "44"], "10 + 5": ["1", "2", "3", "4"], "Peru": ["Lima", "Lima", "Lima", "x"]})
    tiny_eval_model._engine = engine
    try:
        result = generate_task(tiny_eval_model, "qa", str(qa_dir), GenSettings(
            rewards=["exact"], num_samples=4, temperature=0.7, chat=False, log_samples=True))
    finally:
        tiny_eval_model._engine = None
    metrics = result["metrics"]
    assert metrics["pass@4"] == pytest.approx(2 / 3)
    assert metrics["mean@4"] == pytest.approx((1 / 4 + 0 + 3 / 4) / 3)
    seeds = [p.seed for p in engine.params]
    assert len(set(seeds)) == 12 and all(p.do_sample and p.temperature == 0.7 for p in engine.params)
    assert result["samples"][0]["prompt"] == "Question: What is 6 x 7?\nAnswer:"  # plain prompting


def test_regex_and_python_verifiers(tiny_eval_model, qa_dir, tmp_path, monkeypatch):
    (tmp_path / "checker.py").write_text(
        "def score(prompts, completions, answer, **kw):\n"
        "    return [1.0 if a in c else 0.0 for c, a in zip(completions, answer)]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for verifier, expected in ((["regex:ANSWER=(\\w+)"], [1, 0, 0]), (["python:checker:score"], [1, 1, 1])):
        engine = ScriptedEngine(tiny_eval_model.tokenizer, {
            "6 x 7": ["ANSWER=42"], "10 + 5": ["I think 15, ANSWER=16"], "Peru": ["It is Lima"]})
        tiny_eval_model._engine = engine
        try:
            result = generate_task(tiny_eval_model, "qa", str(qa_dir),
                                   GenSettings(rewards=verifier, log_samples=True))
        finally:
            tiny_eval_model._engine = None
        assert [s["correct"] for s in result["samples"]] == expected, verifier


def test_n_shot_rows_become_earlier_turns(tiny_eval_model, qa_dir):
    engine = ScriptedEngine(tiny_eval_model.tokenizer, {"10 + 5": ["15"], "Peru": ["Lima"]})
    tiny_eval_model._engine = engine
    try:
        result = generate_task(tiny_eval_model, "qa", str(qa_dir), GenSettings(rewards=["accuracy"], n_shot=1,
                                                                               log_samples=True))
    finally:
        tiny_eval_model._engine = None
    assert result["items"] == 2 and result["metrics"]["acc"] == 1.0
    assert "What is 6 x 7?" in result["samples"][0]["prompt"] and "42" in result["samples"][0]["prompt"]


def test_pass_at_k_estimator():
    assert pass_at_k(10, 0, 3) == 0.0
    assert pass_at_k(10, 10, 3) == 1.0
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(10, 3, 2) == pytest.approx(1 - (7 * 6) / (10 * 9))


def test_greedy_with_many_samples_is_refused(tiny_eval_model, qa_dir):
    from gym.core.errors import ConfigError

    with pytest.raises(ConfigError, match="need sampling: set temperature > 0"):
        generate_task(tiny_eval_model, "qa", str(qa_dir), GenSettings(rewards=["accuracy"], num_samples=4))
