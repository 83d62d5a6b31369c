"""Memory as a library and a service: ``TemporalMemory`` (add / search / context,
persistent, incremental, index-backed), ``MemoryCollection`` (one in-process memory per
conversation of a dataset: what the evaluation harness and the GRPO rewards search
through) and the HTTP service (``tider.memory.service``)."""

from tider.memory.base import MemoryBase, SearchHits
from tider.memory.collection import MemoryCollection
from tider.memory.files import StoreError
from tider.memory.records import MemoryInputError
from tider.memory.temporal_memory import TemporalMemory

__all__ = ["MemoryBase", "MemoryCollection", "MemoryInputError", "SearchHits", "StoreError", "TemporalMemory"]
