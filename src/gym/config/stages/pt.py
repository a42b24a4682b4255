"""stage: pt, continued pre-training on plain text (run by gym.train.methods.pt)."""

from gym.config.stages.registry import Stage, register
from gym.core.kinds import DataKind

register(Stage(name="pt", data_kind=DataKind.UNSUPERVISED, trainer="gym.train.methods.pt",
               summary="continued pre-training on plain text"))
