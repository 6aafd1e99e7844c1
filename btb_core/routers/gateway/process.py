"""Lifecycle of the real SGLang Model Gateway on loopback, in front of stand-in workers.

:class:`SGLangGateway` is a context manager. On entry it starts, on free loopback ports,

* one stand-in worker per replica: a small aiohttp server (all of them on one asyncio loop in a
  background thread) answering the endpoints the gateway probes when it registers a worker
  (``/health``, ``/server_info``, ``/model_info``; ``/get_server_info`` and ``/get_model_info`` for
  older releases) and ``POST /generate``, whose response it **holds open** until told to release it;
* the gateway: ``python -m sglang_router.launch_router`` (the launcher shipped in the
  ``sglang-router`` wheel, ``sgl-model-gateway/bindings/python/src/sglang_router/launch_router.py``,
  sgl-project/sglang @ d5b04e1c) as a child process,

then waits until ``GET /readiness`` reports every worker healthy. On exit (success, error or
``KeyboardInterrupt``) it releases every held response, terminates the gateway's process group
(``SIGTERM``, then ``SIGKILL`` after 5 s), and stops the worker loop: nothing is left running. The
child also gets ``PR_SET_PDEATHSIG`` so it dies with this process even if Python is killed.

Replica numbering follows the gateway's own worker order (``GET /workers``), because the gateway
breaks least-load ties by the first worker in that order (``min_by_key`` over the worker list in
``sgl-model-gateway/src/policies/cache_aware.rs``, sgl-project/sglang @ b93974f1) and that order is
not the ``--worker-urls`` order (it differs from run to run). Replicas are identical in the
simulator, so the relabelling changes nothing but makes "lowest index" mean the same on both sides.

Offline: the workers report a ``model_path`` that is a local directory holding a one-token
``tokenizer.json`` (also passed as ``--tokenizer-path``), so the gateway loads that file and never
tries to download a tokenizer. Routing ``/generate`` by text does not use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from ...errors import BTBError

#: Policies of the gateway's regular (non-PD) HTTP router that the adapter can drive
#: (``--policy`` choices of ``router_args.py``; ``manual`` needs routing keys, so it is left out).
GATEWAY_POLICIES = ("cache_aware", "round_robin", "power_of_two", "random")

#: Tree eviction is pinned off: the gateway evicts on a wall-clock thread every
#: ``eviction_interval_secs`` (it must be > 0), trimming each worker's tree to ``max_tree_size``
#: characters. One year and 2**60 characters mean no trim can happen during a replay, so wall-clock
#: time cannot change a decision.
EVICTION_INTERVAL_SECS = 365 * 24 * 3600
MAX_TREE_SIZE_CHARS = 2 ** 60

_TOKENIZER_JSON = {
    "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
    "pre_tokenizer": None, "post_processor": None, "decoder": None,
    "model": {"type": "WordLevel", "vocab": {"[UNK]": 0}, "unk_token": "[UNK]"},
}


class GatewayError(BTBError, RuntimeError):
    """The gateway is missing, did not come up, or misbehaved; the message is one line."""


def gateway_available() -> bool:
    """True if the ``sglang-router`` package (and aiohttp) can be imported."""
    return (importlib.util.find_spec("sglang_router") is not None
            and importlib.util.find_spec("aiohttp") is not None)


def require_gateway() -> None:
    """Raise :class:`GatewayError` (one line, how to install) if the package is missing."""
    if not gateway_available():
        raise GatewayError("policy sglang_gateway needs the sglang-router package: "
                           "pip install -e '.[gateway]' (make install does this)")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago (bind to port 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    """``preexec_fn``: ask Linux to SIGKILL the child when this process dies."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


