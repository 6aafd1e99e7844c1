"""Calibration of one real engine: TTFT vs prompt length (cold) and vs cached context, and the
cost model fitted to it.

The fitted model is the simulator's own step model (:class:`btb_core.cost.CostModel` with the
engine's chunk budget): a request alone on the engine is prefilled in chunks of at most
``chunk_tokens`` tokens, one engine step each; chunk ``j`` computes ``S_j`` new tokens after
``C_j`` tokens already in the KV cache, so

``TTFT = frontend_s + sum_j [ step_overhead_s + a x S_j + b x (S_j x C_j + S_j^2 / 2) + e x C_j ]``

with ``a`` = seconds per token of the linear (matmul) work, ``b`` = seconds per (query, key)
pair of causal attention and ``e`` = seconds per token of context already in the KV cache, per
chunk (``CostModel.context_s_per_token``): work that grows with a request's cached context but not
with its new tokens. Measured on this engine (``benchmarks/engine_context_cost.py``: bursts of
requests with 32-256 new tokens after 512-4,096 cached ones), ``a`` and ``b`` alone under-predict
a request with few new tokens after a long cached context by up to ~40%; ``e`` of ~2-3 us per
cached token takes the misfit to a few percent. Part of it is the API-server process (tokenising
and handling the whole prompt, ~1.4 us per prompt token, on the same core as the engine), part the
engine's worker (reading the cached KV). ``frontend_s`` is what the engine's step loop does not see: HTTP,
tokenisation, detokenisation and streaming of the first chunk. ``step_overhead_s`` is pinned by the
measured time per output token of a lone request (its decode step is almost all overhead for so
small a model), minus the weights' read time; the other three non-negative coefficients are a
least-squares fit on relative error (each row divided by its measured TTFT) over every calibration
point at the median TTFT of its repeats (:data:`FIT_POINTS`), with ``e`` as a fourth coefficient. (Without a decode measurement all four are fitted, and the overhead is poorly separated
from the front-end latency.) They map onto the cost model as

A sixth number is not part of a lone request's TTFT: ``arrival_overhead_s``, the seconds that
one request arriving while the server computes a step takes from that step (the API server's
front-end work runs on the same core; ``CostModel.arrival_overhead_s``). :func:`measure` times a
cold prompt of one full step alone and with ``k`` requests arriving during its step, and
:func:`fit_cost` takes ``(TTFT with k - TTFT alone) / k`` (mean over rounds, at least 0).

``mfu = 2 x P_matmul / (peak x a)``, ``attention_mfu = 4 x layers x heads x head_dim / (peak x b)``

for the tiny model's :class:`~btb_core.specs.ModelSpec` on a CPU "node" whose ``peak_flops`` is the
faster of the two fitted rates (so one of ``mfu`` / ``attention_mfu`` is 1 and the other is that
term's rate relative to it; no datasheet peak is involved).
"""

from __future__ import annotations

import numbers
import threading
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..cost import CostModel
from ..specs import GPUSpec, NodeSpec
from .client import complete
from .server import (ENGINE_BLOCK_TOKENS, ENGINE_CHUNK_TOKENS, ENGINE_KV_SPACE_GIB, ENGINE_MAX_MODEL_LEN,
                     SERVED_MODEL_NAME,
                     tiny_model_spec)
from .text import PromptBuilder

#: Peak used when neither term was fitted (both coefficients 0), FLOP/s; a placeholder.
NOMINAL_PEAK_FLOPS = 1e12
#: Nominal memory bandwidth of one core's share of DRAM, B/s (decode-step memory term; with
#: ``mbu`` fitted from the measured time per output token).
NOMINAL_MEMORY_BYTES_PER_S = 20e9

#: Default cold prompt lengths (tokens): 1 or 2 engine steps of 2,048 tokens.
COLD_LENGTHS = (128, 512, 1024, 2048, 3072, 4096)
#: Default (cached context, new tokens) pairs.
CACHED_POINTS = ((1024, 256), (2048, 256), (4096, 256), (2048, 1024), (4096, 1024), (4096, 2048),
                 (1024, 32), (2048, 64), (4096, 32))
