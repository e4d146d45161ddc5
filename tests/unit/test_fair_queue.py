"""The dispatch queue: weighted round-robin across tenants, per-task-type caps, FIFO within a tenant."""

from __future__ import annotations

from scheduler.dispatch.queue import FairQueue


def drain(q: FairQueue[str], pool: str = "p") -> list[str]:
    out = []
    while (x := q.take(pool)) is not None:
        out.append(x)
    return out


def test_round_robin_across_tenants() -> None:
    q: FairQueue[str] = FairQueue()
    for i in range(4):
        q.put("p", "big", "t", f"big{i}")
    q.put("p", "small", "t", "small0")
    assert drain(q) == ["big0", "small0", "big1", "big2", "big3"]


def test_weights() -> None:
    q: FairQueue[str] = FairQueue(weights={"gold": 2})
    for i in range(4):
        q.put("p", "gold", "t", f"g{i}")
        q.put("p", "std", "t", f"s{i}")
    assert drain(q)[:6] == ["g0", "g1", "s0", "g2", "g3", "s1"]


def test_type_cap_passes_over_without_blocking_others() -> None:
    q: FairQueue[str] = FairQueue(type_caps={"export": 1})
    q.put("p", "a", "export", "e1")
    q.put("p", "a", "export", "e2")
    q.put("p", "a", "ping", "p1")
    assert q.take("p") == "e1"
    assert q.take("p") == "p1"
    assert q.take("p") is None
    q.finished("export")
    assert q.take("p") == "e2"


def test_worker_task_types_and_pools() -> None:
    q: FairQueue[str] = FairQueue()
    q.put("p", "a", "shell", "s")
    q.put("other", "a", "shell", "o")
    assert q.take("p", accepts=lambda t: t == "http") is None
    assert q.take("p", accepts=lambda t: t == "shell") == "s"
    assert q.depth("other") == 1
    assert len(q) == 1


def test_remove() -> None:
    q: FairQueue[str] = FairQueue()
    for x in "abc":
        q.put("p", x, "t", x)
    assert q.remove(lambda x: x == "b") == ["b"]
    assert drain(q) == ["a", "c"]
