"""btb_core: cost model, traces, simulator and routers for bursty same-prefix LLM traffic.

Bite the Bullet (BTB): when the same long prefix arrives X times within Z seconds, copy its KV
cache over RDMA to the M least-loaded replicas instead of recomputing it on each.
"""

__version__ = "0.1.0"
