"""Repository and data paths, resolved from the package location, never from the current directory.

Two layouts:

- a source checkout (``make install`` is an editable install): the package sits next to
  ``pyproject.toml``; :data:`REPO_ROOT` is that folder, :data:`DATA_DIR` its ``data/``;
- an installed wheel (``pip install .``, not editable): the shipped data are installed with it
  under ``<prefix>/share/btb_core/data`` (``[tool.setuptools.data-files]`` in ``pyproject.toml``),
  and outputs that would go under the repository (``build/``, ``figures/``) go under
  ``$BTB_HOME`` (default ``~/.btb``).

``$BTB_DATA_DIR`` overrides :data:`DATA_DIR` in both layouts (a folder laid out as ``data/``).
"""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

_PACKAGE_PARENT = Path(__file__).resolve().parents[1]
#: True when running from a source checkout (editable install), False for an installed wheel.
IN_CHECKOUT = (_PACKAGE_PARENT / "pyproject.toml").is_file() and (_PACKAGE_PARENT / "btb_core").is_dir()

#: Repository root (the folder holding ``pyproject.toml``) in a checkout; else ``$BTB_HOME`` or
#: ``~/.btb``, where an installed package writes what a checkout keeps under its root.
REPO_ROOT = (_PACKAGE_PARENT if IN_CHECKOUT
             else Path(os.environ.get("BTB_HOME", Path.home() / ".btb")).expanduser().resolve())

#: Shipped data (traces, profiles), each with SOURCE.md and license.
if os.environ.get("BTB_DATA_DIR"):
    DATA_DIR = Path(os.environ["BTB_DATA_DIR"]).expanduser().resolve()
elif IN_CHECKOUT:
    DATA_DIR = _PACKAGE_PARENT / "data"
else:
    DATA_DIR = Path(sysconfig.get_path("data")) / "share" / "btb_core" / "data"


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
