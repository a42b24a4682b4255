"""Rewards: the rule-based verifiers (accuracy, format, length, ...), a trained reward model as a reward, and user
functions, built from the `reward_funcs` specs of gym.config.rewards. Training (grpo, gspo, rloo, ppo), evaluation
(gen: tasks) and Training-Free GRPO score answers with the same functions."""
