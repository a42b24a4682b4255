from __future__ import annotations

import re

import pytest
import torch

from gym.data.formats import Example
from gym.data.processors import encode_supervised
from gym.data.templates import get_chat_format
from gym.infer.chat import ChatModel
from gym.workflows.training import run_exp


def test_chat_uses_the_template_the_adapter_was_trained_with(trained_run, tokenizer):
    """Trained with a named template; chat must render prompts token-for-token the same way."""
    chat = ChatModel({"adapter_name_or_path": str(trained_run), "do_sample": False, "max_new_tokens": 12,
                      "repetition_penalty": 1.5})
    assert chat.data_args.template == "llama3"
    question = [{"role": "user", "content": "Add 2 and 3."}]
    training_ids = encode_supervised(Example("t", question + [{"role": "assistant", "content": "5"}]),
                                     get_chat_format(tokenizer, "llama3", "Answer briefly."), cutoff_len=512)
    prompt_len = training_ids["labels"].index(next(x for x in training_ids["labels"] if x != -100))
    prompt = chat.render(question)
    assert prompt == training_ids["input_ids"][:prompt_len]
    answer = chat.chat(question)
    # The answer is what the merged model itself generates greedily from exactly that prompt. (The repetition
    # penalty keeps the random tiny model from repeating one token, which would match almost anything.)
    assert chat.decoding == {**chat.decoding, "max_new_tokens": 12, "do_sample": False, "repetition_penalty": 1.5}
    with torch.no_grad():
        out = chat.model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, repetition_penalty=1.5,
                                  eos_token_id=chat.chat_format.stop_token_ids(), pad_token_id=tokenizer.pad_token_id)
    new_tokens = out[0, len(prompt):].tolist()
    assert len(set(new_tokens)) > 3
    assert answer == tokenizer.decode(new_tokens, skip_special_tokens=True)


def test_adapter_is_merged_so_chat_sees_the_trained_weights(train_config):
    result = run_exp(train_config())
    base = ChatModel({"model_name_or_path": train_config()["model_name_or_path"]})
    tuned = ChatModel({"adapter_name_or_path": result.output_dir})
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        assert not torch.allclose(base.model(ids).logits, tuned.model(ids).logits)


def test_cut_at_stop_holds_back_only_what_could_become_a_stop_string():
    from gym.infer.stops import cut_at_stop

    pieces = ["The ans", "wer is 4", "2.\nQ", "uestion: next"]
    assert "".join(cut_at_stop(iter(pieces), ["\nQuestion:"])) == "The answer is 42."
    assert list(cut_at_stop(iter(pieces), ["\nQuestion:"]))[:2] == ["The ans", "wer is 4"]  # streamed, not buffered
    assert "".join(cut_at_stop(iter(["abc", "def"]), ["zz"])) == "abcdef"
    assert "".join(cut_at_stop(iter(["a STOP b"]), ["STOP", "a S"])) == ""  # the earliest stop wins
    assert "".join(cut_at_stop(iter(["ab"]), [])) == "ab"


def test_stop_and_seed(tiny_model_dir):
    model = ChatModel({"model_name_or_path": str(tiny_model_dir), "max_new_tokens": 12, "do_sample": True,
                       "temperature": 1.0, "top_k": 0, "top_p": 1.0})
    question = [{"role": "user", "content": "Say something."}]
    first, again = model.chat(question, seed=7), model.chat(question, seed=7)
    assert first == again and first  # the same seed samples the same answer
    stop = first[3:5]
    cut = model.chat(question, seed=7, stop=[stop])
    assert cut == first[: first.find(stop)] and stop not in cut


