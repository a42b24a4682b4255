"""Guards that are models: a sequence classifier, or a chat model of a guard family that answers in words.

Classifier (`classifier:PATH`, what `gym train` stage cls makes, or any transformers sequence-classification
model): the judged message's text alone is classified (a stage cls output reads it as one user turn in its chat
format, as it read its `text` rows). Labels named like safe/benign/none/neutral (or LABEL_0
of an unnamed binary model) are the clear classes; every other label is a category, scored by its probability
(sigmoid per label for a multi-label model, softmax otherwise). Flagged when a category's score reaches the
threshold.

Chat guards (Llama Guard 3, ShieldGemma, Qwen3Guard, Granite Guardian) are causal language models that write a
verdict. Each is prompted in its own format (`gym.safety.formats`), decoded greedily for a few tokens, and scored
where its verdict word starts: the score is P(flag word) / (P(flag word) + P(clear word)) from the logits at that
step, the field's usual reading (ShieldGemma's card scores Yes against No the same way). Flagged when the score
reaches the threshold, so the decision and the score always agree. Categories are read from the words the guard
wrote (Llama Guard's second line, Qwen3Guard's `Categories:`), or are the policies that flagged (ShieldGemma,
one pass per policy) or the risk checked (Granite Guardian).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gym.core.errors import ConfigError, ModelError
from gym.core.files import CONFIG_FILE
from gym.models.classifier import TrainedClassifier, load_trained_classifier
from gym.models.loader import resolve_model_path
from gym.models.vision import is_multimodal
from gym.safety.base import Guard
from gym.safety.formats import (
    LLAMA_GUARD_CATEGORIES,
    SHIELDGEMMA_POLICIES,
    Policy,
    llama_guard_prompt,
    shieldgemma_prompt,
)
from gym.safety.verdict import Message, Verdict, last_text

CLEAR_LABELS = {"safe", "benign", "none", "neutral", "ok", "clean", "not_toxic", "non_toxic", "non-toxic",
                "negative", "normal", "label_0"}
BATCH = 8


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _config(folder: str) -> dict[str, Any]:
    path = Path(folder) / "config.json"
    if path.is_file():
        return dict(json.loads(path.read_text()))
    try:
        from transformers import AutoConfig

        return dict(AutoConfig.from_pretrained(folder).to_dict())
    except (OSError, ValueError) as exc:
        raise ModelError(f"Could not read the guard model's config at {folder}: {_first_line(exc)}") from None


def detect_family(folder: str, tokenizer: Any | None, config: dict[str, Any]) -> str:
    """The guard family of a model folder, from its architecture, its chat template, then its name."""
    if any(str(a).endswith("ForSequenceClassification") for a in config.get("architectures") or []):
        return "classifier"
    template = str(getattr(tokenizer, "chat_template", None) or "")
    if "unsafe content" in template and "categories" in template.lower():
        return "llama-guard"
    if "guardian_config" in template or "risk_name" in template:
        return "granite-guardian"
    if "Human Question" in template or "guideline" in template:
        return "shieldgemma"
    if "Safety:" in template and "Categories:" in template:
        return "qwen3guard"
    name = (str(config.get("_name_or_path") or "") + " " + folder).lower().replace("_", "-")
    for needle, family in (("llama-guard", "llama-guard"), ("llamaguard", "llama-guard"),
                           ("shieldgemma", "shieldgemma"), ("qwen3guard", "qwen3guard"),
                           ("granite-guardian", "granite-guardian")):
        if needle in name:
            return family
    raise ConfigError(f"{folder} is not a guard Gym recognises: neither a sequence-classification model nor one of "
                      "Llama Guard, ShieldGemma, Qwen3Guard or Granite Guardian (by its chat template or name). Name "
                      "the family in the guard spec (gym api's --guard, gym eval's --safety_judge, a gate's judge): "
                      "llama-guard:PATH (or shieldgemma:, qwen3guard:, granite-guardian:, classifier:).")


def load_model_guard(family: str | None, target: str, *, spec: str, threshold: float) -> Guard:
    folder = resolve_model_path(target)
    from transformers import AutoTokenizer

    adapter = (Path(folder) / "adapter_config.json").is_file()
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError) as exc:
        raise ModelError(f"Could not load the guard's tokenizer from {folder}: {_first_line(exc)}") from None
    if family is None:
        family = "classifier" if adapter and "SEQ_CLS" in (Path(folder) / "adapter_config.json").read_text() \
            else detect_family(folder, tokenizer, {} if adapter else _config(folder))
    if family == "classifier":
        return ClassifierGuard(spec, folder, tokenizer, threshold)
    return ChatGuard(spec, family, folder, tokenizer, threshold)


class _ModelGuard(Guard):
    def __init__(self, spec: str, threshold: float) -> None:
        self.spec = spec
        self.threshold = threshold
        # One forward at a time: torch already uses every core for one, and the server calls from many threads.
        self._lock = threading.Lock()
        self.model: Any = None

    def close(self) -> None:
        self.model = None


class ClassifierGuard(_ModelGuard):
    """A sequence classifier, reading the judged message's text alone (an answer is judged as the text it is, not
    as a reply: a guard trained on prompts has never seen a conversation with answers, and flags any). One trained
    by `gym train` stage cls (its folder holds the run's gym_config.yaml) reads that text as its `text` rows were
    read, one user turn in its chat format (gym.models.classifier)."""

    def __init__(self, spec: str, folder: str, tokenizer: Any, threshold: float) -> None:
        super().__init__(spec, threshold)
        self.trained: TrainedClassifier | None = None
        if (Path(folder) / CONFIG_FILE).is_file():
            self.trained = load_trained_classifier(folder)
            self.model, self.tokenizer, self.labels = self.trained.model, self.trained.tokenizer, self.trained.labels
            self.multi_label = False
        else:
            self._load_plain(folder, tokenizer)
        clear = [i for i, name in enumerate(self.labels) if name.lower() in CLEAR_LABELS]
        if not clear and not self.multi_label:
            raise ConfigError(f"Guard classifier {folder} has labels {self.labels}, none of which means 'safe' "
                              f"({', '.join(sorted(CLEAR_LABELS))}); a single-label guard needs a clear class.")
        self.clear = set(clear)
        self.categories = tuple(name for i, name in enumerate(self.labels) if i not in self.clear)

    def _load_plain(self, folder: str, tokenizer: Any) -> None:
        from transformers import AutoModelForSequenceClassification

        missing: list[str] = []
        try:
            if (Path(folder) / "adapter_config.json").is_file():
                from peft import AutoPeftModelForSequenceClassification

                model = AutoPeftModelForSequenceClassification.from_pretrained(folder).merge_and_unload()
            else:
                model, info = AutoModelForSequenceClassification.from_pretrained(folder, output_loading_info=True)
                missing = sorted(info.get("missing_keys") or ())
        except (OSError, ValueError) as exc:
            raise ModelError(f"Could not load the guard classifier {folder}: {_first_line(exc)}") from None
        if missing:
            # transformers gives a causal LM (or a bare encoder) a freshly drawn head and only logs it: such a guard
            # would flag at random, so a head the folder does not hold is refused.
            architectures = ", ".join(model.config.architectures or []) or "unknown"
            raise ConfigError(f"{folder} is not a trained sequence classifier (its architecture is {architectures}, "
                              f"so {', '.join(missing[:3])} would be random): a classifier guard needs a model with "
                              "its classification head, such as the output of `gym train` stage cls. For a chat "
                              "guard, name its family (llama-guard:, shieldgemma:, qwen3guard:, granite-guardian:).")
        self.model = model.eval()
        self.tokenizer = tokenizer
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        if model.config.pad_token_id is None:
            model.config.pad_token_id = tokenizer.pad_token_id
        labels = {int(k): str(v) for k, v in model.config.id2label.items()}
        self.labels = [labels[i] for i in range(len(labels))]
        self.multi_label = model.config.problem_type == "multi_label_classification"

    def probabilities(self, conversations: Sequence[list[Message]]) -> list[list[float]]:
        """Each conversation's class probabilities, in label order."""
        texts = [last_text(c) or " " for c in conversations]
        if self.trained is not None:  # each text as one user turn, as the classifier read its rows' text
            return [[row[name] for name in self.labels] for row in self.trained.probabilities(texts)]
        rows: list[list[float]] = []
        for start in range(0, len(texts), BATCH):
            batch = self.tokenizer(texts[start:start + BATCH], return_tensors="pt", padding=True, truncation=True,
                                   max_length=min(int(getattr(self.tokenizer, "model_max_length", 2048)), 2048))
            with torch.inference_mode():
                logits = self.model(**batch).logits.float()
            rows += (torch.sigmoid(logits) if self.multi_label else torch.softmax(logits, dim=-1)).tolist()
        return rows

    def check_batch(self, conversations: Sequence[list[Message]]) -> list[Verdict]:
        with self._lock:
            probs = self.probabilities(conversations)
        verdicts = []
        for row in probs:
            scores = {self.labels[i]: float(p) for i, p in enumerate(row) if i not in self.clear}
            hits = {name: score >= self.threshold for name, score in scores.items()}
            if not self.multi_label:  # a single-label model is flagged as much as it is not clear
                unsafe = 1.0 - sum(row[i] for i in self.clear)
                flagged = unsafe >= self.threshold
                if flagged and not any(hits.values()):  # unsafe in all, in no one category: name the likeliest
                    hits[max(scores, key=scores.__getitem__)] = True
            else:
                flagged = any(hits.values())
            verdicts.append(Verdict(flagged, hits, scores))
        return verdicts


@dataclass(frozen=True)
class _Family:
    flag_words: tuple[str, ...]
    clear_words: tuple[str, ...]
    verdict: str
    """A regular expression whose group 1 is the verdict word in the guard's answer."""
    max_new_tokens: int
    needs_template: bool


FAMILY_WORDS: dict[str, _Family] = {
    "llama-guard": _Family(("unsafe",), ("safe",), r"^\s*(unsafe|safe)\b", 16, False),
    "shieldgemma": _Family(("Yes",), ("No",), r"^\s*(Yes|No)\b", 1, False),
    "qwen3guard": _Family(("Unsafe", "Controversial"), ("Safe",), r"Safety:\s*(Unsafe|Controversial|Safe)\b", 24,
                          True),
    "granite-guardian": _Family(("Yes", "yes"), ("No", "no"), r"^\s*(?:<score>\s*)?(Yes|No|yes|no)\b", 8, True),
}


class ChatGuard(_ModelGuard):
    def __init__(self, spec: str, family: str, folder: str, tokenizer: Any, threshold: float,
                 risk: str = "harm") -> None:
        super().__init__(spec, threshold)
        self.family = family
        self.words = FAMILY_WORDS[family]
        self.tokenizer = tokenizer
        self.folder = folder
        self.risk = risk
        template = str(getattr(tokenizer, "chat_template", None) or "")
        self.own_template = bool(template)
        if self.words.needs_template and not template:
            raise ConfigError(f"{folder}: a {family} guard is prompted by the chat template its tokenizer ships, "
                              "and this tokenizer has none (copy tokenizer_config.json / chat_template.jinja from "
                              "the published model).")
        from transformers import AutoModelForCausalLM

        if is_multimodal(folder):  # transformers would say "Unrecognized configuration class LlavaConfig ..."
            raise ModelError(f"{folder} is a vision-language model; a {family} guard reads text, and is a text model "
                             "(the family's published guard, or a causal LM fine-tuned to answer as it does).")
        try:
            self.model = AutoModelForCausalLM.from_pretrained(folder).eval()
        except (OSError, ValueError) as exc:
            raise ModelError(f"Could not load the guard model {folder}: {_first_line(exc)}") from None
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.padding_side = "left"
        self.flag_ids = self._word_ids(self.words.flag_words)
        self.clear_ids = self._word_ids(self.words.clear_words)
        if family == "llama-guard":
            self.categories = tuple(LLAMA_GUARD_CATEGORIES)
        elif family == "shieldgemma":
            self.categories = tuple(p.category for p in SHIELDGEMMA_POLICIES)
        elif family == "granite-guardian":
            self.categories = (risk,)
        else:
            self.categories = ()

    def _word_ids(self, words: tuple[str, ...]) -> list[int]:
        """The first token of each word, bare and after a space: whichever the guard writes first."""
        ids: set[int] = set()
        for word in words:
            for text in (word, " " + word):
                pieces = self.tokenizer.encode(text, add_special_tokens=False)
                if pieces:
                    ids.add(int(pieces[0]))
        return sorted(ids)

    # ---- prompts ----------------------------------------------------------------------------------------------
    def prompts(self, conversation: list[Message]) -> list[tuple[str, str | None]]:
        """(prompt text, the policy it checks or None) per pass: one, or one per ShieldGemma policy."""
        chat = [{"role": m["role"], "content": last_text([m])} for m in conversation
                if m["role"] in ("user", "assistant")]
        if self.family == "shieldgemma":
            return [(self._shieldgemma(chat, policy), policy.category) for policy in SHIELDGEMMA_POLICIES]
        if self.family == "llama-guard":
            text = (self.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
                    if self.own_template else llama_guard_prompt(chat))
            return [(text, None)]
        if self.family == "granite-guardian":
            text = self.tokenizer.apply_chat_template(chat, guardian_config={"risk_name": self.risk},
                                                      tokenize=False, add_generation_prompt=True)
            return [(text, self.risk)]
        return [(self.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True), None)]

    def _shieldgemma(self, chat: list[Message], policy: Policy) -> str:
        if self.own_template and "guideline" in str(self.tokenizer.chat_template):
            response = bool(chat) and chat[-1]["role"] == "assistant"
            return str(self.tokenizer.apply_chat_template(chat, guideline=policy.guideline(response),
                                                          tokenize=False, add_generation_prompt=True))
        return shieldgemma_prompt(chat, policy)

    # ---- scoring ----------------------------------------------------------------------------------------------
    def answer(self, texts: list[str]) -> list[tuple[str, float]]:
        """(the guard's words, the flag score) per prompt."""
        results: list[tuple[str, float]] = []
        # A rendered template already holds its special tokens (Llama Guard's header, <bos>): do not add twice.
        special = not any(t.startswith(s) for t in texts[:1] for s in
                          filter(None, [getattr(self.tokenizer, "bos_token", None)]))
        for start in range(0, len(texts), BATCH):
            batch = self.tokenizer(texts[start:start + BATCH], return_tensors="pt", padding=True,
                                   add_special_tokens=special)
            with torch.inference_mode():
                out = self.model.generate(**batch, do_sample=False, max_new_tokens=self.words.max_new_tokens,
                                          output_logits=True, return_dict_in_generate=True,
                                          pad_token_id=self.tokenizer.pad_token_id)
            width = batch["input_ids"].shape[1]
            for row in range(len(out.sequences)):
                ids = out.sequences[row, width:].tolist()
                step_logits = [out.logits[step][row] for step in range(len(ids))]
                results.append(self._read(ids, step_logits))
        return results

    def _read(self, ids: list[int], step_logits: list[torch.Tensor]) -> tuple[str, float]:
        eos = {self.tokenizer.eos_token_id, self.tokenizer.pad_token_id}
        kept = [i for i in ids if i not in eos]
        text = self.tokenizer.decode(kept, skip_special_tokens=True)
        found = re.search(self.words.verdict, text, flags=re.MULTILINE)
        step = 0
        if found:  # the step whose token starts the verdict word
            for index in range(len(kept)):
                if len(self.tokenizer.decode(kept[:index + 1], skip_special_tokens=True)) > found.start(1):
                    step = index
                    break
        logits = step_logits[min(step, len(step_logits) - 1)].float()
        pair = torch.stack([torch.logsumexp(logits[self.flag_ids], 0), torch.logsumexp(logits[self.clear_ids], 0)])
        return text, float(torch.softmax(pair, 0)[0])

    def check_batch(self, conversations: Sequence[list[Message]]) -> list[Verdict]:
        passes = [self.prompts(c) for c in conversations]
        texts = [text for p in passes for text, _ in p]
        with self._lock:
            answers = self.answer(texts)
        verdicts, at = [], 0
        for conversation_passes in passes:
            mine = answers[at:at + len(conversation_passes)]
            at += len(conversation_passes)
            verdicts.append(self._verdict(conversation_passes, mine))
        return verdicts

    def _verdict(self, passes: list[tuple[str, str | None]], answers: list[tuple[str, float]]) -> Verdict:
        if self.family in ("shieldgemma", "granite-guardian"):
            scores = {str(policy): score for (_, policy), (_, score) in zip(passes, answers)}
            hits = {name: score >= self.threshold for name, score in scores.items()}
            return Verdict(any(hits.values()), hits, scores)
        text, score = answers[0]
        flagged = score >= self.threshold
        named = _categories(self.family, text) if flagged else []
        hits = {code: code in named for code in self.categories}
        for name in named:
            hits.setdefault(name, True)
        scores = {name: (score if hit else 0.0) for name, hit in hits.items()}
        if flagged and not named:
            hits["unsafe"], scores["unsafe"] = True, score
        return Verdict(flagged, hits, scores)


def _categories(family: str, text: str) -> list[str]:
    if family == "llama-guard":
        lines = [line.strip() for line in text.strip().splitlines()]
        return [c.strip() for c in lines[1].split(",") if c.strip()] if len(lines) > 1 else []
    found = re.search(r"Categories:\s*(.+)", text)
    if not found or found.group(1).strip().lower() == "none":
        return []
    return [c.strip() for c in re.split(r"[,|]", found.group(1)) if c.strip()]
