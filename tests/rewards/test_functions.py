"""Reward functions for the online RL stages: each built-in on hand-made completions, user code loaded
by module and by file, the registry's errors, and reward models (full and LoRA) scored against a direct
forward pass of the same model."""

from __future__ import annotations

import json

import pytest
import torch

from gym.core.errors import ConfigError, GymError, ModelError
from gym.rewards.functions import (
    REWARD_FUNCS,
    combined_reward,
    get_reward_funcs,
    load_reward_model,
)


def reward(spec: str):
    funcs, _ = get_reward_funcs([spec])
    return funcs[0]


# ---------------------------------------------------------------- accuracy

@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        ("<think>6*7</think> The answer is \\boxed{42}.", "42", 1.0),
        ("First \\boxed{7}, then on reflection \\boxed{42}", "42", 1.0),  # the last box counts
        ("So \\boxed{\\frac{1}{2}}", "1/2", 1.0),  # nested braces kept whole
        ("So \\boxed{\\frac{1}{2}}", "\\frac{1}{2}", 1.0),
        ("\\boxed{42 apples}", "42", 1.0),
        ("I think 12, no wait, it is 42.", "42", 1.0),  # last number, trailing period ignored
        ("Total: 1,234 dollars", "1234", 1.0),
        ("Total: 1234 dollars", "1,234", 1.0),
        ("It costs 3.50", "3.5", 1.0),
        ("It is 42.0", "42", 1.0),
        ("The temperature fell to -3 degrees", "-3", 1.0),
        ("pages 10-12", "12", 1.0),  # a hyphen, not a minus
        ("\\boxed{42}", "$42$", 1.0),
        ("\\boxed{42}", "\\boxed{42}", 1.0),
        ("Step one. #### 42", "Natalia sold 48/2 = 24 clips. #### 42", 1.0),
        ("<think>hmm</think> \\boxed{Paris}", "paris.", 1.0),
        ("<think>Lyon?</think> Paris", "Paris", 1.0),
        ("The answer is 41", "42", 0.0),
        ("\\boxed{7} and then 42", "42", 0.0),  # a boxed answer wins over later numbers
        ("no number here", "42", 0.0),
        ("\\boxed{Lyon}", "Paris", 0.0),
        ("\\boxed{42", "42", 1.0),  # unbalanced box: falls back to the last number
    ],
)
def test_accuracy(completion, answer, expected):
    assert reward("accuracy")(prompts=["q"], completions=[completion], answer=[answer]) == [expected]


def test_accuracy_conversational_and_missing_answers():
    fn = reward("accuracy")
    completions = [[{"role": "assistant", "content": "\\boxed{3}"}], [{"role": "assistant", "content": "4"}],
                   [{"role": "assistant", "content": "5"}], [{"role": "assistant", "content": "6"}]]
    rewards = fn(prompts=[[{"role": "user", "content": "q"}]] * 4, completions=completions,
                 answer=["3", "5", None, " "], completion_ids=[[1]] * 4, trainer_state=None)
    assert rewards == [1.0, 0.0, None, None]
    assert fn(prompts=["q"], completions=["7"], answer=[7]) == [1.0]  # non-string answers from JSON


def test_accuracy_without_answer_column():
    with pytest.raises(ConfigError, match="answer` column"):
        reward("accuracy")(prompts=["q"], completions=["42"], solution=["42"])


# ---------------------------------------------------------------- format and length

@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("<think>add them</think> 42", 1.0),
        ("\n<think>multi\nline</think>\n\\boxed{42}", 1.0),
        ("<think>add them</think>", 0.75),  # no answer after the thought
        ("<think></think> 42", 0.75),  # empty thought
        ("Sure! <think>add</think> 42", 0.75),  # text before the thought
        ("</think> oops <think>", 0.5),  # both tags, wrong order
        ("<think>still thinking", 0.25),
        ("</think> 42", 0.25),
        ("42", 0.0),
    ],
)
def test_format_partial_credit(completion, expected):
    assert reward("format")(prompts=["q"], completions=[completion]) == [expected]
    conversational = [[{"role": "assistant", "content": completion}]]
    assert reward("format")(prompts=["q"], completions=conversational) == [expected]


