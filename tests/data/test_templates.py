from __future__ import annotations

import json
import logging

import pytest

from gym.config.parser import get_train_args
from gym.core.errors import ConfigError
from gym.data.formats import Example
from gym.data.loader import get_dataset
from gym.data.processors import IGNORE_INDEX, encode_supervised
from gym.data.templates import TEMPLATES, get_chat_format

CONVERSATION = [
    {"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4."},
    {"role": "user", "content": "And 3+3?"}, {"role": "assistant", "content": "6."},
]


def test_tokenizer_template_pieces_rebuild_the_whole_conversation(tokenizer):
    chat = get_chat_format(tokenizer)
    pairs = chat.render_pairs(CONVERSATION)
    whole = tokenizer.apply_chat_template(CONVERSATION, tokenize=False)
    assert "".join(p + r for p, r in pairs) == whole
    assert [r for _, r in pairs] == ["4.<|im_end|>\n", "6.<|im_end|>\n"]


def test_loss_only_on_assistant_turns_and_each_ends_with_end_of_turn(tokenizer):
    chat = get_chat_format(tokenizer)
    enc = encode_supervised(Example("t", CONVERSATION), chat, cutoff_len=512)
    learned = [t for t, label in zip(enc["input_ids"], enc["labels"]) if label != IGNORE_INDEX]
    assert tokenizer.decode(learned) == "4.<|im_end|>\n6.<|im_end|>\n"
    assert learned.count(tokenizer.convert_tokens_to_ids("<|im_end|>")) == 2


def test_train_on_prompt_and_mask_history(tokenizer):
    chat = get_chat_format(tokenizer)
    everything = encode_supervised(Example("t", CONVERSATION), chat, 512, train_on_prompt=True)
    assert sum(label != IGNORE_INDEX for label in everything["labels"]) == len(everything["input_ids"]) - 1
    last_only = encode_supervised(Example("t", CONVERSATION), chat, 512, mask_history=True)
    learned = [t for t, label in zip(last_only["input_ids"], last_only["labels"]) if label != IGNORE_INDEX]
    assert tokenizer.decode(learned) == "6.<|im_end|>\n"


LONG_LAST_PROMPT = [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"},
                    {"from": "human", "value": "w " * 100}, {"from": "gpt", "value": "end"}]


@pytest.mark.parametrize("mask_history", [True, False])
def test_mask_history_keeps_the_last_answer_of_a_conversation_over_cutoff_len(tmp_path, tokenizer, mask_history):
    """The end is cut from an over-long row; under mask_history that is the one answer it learns, so there the last
    answer keeps its room and the conversation before it is cut instead (LLaMA-Factory reverses the turns)."""
    (tmp_path / "chat.json").write_text(json.dumps([{"conversations": LONG_LAST_PROMPT}]))
    (tmp_path / "dataset_info.json").write_text(json.dumps({"chat": {"file_name": "chat.json",
                                                                     "formatting": "sharegpt"}}))
    args = get_train_args({"dataset": "chat", "dataset_dir": str(tmp_path), "cutoff_len": 40,
                           "mask_history": mask_history})
    chat = get_chat_format(tokenizer)
    [row] = get_dataset(args.data, chat, "supervised").train
    learned = [t for t, label in zip(row["input_ids"], row["labels"]) if label != IGNORE_INDEX]
    messages = [{"role": "user" if m["from"] == "human" else "assistant", "content": m["value"]}
                for m in LONG_LAST_PROMPT]
    whole = tokenizer.encode("".join(p + r for p, r in chat.render_pairs(messages)), add_special_tokens=False)
    assert len(row["input_ids"]) == 40
    if mask_history:
        assert learned == tokenizer.encode("end<|im_end|>\n", add_special_tokens=False)
        # the prompt's tail, so the answer follows its assistant header as when served
        assert tokenizer.decode(row["input_ids"]).endswith("w <|im_end|>\n<|im_start|>assistant\nend<|im_end|>\n")
        assert row["input_ids"] == whole[-40:]
    else:  # unchanged: the first cutoff_len tokens, learning the first answer
        assert row["input_ids"] == whole[:40]
        assert tokenizer.decode(learned) == "yo<|im_end|>\n"


def test_mask_history_splits_cutoff_len_between_the_last_prompt_and_answer_as_llamafactory(tokenizer):
    chat = get_chat_format(tokenizer)
    long_answer = [*CONVERSATION[:3], {"role": "assistant", "content": "six " * 200}]
    pairs = chat.render_pairs(long_answer)
    prompt_len = len(tokenizer.encode(pairs[-1][0], add_special_tokens=False))
    row = encode_supervised(Example("t", long_answer), chat, 64, mask_history=True)
    learned = [label for label in row["labels"] if label != IGNORE_INDEX]
    assert prompt_len * 2 < 64  # a short prompt stays whole; the answer takes the rest
    assert len(row["input_ids"]) == 64 and len(learned) == 64 - prompt_len
    assert tokenizer.decode(row["input_ids"]).startswith("<|im_start|>user\nAnd 3+3?")


