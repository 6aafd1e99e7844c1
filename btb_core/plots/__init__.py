"""Altair chart builders (one module per topic) and :func:`save_chart`.

Chart builders take plain result tables (pandas) and return ``altair`` charts; they import nothing
from the simulator. Notebooks call them and save the result with :func:`save_chart`.
"""

from __future__ import annotations

import os
from pathlib import Path

import altair as alt

from ..fileio import atomic_write_bytes
from ..paths import figures_dir

# Our builders thin their data themselves; a long timeline may still exceed altair's default cap.
alt.data_transformers.disable_max_rows()



def enable_renderer(name: str | None = None) -> str:
    """Choose how charts display in a notebook; returns the renderer's name.

    ``name`` (default ``$BTB_CHART_RENDERER``) is any altair renderer: headless runs (papermill via
    ``make reproduce``, nbval) use ``png`` so the executed notebooks carry static images that read
    offline and on code hosts. Without one, charts are interactive and need no network: altair's
    ``jupyter`` renderer (an anywidget whose Vega / Vega-Lite / vega-embed JavaScript is bundled
    from the ``vl-convert-python`` package, so the Vega-Lite version always matches altair's)
    instead of the default ``html`` renderer, which loads vega from a public CDN and shows "Error
    loading script" offline (JupyterLab's own Vega extension renders Vega-Lite 5 only).
    """
    name = name or os.environ.get("BTB_CHART_RENDERER") or "jupyter"
    if name == "jupyter":
        alt.renderers.enable("jupyter", offline=True)
    else:
        alt.renderers.enable(name)
    return name


enable_renderer()


def policy_order(policies) -> list[str]:
    """The distinct ``policies`` present, in the order of :data:`btb_core.routers.POLICIES` (the
    registry; unknown ones last, in order of appearance), so every chart reads the same way."""
    from ..routers import POLICIES

    present = list(dict.fromkeys(policies))
    return [p for p in POLICIES if p in present] + [p for p in present if p not in POLICIES]


def setup_label(setup: str) -> str:
    """A setup name as a person reads it: ``"70b_h100x4"`` -> ``"Llama-3.3-70B on 4x H100-SXM"``.

    Unknown names are returned unchanged; ``70b_h100x4_reference`` reads as the published table's.
    """
    from ..cost import REFERENCE_SETUP
    from ..specs import GPUS, MODELS, SETUPS

    if setup == REFERENCE_SETUP:
        return "Llama-3.3-70B on 4x H100 (published linear table)"
    if setup not in SETUPS:
        return str(setup)
    model, gpu, n = SETUPS[setup]
    return f"{MODELS[model].name} on {n}x {GPUS[gpu].name}"


def tidy(df, digits: int = 3):
    """A table for display: integer-valued float columns as integers, other floats rounded.

    Counts that pandas stored as float (a column with gaps, e.g. a parameter that only BTB rows
    have) show as ``2``, not ``2.0``; every other float column keeps ``digits`` decimals.
    """
    import pandas as pd

    out = df.copy()
    for col in out.columns:
        s = out[col]
        if pd.api.types.is_float_dtype(s):
            finite = s.dropna()
            if len(finite) and (finite == finite.round()).all() and finite.abs().max() < 2**53:
                out[col] = s.astype("Int64")
            else:
                out[col] = s.round(digits)
    return out.style.format(precision=digits, thousands=",", na_rep="") if digits is not None else out


def save_chart(chart: alt.TopLevelMixin, stem: str, directory: Path | None = None,
               scale: float = 2.0) -> list[Path]:
    """Write ``chart`` as ``<stem>.png`` and ``<stem>.svg`` (via vl-convert), atomically.

    Parameters
    ----------
    chart : altair chart
    stem : str
        File name without extension, e.g. ``"00_prefill_vs_transfer"``.
    directory : Path, optional
        Defaults to :func:`btb_core.paths.figures_dir` (``$BTB_FIGURES_DIR``, else ``build/figures/``:
        only ``make reproduce`` writes the shipped ``figures/``).
    scale : float
        PNG pixel scale factor.

    Returns
    -------
    list of Path
        The PNG and SVG paths written.
    """
    import vl_convert as vlc

    directory = Path(directory) if directory is not None else figures_dir()
    directory.mkdir(parents=True, exist_ok=True)
    spec = chart.to_json()
    png = directory / f"{stem}.png"
    svg = directory / f"{stem}.svg"
    atomic_write_bytes(png, vlc.vegalite_to_png(spec, scale=scale))
    atomic_write_bytes(svg, vlc.vegalite_to_svg(spec).encode())
    return [png, svg]


__all__ = ["enable_renderer", "policy_order", "save_chart", "setup_label", "tidy"]