def test_format_custom_regex():
    fn = reward(r"format:<answer>\d{1,3}</answer>")
    completions = ["x <answer>42</answer>", "<answer>4242</answer>", "42"]
    assert fn(prompts=["q"] * 3, completions=completions) == [1.0, 0.0, 0.0]
    # A comma-separated string keeps the commas inside the regex.
    funcs, _ = get_reward_funcs(r"accuracy,format:^\d{1,3}$,length:2")
    assert [f.__name__ for f in funcs] == ["accuracy", "format", "length"]
    assert funcs[1](prompts=["q"], completions=["123"]) == [1.0]


def test_format_invalid_regex():
    with pytest.raises(ConfigError, match="not a valid regular expression"):
        get_reward_funcs(["format:(unclosed"])


def test_length():
    fn = reward("length:4")
    rewards = fn(prompts=["q"] * 4, completions=["one two three four", "one two three", "", " ".join(["w"] * 20)])
    assert rewards == [1.0, 0.75, 0.0, 0.0]
    assert reward("length")(prompts=["q"], completions=[" ".join(["w"] * 50)]) == [1.0]  # default target 50
    for bad in ("length:0", "length:-3", "length:many"):
        with pytest.raises(ConfigError, match="positive number of words"):
            get_reward_funcs([bad])


# ---------------------------------------------------------------- python

USER_MODULE = """
def exclaim(prompts, completions, bonus=None, **kwargs):
    return [float(c.count("!")) + (b or 0) for c, b in zip(completions, bonus or [0] * len(completions))]

def wrong_length(prompts, completions, **kwargs):
    return [1.0]

def wrong_type(prompts, completions, **kwargs):
    return ["high"] * len(completions)

def not_a_list(prompts, completions, **kwargs):
    return 1.0

NOT_CALLABLE = 3
"""


@pytest.fixture()
def user_rewards(tmp_path, monkeypatch):
    """A module of user reward functions under a name unique to the test, with cwd at its folder."""
    name = f"user_rewards_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(USER_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", list(__import__("sys").path))
    return name


def test_python_by_module_and_by_file(user_rewards, tmp_path):
    by_module = reward(f"python:{user_rewards}:exclaim")
    assert by_module.__name__ == "exclaim"
    assert by_module(prompts=["q", "q"], completions=["hi!", "hi!!!"], bonus=[0.5, None]) == [1.5, 3.0]
    by_file = reward(f"python:{tmp_path / user_rewards}.py:exclaim")
    assert by_file(prompts=["q"], completions=["!!"]) == [2.0]
    relative = reward(f"python:./{user_rewards}.py:exclaim")
    assert relative(prompts=["q"], completions=["!"]) == [1.0]


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("python:no_such_module_xyz:fn", "cannot import module 'no_such_module_xyz'"),
        ("python:{mod}:missing", "has no attribute 'missing'"),
        ("python:{mod}:NOT_CALLABLE", r"'NOT_CALLABLE' is not callable \(it is a int\)"),
        ("python:{mod}", "python:<module>:<function>"),
        ("python:", "python:<module>:<function>"),
        ("python:nowhere/rewards.py:fn", "file not found"),
    ],
)
def test_python_bad_specs(user_rewards, spec, match):
    with pytest.raises(ConfigError, match=match):
        get_reward_funcs([spec.format(mod=user_rewards)])


@pytest.mark.parametrize(
    ("fn", "match"),
    [("wrong_length", "returned 1 values; expected a list of 2"), ("wrong_type", "returned 'high'"),
     ("not_a_list", "returned a float")],
)
def test_python_wrong_return(user_rewards, fn, match):
    checked = reward(f"python:{user_rewards}:{fn}")
    with pytest.raises(GymError, match=f"`python:{user_rewards}:{fn}` {match}"):
        checked(prompts=["q", "q"], completions=["a", "b"])


# ---------------------------------------------------------------- registry and combination

def test_get_reward_funcs_names_and_weights():
    funcs, weights = get_reward_funcs("accuracy, format")
    assert [f.__name__ for f in funcs] == ["accuracy", "format"]
    assert weights == [1.0, 1.0]
    funcs, weights = get_reward_funcs(["length:10", "length:20", "format"], weights=[1, 0.5, 2])
    assert [f.__name__ for f in funcs] == ["length", "length_2", "format"]  # distinct names in TRL's logs
    assert weights == [1.0, 0.5, 2.0]
    assert set(REWARD_FUNCS) == {"accuracy", "exact", "regex", "format", "length", "reward_model", "python"}