def test_prompt_for_inference_matches_training_prefix(tokenizer):
    chat = get_chat_format(tokenizer)
    prompt = chat.render_prompt(CONVERSATION[:1])
    assert prompt == chat.render_pairs(CONVERSATION[:2])[0][0]


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_named_templates_split_cleanly(tokenizer, name):
    chat = get_chat_format(tokenizer, name)
    pairs = chat.render_pairs(CONVERSATION, system="Be brief.")
    assert len(pairs) == 2
    assert "4." in pairs[0][1] and "6." in pairs[1][1]
    assert "What is 2+2?" in pairs[0][0] and "Be brief." in pairs[0][0]
    # The prompt sent at inference is the training prompt of the same turn (with qwen3's thinking on,
    # the empty thought is part of the learned answer instead, so the prompt stops before it).
    assert chat.render_prompt(CONVERSATION[:1], system="Be brief.") == pairs[0][0]


def test_qwen3_thinking_off_puts_empty_thought_in_prompt(tokenizer):
    on = get_chat_format(tokenizer, "qwen3", enable_thinking=True).render_pairs(CONVERSATION[:2])[0]
    off = get_chat_format(tokenizer, "qwen3", enable_thinking=False).render_pairs(CONVERSATION[:2])[0]
    assert on[1].startswith("<think>\n\n</think>\n\n4.")
    assert off[0].endswith("<think>\n\n</think>\n\n") and off[1] == "4.<|im_end|>\n"


def test_named_template_that_disagrees_with_tokenizer_warns(tokenizer, caplog):
    with caplog.at_level(logging.WARNING):
        get_chat_format(tokenizer, "llama3")
    assert "renders conversations differently" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        get_chat_format(tokenizer, "chatml")
    assert "differently" not in caplog.text


def test_unknown_template_suggests(tokenizer):
    with pytest.raises(ConfigError, match="Did you mean 'llama3'"):
        get_chat_format(tokenizer, "lama3")


