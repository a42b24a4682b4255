"""The training job's methods: one module per family of stages, each with `run(args)`. The stages themselves (names,
options, data kinds) are declared in gym.config.stages, which names the module here that trains each one.
"""