#: A shorter calibration (smoke test, notebook quick defaults): two lengths span two engine steps.
QUICK_COLD_LENGTHS = (256, 1024, 2048, 3072)
QUICK_CACHED_POINTS = ((1024, 256), (2048, 512), (2048, 32))
#: The arrival-overhead measurement (see :func:`measure_arrival`): requests arriving during the
#: step, their prompt length and new tokens (their prefix is cached first: they cannot join the
#: full step they arrive in), rounds. 24 arrivals x 4 rounds (~10 s): one round's estimate
#: scattered by 1.3 ms (sd) with 24 arrivals against 1.9 ms with 12 on one server
#: (``benchmarks/engine_arrival_cost.py``; 1.1-2.7 against 3.2-3.4 ms in an earlier check), so
#: the mean of 4 rounds is good to ~1 ms of ~5.
ARRIVAL_REQUESTS = 24
ARRIVAL_SIDE_TOKENS = 1056
ARRIVAL_SIDE_NEW = 32
ARRIVAL_ROUNDS = 4


def chunk_steps(new_tokens: int, cached_tokens: int, chunk_tokens: int = ENGINE_CHUNK_TOKENS):
    """The ``(S_j, C_j)`` chunks of one request alone on the engine."""
    out = []
    done = cached_tokens
    left = new_tokens
    while left > 0:
        s = min(left, chunk_tokens)
        out.append((s, done))
        done += s
        left -= s
    return out


def design_row(new_tokens: int, cached_tokens: int, chunk_tokens: int = ENGINE_CHUNK_TOKENS):
    """Regressors ``[1, steps, sum S, sum (S C + S^2/2), sum C]`` of one request alone."""
    steps = chunk_steps(new_tokens, cached_tokens, chunk_tokens)
    return [1.0, float(len(steps)), float(sum(s for s, _ in steps)),
            float(sum(s * c + 0.5 * s * s for s, c in steps)), float(sum(c for _, c in steps))]


