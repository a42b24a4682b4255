from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class GeneratingArguments:
    """Decoding defaults for chat, serving and batch inference."""

    do_sample: bool = field(default=True, metadata={"help": "Sample; false decodes greedily."})
    temperature: float = field(default=0.7, metadata={"help": "Sampling temperature."})
    top_p: float = field(default=0.9, metadata={"help": "Nucleus sampling mass."})
    top_k: int = field(default=50, metadata={"help": "Sample among the k most likely tokens."})
    max_new_tokens: int = field(default=512, metadata={"help": "Most tokens generated per answer."})
    repetition_penalty: float = field(default=1.0, metadata={"help": "Penalty on repeated tokens (1.0 = none)."})

    def to_generate_kwargs(self) -> dict[str, Any]:
        kwargs = asdict(self)
        if not self.do_sample:
            for key in ("temperature", "top_p", "top_k"):
                kwargs.pop(key)
        return kwargs
