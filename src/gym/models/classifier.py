"""A trained sequence classifier (the output folder of `stage: cls`) loaded back, ready to classify conversations.

A full fine-tune is a plain transformers folder (AutoModelForSequenceClassification reads it, class names
included). A LoRA run saves an adapter (task type SEQ_CLS, the `score` head saved whole beside it), as rm does; it
is merged here onto its base, with the class names its gym_config.yaml records. Inputs are rendered exactly as
training rendered its rows (gym.data.processors.classifier_text, in the chat format of gym_config.yaml).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from transformers import AutoConfig, AutoModelForSequenceClassification

from gym.core.errors import ModelError
from gym.core.files import CONFIG_FILE, MANIFEST_FILE
from gym.data.messages import Message
from gym.data.processors import classifier_text
from gym.data.templates import ChatFormat, trained_chat_format
from gym.models.adapters import attach_adapter, trained_base
from gym.models.loader import load_tokenizer, require_safetensors, resolve_model_path


@dataclass
class TrainedClassifier:
    model: Any  # in eval mode, its pad_token_id the tokenizer's
    tokenizer: Any
    chat: ChatFormat
    labels: list[str]  # the class names, in output order
    max_length: int = 2048  # the run's cutoff_len: longer texts keep their last tokens, as in training

    def text(self, messages: Sequence[Message], system: str | None = None) -> str:
        """The text the classifier reads for a conversation (a bare string: one user turn)."""
        return classifier_text(self.chat, messages, system)

    @torch.no_grad()
    def probabilities(self, conversations: Sequence[str | Sequence[Message]], batch_size: int = 16
                      ) -> list[dict[str, float]]:
        """Per conversation (or bare user text), each class's probability."""
        texts = [self.text([{"role": "user", "content": c}] if isinstance(c, str) else c) for c in conversations]
        out: list[dict[str, float]] = []
        pad = self.tokenizer.pad_token_id
        device = next(self.model.parameters()).device
        for start in range(0, len(texts), batch_size):
            ids = [self.tokenizer.encode(t, add_special_tokens=False)[-self.max_length:]
                   for t in texts[start:start + batch_size]]
            longest = max(len(i) for i in ids)
            input_ids = torch.tensor([i + [pad] * (longest - len(i)) for i in ids], device=device)
            mask = torch.tensor([[1] * len(i) + [0] * (longest - len(i)) for i in ids], device=device)
            probs = self.model(input_ids=input_ids, attention_mask=mask).logits.float().softmax(-1)
            out += [dict(zip(self.labels, row)) for row in probs.tolist()]
        return out

    def predict(self, conversations: Sequence[str | Sequence[Message]]) -> list[str]:
        """Per conversation (or bare user text), the most probable class."""
        return [max(p, key=p.__getitem__) for p in self.probabilities(conversations)]


def load_trained_classifier(folder: str | Path) -> TrainedClassifier:
    """The classifier a `stage: cls` run saved in `folder` (full or LoRA), on the GPU when there is one."""
    folder = Path(folder).expanduser()
    config_file = folder / CONFIG_FILE
    saved: Mapping[str, Any] = (yaml.safe_load(config_file.read_text(encoding="utf-8")) or {}
                                if config_file.is_file() else {})
    require_safetensors(folder)
    try:
        if _is_adapter(folder):
            labels = saved.get("labels")
            if not labels:
                raise ModelError(f"{folder} is a LoRA adapter whose {CONFIG_FILE} lists no `labels`: it is not the "
                                 "output of a `stage: cls` run.")
            base = _adapter_base(folder)
            model = AutoModelForSequenceClassification.from_pretrained(
                base, num_labels=len(labels), id2label=dict(enumerate(labels)),
                label2id={name: i for i, name in enumerate(labels)}, dtype=torch.float32)
            model = attach_adapter(model, folder, base)
        elif (folder / "config.json").is_file():
            architectures = AutoConfig.from_pretrained(folder).architectures or []
            if not any(a.endswith("ForSequenceClassification") for a in architectures):
                raise ModelError(f"{folder} is not a sequence classifier (its architecture is "
                                 f"{', '.join(architectures) or 'unknown'}): give the output_dir of a `stage: cls` "
                                 "run.")
            model = AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32)
            labels = [model.config.id2label[i] for i in range(model.config.num_labels)]
        else:
            raise ModelError(f"{folder} holds neither config.json nor adapter_config.json: give the output_dir of a "
                             "`stage: cls` run.")
    except (OSError, ValueError) as exc:
        raise ModelError(f"Could not load the classifier {folder}: {exc}") from None
    tokenizer = load_tokenizer(str(folder))
    model.config.pad_token_id = tokenizer.pad_token_id  # the head finds each row's last token through it
    model.to("cuda" if torch.cuda.is_available() else "cpu").eval()
    return TrainedClassifier(model, tokenizer, trained_chat_format(folder, tokenizer), [str(n) for n in labels],
                             int(saved.get("cutoff_len") or 2048))


def _is_adapter(folder: Path) -> bool:
    """Whether the run saved an adapter: its manifest says (an overwritten output dir may keep an older run's
    adapter files beside a full model), else whether there is an adapter_config.json."""
    try:
        what = json.loads((folder / MANIFEST_FILE).read_text(encoding="utf-8")).get("what")
    except (OSError, ValueError):
        what = None
    return what in ("lora-adapter", "adapter") if what else (folder / "adapter_config.json").is_file()


def _adapter_base(folder: Path) -> str:
    """The base the adapter was trained on, as the run resolved it (its manifest), else as the adapter names it."""
    try:
        resolved = json.loads((folder / MANIFEST_FILE).read_text(encoding="utf-8")).get("resolved_base_path")
    except (OSError, ValueError):
        resolved = None
    if resolved and Path(resolved).exists():
        return str(resolved)
    base = trained_base(folder)
    if not base:
        raise ModelError(f"{folder}: the adapter names no base model (adapter_config.json, {MANIFEST_FILE}).")
    return resolve_model_path(base)
