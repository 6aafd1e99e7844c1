"""Hypothesis strategies shared by the property tests (not a test module)."""

from __future__ import annotations

from hypothesis import strategies as st

from btb_core.trace import make_trace


@st.composite
def family_traces(draw, block_tokens: int, max_requests: int = 30, max_gap_s: float = 0.5,
                  max_shared_blocks: int = 12, extra_tokens: tuple[int, int] = (1, 400),
                  max_output: int = 30, branches: int = 0):
    """Small traces whose rows share prefixes in up to 4 families.

    Each row: an arrival gap in ``[0, max_gap_s]``; up to ``max_shared_blocks`` blocks of its
    family's prefix; with ``branches`` > 0, up to 3 blocks of one of ``branches + 1`` sub-prefixes
    of the family (a second level of sharing); then its own blocks, for ``shared x block_tokens +
    extra`` tokens in all (``extra`` drawn from ``extra_tokens``); an output of 1 ..
    ``max_output`` tokens. Ids are strings, chained and interned by ``make_trace``.
    """
    n = draw(st.integers(1, max_requests))
    families = draw(st.integers(1, 4))
    rows = []
    t = 0.0
    for k in range(n):
        t += draw(st.floats(0.0, max_gap_s))
        fam = draw(st.integers(0, families - 1))
        shared = draw(st.integers(0, max_shared_blocks))
        branch = draw(st.integers(0, branches)) if branches else None
        extra = draw(st.integers(*extra_tokens))
        out = draw(st.integers(1, max_output))
        tokens = shared * block_tokens + extra
        n_blocks = -(-tokens // block_tokens)
        ids = [f"f{fam}-{i}" for i in range(min(shared, n_blocks))]
        if branch is not None:
            ids += [f"f{fam}-b{branch}-{i}" for i in range(min(3, n_blocks - len(ids)))]
        ids += [f"u{k}-{i}" for i in range(n_blocks - len(ids))]
        rows.append((t, tokens, out, ids))
    a, i, o, h = zip(*rows)
    return make_trace(list(a), list(i), list(o), list(h), block_tokens=block_tokens)
