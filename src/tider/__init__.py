"""tider: a learned temporal-window locator for long-horizon agent memory."""

__version__ = "0.1.0"

__all__ = ["TemporalMemory"]


def __getattr__(name: str):
    # Lazy: `import tider` (and `tider --help`) must not import faiss or torch.
    if name == "TemporalMemory":
        from tider.memory import TemporalMemory

        return TemporalMemory
    raise AttributeError(f"module 'tider' has no attribute {name!r}")
