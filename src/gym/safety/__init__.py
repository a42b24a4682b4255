"""Safety: guard models that judge a conversation, the refusal judge, the safety evaluation's sets and metrics, and
the gate that refuses a variant whose harmful compliance rose.

A guard answers (flagged, categories, scores) for the last message of a conversation; `gym api --guard`, the
moderation route, `gym eval --task safety:...` and the gates all ask the same `Guard`. This package generates
nothing itself: callers that need a model's answers (eval, variants, soup, deltas, the service) pass them in, so
it sits below all of them and imports none.
"""
