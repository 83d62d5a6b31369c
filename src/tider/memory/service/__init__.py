"""``tider memory serve``: the HTTP service over named memories.

``app`` (the FastAPI app, adds, errors, access by route), ``manage`` (get, list, update,
delete), ``search`` (one memory, several), ``keys`` (API keys bound to name patterns),
``open_memories`` (the bounded set of open memories).
"""

from tider.memory.service.app import create_app, serve

__all__ = ["create_app", "serve"]
