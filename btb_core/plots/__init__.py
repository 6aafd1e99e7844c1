"""Altair chart builders (one module per topic) and :func:`save_chart`.

Chart builders take plain result tables (pandas) and return ``altair`` charts; they import nothing
from the simulator. Notebooks call them and save the result with :func:`save_chart`.
"""

from __future__ import annotations

import os
from pathlib import Path

import altair as alt

from ..fileio import atomic_write_bytes
from ..formatting import column_decimals
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


#: Human names of the shipped traces (file stems as :mod:`btb_core.trace` names them).
TRACE_LABELS = {
    "conversation_trace": "Mooncake conversation",
    "synthetic_trace": "Mooncake synthetic",
    "AzureLLMInferenceTrace_code": "Azure LLM 2023 code",
    "AzureLLMInferenceTrace_conv": "Azure LLM 2023 conversation",
}


def trace_label(name: str) -> str:
    """A trace name as a person reads it: ``"conversation_trace"`` -> ``"Mooncake conversation"``.

    Names not in :data:`TRACE_LABELS` (ART-Chat, user files) are returned unchanged.
    """
    return TRACE_LABELS.get(str(name), str(name))


def tidy(df, digits: int | str | None = 3, whole_as_int: bool = True):
    """A table for display: integer-valued float columns as integers, one precision per float column.

    Counts that pandas stored as float (a column with gaps, e.g. a parameter that only BTB rows
    have) show as ``2``, not ``2.0``. Other float columns keep ``digits`` decimals, or with
    ``digits="auto"`` each column gets the decimals of :func:`column_decimals` (3 significant
    figures of its smallest value), so ``0.0122`` and ``19,710`` never share a format and no value
    shows as ``1.971e+04``. Numbers get thousands separators, missing values show empty.
    ``whole_as_int=False`` keeps ``digits`` decimals on whole-number floats too (a ratio column
    that happens to be all 1: ``1.00``, not ``1``).

    Returns
    -------
    pandas.io.formats.style.Styler
        ``digits=None``: the converted :class:`pandas.DataFrame` instead (no formatting).
    """
    import pandas as pd

    out = df.copy()
    formats = {}
    for col in out.columns:
        s = out[col]
        if pd.api.types.is_float_dtype(s):
            finite = s.dropna()
            finite = finite[finite.abs() != float("inf")]
            if (whole_as_int and len(finite) and (finite == finite.round()).all()
                    and finite.abs().max() < 2**53):
                out[col] = s.astype("Int64")
                formats[col] = "{:,}"
            elif digits is not None:
                d = column_decimals(finite) if digits == "auto" else int(digits)
                out[col] = s.round(d)
                formats[col] = f"{{:,.{d}f}}"
        elif pd.api.types.is_integer_dtype(s) and not pd.api.types.is_bool_dtype(s):
            formats[col] = "{:,}"
    if digits is None:
        return out

    def label(v):  # float index / header labels (a window of 1.0 s, a bin of 10.0 s): 1, 10, 0.5
        return f"{v:,g}" if isinstance(v, float) else v

    return (out.style.format(formats, na_rep="").format_index(label, axis=0)
            .format_index(label, axis=1))


def with_subtitle(chart: alt.TopLevelMixin, line: str) -> alt.TopLevelMixin:
    """``chart`` with ``line`` added under its title (e.g. the model, hardware and replicas it ran on).

    Keeps the title and any subtitle lines the builder set. A chart without a title gets ``line``
    as its title (Vega draws no subtitle under an empty title).
    """
    title = chart.title
    if isinstance(title, alt.TitleParams):
        spec = title.to_dict()
    elif isinstance(title, (str, list)) and title:
        spec = {"text": title}
    else:
        return chart.properties(title=alt.TitleParams(line, anchor="start"))
    sub = spec.get("subtitle", [])
    spec["subtitle"] = [*([sub] if isinstance(sub, str) else sub), line]
    spec.setdefault("anchor", "start")
    return chart.properties(title=alt.TitleParams(**spec))


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


__all__ = ["TRACE_LABELS", "column_decimals", "enable_renderer", "policy_order", "save_chart", "setup_label", "tidy",
           "trace_label", "with_subtitle"]
