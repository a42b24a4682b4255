"""Data: dataset registry, row formats, chat templates, tokenization per data kind, packing, collators."""
