"""Prometheus metrics of planner and worker processes (docs/operations.md lists every one).

Each process builds its own `CollectorRegistry` (never the library's global one), so several planners
and workers can live in one test process. Hot paths only bump plain ints and lock-free histograms
(`core.py`); gauges are read from the live objects when Prometheus scrapes, on the event loop.
"""
