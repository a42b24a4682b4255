"""The HTTP door: an OpenAI-compatible API (FastAPI + uvicorn) over gym.infer's engine."""
