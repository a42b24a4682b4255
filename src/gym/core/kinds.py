"""The kinds of training data, named once: which rows a stage reads and how they are tokenized."""

from __future__ import annotations

import enum


class DataKind(str, enum.Enum):
    UNSUPERVISED = "unsupervised"  # plain text (pt)
    SUPERVISED = "supervised"  # conversations, loss on the answers (sft)
    PAIRWISE = "pairwise"  # a prompt with a chosen and a rejected answer (rm, dpo family)
    FEEDBACK = "feedback"  # an answer tagged desirable or not (kto)
    PROMPT = "prompt"  # prompts only; the method samples the answers (ppo, grpo, gspo, rloo)
    LABELLED = "labelled"  # a text or conversation with a class label (cls)
