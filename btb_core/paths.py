"""Repository paths, resolved from the package location, never from the current directory."""

from __future__ import annotations

import os
from pathlib import Path

#: Repository root (the folder holding ``pyproject.toml``); valid for an editable install.
REPO_ROOT = Path(__file__).resolve().parents[1]
#: Shipped data (traces, profiles), each with SOURCE.md and license.
DATA_DIR = REPO_ROOT / "data"


def figures_dir() -> Path:
    """Where notebooks save figures: ``$BTB_FIGURES_DIR`` if set, else ``<repo>/build/figures``.

    Only ``make reproduce`` (``python -m btb_core.notebooks --params ...``) points this at the shipped
    ``figures/``; ``make test`` uses ``build/figures-quick``; a notebook run by hand (JupyterLab) writes
    to ``build/figures`` so it never overwrites the full-size figures. A relative path is taken from the
    repository root.
    """
    path = Path(os.environ.get("BTB_FIGURES_DIR", REPO_ROOT / "build" / "figures"))
    if not path.is_absolute():
        path = REPO_ROOT / path
    path.mkdir(parents=True, exist_ok=True)
    return path
