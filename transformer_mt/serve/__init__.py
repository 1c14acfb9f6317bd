"""`transformer-mt serve`: an HTTP API with cross-request batching, and a page showing the attention.

Needs the `serve` extra (FastAPI and uvicorn); `jobs/serve.py` starts it. What each module owns:
docs/architecture.md.
"""
