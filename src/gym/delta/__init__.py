"""Fine-tune deltas: extract, compress (BitDelta, DeltaQuant), store, apply."""