def check_arrival_sizes(side_tokens: int, side_new: int) -> tuple[int, int]:
    """``(cached tokens, uncached blocks)`` of :func:`measure_arrival`'s arriving requests.

    Raises
    ------
    ValueError
        ``side_tokens`` or ``side_new`` < 1; ``side_tokens - side_new`` not a multiple of the
        engine's block size (the cached part must be whole blocks); a prompt longer than the
        servers accept (``ENGINE_MAX_MODEL_LEN``); more than 100 uncached blocks (each arriving
        request's own block ids are 100 apart).
    """
    bt = ENGINE_BLOCK_TOKENS
    if side_tokens < 1 or side_new < 1:
        raise ValueError(f"measure_arrival: side_tokens and side_new must be >= 1, got "
                         f"{side_tokens} and {side_new}")
    cached = max(0, side_tokens - side_new)
    if cached % bt:
        raise ValueError(f"measure_arrival: side_tokens - side_new = {cached} is not a multiple of "
                         f"the block size {bt}")
    if side_tokens + 1 > ENGINE_MAX_MODEL_LEN:
        raise ValueError(f"measure_arrival: side_tokens {side_tokens} + 1 output token exceeds the "
                         f"servers' --max-model-len {ENGINE_MAX_MODEL_LEN}")
    nb = -(-side_tokens // bt) - cached // bt
    if nb > 100:
        raise ValueError(f"measure_arrival: at most 100 uncached blocks ({100 * bt} tokens) per "
                         f"arriving request, got {nb}")
    return cached, nb


def measure_arrival(port: int, rounds: int = ARRIVAL_ROUNDS, k: int = ARRIVAL_REQUESTS,
                    salt: int = 20_000, chunk_tokens: int = ENGINE_CHUNK_TOKENS,
                    side_tokens: int = ARRIVAL_SIDE_TOKENS,
                    side_new: int = ARRIVAL_SIDE_NEW) -> list[dict]:
    """Time a cold ``chunk_tokens``-token prompt (one full engine step) alone and with ``k``
    requests arriving one after another during its step, ``rounds`` times (alone first each round).

    The arriving requests (``side_tokens`` tokens, default :data:`ARRIVAL_SIDE_TOKENS`, all but the
    last ``side_new`` (:data:`ARRIVAL_SIDE_NEW`) cached by an unrecorded request first; none
    cached when ``side_new >= side_tokens``) cannot join the step, which
    fills the budget, so the long prompt's extra TTFT is work done on the server's core while it
    computes: ``CostModel.arrival_overhead_s`` per arrival (``benchmarks/engine_arrival_cost.py``
    measured 4.5-5.4 ms on this project's test machine). The first arrives at 5% of the same round's
    lone TTFT ``T``, the others one every ``0.6 x T / k`` after it. One possible bias, small: with
    arrivals, the long prompt's first token is streamed while the engine already computes the
    arriving requests' step on the same core, alone it is not (a share of a ~1 ms streaming time,
    over ``k``).

    Returns
    -------
    list of dict
        Rows of :func:`measure`'s frame with ``kind = "arrival"`` and ``arrivals`` (0 or ``k``).

    Raises
    ------
    ValueError
        Sizes :func:`check_arrival_sizes` refuses, before any request is sent.
    """
    bt = ENGINE_BLOCK_TOKENS
    cached, nb = check_arrival_sizes(side_tokens, side_new)
    rows = []
    base = list(range(cached // bt))
    long_ids = list(range(100_000, 100_000 + -(-chunk_tokens // bt)))
    for rnd in range(rounds):
        side_pb = PromptBuilder(bt, salt + 2 * rnd + 1)
        if cached:
            complete(port, SERVED_MODEL_NAME, side_pb.text(base, cached), 1)
        alone = complete(port, SERVED_MODEL_NAME,
                         PromptBuilder(bt, salt + 1_000 + 2 * rnd).text(long_ids, chunk_tokens), 1)
        long_text = PromptBuilder(bt, salt + 1_001 + 2 * rnd).text(long_ids, chunk_tokens)
        out: dict = {}
        errors: list[BaseException] = []

        def send(key, text):
            try:
                out[key] = complete(port, SERVED_MODEL_NAME, text, 1)
            except BaseException as exc:   # re-raised below
                errors.append(exc)

        main = threading.Thread(target=send, args=("long", long_text), daemon=True)
        main.start()
        time.sleep(0.05 * alone.ttft_s)
        sides = []
        for i in range(k):
            text = side_pb.text(base + [1_000_000 + 100 * i + j for j in range(nb)],
                                side_tokens)
            t = threading.Thread(target=send, args=(i, text), daemon=True)
            t.start()
            sides.append(t)
            time.sleep(0.6 * alone.ttft_s / k)
        for t in [main, *sides]:
            t.join()
        if errors:
            raise RuntimeError(f"arrival calibration request failed: {errors[0]}") from errors[0]
        for n_arr, c in ((0, alone), (k, out["long"])):
            rows.append({"kind": "arrival", "input_length": chunk_tokens,
                         "cached_tokens": c.cached_tokens, "new_tokens": chunk_tokens - c.cached_tokens,
                         "ttft_s": c.ttft_s, "tpot_s": np.nan, "repeat": rnd, "arrivals": n_arr})
    return rows


def arrival_overhead_s(calibration: pd.DataFrame, points: str = "rows") -> float:
    """``CostModel.arrival_overhead_s`` from :func:`measure_arrival`'s rows (``kind ==
    "arrival"``): per round (and server, and calibration pass), (TTFT with ``k`` arrivals - TTFT
    alone) / ``k``; their mean (``points="rows"``) or median (``points="median"``, see
    :data:`FIT_POINTS`), at least 0. Rounds with a missing or non-finite ``ttft_s`` or ``arrivals`` are left
    out. 0 without an ``arrivals`` column or without a complete round (calibrations made before
    the measurement existed).

    Raises
    ------
    KeyError
        The frame has ``arrivals`` but not ``kind``, ``repeat`` and ``ttft_s`` (not a
        :func:`measure` frame).
    """
    if "arrivals" not in calibration:
        return 0.0
    rows = calibration[calibration["kind"] == "arrival"]
    rows = rows[np.isfinite(rows["ttft_s"].astype(float)) & np.isfinite(rows["arrivals"].astype(float))]
    _check_points(points)
    per = []
    keys = [k for k in ("server", "pass") if k in rows] + ["repeat"]
    for _, g in rows.groupby(keys):
        alone = g[g["arrivals"] == 0]["ttft_s"]
        busy = g[g["arrivals"] > 0]
        if len(alone) and len(busy):
            per.append((float(busy["ttft_s"].mean()) - float(alone.mean()))
                       / float(busy["arrivals"].iloc[0]))
    if not per:
        return 0.0
    return max(0.0, float(np.median(per) if points == "median" else np.mean(per)))


#: How :func:`fit_cost` combines repeated calibration requests: ``"median"`` fits one row per
#: point (server, kind, prompt length, cached tokens) at the median of its measured TTFTs, and takes
#: the median of the arrival rounds; ``"rows"`` fits every request and takes the rounds' mean (the
#: rule before calibration passes were spread over the validation; results without
#: ``info["calibration_points"]`` were fitted so). The machine this project is tested on has slow
#: spells of 10-30 s in which everything runs 30-50% slower (seen on 2026-12-02: one of the two
#: calibration repeats of a run measured every cold prompt 33-55% slower, on both servers at
#: once; fitted over every row, that run's simulator came out 20-24% slower than the engine for
#: three of its four policies); with three or more requests per point, the median leaves such a
#: spell out.
FIT_POINTS = ("median", "rows")


def _check_points(points) -> None:
    if points not in FIT_POINTS:
        raise ValueError(f"points must be one of {FIT_POINTS}, got {points!r}")


def point_medians(calibration: pd.DataFrame) -> pd.DataFrame:
    """The cold and cached rows of ``calibration``, one per point: (``server`` where present,
    ``kind``, ``input_length``, ``cached_tokens``) with the median ``ttft_s`` of its requests and
    ``requests`` (how many); ``new_tokens`` is the point's own. Other rows are dropped."""
    rows = calibration[calibration["kind"].isin(("cold", "cached"))]
    keys = [k for k in ("server",) if k in rows] + ["kind", "input_length", "cached_tokens",
                                                    "new_tokens"]
    return (rows.groupby(keys, as_index=False, sort=True)["ttft_s"]
            .agg(ttft_s="median", requests="size"))


def measure(port: int, repeats: int = 2, cold_lengths=COLD_LENGTHS, cached_points=CACHED_POINTS,
            decode_tokens: int = 32, salt: int = 10_000, progress=None,
            warmup: bool = True, arrival_rounds: int = ARRIVAL_ROUNDS) -> pd.DataFrame:
    """Send the calibration requests one at a time to the server on ``port``.

    Every cold request has text of its own (a new salt); a cached point first sends its
    ``cached`` tokens (warm-up, not recorded) and then ``cached + new`` tokens that share them.
    Then ``arrival_rounds`` rounds of :func:`measure_arrival` (0: none; the fit's
    ``arrival_overhead_s`` is then 0). The last row is one request with ``decode_tokens``
    outputs, for the time per output token.

    ``warmup`` (default) first sends the whole plan once, unrecorded, with texts of its own: a
    fresh server pays one-time costs the first time it computes a step of a new, larger size
    (measured here: the first cold 512-2,048-token prompts of a new server took 21-37% longer
    than the same lengths a minute later, and the first 1,000-token prompt after a 256-token
    warm-up 24%), which would otherwise bias the fit slow. A replay after calibration runs on the
    warm server.

    Returns
    -------
    pandas.DataFrame
        ``kind`` (cold / cached / arrival / decode), ``input_length``, ``cached_tokens`` (as the
        engine reported), ``new_tokens``, ``ttft_s``, ``tpot_s`` (decode row only), ``repeat``,
        ``arrivals`` (arrival rows: requests that arrived during the step; else 0).
    """
    rows = []
    bt = ENGINE_BLOCK_TOKENS
    k = 0

    def ids(n_tokens, key):
        return [key * 1000 + i for i in range(-(-n_tokens // bt))]

    plan = [("cold", n, 0) for n in cold_lengths] + [("cached", c + s, c) for c, s in cached_points]
    total = len(plan) * repeats + 1
    # one unrecorded warm-up request: first-request costs (allocations, lazy imports)
    complete(port, SERVED_MODEL_NAME, PromptBuilder(bt, salt - 1).text(ids(256, 0), 256), 1)
    if warmup:    # the plan once, unrecorded: one-time costs of each new step size
        for j, (kind, length, cached) in enumerate(plan):
            pb = PromptBuilder(bt, salt + 600 + j)
            if cached:
                complete(port, SERVED_MODEL_NAME, pb.text(ids(length, 1), cached), 1)
            complete(port, SERVED_MODEL_NAME, pb.text(ids(length, 1), length), 1)
        complete(port, SERVED_MODEL_NAME, PromptBuilder(bt, salt - 2).text(ids(512, 2), 512),
                 decode_tokens)
    for rep in range(repeats):
        for kind, length, cached in plan:
            k += 1
            pb = PromptBuilder(bt, salt + k)
            hid = ids(length, 1)
            if cached:
                complete(port, SERVED_MODEL_NAME, pb.text(hid, cached), 1)
            c = complete(port, SERVED_MODEL_NAME, pb.text(hid, length), 1)
            if c.prompt_tokens != length:
                raise RuntimeError(f"calibration prompt of {length} words counted as "
                                   f"{c.prompt_tokens} tokens: the tokenizer is not one word per token")
            rows.append({"kind": kind, "input_length": length, "cached_tokens": c.cached_tokens,
                         "new_tokens": length - c.cached_tokens, "ttft_s": c.ttft_s,
                         "tpot_s": np.nan, "repeat": rep})
            if progress is not None:
                progress(len(rows), total)
    if arrival_rounds:
        rows += measure_arrival(port, arrival_rounds, salt=salt + 50_000)
    pb = PromptBuilder(bt, salt + k + 1)
    c = complete(port, SERVED_MODEL_NAME, pb.text(ids(512, 2), 512), decode_tokens)
    rows.append({"kind": "decode", "input_length": 512, "cached_tokens": c.cached_tokens,
                 "new_tokens": 512 - c.cached_tokens, "ttft_s": c.ttft_s,
                 "tpot_s": (c.end_s - c.first_token_s) / max(1, decode_tokens - 1), "repeat": 0})
    df = pd.DataFrame(rows)
    df["arrivals"] = df["arrivals"].fillna(0).astype(int) if "arrivals" in df else 0
    return df


@dataclass(frozen=True)
class FittedEngine:
    """The fit of :func:`fit_cost`: the coefficients, the cost model, the front-end latency.

    Attributes
    ----------
    frontend_s : float
        Seconds of TTFT outside the engine's step loop.
    step_overhead_s : float
        Fixed seconds per engine step.
    linear_s_per_token : float
        ``a``: seconds per prefilled token of matmul work.
    attention_s_per_pair : float
        ``b``: seconds per causal (query, key) pair.
    context_s_per_token : float
        ``e``: seconds per token of cached context, per chunk (0 in fits made before it existed).
    arrival_overhead_s : float
        Seconds a request arriving during a step adds to it (:func:`arrival_overhead_s`; 0 in
        fits made before it existed).
    cost : btb_core.cost.CostModel
        The simulator's cost model with these coefficients.
    kv_capacity_bytes : int
        The engine's KV space (``VLLM_CPU_KVCACHE_SPACE``).
    tpot_s : float
        Measured seconds per output token (NaN if not measured).
    """

    frontend_s: float
    step_overhead_s: float
    linear_s_per_token: float
    attention_s_per_pair: float
    cost: CostModel
    kv_capacity_bytes: int
    tpot_s: float = float("nan")
    context_s_per_token: float = 0.0
    arrival_overhead_s: float = 0.0

    def predict_ttft_s(self, new_tokens, cached_tokens=0, chunk_tokens: int = ENGINE_CHUNK_TOKENS):
        """Fitted TTFT of requests alone on the engine (arrays broadcast)."""
        new = np.atleast_1d(np.asarray(new_tokens, dtype=np.int64))
        cached = np.broadcast_to(np.asarray(cached_tokens, dtype=np.int64), new.shape)
        coef = np.array([self.frontend_s, self.step_overhead_s, self.linear_s_per_token,
                         self.attention_s_per_pair, self.context_s_per_token])
        return np.array([np.dot(design_row(int(s), int(c), chunk_tokens), coef)
                         for s, c in zip(new, cached)])

    def scaled(self, factor: float) -> "FittedEngine":
        """The same fit with every time ``factor`` times longer (all six coefficients,
        ``tpot_s`` and the weights' read time of the decode memory term): the engine measured ``factor`` times slower than at calibration (see
        :func:`btb_core.engine.validation.speed_probe`). Raises ValueError unless ``factor > 0``."""
        if (not isinstance(factor, numbers.Real) or isinstance(factor, (bool, np.bool_))
                or not (factor > 0 and np.isfinite(factor))):
            raise ValueError(f"FittedEngine.scaled: factor must be a finite number > 0, got {factor!r}")
        factor = float(factor)
        return fitted_engine(self.frontend_s * factor, self.step_overhead_s * factor,
                             self.linear_s_per_token * factor, self.attention_s_per_pair * factor,
                             self.tpot_s * factor, self.context_s_per_token * factor,
                             self.arrival_overhead_s * factor,
                             memory_bytes_per_s=self.cost.node.hbm_bytes_per_s / factor)

    def as_dict(self) -> dict:
        return {"frontend_s": self.frontend_s, "step_overhead_s": self.step_overhead_s,
                "tpot_s": self.tpot_s,
                "linear_s_per_token": self.linear_s_per_token,
                "attention_s_per_pair": self.attention_s_per_pair,
                "context_s_per_token": self.context_s_per_token,
                "arrival_overhead_s": self.arrival_overhead_s, "mfu": self.cost.mfu,
                "attention_mfu": self.cost.attention_mfu, "mbu": self.cost.mbu,
                **({"memory_bytes_per_s": self.cost.node.hbm_bytes_per_s}
                   if self.cost.node.hbm_bytes_per_s != NOMINAL_MEMORY_BYTES_PER_S else {})}

    @classmethod
    def from_dict(cls, d: dict) -> "FittedEngine":
        """Inverse of :meth:`as_dict` (the cost model is rebuilt from the coefficients)."""
        return fitted_engine(d["frontend_s"], d["step_overhead_s"], d["linear_s_per_token"],
                             d["attention_s_per_pair"],
                             float("nan") if d.get("tpot_s") is None else d["tpot_s"],
                             float(d.get("context_s_per_token") or 0.0),
                             float(d.get("arrival_overhead_s") or 0.0),
                             memory_bytes_per_s=float(d.get("memory_bytes_per_s")
                                                      or NOMINAL_MEMORY_BYTES_PER_S))


def _nnls(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares by exhaustive active sets (a few unknowns: 2^n subsets)."""
    best, best_err = np.zeros(a.shape[1]), float(np.sum(y ** 2))
    n = a.shape[1]
    for mask in range(1, 1 << n):
        cols = [j for j in range(n) if mask >> j & 1]
        x, *_ = np.linalg.lstsq(a[:, cols], y, rcond=None)
        if np.all(x >= 0):
            err = float(np.sum((a[:, cols] @ x - y) ** 2))
            if err < best_err:
                best_err = err
                best = np.zeros(n)
                best[cols] = x
    return best


def fit_cost(calibration: pd.DataFrame, chunk_tokens: int = ENGINE_CHUNK_TOKENS, *,
             context_term: bool = True, arrival_term: bool = True,
             points: str = "median") -> FittedEngine:
    """Fit the step model of the module docstring to calibration rows (see :func:`measure`).

    Uses the engine-reported ``cached_tokens`` of each row. ``context_term=False`` fits the model
    without ``e``, ``arrival_term=False`` sets ``arrival_overhead_s`` to 0 (as before each
    existed; for comparisons). ``points`` (:data:`FIT_POINTS`): ``"median"`` (default) fits each
    point's median TTFT over its repeats (:func:`point_medians`) and the arrival rounds' median;
    ``"rows"`` every request and their mean. Raises ValueError with fewer than four prefill rows
    (points) or an unknown ``points``.
    """
    _check_points(points)
    rows = (point_medians(calibration) if points == "median"
            else calibration[calibration["kind"].isin(("cold", "cached"))])
    if len(rows) < 4:
        raise ValueError(f"fit_cost needs >= 4 prefill calibration rows, got {len(rows)}")
    x = np.array([design_row(int(n), int(c), chunk_tokens)
                  for n, c in zip(rows["new_tokens"], rows["cached_tokens"])])
    if not context_term:
        x[:, 4] = 0.0
    y = rows["ttft_s"].to_numpy(dtype=float)
    dec = calibration[calibration["kind"] == "decode"]
    tpot = float(dec["tpot_s"].median()) if len(dec) else float("nan")
    if np.isfinite(tpot) and tpot > 0:
        # The per-step overhead is pinned by the decode measurement (a one-sequence decode step of
        # this model is almost all overhead: its weight reads take ~4 ms at 20 GB/s); prompt
        # lengths alone barely separate it from the front-end latency (both are per request when
        # a prompt fits one step).
        overhead = max(0.0, tpot - _decode_memory_s())
        y_left = y - overhead * x[:, 1]
        keep = [0, 2, 3, 4]
        coef4 = _nnls(x[:, keep] / y[:, None], y_left / y)
        frontend, a, b, e = (float(v) for v in coef4)
    else:
        coef = _nnls(x / y[:, None], np.ones_like(y))
        frontend, overhead, a, b, e = (float(v) for v in coef)
    arrival = arrival_overhead_s(calibration, points) if arrival_term else 0.0
    return fitted_engine(frontend, overhead, a, b, tpot, e, arrival)


def _decode_memory_s() -> float:
    """Seconds to read the tiny model's weights once at :data:`NOMINAL_MEMORY_BYTES_PER_S`."""
    return tiny_model_spec().active_weight_bytes / NOMINAL_MEMORY_BYTES_PER_S


def fitted_engine(frontend_s: float, step_overhead_s: float, linear_s_per_token: float,
                  attention_s_per_pair: float, tpot_s: float = float("nan"),
                  context_s_per_token: float = 0.0,
                  arrival_overhead_s: float = 0.0, *,
                  memory_bytes_per_s: float = NOMINAL_MEMORY_BYTES_PER_S) -> FittedEngine:
    """A :class:`FittedEngine` from its coefficients (``tpot_s``: measured seconds per output
    token, for the decode ``mbu``; NaN keeps ``mbu = 1``; ``context_s_per_token``: ``e``;
    ``arrival_overhead_s``: seconds per request arriving during a step; ``memory_bytes_per_s``:
    the "node's" memory bandwidth, :data:`NOMINAL_MEMORY_BYTES_PER_S` but in
    :meth:`FittedEngine.scaled`)."""
    model = tiny_model_spec()
    kv_bytes = ENGINE_KV_SPACE_GIB * 2 ** 30
    lin = 2.0 * model.matmul_params_active
    attn = 4.0 * model.num_layers * model.num_q_heads * model.head_dim
    a, b = linear_s_per_token, attention_s_per_pair
    rates = [x for x in (lin / a if a > 0 else 0.0, attn / b if b > 0 else 0.0) if x > 0]
    peak = max(rates) if rates else NOMINAL_PEAK_FLOPS
    gpu = GPUSpec(name=f"CPU core (fitted {peak / 1e9:.1f} GFLOP/s)", peak_flops=peak,
                  hbm_bytes_per_s=memory_bytes_per_s,
                  hbm_capacity_bytes=float(model.weight_bytes + kv_bytes),
                  pcie_bytes_per_s=NOMINAL_MEMORY_BYTES_PER_S, nic_bytes_per_s=1e9,
                  nvme_bytes_per_s=1e9, source="fitted to the engine calibration")
    node = NodeSpec(gpu, 1)
    mfu = min(1.0, lin / (peak * a)) if a > 0 else 1.0
    attention_mfu = min(1.0, attn / (peak * b)) if b > 0 else 1.0
    mbu = 1.0
    weights_read_s = model.active_weight_bytes / memory_bytes_per_s
    if np.isfinite(tpot_s) and tpot_s - step_overhead_s > weights_read_s * 1.001:
        mbu = min(1.0, model.active_weight_bytes
                  / (memory_bytes_per_s * (tpot_s - step_overhead_s)))
    cost = CostModel(model, node, mfu=mfu, mbu=mbu, attention=True, attention_mfu=attention_mfu,
                     step_overhead_s=step_overhead_s, context_s_per_token=float(context_s_per_token),
                     arrival_overhead_s=float(arrival_overhead_s))
    return FittedEngine(frontend_s, step_overhead_s, a, b, cost, kv_bytes, float(tpot_s),
                        float(context_s_per_token), float(arrival_overhead_s))


def measure_concurrent(ports, repeats: int = 2, cold_lengths=COLD_LENGTHS,
                       cached_points=CACHED_POINTS, decode_tokens: int = 32, salt: int = 10_000,
                       progress=None, warmup: bool = True,
                       arrival_rounds: int = ARRIVAL_ROUNDS) -> pd.DataFrame:
    """:func:`measure` on every server of ``ports`` at the same time (one thread per server;
    ``warmup`` and ``arrival_rounds`` as there).

    Two servers on one machine slow each other down while both compute (shared caches and memory
    bandwidth; on the 2-core machine this project is tested on, a 30-request replay ran 24-28%
    slower per server with the other server replaying the same trace at the same time than
    alone). A run on ``n`` servers is therefore compared with a cost model fitted to a
    calibration measured with ``n`` servers busy, the condition its bursts run in.

    Returns
    -------
    pandas.DataFrame
        :func:`measure`'s columns plus ``server`` (index in ``ports``) and ``busy_servers``
        (``len(ports)``), servers' rows one after the other.

    Raises
    ------
    RuntimeError
        A calibration request failed on some server (the first error).
    """
    import threading

    ports = list(ports)
    out: list[pd.DataFrame | None] = [None] * len(ports)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            out[i] = measure(ports[i], repeats=repeats, cold_lengths=cold_lengths,
                             cached_points=cached_points, decode_tokens=decode_tokens,
                             salt=salt + 1_000 * i, progress=progress if i == 0 else None,
                             warmup=warmup, arrival_rounds=arrival_rounds)
        except BaseException as exc:  # re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(ports))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"calibration failed: {errors[0]}") from errors[0]
    frames = []
    for i, df in enumerate(out):
        df = df.copy()
        df["server"] = i
        df["busy_servers"] = len(ports)
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def busy_counts(calibration: pd.DataFrame) -> np.ndarray:
    """``busy_servers`` per calibration row (1 where the column is absent: a one-server run)."""
    if "busy_servers" in calibration:
        return calibration["busy_servers"].fillna(1).astype(int).to_numpy()
    return np.ones(len(calibration), dtype=int)


def count_for(counts, num_servers: int) -> int:
    """Of the busy-server ``counts`` calibrated, the one a run on ``num_servers`` servers is
    compared with: ``num_servers`` itself, else the largest smaller count, else the smallest."""
    have = sorted(set(int(k) for k in counts))
    below = [k for k in have if k <= num_servers]
    return max(below) if below else min(have)


def calibration_for(calibration: pd.DataFrame, num_servers: int) -> pd.DataFrame:
    """The rows measured with :func:`count_for` ``num_servers`` servers busy."""
    busy = busy_counts(calibration)
    return calibration[busy == count_for(busy.tolist(), num_servers)]


def fit_for(calibration: pd.DataFrame, num_servers: int, points: str = "median") -> FittedEngine:
    """:func:`fit_cost` of :func:`calibration_for` ``num_servers`` (``points`` as there)."""
    return fit_cost(calibration_for(calibration, num_servers), points=points)


def fit_by_busy(calibration: pd.DataFrame, chunk_tokens: int = ENGINE_CHUNK_TOKENS, *,
                context_term: bool = True, arrival_term: bool = True,
                points: str = "median") -> dict:
    """``{busy_servers: FittedEngine}``: one :func:`fit_cost` per count of servers calibrated at
    once (see :func:`measure_concurrent`; ``context_term``, ``arrival_term`` and ``points`` as
    there)."""
    busy = busy_counts(calibration)
    return {int(k): fit_cost(calibration[busy == k], chunk_tokens, context_term=context_term,
                             arrival_term=arrival_term, points=points)
            for k in sorted(set(busy.tolist()))}


def fit_table(calibration: pd.DataFrame, fitted: FittedEngine) -> pd.DataFrame:
    """Calibration rows with the fitted TTFT and the relative error, for the calibration chart."""
    df = calibration[calibration["kind"].isin(("cold", "cached"))].copy()
    df["fitted_ttft_s"] = fitted.predict_ttft_s(df["new_tokens"].to_numpy(),
                                                df["cached_tokens"].to_numpy())
    df["rel_error"] = df["fitted_ttft_s"] / df["ttft_s"] - 1.0
    return df.reset_index(drop=True)


__all__ = ["ARRIVAL_ROUNDS", "CACHED_POINTS", "COLD_LENGTHS", "FIT_POINTS", "FittedEngine",
           "NOMINAL_PEAK_FLOPS", "point_medians",
           "arrival_overhead_s", "chunk_steps", "fit_curves", "measure_arrival",
           "design_row", "busy_counts", "calibration_for", "count_for", "fit_by_busy", "fit_cost",
           "fit_for", "fitted_engine",
           "fit_table", "measure", "measure_concurrent"]


def fit_curves(fitted: FittedEngine, max_cold_tokens: int = 6144, new_tokens=(256, 1024, 2048),
               max_cached_tokens: int = 4096) -> pd.DataFrame:
    """The fitted model on a dense grid, for :func:`btb_core.plots.engine.calibration_chart`."""
    cold = np.unique(np.linspace(32, max_cold_tokens, 97).astype(int))
    rows = [{"kind": "cold", "new_tokens": int(n), "cached_tokens": 0, "input_length": int(n)}
            for n in cold]
    for s in new_tokens:
        for c in np.linspace(0, max_cached_tokens, 33).astype(int):
            rows.append({"kind": "cached", "new_tokens": int(s), "cached_tokens": int(c),
                         "input_length": int(s + c)})
    df = pd.DataFrame(rows)
    df["fitted_ttft_s"] = fitted.predict_ttft_s(df["new_tokens"].to_numpy(), df["cached_tokens"].to_numpy())
    return df
