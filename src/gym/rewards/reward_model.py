"""`reward_model:<path>`: a trained reward model (the output of `stage: rm`) as a reward function.

The model is loaded once per path, merged if it is a LoRA adapter, and scores each prompt + answer
rendered in the chat format it was trained with (its gym_config.yaml).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoTokenizer
from transformers import AutoModelForSequenceClassification as SeqCls

from gym.core.errors import ConfigError, ModelError
from gym.core.files import MANIFEST_FILE
from gym.data.templates import trained_chat_format
from gym.models.adapters import load_peft_adapter
from gym.rewards.verifiers import RewardFunc, as_text

_SCORE_BATCH = 16
_MAX_LENGTH = 2048


def _not_reward_model(path: Path, why: str) -> ConfigError:
    return ConfigError(
        f"{path} is not a reward model: expected the output folder of `stage: rm` (a sequence-classification "
        f"model, or a LoRA adapter with task_type SEQ_CLS); {why}."
    )


@functools.cache
def load_reward_model(path: str) -> tuple[Any, Any, Any]:
    """The model, tokenizer and chat format of a `stage: rm` output folder, ready for batched scoring
    (cached per path). The chat format is the one the reward model was trained with (its gym_config.yaml)."""
    folder = Path(path).expanduser()
    if not folder.is_dir() and path.count("/") == 1 and not path.startswith((".", "/", "~")):
        folder = _from_hub(path)
    if not folder.is_dir():
        raise ConfigError(f"reward_model: {folder} is not a folder; give the output_dir of a `stage: rm` run (or a "
                          "hub id of a sequence-classification model).")
    adapter_file, manifest_file = folder / "adapter_config.json", folder / MANIFEST_FILE
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
            model = SeqCls.from_pretrained(base, num_labels=1, dtype=torch.float32)
            model = load_peft_adapter(model, folder).merge_and_unload()  # NaN or missing weights refused
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
    return model, tokenizer, trained_chat_format(folder, tokenizer)


def _from_hub(repo_id: str) -> Path:
    """A hub reward model (a sequence-classification model, as TRL takes them), downloaded or from the cache."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id))
    except LocalEntryNotFoundError:
        raise ModelError(f"reward_model '{repo_id}' is a Hugging Face Hub id, and it is not in the local cache while "
                         "this process is offline: download it once with network, or give the output_dir of a "
                         "`stage: rm` run.") from None
    except Exception as exc:  # huggingface_hub raises many types for missing or private repos
        raise ModelError(f"reward_model '{repo_id}' could not be fetched from the Hugging Face Hub: {exc}") from None


def _rm_text(prompt: Any, completion: Any, chat: Any) -> str:
    """Prompt and answer rendered as `stage: rm` saw its pairs: the answer closed by its end-of-turn,
    where the score head was trained to read."""
    answer = {"role": "assistant", "content": as_text(completion)}
    if isinstance(prompt, list):  # a conversation: render it whole
        return "".join(p + r for p, r in chat.render_pairs(prompt + [answer]))
    # Gym's online stages pass prompts already rendered in the chat format: add the answer's piece.
    (_, answer_piece), = chat.render_pairs([{"role": "user", "content": ""}, answer])
    return as_text(prompt) + str(answer_piece)


def reward_model_reward(arg: str | None) -> RewardFunc:
    if not arg:
        raise ConfigError("reward `reward_model` needs a path: reward_model:<output_dir of a `stage: rm` run>.")
    local = Path(arg).expanduser()
    # a folder is cached by its absolute path (one load per run, wherever it is named from); a hub id as given
    model, tokenizer, chat = load_reward_model(str(local.resolve()) if local.exists() else arg)

    def reward_model(prompts: list[Any] | None, completions: list[Any], **kwargs: Any) -> list[float | None]:
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
