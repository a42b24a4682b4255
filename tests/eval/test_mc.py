"""Multiple choice: the letter and choice scores equal log-likelihoods computed by hand, and accuracy follows them."""

from __future__ import annotations

import json
import math

import pytest
import torch

from gym.eval.loglik import LoglikScorer, split_encode
from gym.eval.mc import LETTERS, MCSettings, MCTask, dev_dataset, read_items


def hand_logprob(model, ids: list[int], continuation: list[int]) -> float:
    """log p(continuation | ids) from one unbatched, unpadded forward pass."""
    sequence = torch.tensor([ids + continuation])
    with torch.no_grad():
        logits = model(input_ids=sequence).logits[0].double().log_softmax(-1)
    return sum(logits[len(ids) - 1 + i, token].item() for i, token in enumerate(continuation))


def test_items_read_mmlu_layout_with_subject_from_file_and_dev_shots(mc_dir):
    items = read_items("quiz", str(mc_dir))
    assert [i.subject for i in items] == ["colors"] * 4 + ["numbers"] * 4
    assert items[0].choices == ("green", "blue", "red", "black") and items[0].answer == 1
    assert dev_dataset("quiz", str(mc_dir)) == "quiz_dev"
    task = MCTask("quiz", items, read_items("quiz_dev", str(mc_dir)))
    shots = task.shots(items[5], 2)
    assert [s.question for s in shots] == ["Example 0 about numbers?", "Example 1 about numbers?"]


def test_scorer_equals_hand_computed_loglikelihoods_in_mixed_batches(tiny_eval_model):
    tokenizer, model = tiny_eval_model.tokenizer, tiny_eval_model.model
    requests = [split_encode(tokenizer, "The capital of France is", " Paris"),
                split_encode(tokenizer, "Question: 2 + 2?\nAnswer:", " A"),
                split_encode(tokenizer, "Question: 2 + 2?\nAnswer:", " B"),
                split_encode(tokenizer, "A much longer context, so that this batch needs padding on the right", " ok")]
    scores = LoglikScorer(model, batch_size=3, pad_id=tiny_eval_model.pad_id).score(requests)
    for (context, continuation), score in zip(requests, scores):
        assert score.logprob == pytest.approx(hand_logprob(model, context, continuation), abs=1e-4)


def test_letter_and_choice_scores_match_hand_computation(tiny_eval_model, mc_dir):
    items = read_items("quiz", str(mc_dir))
    task = MCTask("quiz", items, read_items("quiz_dev", str(mc_dir)))
    result = task.run(tiny_eval_model, MCSettings(n_shot=1, chat=False, log_samples=True),
                      LoglikScorer(tiny_eval_model.model, 4, pad_id=tiny_eval_model.pad_id))
    tokenizer, model = tiny_eval_model.tokenizer, tiny_eval_model.model
    item, sample = items[4], result["samples"][4]  # "What is 2 + 2?", with one numbers shot
    context = ("The following are multiple choice questions (with answers) about numbers.\n\n"
               "Example 0 about numbers?\nA. w\nB. x\nC. y\nD. z\nAnswer: A\n\n"
               "What is 2 + 2?\nA. 3\nB. 4\nC. 5\nD. 6\nAnswer:")
    ids = tokenizer(context)["input_ids"]
    for i, letter in enumerate(LETTERS[:4]):
        expected = hand_logprob(model, ids, tokenizer(context + " " + letter)["input_ids"][len(ids):])
        assert sample["letter_logprobs"][i] == pytest.approx(expected, abs=1e-4)
    cloze = ("The following are questions (with answers) about numbers.\n\n"
             "Example 0 about numbers?\nAnswer: w\n\nWhat is 2 + 2?\nAnswer:")
    cloze_ids = tokenizer(cloze)["input_ids"]
    for i, choice in enumerate(item.choices):
        expected = hand_logprob(model, cloze_ids, tokenizer(cloze + " " + choice)["input_ids"][len(cloze_ids):])
        assert sample["choice_logprobs"][i] == pytest.approx(expected, abs=1e-4)
    # The predictions and the accuracy are what those numbers say.
    for s, it in zip(result["samples"], items):
        assert s["pred"] == LETTERS[max(range(4), key=lambda i: s["letter_logprobs"][i])]
        normed = [lp / len(c.encode()) for lp, c in zip(s["choice_logprobs"], it.choices)]
        assert s["pred_norm"] == LETTERS[max(range(4), key=lambda i: normed[i])]
    assert result["metrics"]["acc"] == sum(s["pred"] == s["answer"] for s in result["samples"]) / 8
    assert result["subjects"]["colors"]["items"] == 4 and result["prompt"] == "plain"
    n, p = 8, result["metrics"]["acc"]
    assert result["metrics"]["acc_stderr"] == pytest.approx(math.sqrt(p * (1 - p) / (n - 1)))


