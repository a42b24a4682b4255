"""Workflows: jobs composed, one layer above them. A training run is train (gym.train), then, when the config asks,
compress the result into a delta (gym.delta) and evaluate it (gym.eval); each job stays ignorant of the others."""
