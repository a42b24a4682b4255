"""Guard categories as OpenAI's moderation categories, so `/v1/moderations` answers in the names clients know.

Each family's own categories map onto OpenAI's where the meaning matches (Llama Guard's MLCommons hazards,
ShieldGemma's harm types); a guard category already named as one of OpenAI's (a keyword list's
`# category: violence`) maps onto itself. A category with no counterpart (Llama Guard's S7 Privacy, say) is
reported under its own name only. An OpenAI category's score is the highest score mapped onto it.
"""

from __future__ import annotations

from gym.safety.verdict import Verdict

OPENAI_CATEGORIES = ("harassment", "harassment/threatening", "hate", "hate/threatening", "illicit",
                     "illicit/violent", "self-harm", "self-harm/intent", "self-harm/instructions", "sexual",
                     "sexual/minors", "violence", "violence/graphic")

TO_OPENAI: dict[str, tuple[str, ...]] = {
    # Llama Guard 3 (MLCommons hazards)
    "S1": ("violence", "illicit/violent"), "S2": ("illicit",), "S3": ("sexual",), "S4": ("sexual/minors",),
    "S5": ("harassment",), "S9": ("illicit/violent", "violence"), "S10": ("hate",), "S11": ("self-harm",),
    "S12": ("sexual",), "S14": ("illicit",),
    # ShieldGemma's harm types
    "dangerous": ("illicit/violent",), "harassment": ("harassment",), "hate": ("hate",), "sexual": ("sexual",),
}


def openai_categories(verdict: Verdict) -> tuple[dict[str, bool], dict[str, float]]:
    """(categories, category_scores) in OpenAI's names, plus the guard's own categories that have none."""
    flags = {name: False for name in OPENAI_CATEGORIES}
    scores = {name: 0.0 for name in OPENAI_CATEGORIES}
    for name, hit in verdict.categories.items():
        score = float(verdict.scores.get(name, 1.0 if hit else 0.0))
        targets = TO_OPENAI.get(name) or ((name,) if name in OPENAI_CATEGORIES else ())
        for target in targets or (name,):
            flags[target] = flags.get(target, False) or hit
            scores[target] = max(scores.get(target, 0.0), score)
    return flags, scores