def test_get_reward_funcs_errors():
    with pytest.raises(ConfigError, match="Did you mean 'accuracy'.*Known: accuracy, exact, regex, format"):
        get_reward_funcs(["acuracy"])
    with pytest.raises(ConfigError, match="reward_weights has 1 values but reward_funcs has 2"):
        get_reward_funcs(["accuracy", "format"], weights=[1.0])
    for empty in ([], None, " , "):
        with pytest.raises(ConfigError, match="No reward functions"):
            get_reward_funcs(empty)
    with pytest.raises(ConfigError, match="takes no argument"):
        get_reward_funcs(["accuracy:strict"])
    with pytest.raises(ConfigError, match="reward_model` needs a path"):
        get_reward_funcs(["reward_model"])


def test_combined_reward_weights_and_none():
    funcs, weights = get_reward_funcs(["accuracy", "format"], weights=[2.0, 0.5])
    completions = ["<think>x</think> \\boxed{1}", "<think>x</think> \\boxed{2}", "\\boxed{3}"]
    totals = combined_reward(funcs, weights, ["q"] * 3, completions, answer=["1", "1", None])
    assert totals == [2.0 + 0.5, 0.5, 0.0]  # the None accuracy counts as 0


# ---------------------------------------------------------------- reward models

TEXTS = ["<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n", "Tell me a story about a dragon."]
REPLIES = ["4", "Once upon a time a small dragon learned to read, and then it read every book it could find."]
# What a reward model scores for a rendered prompt: prompt + answer + the end of turn, as `stage: rm` trains.
SCORED = [p + c + "<|im_end|>\n" for p, c in zip(TEXTS, REPLIES)]


def direct_scores(model, tokenizer, texts):
    """Each text alone, unpadded: the score head at the last token."""
    model.eval()
    with torch.no_grad():
        return [model(**tokenizer(t, return_tensors="pt", add_special_tokens=False)).logits[0, 0].item()
                for t in texts]


@pytest.fixture(scope="module")
def seq_cls_dir(tmp_path_factory, tokenizer):
    from transformers import LlamaConfig, LlamaForSequenceClassification

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_labels=1, pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForSequenceClassification(config)
    path = tmp_path_factory.mktemp("rm-full")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_reward_model_full(seq_cls_dir, tokenizer):
    fn = reward(f"reward_model:{seq_cls_dir}")
    assert fn.__name__ == "reward_model"
    model, _, _ = load_reward_model(str(seq_cls_dir.resolve()))
    scores = fn(prompts=TEXTS, completions=REPLIES)  # very different lengths: one row is padded
    assert len(scores) == 2 and all(isinstance(s, float) for s in scores)
    assert scores == pytest.approx(direct_scores(model, tokenizer, SCORED), abs=1e-5)
    assert scores[0] != pytest.approx(scores[1])

    # Conversational rows are rendered with the chat template, the reply as the assistant turn.
    prompts = [[{"role": "user", "content": "What is 2+2?"}]] * 2
    completions = [[{"role": "assistant", "content": r}] for r in REPLIES]
    rendered = [tokenizer.apply_chat_template(p + c, tokenize=False) for p, c in zip(prompts, completions)]
    assert fn(prompts=prompts, completions=completions) == pytest.approx(direct_scores(model, tokenizer, rendered),
                                                                          abs=1e-5)


