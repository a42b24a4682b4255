"""Exports of what Gym trained, for other tools: `gym export` (formats in gym.export.config.FORMATS)."""
