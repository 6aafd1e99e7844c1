"""A suite of burst shapes, and a runner that puts every routing policy on every shape (issue 10).

The Bursted dataset has one burst shape (jobs of 500 requests sharing 65,536 tokens over 60 s). A
router that only wins there answers "does this rule help on this dataset?", not "what should my
router do under bursty shared-prefix traffic?". The suite varies what matters, one axis at a time
around a middle shape (a 32,768-token prefix, 8 requests/s, 4 replicas):

- shared prefix 4k to 128k tokens;
- burst rate 1 to 20 requests/s;
- 4 to 16 replicas;
- no or heavy background traffic (unrelated prompts with their own outputs);
- 1 to 3 concurrent jobs with different prefixes;
- a steady trickle (one long-prefix request per second: nothing to warm);
- decoys (prefixes that repeat two or three times within a second, then never again);
- decode-heavy outputs (hundreds of output tokens per request);
- multi-turn sessions (each turn's prompt extends the previous turn's).

Each shape is a :class:`Shape` (a frozen description) whose :meth:`Shape.build` gives a
:class:`~btb_core.trace.Trace`; arrivals are a Poisson process drawn from a
``numpy.random.Generator`` seeded by ``seed``, so a shape and a seed give one trace. Traces are
small (100-300 requests) so the whole suite runs in a few minutes on two cores.

:func:`run_suite` replays every policy on every shape (serially or on a process pool) and
:func:`summarize` gives one row per (shape, policy): mean / p95 TTFT, copies, unused copies and the
ratio of the policy's mean and p95 TTFT to the best policy of that shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from .errors import ConfigError

#: Tokens per block of the suite's traces (the Mooncake trace block, ``trace.MOONCAKE_BLOCK_TOKENS``).
SUITE_BLOCK_TOKENS = 512

#: Policies :func:`run_suite` runs by default: every policy of :data:`btb_core.routers.POLICIES`
#: except external ones (``sglang_gateway`` starts a real process; name it to include it).
DEFAULT_SETUP = "70b_h100x4"


@dataclass(frozen=True)
class BurstJob:
    """One job: requests sharing one prefix, arriving as a Poisson process.

    Attributes
    ----------
    prefix_tokens : int >= 0
        Shared prefix (a multiple of the block size).
    rate_per_s : float > 0
        Mean arrival rate, requests per second.
    duration_s : float > 0
        The job sends for this long from ``start_s``.
    start_s : float >= 0
    suffix_tokens : int >= 1
        Each request's own tokens after the prefix.
    output_tokens : int >= 1
    """

    prefix_tokens: int
    rate_per_s: float
    duration_s: float
    start_s: float = 0.0
    suffix_tokens: int = 256
    output_tokens: int = 1


@dataclass(frozen=True)
class Shape:
    """One burst shape of the suite (see the module docstring).

    Attributes
    ----------
    name : str
    description : str
    jobs : tuple of BurstJob
    replicas : int >= 1
    background_rate_per_s : float >= 0
        Unrelated requests (own prompt of ``background_tokens`` tokens drawn uniformly, own output
        of ``background_output_tokens``), Poisson, over ``[0, span_s]``.
    background_tokens, background_output_tokens : (int, int)
        Inclusive ranges.
    decoys : int >= 0
        Decoy prefixes: each repeats ``decoy_repeats`` times within 0.5 s at a uniform time in
        ``[0, span_s]``, with ``decoy_prefix_tokens`` shared tokens, then never again.
    sessions : int >= 0
        Multi-turn conversations: ``session_turns`` turns each, ``session_think_s`` apart, starting
        uniformly in ``[0, span_s / 2]``; every session shares a ``session_system_tokens`` system
        prompt, and turn ``k`` appends ``session_turn_tokens`` tokens to turn ``k - 1``'s prompt.
    span_s : float > 0
        Background / decoy / session time span.
    scheduler : {"prefill_first", "chunked"}
    setup : str
        A :data:`btb_core.specs.SETUPS` name.
    block_tokens : int
    """

    name: str
    description: str
    jobs: tuple = ()
    replicas: int = 4
    background_rate_per_s: float = 0.0
    background_tokens: tuple = (1024, 8192)
    background_output_tokens: tuple = (16, 256)
    decoys: int = 0
    decoy_prefix_tokens: int = 16_384
    decoy_repeats: int = 3
    sessions: int = 0
    session_turns: int = 4
    session_think_s: float = 6.0
    session_system_tokens: int = 4096
    session_turn_tokens: int = 2048
    session_output_tokens: int = 128
    span_s: float = 20.0
    scheduler: str = "chunked"
    setup: str = DEFAULT_SETUP
    block_tokens: int = SUITE_BLOCK_TOKENS
    tags: tuple = field(default=(), compare=False)

    def __post_init__(self) -> None:
        def bad(f, why):
            raise ConfigError(f"Shape {self.name!r}: {f}={getattr(self, f)!r}: {why}")

        if not isinstance(self.replicas, int) or self.replicas < 1:
            bad("replicas", "must be an integer >= 1")
        if not self.span_s > 0:
            bad("span_s", "must be > 0")
        for j in self.jobs:
            if j.prefix_tokens % self.block_tokens or j.prefix_tokens < 0:
                bad("jobs", f"prefix_tokens={j.prefix_tokens} is not a multiple of {self.block_tokens}")
            if not (j.rate_per_s > 0 and j.duration_s > 0):
                bad("jobs", "rate_per_s and duration_s must be > 0")
        if not (self.jobs or self.background_rate_per_s > 0 or self.decoys or self.sessions):
            bad("jobs", "the shape sends no request")
        for f in ("decoy_prefix_tokens", "session_system_tokens", "session_turn_tokens"):
            if getattr(self, f) % self.block_tokens:
                bad(f, f"must be a multiple of block_tokens={self.block_tokens}")

    def scaled(self, factor: float) -> "Shape":
        """The same shape with every duration and span multiplied by ``factor`` (fewer requests at
        the same rates; for tests and quick notebook runs)."""
        if not factor > 0:
            raise ConfigError(f"Shape.scaled: factor={factor!r} must be > 0")
        jobs = tuple(replace(j, duration_s=j.duration_s * factor, start_s=j.start_s * factor)
                     for j in self.jobs)
        return replace(self, jobs=jobs, span_s=self.span_s * factor,
                       decoys=int(round(self.decoys * factor)) if self.decoys else 0,
                       sessions=max(1, int(round(self.sessions * factor))) if self.sessions else 0)

    def cluster(self, scheduler: str | None = None):
        """The :class:`~btb_core.sim.ClusterConfig` the shape runs on."""
        from .sim import ClusterConfig

        return ClusterConfig.from_setup(self.setup, num_replicas=self.replicas,
                                        scheduler=scheduler or self.scheduler)

    def build(self, seed: int = 0):
        """The shape's trace for ``seed``: rows sorted by arrival; ``source`` column says ``job``
        (``job0``, ``job1``...), ``background``, ``decoy`` or ``session``."""
        from .trace import make_trace

        rng = np.random.default_rng(seed)
        bt = self.block_tokens
        rows = []                                     # (arrival_s, input, output, ids, source)
        next_id = [1]

        def fresh(n):
            a = next_id[0]
            next_id[0] += n
            return list(range(a, a + n))

        def poisson(rate, start, duration):
            if rate <= 0 or duration <= 0:
                return np.zeros(0)
            n = rng.poisson(rate * duration)
            return np.sort(start + rng.uniform(0.0, duration, max(1, n)))

        for j, job in enumerate(self.jobs):
            prefix = fresh(job.prefix_tokens // bt)
            n_suffix = -(-job.suffix_tokens // bt)
            for t in poisson(job.rate_per_s, job.start_s, job.duration_s).tolist():
                rows.append((t, job.prefix_tokens + job.suffix_tokens, job.output_tokens,
                             prefix + fresh(n_suffix), f"job{j}"))
        lo, hi = self.background_tokens
        olo, ohi = self.background_output_tokens
        for t in poisson(self.background_rate_per_s, 0.0, self.span_s).tolist():
            n_in = int(rng.integers(lo, hi + 1))
            rows.append((t, n_in, int(rng.integers(olo, ohi + 1)), fresh(-(-n_in // bt)),
                         "background"))
        for _ in range(self.decoys):
            prefix = fresh(self.decoy_prefix_tokens // bt)
            t0 = float(rng.uniform(0.0, self.span_s))
            for t in np.sort(t0 + rng.uniform(0.0, 0.5, self.decoy_repeats)).tolist():
                rows.append((t, self.decoy_prefix_tokens + 256, 1, prefix + fresh(1), "decoy"))
        if self.sessions:
            system = fresh(self.session_system_tokens // bt)
            per_turn = self.session_turn_tokens // bt
            for _ in range(self.sessions):
                t = float(rng.uniform(0.0, self.span_s / 2))
                ids = list(system)
                for _k in range(self.session_turns):
                    ids = ids + fresh(per_turn)
                    rows.append((t, len(ids) * bt, self.session_output_tokens, list(ids), "session"))
                    t += self.session_think_s * float(rng.uniform(0.5, 1.5))
        rows.sort(key=lambda r: r[0])
        a, i, o, h, s = zip(*rows)
        return make_trace(list(a), list(i), list(o), list(h), block_tokens=bt, name=self.name,
                          source=list(s))


def _burst(prefix_k: int, rate: float, duration_s: float = 20.0, **kw) -> BurstJob:
    return BurstJob(prefix_k * 1024, rate, duration_s, **kw)


#: The suite (issue 10): each shape varies one axis around ``p32k`` (32k prefix, 8 req/s for 20 s,
#: 4 replicas, chunked prefill on Llama-3.3-70B / 4x H100).
SHAPES: tuple[Shape, ...] = (
    Shape("p4k_r20_n8", "4k prefix, 20 req/s, 8 replicas", (_burst(4, 20.0, 10.0),), replicas=8,
          span_s=10.0, tags=("prefix", "rate", "replicas")),
    Shape("p16k", "16k prefix, 8 req/s, 4 replicas", (_burst(16, 8.0),), tags=("prefix",)),
    Shape("p32k", "32k prefix, 8 req/s, 4 replicas (the middle shape)", (_burst(32, 8.0),),
          tags=("prefix", "rate", "replicas")),
    Shape("p64k", "64k prefix, 4 req/s, 8 replicas (a Bursted-like job)",
          (_burst(64, 4.0, 30.0),), replicas=8, span_s=30.0, tags=("prefix",)),
    Shape("p64k_long_suffix", "64k prefix + 2k own tokens, 6 req/s, 4 replicas (one warm "
          "replica cannot keep up)", (_burst(64, 6.0, 15.0, suffix_tokens=2048),), span_s=15.0,
          tags=("prefix", "rate")),
    Shape("p128k", "128k prefix, 1 req/s, 4 replicas", (_burst(128, 1.0, 30.0),), span_s=30.0,
          tags=("prefix", "rate")),
    Shape("p32k_r2", "32k prefix, 2 req/s, 4 replicas", (_burst(32, 2.0, 40.0),), span_s=40.0,
          tags=("rate",)),
    Shape("p32k_n16", "32k prefix, 16 req/s, 16 replicas", (_burst(32, 16.0, 12.0),),
          replicas=16, span_s=12.0, tags=("replicas", "rate")),
    Shape("background", "32k prefix at 6 req/s amid 4 req/s of unrelated traffic",
          (_burst(32, 6.0, 20.0, start_s=5.0),), background_rate_per_s=4.0, span_s=30.0,
          tags=("background",)),
    Shape("three_jobs", "3 concurrent jobs (16k, 32k, 64k prefixes), 8 replicas",
          (_burst(16, 4.0), _burst(32, 4.0, start_s=2.0), _burst(64, 2.0, start_s=4.0)),
          replicas=8, tags=("jobs",)),
    Shape("trickle", "one 64k-prefix request per second, 8 replicas (nothing to warm)",
          (_burst(64, 1.0, 40.0),), replicas=8, span_s=40.0, tags=("trickle",)),
    Shape("decoys", "40 decoy prefixes (3 repeats within 0.5 s) amid 3 req/s background",
          (), decoys=40, background_rate_per_s=3.0, span_s=30.0, tags=("decoys",)),
    Shape("decode_heavy", "16k prefix, 6 req/s, 512 output tokens each",
          (_burst(16, 6.0, output_tokens=512),), tags=("decode",)),
    Shape("multi_turn", "40 sessions x 4 turns sharing a 4k system prompt, 2 req/s of 32k burst",
          (_burst(32, 2.0, 30.0),), sessions=40, span_s=30.0, tags=("sessions",)),
)


def shapes(names=None, scale: float = 1.0) -> list[Shape]:
    """Shapes of :data:`SHAPES` (all, or those named, in suite order), scaled by ``scale``.

    Raises
    ------
    ConfigError
        On an unknown or repeated shape name (the message lists the valid ones), or a ``scale``
        that is not a finite number > 0.
    """
    if not (isinstance(scale, (int, float)) and not isinstance(scale, bool)
            and math.isfinite(scale) and scale > 0):
        raise ConfigError(f"--scale {scale!r}: must be a finite number > 0 (1 = the suite as "
                          f"shipped)")
    by_name = {s.name: s for s in SHAPES}
    if names is None:
        chosen = list(SHAPES)
    else:
        unknown = [n for n in names if n not in by_name]
        if unknown:
            raise ConfigError(f"unknown shape(s) {unknown}; choose from {', '.join(by_name)}")
        from .experiment import repeated
        twice = repeated(names)
        if twice:
            raise ConfigError(f"shape {', '.join(twice)} given more than once")
        chosen = [by_name[n] for n in names]
    return [s if scale == 1.0 else s.scaled(scale) for s in chosen]


def run_one(shape: Shape, policy: str, seed: int = 0, params: dict | None = None,
            keep_result: bool = False) -> dict:
    """Replay ``shape`` (built with ``seed``) under ``policy``; one summary row (dict).

    With ``keep_result`` the row also carries the :class:`~btb_core.sim.SimResult` under
    ``"result"`` and the router under ``"router"`` (not picklable across a process pool cheaply;
    used by notebooks for ledgers).
    """
    from .routers import make_router
    from .sim import simulate

    trace = shape.build(seed)
    router = make_router(policy, **(params or {}))
    res = simulate(trace, router, shape.cluster(), seed=seed, progress=False)
    m = res.metrics
    row = {"shape": shape.name, "policy": policy, "requests": m["requests"],
           "ttft_mean_s": m["ttft_mean_s"], "ttft_p95_s": m["ttft_p95_s"],
           "copies": m["rdma_copies"], "copies_unused": m["copies_unused"],
           "rdma_gb": m["rdma_bytes"] / 1e9,
           "recomputed_prefill_tokens": m["recomputed_prefill_tokens"]}
    if keep_result:
        row["result"] = res
        row["router"] = router
    return row


def _job(args):
    shape, policy, seed, params = args
    return run_one(shape, policy, seed, params)


def run_suite(policies=None, shape_list=None, seed: int = 0, workers: int = 1,
              params: dict | None = None, progress: bool | None = None) -> pd.DataFrame:
    """Every policy on every shape; returns :func:`summarize` of the rows.

    Parameters
    ----------
    policies : sequence of str, optional
        Default: every policy of :data:`btb_core.routers.POLICIES` except external ones
        (``Router.external``: ``sglang_gateway``).
    shape_list : sequence of Shape, optional
        Default: :func:`shapes` (the full suite).
    seed : int
        Trace and router seed.
    workers : int
        Worker processes (1 = serial in this process).
    params : dict, optional
        ``{policy: {parameter: value}}`` router parameters (default: every policy's defaults).
    progress : bool, optional
        tqdm bar (default: on a terminal).

    Raises
    ------
    ConfigError
        On an unknown or repeated policy, or ``workers < 1``.
    """
    from .experiment import check_names
    from .routers import POLICIES

    policies = (list(policies) if policies
                else [p for p, c in POLICIES.items() if not getattr(c, "external", False)])
    check_names(policies=policies)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"workers={workers!r}: must be an integer >= 1 (1 = in this process)")
    shape_list = list(shape_list) if shape_list is not None else shapes()
    params = params or {}
    jobs = [(s, p, seed, params.get(p)) for s in shape_list for p in policies]
    from tqdm.auto import tqdm
    import sys

    show = sys.stderr.isatty() if progress is None else progress
    bar = tqdm(total=len(jobs), desc="suite", unit="run", disable=not show)
    rows = []
    if workers == 1:
        for j in jobs:
            rows.append(_job(j))
            bar.update(1)
    else:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=workers) as pool:
            for row in pool.map(_job, jobs):
                rows.append(row)
                bar.update(1)
    bar.close()
    return summarize(pd.DataFrame(rows))


def summarize(rows: pd.DataFrame) -> pd.DataFrame:
    """Add ratio-to-best columns to suite rows (one per shape x policy).

    ``mean_ratio`` / ``p95_ratio``: the policy's mean / p95 TTFT over the best (lowest) of that
    shape, over every policy run; ``mean_vs_best_other`` / ``p95_vs_best_other``: over the best of
    the *other* policies (the issue's goal is stated this way); ``unused_share``: unused copies over
    copies (0 without copies).
    """
    df = rows.copy()
    g = df.groupby("shape")
    df["mean_ratio"] = df["ttft_mean_s"] / g["ttft_mean_s"].transform("min")
    df["p95_ratio"] = df["ttft_p95_s"] / g["ttft_p95_s"].transform("min")
    for col, out in (("ttft_mean_s", "mean_vs_best_other"), ("ttft_p95_s", "p95_vs_best_other")):
        vals = []
        for _, row in df.iterrows():
            others = df[(df["shape"] == row["shape"]) & (df["policy"] != row["policy"])][col]
            vals.append(row[col] / others.min() if len(others) else float("nan"))
        df[out] = vals
    df["unused_share"] = np.where(df["copies"] > 0, df["copies_unused"] / df["copies"].clip(lower=1),
                                  0.0)
    order = {s.name: i for i, s in enumerate(SHAPES)}
    df["_o"] = df["shape"].map(lambda s: order.get(s, len(order)))
    return df.sort_values(["_o", "ttft_mean_s"], kind="stable").drop(columns="_o").reset_index(drop=True)


def ratio_table(summary: pd.DataFrame, column: str = "mean_ratio") -> pd.DataFrame:
    """Shapes x policies table of ``column`` (shape order of the suite, policies in chart order)."""
    from .plots import policy_order

    t = summary.pivot(index="shape", columns="policy", values=column)
    order = [s.name for s in SHAPES if s.name in t.index] + [s for s in t.index
                                                             if s not in {x.name for x in SHAPES}]
    return t.loc[order, policy_order(summary["policy"])]


def goal_table(summary: pd.DataFrame, policy: str = "btb_adaptive", mean_goal: float = 1.05,
               p95_goal: float = 1.10, unused_goal: float = 0.05) -> pd.DataFrame:
    """Per shape, ``policy`` against the issue-10 goal: mean TTFT at most ``mean_goal`` x and p95
    at most ``p95_goal`` x the best *other* policy, unused copies at most ``unused_goal`` of its
    copies. Columns ``shape, best_other, mean_vs_best_other, p95_vs_best_other, copies,
    copies_unused, meets_goal``."""
    rows = []
    for shape, g in summary.groupby("shape", sort=False):
        mine = g[g["policy"] == policy]
        others = g[g["policy"] != policy]
        if mine.empty or others.empty:
            continue
        m = mine.iloc[0]
        best = others.sort_values("ttft_mean_s").iloc[0]["policy"]
        ok = (m["mean_vs_best_other"] <= mean_goal and m["p95_vs_best_other"] <= p95_goal
              and m["copies_unused"] <= unused_goal * max(m["copies"], 1))
        rows.append({"shape": shape, "best_other": best,
                     "mean_vs_best_other": m["mean_vs_best_other"],
                     "p95_vs_best_other": m["p95_vs_best_other"], "copies": int(m["copies"]),
                     "copies_unused": int(m["copies_unused"]), "meets_goal": bool(ok)})
    return pd.DataFrame(rows)


def literal_rule_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Per shape: ``btb`` (the literal rule) next to ``cache_aware`` (its fallback) and the best
    policy: ``btb_mean_s, cache_aware_mean_s, best_policy, best_mean_s, btb_copies,
    btb_unused, btb_equals_cache_aware`` (the rule never fired: identical mean TTFT)."""
    rows = []
    for shape, g in summary.groupby("shape", sort=False):
        by = g.set_index("policy")
        if "btb" not in by.index or "cache_aware" not in by.index:
            continue
        best = g.sort_values("ttft_mean_s").iloc[0]
        rows.append({"shape": shape, "btb_mean_s": by.loc["btb", "ttft_mean_s"],
                     "cache_aware_mean_s": by.loc["cache_aware", "ttft_mean_s"],
                     "best_policy": best["policy"], "best_mean_s": best["ttft_mean_s"],
                     "btb_copies": int(by.loc["btb", "copies"]),
                     "btb_unused": int(by.loc["btb", "copies_unused"]),
                     "btb_equals_cache_aware": bool(by.loc["btb", "ttft_mean_s"]
                                                    == by.loc["cache_aware", "ttft_mean_s"])})
    return pd.DataFrame(rows)


__all__ = ["BurstJob", "SHAPES", "SUITE_BLOCK_TOKENS", "Shape", "goal_table", "literal_rule_table",
           "ratio_table", "run_one", "run_suite", "shapes", "summarize"]
