"""Reward functions for the online RL stages (grpo, gspo, rloo, ppo), chosen by name in the config.

    reward_funcs: [accuracy, format]        # or "accuracy,format"
    reward_weights: [1.0, 0.5]              # optional, all 1.0 by default

Every entry is `name` or `name:argument` (`length:80`, `format:<regex>`, `reward_model:saves/rm`,
`python:my_rewards:score`). Each resolves to a callable with TRL's reward signature,
`fn(prompts, completions, **columns) -> list[float | None]`, so the same list feeds TRL's trainers
and our own PPO loop (through `combined_reward`). A None reward means "not applicable to this row".
"""

from __future__ import annotations

import difflib
import functools
import importlib
import importlib.util
import json
import math
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gym.errors import ConfigError, GymError, ModelError

RewardFunc = Callable[..., list[float | None]]

_SCORE_BATCH = 16
_MAX_LENGTH = 2048


def _text(item: Any) -> str:
    """A completion (or prompt) as plain text: strings pass through, chat messages give their contents."""
    if item is None:
        return ""
    if isinstance(item, str):
        return item
    if isinstance(item, dict):
        content = item.get("content", "")
        if isinstance(content, list):  # multimodal parts: keep the text ones
            return "".join(part.get("text", "") for part in content if isinstance(part, dict))
        return "" if content is None else str(content)
    if isinstance(item, (list, tuple)):
        return "\n".join(_text(message) for message in item)
    return str(item)


# ---------------------------------------------------------------- accuracy

# A minus sign counts only when it is not a hyphen between numbers ("pages 10-12" ends in 12, not -12).
_NUMBER = re.compile(r"(?<![\d.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?")
_FRAC = re.compile(r"(-?)\\[dt]?frac\{(-?\d+)\}\{(\d+)\}")


