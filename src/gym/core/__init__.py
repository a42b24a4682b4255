"""The bottom layer: errors, small helpers, shared kinds and file-format constants.

Nothing here imports from the rest of Gym, and nothing here imports torch or transformers at module
level, so every other layer (and `import gym`) may use it for free.
"""
