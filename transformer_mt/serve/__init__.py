"""`transformer-mt serve`: an HTTP API with cross-request batching, and a page showing the attention.

    batcher.py  the queue and the one worker thread that decodes concurrent requests together
    app.py      the FastAPI routes (/translate, /health, /metrics, the page at /), limits and errors
    page.html   the page: a text box, the translation and an interactive cross-attention heatmap

Needs the `serve` extra (FastAPI and uvicorn); `jobs/serve.py` starts it.
"""
