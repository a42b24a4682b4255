"""LLaMA-Factory-style entry point: `get_train_args(dict)` -> (model, data, training, finetuning, generating)."""

from gym.config.parser import get_infer_args, get_train_args

__all__ = ["get_infer_args", "get_train_args"]
