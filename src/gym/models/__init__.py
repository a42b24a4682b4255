"""Models: short names and the embedded model, loading (GGUF conversion included), adapters."""