def test_reward_model_lora_adapter(tiny_model_dir, tokenizer, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(0)
    base = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1, dtype=torch.float32)
    plain_scores = direct_scores(base, tokenizer, SCORED)
    peft_model = get_peft_model(base, LoraConfig(task_type="SEQ_CLS", r=4, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():  # trained-looking weights, so the adapter really changes the scores
        for name, param in peft_model.named_parameters():
            if "lora_B" in name or ("score" in name and param.requires_grad):
                param.add_(torch.randn_like(param) * 0.5)
    adapter_dir = tmp_path / "rm-lora"
    peft_model.save_pretrained(adapter_dir)  # no tokenizer: it comes from the base
    (adapter_dir / "gym_manifest.json").write_text(json.dumps({"resolved_base_path": str(tiny_model_dir)}))
    # The manifest, not the adapter config, names the base (as a Gym rm run writes it).
    config_file = adapter_dir / "adapter_config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "base_model_name_or_path": "gone"}))

    expected = direct_scores(peft_model, tokenizer, SCORED)
    assert expected != pytest.approx(plain_scores, abs=1e-3)
    model, rm_tokenizer, _ = load_reward_model(str(adapter_dir))
    assert rm_tokenizer.padding_side == "right" and model.config.pad_token_id == rm_tokenizer.pad_token_id
    assert not hasattr(model, "peft_config")  # merged
    scores = reward(f"reward_model:{adapter_dir}")(prompts=TEXTS, completions=REPLIES, completion_ids=None)
    assert scores == pytest.approx(expected, abs=1e-4)


def test_not_a_reward_model(tmp_path, tiny_model_dir):
    with pytest.raises(ConfigError, match="is not a folder"):
        get_reward_funcs([f"reward_model:{tmp_path / 'missing'}"])
    with pytest.raises(ConfigError, match="is not a reward model: expected the output folder of `stage: rm`"):
        get_reward_funcs([f"reward_model:{tmp_path}"])  # an empty folder
    with pytest.raises(ConfigError, match="its architecture is LlamaForCausalLM"):
        get_reward_funcs([f"reward_model:{tiny_model_dir}"])
    sft_adapter = tmp_path / "sft"
    sft_adapter.mkdir()
    (sft_adapter / "adapter_config.json").write_text(json.dumps({"task_type": "CAUSAL_LM"}))
    with pytest.raises(ConfigError, match="task_type CAUSAL_LM"):
        get_reward_funcs([f"reward_model:{sft_adapter}"])
    missing_base = tmp_path / "missing-base"
    missing_base.mkdir()
    (missing_base / "adapter_config.json").write_text(
        json.dumps({"task_type": "SEQ_CLS", "base_model_name_or_path": str(tmp_path / "nowhere")}))
    with pytest.raises(ModelError, match="Could not load the reward model"):
        get_reward_funcs([f"reward_model:{missing_base}"])


# ---------------------------------------------------------------- the keys every online stage shares

def test_reward_model_key_joins_the_reward_functions(seq_cls_dir):
    from gym.config.rewards import RewardChoice
    from gym.rewards.functions import rewards_of

    funcs, weights = rewards_of(RewardChoice(reward_funcs=["format"], reward_model=str(seq_cls_dir)))
    assert [f.__name__ for f in funcs] == ["format", "reward_model"] and weights == [1.0, 1.0]
    # Weights given for reward_funcs only: the reward model weighs 1.
    _, weights = rewards_of(RewardChoice(reward_funcs=["format"], reward_weights=[0.5], reward_model=str(seq_cls_dir)))
    assert weights == [0.5, 1.0]
    _, weights = rewards_of(RewardChoice(reward_funcs=["format"], reward_weights=[0.5, 2.0],
                                         reward_model=str(seq_cls_dir)))
    assert weights == [0.5, 2.0]
    with pytest.raises(ConfigError, match="one weight per reward function"):
        rewards_of(RewardChoice(reward_funcs=["format", "length"], reward_weights=[1.0, 2.0, 3.0]))
    with pytest.raises(ConfigError, match="needs rewards: set `reward_funcs`"):
        rewards_of(RewardChoice())


def test_exact_and_regex_verifiers():
    from gym.rewards.functions import get_reward_funcs

    (exact,), _ = get_reward_funcs(["exact"])
    assert exact(prompts=[""] * 4, completions=["Lima.", "<think>hmm</think> lima", "The answer is Lima", "$42"],
                 answer=["Lima", "Lima", "Lima", "42"]) == [1.0, 1.0, 0.0, 1.0]
    (regex, _format), _ = get_reward_funcs("regex:ANSWER: (\\d+),format")
    assert regex(prompts=[""] * 3, completions=["ANSWER: 1 then ANSWER: 7", "ANSWER: 8", "none"],
                 answer=["7", "7", "7"]) == [1.0, 0.0, 0.0]
    funcs, _ = get_reward_funcs("regex:\\d{1,3},accuracy")  # a comma inside the pattern stays in it
    assert len(funcs) == 2
    with pytest.raises(ConfigError, match="needs a pattern"):
        get_reward_funcs(["regex"])


def test_every_reward_name_the_config_accepts_is_built_here():
    from gym.config.rewards import REWARD_NAMES
    from gym.rewards.functions import REWARD_FUNCS

    assert set(REWARD_FUNCS) == set(REWARD_NAMES)