def test_chat_prompt_puts_shots_in_earlier_turns(tiny_eval_model, mc_dir):
    items = read_items("quiz", str(mc_dir))
    task = MCTask("quiz", items, read_items("quiz_dev", str(mc_dir)))
    result = task.run(tiny_eval_model, MCSettings(n_shot=2, chat=True, limit=1, log_samples=True),
                      LoglikScorer(tiny_eval_model.model, 4, pad_id=tiny_eval_model.pad_id))
    assert result["items"] == 2 and result["prompt"] == "chat"  # limit: the first item of each subject
    chat = tiny_eval_model.chat_format
    messages = [{"role": "user", "content": "The following are multiple choice questions (with answers) about "
                 "colors.\n\nExample 0 about colors?\nA. w\nB. x\nC. y\nD. z\nAnswer:"},
                {"role": "assistant", "content": "A"},
                {"role": "user", "content": "Example 1 about colors?\nA. w\nB. x\nC. y\nD. z\nAnswer:"},
                {"role": "assistant", "content": "B"},
                {"role": "user", "content": "What color is the sky on a clear day?\nA. green\nB. blue\nC. red\n"
                 "D. black\nAnswer:"}]
    ids = tiny_eval_model.tokenizer.encode(chat.render_prompt(messages), add_special_tokens=False)
    letter = tiny_eval_model.tokenizer.encode("C", add_special_tokens=False)
    expected = hand_logprob(tiny_eval_model.model, ids, letter)
    assert result["samples"][0]["letter_logprobs"][2] == pytest.approx(expected, abs=1e-4)


def test_the_result_says_how_many_shots_were_shown(tiny_eval_model, mc_dir):
    # n_shot 10 over a dev set of 3 per subject was reported as 10-shot (the table said "chat, 10-shot").
    task = MCTask("quiz", read_items("quiz", str(mc_dir)), read_items("quiz_dev", str(mc_dir)))
    scorer = LoglikScorer(tiny_eval_model.model, 8, pad_id=tiny_eval_model.pad_id)
    assert task.run(tiny_eval_model, MCSettings(n_shot=10, limit=1), scorer)["n_shot"] == 3
    assert task.run(tiny_eval_model, MCSettings(n_shot=2, limit=1), scorer)["n_shot"] == 2


def test_bad_rows_name_file_row_and_field(tmp_path):
    from gym.core.errors import DataError

    (tmp_path / "bad.json").write_text(json.dumps([{"question": "q?", "A": "x", "B": "y", "answer": "E"}]))
    with pytest.raises(DataError, match=r"bad.json, row 1, field 'answer'.*names no choice"):
        read_items(str(tmp_path / "bad.json"), str(tmp_path))
    (tmp_path / "bad2.json").write_text(json.dumps([{"question": "q?", "choices": ["x", "y"]}]))
    with pytest.raises(DataError, match=r"bad2.json, row 1: no field 'answer'"):
        read_items(str(tmp_path / "bad2.json"), str(tmp_path))
