"""Files the CLI reads at run time, found inside the installed package rather than next to
a checkout: the recipes under ``configs/`` and the shipped tiny locator under ``models/``.

A wheel carries them under ``tider/_data`` (``pyproject.toml``, package-data); in a checkout
``src/tider/_data/configs`` and ``src/tider/_data/models`` are links to the root ``configs/``
and ``models/``, so an editable install reads the files users edit and the docs name.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def path(relative: str) -> Path:
    """The shipped file or folder ``relative`` (as named in the checkout, e.g.
    ``configs/sft/tiny-cpu.yaml``) as an absolute filesystem path, links resolved.

    A real path, not a ``Traversable``: recipes and model folders go to subprocesses and to
    transformers, which open them by name (a wheel installs unzipped, so one always exists)."""
    return Path(str(files("tider").joinpath("_data", relative))).resolve()
