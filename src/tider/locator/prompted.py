"""The ``prompted`` window source (zero-shot baseline) lives beside the endpoint locator
in ``tider.locator.endpoint``; importing this module registers it under the name the
source registry's ``LAZY_SOURCES`` points at."""

from tider.locator.endpoint import make_prompted_source  # noqa: F401  (registers "prompted")
