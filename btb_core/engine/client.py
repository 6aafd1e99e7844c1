"""One streaming completion request to a vLLM OpenAI-compatible server (standard library only).

TTFT is measured on the client at the first streamed chunk that carries generated text, from the
moment the request is sent; cached prompt tokens are read from the final usage chunk
(``usage.prompt_tokens_details.cached_tokens``, present with ``--enable-prompt-tokens-details`` and
``stream_options.include_usage``).
"""

from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass


class EngineRequestError(RuntimeError):
    """The server answered with an error or closed the stream early."""


@dataclass
class Completion:
    """What one request measured.

    Attributes
    ----------
    start_s, first_token_s, end_s : float
        ``time.perf_counter()`` when the request was sent, its first generated chunk arrived, and
        the stream ended.
    prompt_tokens, cached_tokens, completion_tokens : int
        From the server's usage record.
    """

    start_s: float
    first_token_s: float
    end_s: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.start_s


def complete(port: int, model: str, prompt: str, max_tokens: int, *, host: str = "127.0.0.1",
             timeout_s: float = 300.0, on_first_token=None, on_chunk=None) -> Completion:
    """Send one streaming ``/v1/completions`` request and wait for its end.

    ``max_tokens`` tokens are generated exactly (``min_tokens`` = ``max_tokens``, ``ignore_eos``),
    greedy. ``on_first_token()`` is called when the first chunk arrives, ``on_chunk(n)`` after
    the ``n``-th chunk that carries generated text (one per engine step: a decode's step clock).

    Raises
    ------
    EngineRequestError
        HTTP status other than 200, or no generated chunk / usage record in the stream.
    """
    body = json.dumps({
        "model": model, "prompt": prompt, "max_tokens": int(max_tokens),
        "min_tokens": int(max_tokens), "ignore_eos": True, "temperature": 0.0, "stream": True,
        "stream_options": {"include_usage": True},
    }).encode()
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        start = time.perf_counter()
        conn.request("POST", "/v1/completions", body=body,
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise EngineRequestError(f"server on port {port} answered HTTP {resp.status}: "
                                     f"{resp.read()[:300]!r}")
        first = None
        usage = None
        chunks = 0
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            if chunk.get("choices"):
                if first is None:
                    first = time.perf_counter()
                    if on_first_token is not None:
                        on_first_token()
                if on_chunk is not None:
                    chunks += 1
                    on_chunk(chunks)
            if chunk.get("usage"):
                usage = chunk["usage"]
        end = time.perf_counter()
    finally:
        conn.close()
    if first is None or usage is None:
        raise EngineRequestError(f"server on port {port}: stream ended without "
                                 f"{'a generated chunk' if first is None else 'a usage record'}")
    details = usage.get("prompt_tokens_details") or {}
    return Completion(start, first, end, int(usage.get("prompt_tokens", 0)),
                      int(details.get("cached_tokens") or 0), int(usage.get("completion_tokens", 0)))


def complete_at_once(port: int, model: str, prompts, max_tokens: int, **kwargs) -> list[Completion]:
    """:func:`complete` for every prompt of ``prompts`` at the same time (one thread each), in
    order. Re-raises the first request's error after every request ended."""
    from concurrent.futures import ThreadPoolExecutor

    prompts = list(prompts)
    if not prompts:
        return []
    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        futures = [pool.submit(complete, port, model, p, max_tokens, **kwargs) for p in prompts]
        return [f.result() for f in futures]
