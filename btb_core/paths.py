"""Repository paths, resolved from the package location, never from the current directory."""

from __future__ import annotations

import os
from pathlib import Path

#: Repository root (the folder holding ``pyproject.toml``); valid for an editable install.
REPO_ROOT = Path(__file__).resolve().parents[1]
#: Shipped data (traces, profiles), each with SOURCE.md and license.
DATA_DIR = REPO_ROOT / "data"


def figures_dir() -> Path:
    """Where notebooks save figures: ``$BTB_FIGURES_DIR`` if set, else ``<repo>/figures``.

    ``make test`` points this at ``build/figures-quick`` so quick-parameter runs never overwrite the
    full-size figures shipped in ``figures/``. A relative path is taken from the repository root.
    """
    path = Path(os.environ.get("BTB_FIGURES_DIR", REPO_ROOT / "figures"))
    if not path.is_absolute():
        path = REPO_ROOT / path
    path.mkdir(parents=True, exist_ok=True)
    return path
