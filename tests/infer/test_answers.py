"""ModelAnswers: many conversations answered greedily through the engine, as generate would answer each alone; the
weights as they are at each call."""

from __future__ import annotations

import torch

from gym.infer.answers import ModelAnswers


def greedy(model, prompt_ids: list[int], n: int, stops: list[int]) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=n, do_sample=False,
                             eos_token_id=stops, pad_token_id=stops[0])[0, len(prompt_ids):].tolist()
    return [t for t in out if t not in stops]


def test_answers_match_generate_and_follow_the_weights(tiny_model_dir):
    answers = ModelAnswers.load(str(tiny_model_dir), batch_size=2)
    torch.manual_seed(1)
    with torch.no_grad():  # wider weights than the tiny model's: it says words instead of new lines
        for param in answers.model.parameters():
            if param.dim() == 2:
                param.normal_(0, 0.3)
    conversations = [[{"role": "user", "content": f"Question number {i}?"}] for i in range(7)]  # > 2 x batch in flight
    texts = answers(conversations, 6)
    stops = answers.chat_format.stop_token_ids()
    for conversation, text in zip(conversations, texts):
        ids = answers.tokenizer.encode(answers.chat_format.render_prompt(conversation, None), add_special_tokens=False)
        expected = answers.tokenizer.decode(greedy(answers.model, ids, 6, stops), skip_special_tokens=True)
        assert text == expected.removesuffix("\ufffd").strip()  # the engine holds back half a character
    assert answers.template == "tokenizer" and answers([], 6) == []

    with torch.no_grad():  # a job adds a delta in place: the next call answers with the changed weights
        answers.model.lm_head.weight.mul_(-1)
    assert all(texts) and answers(conversations[:2], 6) != texts[:2]
