"""tider: a learned temporal-window locator for long-horizon agent memory."""

__version__ = "0.1.0"
