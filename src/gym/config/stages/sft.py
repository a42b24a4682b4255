"""stage: sft, supervised fine-tuning on conversations (run by gym.train.methods.sft)."""

from gym.config.stages.registry import Stage, register
from gym.core.kinds import DataKind

register(Stage(name="sft", data_kind=DataKind.SUPERVISED, trainer="gym.train.methods.sft",
               summary="supervised fine-tuning on conversations", media=True))