CONVERSATIONS = [
    ([{"role": "user", "content": "Hi {there}"}, {"role": "assistant", "content": "Hello 'x'\n"}], None),
    ([{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"}, {"role": "user", "content": "Q2"},
      {"role": "assistant", "content": "<think>hm</think>A2"}], "Be brief."),
    ([{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"},
      {"role": "observation", "content": "obs"}, {"role": "assistant", "content": "A2"}], "S"),
]


@pytest.mark.parametrize("name", sorted(TEMPLATES))
@pytest.mark.parametrize("thinking", [True, False])
@pytest.mark.parametrize("default_system", [None, "Default system."])
def test_jinja_export_renders_exactly_what_the_named_template_renders(tokenizer, name, thinking, default_system):
    """Exports carry the trained format as a Jinja chat template; transformers' renderer must give the same text."""
    from gym.data.chat_jinja import jinja_chat_template
    from gym.data.templates import ChatFormat

    chat = ChatFormat(tokenizer, TEMPLATES[name], default_system, thinking)
    jinja = jinja_chat_template(TEMPLATES[name], tokenizer.eos_token, default_system, thinking)
    for messages, system in CONVERSATIONS:
        hf = ([{"role": "system", "content": system}] if system else []) + messages
        whole = tokenizer.apply_chat_template(hf, chat_template=jinja, tokenize=False)
        assert whole == "".join(p + r for p, r in chat.render_pairs(messages, system))
        prompt = tokenizer.apply_chat_template(hf[:-1], chat_template=jinja, tokenize=False, add_generation_prompt=True)
        assert prompt == chat.render_prompt(messages[:-1], system)


# LLaMA-Factory's templates of the same names, written out by hand from its definitions (src/llamafactory/data/
# template.py): (first prompt with the system "Be brief.", first prompt with no system given, second prompt, the
# text after each answer). <EOS> stands for the tokenizer's EOS, which LLaMA-Factory writes as {"eos_token"}.
LLAMAFACTORY_RENDERS = {
    "llama2": ("<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nWhat is 2+2? [/INST]", "<s>[INST] What is 2+2? [/INST]",
               "<s>[INST] And 3+3? [/INST]", "<EOS>"),
    "llama4": ("<|begin_of_text|><|header_start|>system<|header_end|>\n\nBe brief.<|eot|>"
               "<|header_start|>user<|header_end|>\n\nWhat is 2+2?<|eot|><|header_start|>assistant<|header_end|>\n\n",
               "<|begin_of_text|><|header_start|>user<|header_end|>\n\nWhat is 2+2?<|eot|>"
               "<|header_start|>assistant<|header_end|>\n\n",
               "<|header_start|>user<|header_end|>\n\nAnd 3+3?<|eot|><|header_start|>assistant<|header_end|>\n\n",
               "<|eot|>"),
    "gemma3": ("<bos><start_of_turn>user\nBe brief.\n\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
               "<bos><start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
               "<start_of_turn>user\nAnd 3+3?<end_of_turn>\n<start_of_turn>model\n", "<end_of_turn>\n"),
    "vicuna": ("Be brief.USER: What is 2+2? ASSISTANT:",
               "A chat between a curious user and an artificial intelligence assistant. The assistant gives helpful, "
               "detailed, and polite answers to the user's questions.USER: What is 2+2? ASSISTANT:",
               "USER: And 3+3? ASSISTANT:", "<EOS>"),
    "zephyr": ("<|system|>\nBe brief.<EOS><|user|>\nWhat is 2+2?<EOS><|assistant|>\n",
               "<|system|>\nYou are Zephyr, a helpful assistant.<EOS><|user|>\nWhat is 2+2?<EOS><|assistant|>\n",
               "<|user|>\nAnd 3+3?<EOS><|assistant|>\n", "<EOS>"),
    "phi": ("<|system|>\nBe brief.<|end|>\n<|user|>\nWhat is 2+2?<|end|>\n<|assistant|>\n",
            "<|user|>\nWhat is 2+2?<|end|>\n<|assistant|>\n", "<|user|>\nAnd 3+3?<|end|>\n<|assistant|>\n",
            "<|end|>\n"),
    "phi4": ("<|im_start|>system<|im_sep|>Be brief.<|im_end|><|im_start|>user<|im_sep|>What is 2+2?<|im_end|>"
             "<|im_start|>assistant<|im_sep|>",
             "<|im_start|>user<|im_sep|>What is 2+2?<|im_end|><|im_start|>assistant<|im_sep|>",
             "<|im_start|>user<|im_sep|>And 3+3?<|im_end|><|im_start|>assistant<|im_sep|>", "<|im_end|>"),
    "deepseek": ("<｜begin▁of▁sentence｜>Be brief.\n\nUser: What is 2+2?\n\nAssistant:",
                 "<｜begin▁of▁sentence｜>User: What is 2+2?\n\nAssistant:", "User: And 3+3?\n\nAssistant:", "<EOS>"),
    "deepseek3": ("<｜begin▁of▁sentence｜>Be brief.<｜User｜>What is 2+2?<｜Assistant｜>",
                  "<｜begin▁of▁sentence｜><｜User｜>What is 2+2?<｜Assistant｜>", "<｜User｜>And 3+3?<｜Assistant｜>",
                  "<EOS>"),
    "yi": ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n", "<|im_end|>\n"),
    "cohere": ("<BOS_TOKEN><|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>Be brief.<|END_OF_TURN_TOKEN|>"
               "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>What is 2+2?<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|>"
               "<|CHATBOT_TOKEN|>",
               "<BOS_TOKEN><|START_OF_TURN_TOKEN|><|USER_TOKEN|>What is 2+2?<|END_OF_TURN_TOKEN|>"
               "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
               "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>And 3+3?<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|>"
               "<|CHATBOT_TOKEN|>", "<EOS>"),
}


@pytest.mark.parametrize("name", sorted(LLAMAFACTORY_RENDERS))
@pytest.mark.parametrize("system", ["Be brief.", None])
def test_templates_from_llamafactory_render_what_it_renders(tokenizer, name, system):
    with_system, without_system, second, end = (text.replace("<EOS>", tokenizer.eos_token)
                                                for text in LLAMAFACTORY_RENDERS[name])
    chat = get_chat_format(tokenizer, name)
    pairs = chat.render_pairs(CONVERSATION, system=system)
    assert pairs == [(with_system if system else without_system, "4." + end), (second, "6." + end)]
    assert chat.render_prompt(CONVERSATION[:3], system=system) == "".join(p + r for p, r in pairs[:1]) + second
    # The prompts are masked and the answers learned, each with what ends it (EOS is appended to an answer when the
    # test tokenizer does not know the template's end-of-turn token as special).
    row = encode_supervised(Example("t", CONVERSATION, system=system), chat, cutoff_len=1024)
    masked = [t for t, label in zip(row["input_ids"], row["labels"]) if label == IGNORE_INDEX]
    learned = [t for t, label in zip(row["input_ids"], row["labels"]) if label != IGNORE_INDEX]
    assert tokenizer.decode(masked) == pairs[0][0] + second
    assert tokenizer.decode(learned).replace(tokenizer.eos_token, "") == ("4." + end + "6." + end).replace(
        tokenizer.eos_token, "")


def test_llama2_configs_name_their_template(tokenizer):
    """`template: llama2` from a LLaMA-Factory config is read, not refused with "Did you mean 'llama3'?"."""
    assert get_train_args({"template": "llama2"}).data.template == "llama2"
    assert get_chat_format(tokenizer, "llama2").template is TEMPLATES["llama2"]