def _last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}`, with nested braces (`\\boxed{\\frac{1}{2}}`) kept whole."""
    start = text.rfind("\\boxed")
    if start < 0:
        return None
    open_at = text.find("{", start)
    if open_at < 0 or text[start + len("\\boxed"):open_at].strip():
        return None
    depth = 0
    for i in range(open_at, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[open_at + 1:i]
    return None  # unbalanced: the model stopped mid-answer


def _to_number(text: str) -> float | None:
    s = text.strip().replace("$", "").replace(" ", "").rstrip(".").removesuffix("%")
    if re.fullmatch(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?", s):
        s = s.replace(",", "")
    if m := _FRAC.fullmatch(s):
        return (-1 if m[1] else 1) * int(m[2]) / int(m[3]) if int(m[3]) else None
    if m := re.fullmatch(r"(-?\d+)/(\d+)", s):
        return int(m[1]) / int(m[2]) if int(m[2]) else None
    # Gate float() so words like "nan" or "inf" never count as numbers.
    return float(s) if re.fullmatch(r"-?\d+(?:\.\d+)?|-?\.\d+", s) else None


def _normalise(text: str) -> str:
    text = _last_boxed(text) or text
    return " ".join(text.replace("$", "").strip().rstrip(".").lower().split())


def _answer_value(answer: Any) -> str | None:
    text = "" if answer is None else str(answer).strip()
    if "####" in text:  # GSM8K keeps its worked solution before "#### 42"
        text = text.rsplit("####", 1)[1].strip()
    return text or None


def _is_correct(completion: str, answer: str) -> bool:
    target = _to_number(_normalise(answer))
    boxed = _last_boxed(completion)
    if target is not None:
        # A boxed answer may carry units or words ("\boxed{42 apples}"): its last number is the prediction.
        pool = boxed if boxed is not None else completion
        guess = _to_number(pool)
        if guess is None and (numbers := _NUMBER.findall(pool)):
            guess = _to_number(numbers[-1])
        return guess is not None and abs(guess - target) <= 1e-6
    guess = boxed if boxed is not None else completion.rsplit("</think>", 1)[-1]
    return _normalise(guess) == _normalise(answer)


def _accuracy(arg: str | None) -> RewardFunc:
    _no_argument("accuracy", arg)

    def accuracy(prompts: list, completions: list, answer: list | None = None, **kwargs: Any) -> list[float | None]:
        if answer is None:
            raise ConfigError(
                "The `accuracy` reward needs an `answer` column in the dataset: map it in dataset_info.json, "
                'e.g. "columns": {"prompt": "question", "answer": "solution"}.'
            )
        rewards: list[float | None] = []
        for completion, raw in zip(completions, answer, strict=True):
            target = _answer_value(raw)
            rewards.append(None if target is None else float(_is_correct(_text(completion), target)))
        return rewards

    return accuracy


# ---------------------------------------------------------------- format and length

_THINK_FORMAT = re.compile(r"^\s*<think>.+?</think>\s*\S", re.DOTALL)


def _think_format_score(text: str) -> float:
    if _THINK_FORMAT.search(text):
        return 1.0
    # Partial credit: a small model that only opens its thought still gets a gradient towards the format.
    opens, closes = text.find("<think>"), text.rfind("</think>")
    return 0.25 * ((opens >= 0) + (closes >= 0) + (0 <= opens < closes))


def _format(arg: str | None) -> RewardFunc:
    if arg is None:
        def format(prompts: list, completions: list, **kwargs: Any) -> list[float | None]:
            return [_think_format_score(_text(c)) for c in completions]

        return format
    try:
        pattern = re.compile(arg, re.DOTALL)
    except re.error as exc:
        raise ConfigError(f"reward `format:{arg}`: not a valid regular expression ({exc}).") from None

    def format(prompts: list, completions: list, **kwargs: Any) -> list[float | None]:
        return [1.0 if pattern.search(_text(c)) else 0.0 for c in completions]

    return format


def _length(arg: str | None) -> RewardFunc:
    try:
        target = float(arg) if arg is not None else 50.0
    except ValueError:
        target = math.nan
    if not target > 0 or math.isinf(target):
        raise ConfigError(f"reward `length:{arg}`: the target must be a positive number of words, e.g. length:50.")

    def length(prompts: list, completions: list, **kwargs: Any) -> list[float | None]:
        return [1.0 - min(1.0, abs(len(_text(c).split()) - target) / target) for c in completions]

    return length


def _no_argument(name: str, arg: str | None) -> None:
    if arg is not None:
        raise ConfigError(f"reward `{name}:{arg}`: `{name}` takes no argument; write just `{name}`.")


# ---------------------------------------------------------------- reward model

def _not_reward_model(path: Path, why: str) -> ConfigError:
    return ConfigError(
        f"{path} is not a reward model: expected the output folder of `stage: rm` (a sequence-classification "
        f"model, or a LoRA adapter with task_type SEQ_CLS); {why}."
    )


@functools.cache
def load_reward_model(path: str) -> tuple[Any, Any, Any]:
    """The model, tokenizer and chat format of a `stage: rm` output folder, ready for batched scoring
    (cached per path). The chat format is the one the reward model was trained with (its gym_config.yaml)."""
    import torch
    from transformers import AutoConfig, AutoTokenizer
    from transformers import AutoModelForSequenceClassification as SeqCls

    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise ConfigError(f"reward_model: {folder} is not a folder; give the output_dir of a `stage: rm` run.")
    adapter_file, manifest_file = folder / "adapter_config.json", folder / "gym_manifest.json"
    try:
        if adapter_file.is_file():
            adapter = json.loads(adapter_file.read_text())
            if adapter.get("task_type") != "SEQ_CLS":
                raise _not_reward_model(folder, f"its adapter has task_type {adapter.get('task_type')}")
            base = adapter.get("base_model_name_or_path")
            if manifest_file.is_file():
                base = json.loads(manifest_file.read_text()).get("resolved_base_path") or base
            if not base:
                raise _not_reward_model(folder, "its adapter names no base model")
            from peft import PeftModel

            model = SeqCls.from_pretrained(base, num_labels=1, dtype=torch.float32)
            model = PeftModel.from_pretrained(model, str(folder)).merge_and_unload()
        elif (folder / "config.json").is_file():
            base = str(folder)
            architectures = AutoConfig.from_pretrained(base).architectures or []
            if not any(a.endswith("ForSequenceClassification") for a in architectures):
                raise _not_reward_model(folder, f"its architecture is {', '.join(architectures) or 'unknown'}")
            model = SeqCls.from_pretrained(base, dtype=torch.float32)
        else:
            raise _not_reward_model(folder, "it holds neither config.json nor adapter_config.json")
        has_tokenizer = any((folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json"))
        tokenizer = AutoTokenizer.from_pretrained(str(folder) if has_tokenizer else base)
    except (OSError, ValueError) as exc:
        raise ModelError(f"Could not load the reward model {folder}: {exc}") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    # Sequence-classification heads find each row's last real token through config.pad_token_id; if it
    # disagrees with the id the tokenizer pads with, batched scores silently read padding.
    model.config.pad_token_id = tokenizer.pad_token_id
    model.to("cuda" if torch.cuda.is_available() else "cpu").eval()
    return model, tokenizer, _trained_chat_format(folder, tokenizer)


def _trained_chat_format(folder: Path, tokenizer: Any) -> Any:
    """The chat format recorded in a Gym output's gym_config.yaml; the tokenizer's own otherwise."""
    import yaml

    from gym.data.templates import get_chat_format

    config_file = folder / "gym_config.yaml"
    config = (yaml.safe_load(config_file.read_text()) or {}) if config_file.is_file() else {}
    return get_chat_format(tokenizer, config.get("template"), config.get("default_system"),
                           config.get("enable_thinking", True))


def _rm_text(prompt: Any, completion: Any, chat: Any) -> str:
    """Prompt and answer rendered as `stage: rm` saw its pairs: the answer closed by its end-of-turn,
    where the score head was trained to read."""
    answer = {"role": "assistant", "content": _text(completion)}
    if isinstance(prompt, list):  # a conversation: render it whole
        return "".join(p + r for p, r in chat.render_pairs(prompt + [answer]))
    # Gym's online stages pass prompts already rendered in the chat format: add the answer's piece.
    (_, answer_piece), = chat.render_pairs([{"role": "user", "content": ""}, answer])
    return _text(prompt) + answer_piece


def _reward_model(arg: str | None) -> RewardFunc:
    import torch

    if not arg:
        raise ConfigError("reward `reward_model` needs a path: reward_model:<output_dir of a `stage: rm` run>.")
    model, tokenizer, chat = load_reward_model(str(Path(arg).expanduser().resolve()))

    def reward_model(prompts: list | None, completions: list, **kwargs: Any) -> list[float | None]:
        prompts = prompts if prompts is not None else [""] * len(completions)
        texts = [_rm_text(p, c, chat) for p, c in zip(prompts, completions, strict=True)]
        scores: list[float | None] = []
        for i in range(0, len(texts), _SCORE_BATCH):
            # Prompts arrive already rendered with their special tokens, as in TRL's own reward-model path.
            batch = tokenizer(texts[i:i + _SCORE_BATCH], return_tensors="pt", padding=True, truncation=True,
                              max_length=_MAX_LENGTH, add_special_tokens=False).to(model.device)
            with torch.no_grad():
                scores.extend(model(**batch).logits[:, 0].float().tolist())
        return scores

    return reward_model


# ---------------------------------------------------------------- user code

def _python(arg: str | None) -> RewardFunc:
    target, _, attr = (arg or "").rpartition(":")
    if not target or not attr:
        raise ConfigError(
            f"reward `python:{arg or ''}`: write python:<module>:<function> or python:<file.py>:<function>."
        )
    spec_text = f"python:{arg}"
    if target.endswith(".py") or "/" in target or os.sep in target:
        file = Path(target).expanduser().resolve()
        if not file.is_file():
            raise ConfigError(f"reward `{spec_text}`: file not found: {file}")
        name = f"gym_user_rewards_{file.stem}"
        spec = importlib.util.spec_from_file_location(name, file)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses and pickling look the module up by name
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[name]
            raise ConfigError(f"reward `{spec_text}`: importing {file} failed: {exc!r}") from exc
    else:
        if os.getcwd() not in sys.path:  # so a rewards.py next to the config is importable, as users expect
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(target)
        except Exception as exc:
            raise ConfigError(f"reward `{spec_text}`: cannot import module '{target}': {exc!r}") from exc
    fn = getattr(module, attr, None)
    if fn is None:
        raise ConfigError(f"reward `{spec_text}`: module '{target}' has no attribute '{attr}'.")
    if not callable(fn):
        raise ConfigError(f"reward `{spec_text}`: '{attr}' is not callable (it is a {type(fn).__name__}).")

    @functools.wraps(fn)
    def checked(prompts: list, completions: list, **kwargs: Any) -> list[float | None]:
        rewards = fn(prompts=prompts, completions=completions, **kwargs)
        expected = f"expected a list of {len(completions)} numbers (or None), one per completion"
        if not isinstance(rewards, (list, tuple)):
            raise GymError(f"Reward function `{spec_text}` returned a {type(rewards).__name__}; {expected}.")
        if len(rewards) != len(completions):
            raise GymError(f"Reward function `{spec_text}` returned {len(rewards)} values; {expected}.")
        bad = [r for r in rewards if r is not None and (isinstance(r, bool) or not isinstance(r, (int, float)))]
        if bad:
            raise GymError(f"Reward function `{spec_text}` returned {bad[0]!r} ({type(bad[0]).__name__}); {expected}.")
        return [None if r is None else float(r) for r in rewards]

    return checked


# ---------------------------------------------------------------- registry

REWARD_FUNCS: dict[str, Callable[[str | None], RewardFunc]] = {
    "accuracy": _accuracy,
    "format": _format,
    "length": _length,
    "reward_model": _reward_model,
    "python": _python,
}


def _split_specs(names: str) -> list[str]:
    """Split "accuracy,format:<regex>" on commas, except the commas inside a regex (`\\d{1,3}`)."""
    specs: list[str] = []
    for piece in names.split(","):
        if specs and specs[-1].startswith("format:") and piece.split(":", 1)[0].strip() not in REWARD_FUNCS:
            specs[-1] += "," + piece
        else:
            specs.append(piece.strip())
    return [s for s in specs if s]


def get_reward_funcs(
    names: str | list[str] | None, weights: list[float] | None = None
) -> tuple[list[RewardFunc], list[float]]:
    """Reward callables for `reward_funcs` (a list, or a comma-separated string) and their weights."""
    specs = _split_specs(names) if isinstance(names, str) else [str(n).strip() for n in names or []]
    if not specs:
        raise ConfigError(
            f"No reward functions: set reward_funcs, e.g. `reward_funcs: [accuracy, format]` "
            f"(known: {', '.join(REWARD_FUNCS)})."
        )
    if isinstance(weights, str):
        weights = [w for w in weights.split(",") if w.strip()]
    if weights is None:
        weights = [1.0] * len(specs)
    if len(weights) != len(specs):
        raise ConfigError(
            f"reward_weights has {len(weights)} values but reward_funcs has {len(specs)} ({', '.join(specs)}); "
            "give one weight per reward function, or leave reward_weights out for all 1.0."
        )
    try:
        weights = [float(w) for w in weights]
    except (TypeError, ValueError):
        raise ConfigError(f"reward_weights must be numbers, got {weights!r}.") from None
    funcs: list[RewardFunc] = []
    seen: dict[str, int] = {}
    for spec in specs:
        name, colon, arg = spec.partition(":")
        name = name.strip()
        if name not in REWARD_FUNCS:
            close = difflib.get_close_matches(name, REWARD_FUNCS, n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise ConfigError(f"Unknown reward function '{name}'.{hint} Known: {', '.join(REWARD_FUNCS)}.")
        fn = REWARD_FUNCS[name](arg if colon else None)
        # TRL logs each reward under fn.__name__; two entries with one name would merge in the logs.
        seen[fn.__name__] = seen.get(fn.__name__, 0) + 1
        if seen[fn.__name__] > 1:
            fn.__name__ = f"{fn.__name__}_{seen[fn.__name__]}"
        funcs.append(fn)
    return funcs, weights


def combined_reward(
    funcs: list[RewardFunc], weights: list[float], prompts: list, completions: list, **columns: Any
) -> list[float]:
    """The weighted sum of all rewards per completion; None (and NaN) count as 0."""
    if len(funcs) != len(weights):
        raise ConfigError(f"{len(funcs)} reward functions but {len(weights)} weights.")
    totals = [0.0] * len(completions)
    for fn, weight in zip(funcs, weights):
        for i, reward in enumerate(fn(prompts=prompts, completions=completions, **columns)):
            if reward is not None and not math.isnan(reward):
                totals[i] += weight * reward
    return totals


# ---------------------------------------------------------------- the config keys every online stage shares

@dataclass
class RewardChoice:
    """Where rewards come from (grpo, gspo, rloo, ppo): named reward functions and/or a trained reward model."""

    reward_funcs: list[str] | None = field(
        default=None,
        metadata={"help": "Reward functions: accuracy, format, length, reward_model:<path>, python:module:function."},
    )
    reward_weights: list[float] | None = field(
        default=None, metadata={"help": "One weight per reward function (default: all 1)."}
    )
    reward_model: str | None = field(
        default=None, metadata={"help": "Output folder of a `stage: rm` run, used as one more reward."}
    )


def rewards_of(choice: RewardChoice) -> tuple[list[RewardFunc], list[float]]:
    """The reward callables and weights a stage's options ask for; `reward_model` weighs 1 unless weighted."""
    names = list(choice.reward_funcs or [])
    weights = list(choice.reward_weights) if choice.reward_weights is not None else None
    if choice.reward_model:
        names.append(f"reward_model:{choice.reward_model}")
        if weights is not None and len(weights) == len(names) - 1:
            weights.append(1.0)
    if not names:
        raise ConfigError("This stage needs rewards: set `reward_funcs` (e.g. [accuracy, format]) and/or "
                          "`reward_model` (the output folder of a `stage: rm` run).")
    return get_reward_funcs(names, weights)
