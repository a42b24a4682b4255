"""Training: the methods (methods/), the path they share (workflow), the harness, outputs and checkpoints."""