class SGLangGateway:
    """The real gateway plus ``num_workers`` stand-in workers (see the module docstring).

    Parameters
    ----------
    num_workers : int >= 1
        Replicas; worker ``i`` of the simulation is the ``i``-th worker in the gateway's order.
    policy : str
        Gateway ``--policy``, one of :data:`GATEWAY_POLICIES`.
    cache_threshold, balance_abs_threshold, balance_rel_threshold : float, int, float
        The gateway's ``--cache-threshold`` / ``--balance-abs-threshold`` /
        ``--balance-rel-threshold`` (defaults 0.3 / 64 / 1.5, ``router_args.py`` of sglang-router
        0.3.2).
    startup_timeout_s : float
        Seconds to wait for ``/readiness`` with every worker healthy.
    request_timeout_s : float
        Seconds to wait for a dispatched request to reach a worker, or for loads to settle.

    Raises
    ------
    GatewayError
        On entry, if the package is missing, the gateway exits, or it is not ready in time.
    """

    def __init__(self, num_workers: int, policy: str = "cache_aware", cache_threshold: float = 0.3,
                 balance_abs_threshold: int = 64, balance_rel_threshold: float = 1.5,
                 startup_timeout_s: float = 60.0, request_timeout_s: float = 30.0,
                 host: str = "127.0.0.1") -> None:
        if num_workers < 1:
            raise GatewayError(f"sglang_gateway: num_workers={num_workers} must be >= 1")
        if policy not in GATEWAY_POLICIES:
            raise GatewayError(f"sglang_gateway: policy={policy!r} must be one of "
                               f"{list(GATEWAY_POLICIES)}")
        self.num_workers = int(num_workers)
        self.policy = policy
        self.cache_threshold = float(cache_threshold)
        self.balance_abs_threshold = int(balance_abs_threshold)
        self.balance_rel_threshold = float(balance_rel_threshold)
        self.startup_timeout_s = float(startup_timeout_s)
        self.request_timeout_s = float(request_timeout_s)
        self.host = host
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.worker_urls: list[str] = []
        #: worker (port order) -> replica (gateway order)
        self.replica_of_worker: list[int] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._log_path: Path | None = None
        self._runners: list = []
        self._session = None
        self._arrived: dict = {}     # rid -> future(worker index)
        self._release: dict = {}     # rid -> asyncio.Event
        self._posts: dict = {}       # rid -> task of the client POST
        self._released: list = []    # rids released since the last settle
        self.expected_load = [0] * self.num_workers   # per replica, dispatched - released
        self._replica_of_rid: dict = {}   # rid -> replica, while its response is held
        self._dirty = False
        self._rid = 0

    # -- lifecycle -----------------------------------------------------------------------------
    def __enter__(self) -> "SGLangGateway":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        """Start workers and gateway and wait for readiness (idempotent while running)."""
        if self.proc is not None:
            return
        require_gateway()
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="btb-gateway-")
        tmp = Path(self._tmp.name)
        (tmp / "tokenizer.json").write_text(json.dumps(_TOKENIZER_JSON))
        self._log_path = tmp / "gateway.log"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="btb-gateway-loop",
                                        daemon=True)
        self._thread.start()
        self.worker_urls = self._call(self._start_workers(str(tmp)), timeout=30.0)
        for attempt in range(3):
            port, metrics_port = free_port(self.host), free_port(self.host)
            self.url = f"http://{self.host}:{port}"
            cmd = [sys.executable, "-m", "sglang_router.launch_router",
                   "--host", self.host, "--port", str(port),
                   "--worker-urls", *self.worker_urls,
                   "--policy", self.policy,
                   "--cache-threshold", repr(self.cache_threshold),
                   "--balance-abs-threshold", str(self.balance_abs_threshold),
                   "--balance-rel-threshold", repr(self.balance_rel_threshold),
                   "--eviction-interval-secs", str(EVICTION_INTERVAL_SECS),
                   "--max-tree-size", str(MAX_TREE_SIZE_CHARS),
                   "--prometheus-host", self.host, "--prometheus-port", str(metrics_port),
                   "--tokenizer-path", str(tmp / "tokenizer.json"),
                   "--disable-retries", "--disable-circuit-breaker",
                   "--shutdown-grace-period-secs", "1",
                   "--request-timeout-secs", "86400",
                   "--log-level", "warn"]
            log = open(self._log_path, "ab")
            try:
                self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                             start_new_session=True, preexec_fn=_die_with_parent)
            finally:
                log.close()
            try:
                self._wait_ready()
                break
            except GatewayError as exc:
                retry = "Address already in use" in str(exc) and attempt < 2
                self._stop_process()
                if not retry:
                    raise
        order = self._call(self._worker_order(), timeout=10.0)
        if sorted(order) != sorted(self.worker_urls):
            raise GatewayError(f"gateway lists workers {order}, expected {self.worker_urls}")
        self.replica_of_worker = [order.index(u) for u in self.worker_urls]

    def _log_tail(self) -> str:
        try:
            text = self._log_path.read_text(errors="replace")
        except OSError:
            return ""
        import re

        lines = [re.sub(r"\x1b\[[0-9;]*m", "", ln).strip() for ln in text.splitlines()]
        errors = [ln for ln in lines if "rror" in ln or "anic" in ln]
        return (errors or lines or [""])[-1][:300]

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            code = self.proc.poll()
            if code is not None:
                raise GatewayError(f"the SGLang gateway exited with status {code} during start-up: "
                                   f"{self._log_tail() or 'no output'}")
            try:
                if self._call(self._ready(), timeout=5.0):
                    return
            except GatewayError:
                pass
            if time.monotonic() > deadline:
                raise GatewayError(f"the SGLang gateway did not report {self.num_workers} healthy "
                                   f"workers within {self.startup_timeout_s:g} s (startup_timeout_s);"
                                   f" last log line: {self._log_tail() or 'none'}")
            time.sleep(0.1)

    def close(self) -> None:
        """Release held responses, stop the gateway and the workers. Safe to call twice."""
        try:
            if self._loop is not None and self._loop.is_running():
                with contextlib.suppress(BaseException):
                    self._call(self._shutdown_client(), timeout=5.0)
        finally:
            self._stop_process()
            if self._loop is not None and self._loop.is_running():
                with contextlib.suppress(BaseException):
                    self._call(self._shutdown_workers(), timeout=5.0)
                self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(timeout=5.0)
            if self._loop is not None and not self._loop.is_running():
                with contextlib.suppress(Exception):
                    self._loop.close()
            self._loop = self._thread = None
            if self._tmp is not None:
                with contextlib.suppress(Exception):
                    self._tmp.cleanup()
                self._tmp = None

    def _stop_process(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5.0)
        # anything else left in the child's process group
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)

    @property
    def pids(self) -> list[int]:
        """Process ids this object started (the gateway; the workers live in this process)."""
        return [self.proc.pid] if self.proc is not None else []

    # -- requests (called from the simulation thread) ------------------------------------------
    def dispatch(self, text: str) -> tuple[str, int]:
        """Send ``POST /generate`` with ``text``; return ``(rid, replica)`` once a worker got it.

        Settles first if responses were released since the last decision (see :meth:`settle`).
        The response stays open until :meth:`release` of the returned ``rid``.
        """
        if self._dirty:
            self.settle()
        self._rid += 1
        rid = f"btb-{self._rid}"
        worker = self._call(self._dispatch(rid, text), timeout=self.request_timeout_s + 5.0)
        replica = self.replica_of_worker[worker]
        self.expected_load[replica] += 1
        self._replica_of_rid[rid] = replica
        return rid, replica

    def release(self, rid: str) -> None:
        """Let the worker answer ``rid`` (non-blocking; the next :meth:`dispatch` settles)."""
        replica = self._replica_of_rid.pop(rid)
        self.expected_load[replica] -= 1
        self._released.append(rid)
        self._dirty = True
        self._loop.call_soon_threadsafe(self._release[rid].set)

    def settle(self) -> None:
        """Wait until every released response reached the client and the gateway's per-worker
        load (``GET /workers``) equals :attr:`expected_load`, so the next decision sees the
        loads the simulation has."""
        rids, self._released = self._released, []
        self._call(self._settle(rids), timeout=self.request_timeout_s + 5.0)
        self._dirty = False

    def loads(self) -> list[int]:
        """The gateway's current per-replica load (``GET /workers``), in replica order."""
        by_url = self._call(self._worker_loads(), timeout=10.0)
        out = [0] * self.num_workers
        for w, url in enumerate(self.worker_urls):
            out[self.replica_of_worker[w]] = by_url[url]
        return out

    # -- asyncio side --------------------------------------------------------------------------
    def _call(self, coro, timeout: float):
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result(timeout)
        except TimeoutError:
            fut.cancel()
            raise GatewayError(f"the SGLang gateway did not answer within {timeout:g} s "
                               f"(last log line: {self._log_tail() or 'none'})") from None
        except BaseException:
            fut.cancel()
            raise

    async def _start_workers(self, model_dir: str) -> list[str]:
        import logging

        from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

        # The gateway first probes each worker for gRPC (HTTP/2 prior knowledge); aiohttp logs
        # those as bad requests. They are expected: keep them out of the user's terminal.
        logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
        info = {"model_path": model_dir, "tokenizer_path": model_dir, "is_generation": True}
        urls = []
        for i in range(self.num_workers):
            async def handler(request, i=i):
                path = request.path
                if path == "/generate":
                    body = await request.json()
                    rid = body.get("rid")
                    fut = self._arrived.get(rid)
                    if fut is None:
                        return web.json_response({"error": f"unknown rid {rid!r}"}, status=400)
                    if not fut.done():
                        fut.set_result(i)
                    await self._release[rid].wait()
                    return web.json_response({"text": "", "meta_info": {
                        "id": rid, "finish_reason": {"type": "length", "length": 1}}})
                if path in ("/model_info", "/get_model_info", "/server_info", "/get_server_info"):
                    return web.json_response(info)
                if path == "/v1/models":
                    return web.json_response({"object": "list", "data": [
                        {"id": model_dir, "object": "model"}]})
                return web.json_response({})

            app = web.Application(client_max_size=1 << 30)
            app.router.add_route("*", "/{tail:.*}", handler)
            runner = web.AppRunner(app, access_log=None, handle_signals=False)
            await runner.setup()
            site = web.TCPSite(runner, self.host, 0)
            await site.start()
            self._runners.append(runner)
            port = runner.addresses[0][1]
            urls.append(f"http://{self.host}:{port}")
        self._session = ClientSession(connector=TCPConnector(limit=0),
                                      timeout=ClientTimeout(total=None))
        return urls

    async def _ready(self) -> bool:
        try:
            async with self._session.get(self.url + "/readiness") as r:
                if r.status != 200:
                    return False
                d = await r.json(content_type=None)
        except Exception:
            return False
        return d.get("status") == "ready" and int(d.get("healthy_workers", 0)) >= self.num_workers

    async def _workers_json(self) -> list:
        async with self._session.get(self.url + "/workers") as r:
            d = await r.json(content_type=None)
        return d["workers"]

    async def _worker_order(self) -> list[str]:
        return [w["url"] for w in await self._workers_json()]

    async def _worker_loads(self) -> dict:
        return {w["url"]: int(w["load"]) for w in await self._workers_json()}

    async def _post(self, rid: str, text: str):
        payload = json.dumps({"text": text, "rid": rid, "stream": False,
                              "sampling_params": {"max_new_tokens": 1}},
                             ensure_ascii=False).encode("utf-8")
        async with self._session.post(self.url + "/generate", data=payload,
                                      headers={"Content-Type": "application/json"}) as r:
            body = await r.read()
            return r.status, body

    async def _dispatch(self, rid: str, text: str) -> int:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._arrived[rid] = fut
        self._release[rid] = asyncio.Event()
        post = loop.create_task(self._post(rid, text))
        self._posts[rid] = post
        done, _ = await asyncio.wait({fut, post}, timeout=self.request_timeout_s,
                                     return_when=asyncio.FIRST_COMPLETED)
        if fut in done:
            return fut.result()
        if post in done:
            exc = post.exception()
            detail = repr(exc) if exc else "status %s: %s" % (post.result()[0],
                                                              post.result()[1][:200])
            raise GatewayError(f"the SGLang gateway answered request {rid} without forwarding it "
                               f"to a worker ({detail})")
        raise GatewayError(f"request {rid} reached no worker within {self.request_timeout_s:g} s")

    async def _settle(self, rids: list) -> None:
        for rid in rids:
            post = self._posts.pop(rid)
            status, body = await asyncio.wait_for(post, self.request_timeout_s)
            self._arrived.pop(rid, None)
            self._release.pop(rid, None)
            if status != 200:
                raise GatewayError(f"the SGLang gateway returned status {status} for {rid}: "
                                   f"{body[:200]!r}")
        want = {self.worker_urls[w]: self.expected_load[self.replica_of_worker[w]]
                for w in range(self.num_workers)}
        deadline = time.monotonic() + self.request_timeout_s
        while True:
            got = await self._worker_loads()
            if got == want:
                return
            if time.monotonic() > deadline:
                raise GatewayError(f"gateway loads {got} did not settle to {want}")
            await asyncio.sleep(0.001)

    async def _shutdown_client(self) -> None:
        for ev in self._release.values():
            ev.set()
        posts = list(self._posts.values())
        self._posts.clear()
        for p in posts:
            p.cancel()
        if posts:
            await asyncio.gather(*posts, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _shutdown_workers(self) -> None:
        for ev in self._release.values():
            ev.set()
        for runner in self._runners:
            with contextlib.suppress(Exception):
                await runner.cleanup()
        self._runners = []


__all__ = ["GATEWAY_POLICIES", "GatewayError", "SGLangGateway", "free_port", "gateway_available",
           "require_gateway"]