def test_threads_asking_for_the_engine_at_once_share_one(tiny_model_dir, monkeypatch):
    """TF-GRPO's first rollouts ask for the engine from many threads at once; each used to build its own."""
    import threading
    import time

    import gym.infer.chat as chat_module

    built = []
    real = chat_module.build_engine

    def slow_build(*args, **kwargs):
        time.sleep(0.2)  # the window in which the other threads arrive
        built.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(chat_module, "build_engine", slow_build)
    model = ChatModel({"model_name_or_path": str(tiny_model_dir)})
    engines = []
    threads = [threading.Thread(target=lambda: engines.append(model.engine)) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    model.close()
    assert len(built) == 1 and len({id(e) for e in engines}) == 1


def test_a_training_config_whose_run_is_missing_says_the_base_answers(tmp_path, trained_run, caplog):
    """`gym eval CONFIG` before `gym train CONFIG` scored the base with no word: now a warning names the output_dir.
    A finished run is used, as before, without one."""
    import logging

    from gym.infer.config import resolve_inference_config

    caplog.set_level(logging.INFO, logger="gym")
    missing = tmp_path / "never-trained"
    resolved = resolve_inference_config({"model_name_or_path": "smollm2-135m", "output_dir": str(missing)})
    assert "adapter_name_or_path" not in resolved
    assert f"output_dir {missing} holds no finished run" in caplog.text and "using the base model smollm2-135m" in (
        caplog.text)
    caplog.clear()
    resolved = resolve_inference_config({"output_dir": str(trained_run)})
    assert resolved["adapter_name_or_path"] == str(trained_run) and "holds no finished run" not in caplog.text


def test_an_fp4_qlora_run_served_unquantized_leaves_its_quantization_options_behind(tmp_path, tiny_model_dir):
    """`quantization_bit: null` serves a QLoRA adapter on the unquantized base: the saved run's quantization_type and
    double_quantization describe the base it replaced, and would be refused as options without quantization_bit."""
    import json

    import yaml

    from gym.config.parser import get_infer_args
    from gym.infer.config import resolve_inference_config

    run = tmp_path / "run"
    run.mkdir()
    (run / "gym_manifest.json").write_text(json.dumps({"what": "lora-adapter", "stage": "sft"}))
    (run / "gym_config.yaml").write_text(yaml.safe_dump({
        "model_name_or_path": str(tiny_model_dir), "quantization_bit": 4, "quantization_type": "fp4",
        "double_quantization": False, "template": "llama3"}))
    resolved = resolve_inference_config({"adapter_name_or_path": str(run), "quantization_bit": None})
    assert resolved["template"] == "llama3" and "quantization_type" not in resolved
    assert get_infer_args(resolved)[0].quantization_bit is None
    kept = resolve_inference_config({"adapter_name_or_path": str(run)})
    assert (kept["quantization_bit"], kept["quantization_type"]) == (4, "fp4")


@pytest.mark.parametrize("stage, what", [("rm", "reward model"), ("cls", "classifier")])
def test_a_scoring_run_is_refused_as_a_chat_model_saying_what_it_is_for(stage, what, tmp_path):
    # Loaded as a chat model, a reward model "answered" from a head it was never trained to write with.
    import json

    from gym.core.errors import ConfigError

    run = tmp_path / stage
    run.mkdir()
    (run / "gym_manifest.json").write_text(json.dumps({"what": "lora-adapter", "stage": stage}))
    (run / "adapter_config.json").write_text(json.dumps({"task_type": "SEQ_CLS"}))
    with pytest.raises(ConfigError, match=rf"{run} is a {what} \(stage {stage}\).*it does not chat"):
        ChatModel({"adapter_name_or_path": str(run)})


@pytest.mark.parametrize("messages, settings, message", [
    ([{"role": "user", "content": "hi"}], {"temperature": "hot"}, "temperature must be a number at least 0, got 'hot'"),
    ([{"role": "user", "content": "hi"}], {"max_new_tokens": -1}, "max_new_tokens must be a whole number at least 1"),
    ([{"role": "user", "content": "hi"}], {"top_p": 2.0}, "top_p must be a number above 0 and at most 1, got 2.0"),
    ([{"role": "user", "content": "hi"}], {"temprature": 0.5}, "Did you mean 'temperature'?"),
    ([{"role": "user", "content": "hi"}], {"stop": 5}, "stop must be a string or a list of strings, got 5"),
    ([{"role": "user", "content": "hi"}], {"seed": "x"}, "seed must be a whole number, got 'x'"),
    ({"role": "user", "content": "hi"}, {}, "not one message object"),
    ([{"role": "user"}], {}, "messages[0] has no content"),
    ([{"role": "usr", "content": "hi"}], {}, "messages[0].role: 'usr' is not a role. Did you mean 'user'?"),
    ([{"role": "user", "content": 5}], {}, "messages[0].content must be a string, got int 5"),
    ([], {}, "give a non-empty list"),
])
def test_bad_messages_and_settings_are_one_error_and_the_engine_goes_on(messages, settings, message, tiny_model_dir):
    # A string temperature used to reach the engine's thread and stop it: that call hung, and every later one failed.
    from gym.core.errors import ConfigError

    model = ChatModel({"model_name_or_path": str(tiny_model_dir), "do_sample": False, "max_new_tokens": 3})
    try:
        with pytest.raises(ConfigError, match=re.escape(message)):
            model.chat(messages, **settings)
        assert model.chat("Hello") == model.chat([{"role": "user", "content": "Hello"}])  # a string: one user turn
    finally:
        model.close()


def test_a_run_folder_and_keyword_arguments_name_the_model_as_gym_chat_does(trained_run):
    # ChatModel("saves/run") said "Config file not found" of a folder that exists; keyword arguments were a TypeError.
    by_folder = ChatModel(str(trained_run), do_sample=False, max_new_tokens=6)
    by_keys = ChatModel(adapter_name_or_path=str(trained_run), do_sample=False, max_new_tokens=6)
    try:
        assert by_folder.adapters == by_keys.adapters == [str(trained_run)]
        assert by_folder.chat("What is 2+2?") == by_keys.chat("What is 2+2?")
    finally:
        by_folder.close()
        by_keys.close()
