"""The normalised trace table, its loaders, validation and windows.

Every source (Mooncake JSONL, ART-Chat rows, Bursted datasets, Azure CSV) loads into one
:class:`Trace`: a pandas table with the columns of DESIGN.md section 2 plus the trace's
``block_tokens``. Prefix hash ids are *interned* (renumbered to compact ``int32`` in order of first
appearance) and *chained* (equal id means equal whole prefix), and are stored once in a flat array
(``hash_flat`` + ``hash_offsets``); the table's ``hash_ids`` column holds numpy views into it. A
*compact* trace keeps them as runs of consecutive ids instead (:class:`BlockRuns`,
:mod:`~btb_core.trace.runs`) and expands them only when asked.

Chaining rule (DESIGN.md section 2): after loading, an id identifies one whole prefix of blocks, so
"the first K blocks of requests a and b are equal" is exactly ``hash_ids_a[K-1] == hash_ids_b[K-1]``
and one id never appears at two different positions. Sources whose ids are already chained (Mooncake,
ART-Chat) keep their structure; other sources are re-chained by interning the running prefix
``(id of the prefix so far, raw id of this block)``.

Timestamps
----------
* Mooncake ``timestamp`` is integer milliseconds since the trace start (Mooncake
  ``FAST25-release/README.md``); ``arrival_s = timestamp / 1000`` with no re-basing, so the first
  arrival keeps its own value (0.0 for both shipped traces).
* ART-Chat ``timestamp_ms`` is milliseconds from the trace start (first row 0 on the Hugging Face
  viewer of ``alessiotoniolo/ART-Chat-2.5M``); same rule.
* Azure 2023 ``TIMESTAMP`` is a wall-clock datetime; ``arrival_s`` is seconds since the first row.
* Bursted rows already carry ``arrival_s``; kept as written.

Modules
-------
* :mod:`~btb_core.trace.table`: the :class:`Trace` table, constants, :class:`TraceWarning`;
* :mod:`~btb_core.trace.runs`: :class:`BlockRuns`, ids as runs of consecutive ids;
* :mod:`~btb_core.trace.validate`: :func:`make_trace`, :func:`from_table` (validation, interning);
* :mod:`~btb_core.trace.loaders`: the format loaders, :func:`detect_format`, :func:`load_trace`.

Everything public is importable from ``btb_core.trace`` as before.
"""

from .loaders import (FORMATS, detect_format, load_art, load_azure, load_bursted, load_mooncake,
                      load_trace, looks_like_hub_id, shipped_traces)
from .runs import BlockRuns
from .table import (ART_BLOCK_TOKENS, AZURE_BLOCK_TOKENS, CORE_COLUMNS, MAX_ARRIVAL_S, MAX_TOKENS,
                    MOONCAKE_BLOCK_TOKENS, OPTIONAL_COLUMNS, Trace, TraceWarning,
                    _show)  # noqa: F401  (_show: used by other modules' messages)
from .validate import from_table, make_trace

__all__ = [
    "ART_BLOCK_TOKENS", "AZURE_BLOCK_TOKENS", "BlockRuns", "CORE_COLUMNS", "FORMATS", "MAX_ARRIVAL_S", "MAX_TOKENS",
    "MOONCAKE_BLOCK_TOKENS",
    "OPTIONAL_COLUMNS", "Trace", "TraceWarning", "detect_format", "from_table", "load_art",
    "load_azure", "load_bursted", "load_mooncake", "load_trace", "looks_like_hub_id", "make_trace",
    "shipped_traces",
]
