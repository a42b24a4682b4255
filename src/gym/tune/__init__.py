"""Hyper-parameter search over training configs (gym tune), with Optuna."""
