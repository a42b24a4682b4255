"""The `zoo` namespace of the seeds' examples: `from zoo.gym import ...` is `from gym import ...`."""
