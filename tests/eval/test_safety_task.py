"""Safety tasks: the report's shape with scripted answers, --compare on two runs' samples, and the tiny model through
run_eval with a keyword guard as the judge."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.eval.test_toolcall import ReplyEngine

from gym.core.errors import ConfigError
from gym.eval.config import EvalArguments, parse_task
from gym.eval.results import compare, format_table, significance
from gym.eval.safety import SafetySettings, safety_task

REPO = Path(__file__).resolve().parents[2]
DATA = str(REPO / "data")
REFUSE = "I'm sorry, but I can't help with that."


def test_builtin_safety_tasks():
    assert (parse_task("safety_demo").kind, parse_task("safety_demo").target) == ("safety", "safety_demo")
    assert parse_task("xstest").target == "xstest" and parse_task("advbench").kind == "safety"
    assert parse_task("safety:my.json").name == "safety:my.json"
    assert EvalArguments(tasks=["safety_demo"]).max_new_tokens is None  # each task's own default
    with pytest.raises(ConfigError, match="safety_judge"):
        EvalArguments(tasks=["safety_demo"], safety_judge="")


def run_with(model, reply, **settings):
    engine = ReplyEngine(model.tokenizer, reply)
    model._engine = engine
    try:
        return safety_task(model, "safety_demo", DATA, SafetySettings(log_samples=True, **settings), "safety_demo"), \
            engine
    finally:
        model._engine = None


def harmful_prompts() -> set[str]:
    return {r["prompt"] for r in json.loads((REPO / "data" / "safety_demo.json").read_text()) if r["kind"] == "harmful"}


def test_a_model_that_refuses_harm_and_answers_the_rest(tiny_eval_model):
    harmful = harmful_prompts()

    prompts = []

    def reply(prompt_text):
        prompts.append(prompt_text)
        return REFUSE if any(h in prompt_text for h in harmful) else "Here is how."

    result, engine = run_with(tiny_eval_model, reply)
    assert result["metrics"] == {"harmful_compliance": 0.0, "harmful_compliance_stderr": 0.0, "over_refusal": 0.0,
                                 "over_refusal_stderr": 0.0}
    assert (result["items"], result["harmful_items"], result["benign_items"]) == (60, 30, 30)
    assert result["kind"] == "safety" and result["judge"] == "refusal" and result["max_new_tokens"] == 128
    assert all(p.greedy and p.max_new_tokens == 128 for p in engine.params)
    first = result["samples"][0]
    assert first["source"].endswith("safety_demo.json, row 1") and first["harmful_compliance"] == 0.0
    assert first["refused"] and first["category"] == "weapons"
    # the request alone, rendered in the model's chat format, as chat and the API render it
    assert prompts[0] == tiny_eval_model.chat_format.render_prompt([{"role": "user", "content": first["prompt"]}],
                                                                   None)


def test_compare_pairs_the_requests_with_mcnemar(tiny_eval_model, tmp_path):
    harmful = sorted(harmful_prompts())
    complied_by_tuned = set(harmful[:12])
    base, _ = run_with(tiny_eval_model, lambda p: REFUSE if any(h in p for h in harmful) else "Sure.", limit=30)
    tuned, _ = run_with(tiny_eval_model, lambda p: REFUSE if any(h in p for h in harmful if h not in
                                                                 complied_by_tuned) else "Sure.", limit=30)
    assert tuned["metrics"]["harmful_compliance"] == pytest.approx(12 / 30)
    p, test = significance(base, tuned, "harmful_compliance")
    assert test == "McNemar exact" and p == pytest.approx(2 / 2 ** 12)
    for name, result in (("a.json", base), ("b.json", tuned)):
        (tmp_path / name).write_text(json.dumps({"results": {"safety_demo": result}}))
    table = compare(str(tmp_path / "a.json"), str(tmp_path / "b.json"))
    assert "harmful_compliance" in table and "McNemar exact *" in table


def test_limit_and_a_bad_judge(tiny_eval_model):
    result, _ = run_with(tiny_eval_model, lambda p: "Sure.", limit=3)
    assert (result["harmful_items"], result["benign_items"]) == (3, 3)
    # each rate's row counts the requests it is over (3 harmful, 3 benign), not the set's 6, in aligned columns
    table = format_table({"safety_demo": result}).splitlines()
    assert [line.split()[1:2] + line.split()[-3:-2] for line in table[1:]] == [["harmful_compliance", "3"],
                                                                               ["over_refusal", "3"]]
    assert len({line.index(" 3 ") for line in table[1:]}) == 1
    assert result["metrics"]["harmful_compliance"] == 1.0 and "samples" in result
    with pytest.raises(ConfigError, match="keywords file .* does not exist"):
        run_with(tiny_eval_model, lambda p: "Sure.", judge="keywords:/nonexistent.txt")


def test_run_eval_on_the_tiny_model_with_a_keyword_guard(tiny_model_dir, tmp_path):
    """The whole path: `gym eval --task safety_demo --safety_judge keywords:FILE` on the tiny (random) model: the
    report has both rates, a guard judged the harmful answers, and the file reads back for --compare."""
    from gym.cli import main as cli_main

    words = tmp_path / "words.txt"
    words.write_text("# category: anything\n.\n")  # flags every non-empty answer: the random model complies
    out = tmp_path / "r.json"
    assert cli_main(["eval", f"model_name_or_path={tiny_model_dir}", "--task", "safety_demo", "--limit", "2",
                     "--max_new_tokens", "4", "--safety_judge", f"keywords:{words}", "--log_samples", "-o",
                     str(out)]) == 0
    result = json.loads(out.read_text())["results"]["safety_demo"]
    assert result["judge"] == f"keywords:{words}" and result["items"] == 4
    assert set(result["metrics"]) == {"harmful_compliance", "harmful_compliance_stderr", "over_refusal",
                                      "over_refusal_stderr"}
    answered = [s for s in result["samples"] if s["kind"] == "harmful" and s["answer"]]
    assert all(s["harmful_compliance"] == 1.0 for s in answered)
    same = compare(str(out), str(out))
    assert "harmful_compliance" in same and "p < 0.05" not in same  # nothing starred: no footnote


def test_a_vision_language_model_is_refused_in_words(tmp_path):
    """It failed inside transformers: "Unrecognized configuration class LlavaConfig for AutoModelForCausalLM"."""
    from transformers import LlavaConfig

    from gym.eval.model import load_eval_model

    LlavaConfig().save_pretrained(tmp_path / "vlm")  # the config alone says what the model is: nothing else is read
    with pytest.raises(ConfigError, match="gym eval evaluates text models, and .*vlm is a vision-language model"):
        load_eval_model({"model_name_or_path": str(tmp_path / "vlm")})
