"""Model merging: `gym merge CONFIG` combines LoRA adapters or full fine-tunes of one base into one model folder
(linear, task arithmetic, TIES, DARE; docs/merge.md). The entry points are gym.merge.run.merge_models and
gym.cli.merge.main; importing this package loads neither torch nor transformers."""
