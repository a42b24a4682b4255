"""Configuration: one dataclass per concern, the method registry, and the strict parser that fills them."""
