"""The history checker itself (chaos/history.py): synthetic histories with and without violations,
and one read of a real etcd's history."""

from __future__ import annotations

import json

import pytest

from chaos.history import Event, check_history, format_events, read_and_check, read_history
from scheduler.store.etcd import Compare, EtcdClient, EventType
from scheduler.store.etcd.ops import put
from scheduler.store.keyspace import Keyspace

KS = Keyspace("/h")


class History:
    """Builds an etcd-like event list: one revision per call, as etcd assigns them."""

    def __init__(self) -> None:
        self.rev = 1  # revision 1 is etcd's empty store
        self.events: list[Event] = []
        self.leases = {"a": 0xA1, "b": 0xB2, "c": 0xC3}

    def _next(self) -> int:
        self.rev += 1
        return self.rev

    def claim(self, p: int, node: str) -> int:
        r = self._next()
        lease = self.leases[node]
        value = json.dumps({"node": node, "lease": f"{lease:x}"}).encode()
        self.events.append(Event(r, EventType.PUT, KS.owner(p), value, r, lease))
        return r

    def overwrite(self, p: int, node: str, create_revision: int) -> None:
        """A put on a present owner key (as an unconditional put would do)."""
        r = self._next()
        lease = self.leases[node]
        value = json.dumps({"node": node, "lease": f"{lease:x}"}).encode()
        self.events.append(Event(r, EventType.PUT, KS.owner(p), value, create_revision, lease))

    def delete(self, *partitions: int) -> int:
        """Owner keys deleted in one revision (a release, or a lease expiry taking several)."""
        r = self._next()
        self.events += [Event(r, EventType.DELETE, KS.owner(p)) for p in partitions]
        return r

    def write(self, p: int, node: str, token: int, wm: int) -> int:
        r = self._next()
        value = json.dumps({"watermark_ms": wm, "writer": node, "token": token}).encode()
        created = next((e.create_revision for e in self.events if e.key == KS.checkpoint(p)), r)
        self.events.append(Event(r, EventType.PUT, KS.checkpoint(p), value, created))
        return r


def clean_run() -> tuple[History, dict[str, int]]:
    h = History()
    t = {"a0": h.claim(0, "a"), "a1": h.claim(1, "a")}
    h.write(0, "a", t["a0"], 100)
    h.write(1, "a", t["a1"], 100)
    h.write(0, "a", t["a0"], 150)
    t["expiry"] = h.delete(0, 1)  # a's lease expires
    t["b0"] = h.claim(0, "b")
    t["b1"] = h.claim(1, "b")
    h.write(0, "b", t["b0"], 150)  # equal watermark: allowed
    h.write(1, "b", t["b1"], 200)
    t["release"] = h.delete(1)  # b releases partition 1, c claims it
    t["c1"] = h.claim(1, "c")
    h.write(1, "c", t["c1"], 250)
    return h, t


def test_a_clean_history_has_no_violations_and_its_claims_are_reconstructed() -> None:
    h, t = clean_run()
    h.events.insert(0, Event(2, EventType.PUT, b"/h/members/a", b"{}", 2, 0xA1))  # other keys are ignored
    r = check_history(h.events, KS, partitions=2)
    assert r.ok, r.summary()
    assert [(c.partition, c.node, c.token, c.end) for c in r.claims] == [
        (0, "a", t["a0"], t["expiry"]), (1, "a", t["a1"], t["expiry"]),
        (0, "b", t["b0"], None), (1, "b", t["b1"], t["release"]), (1, "c", t["c1"], None),
    ]
    assert r.owners_at(t["a1"]) == {0: "a", 1: "a"}
    assert r.owners_at(t["expiry"]) == {}
    assert r.owners_at(h.rev) == {0: "b", 1: "c"}
    assert [(o.node, n.node) for o, n in r.takeovers_from("a")] == [("a", "b"), ("a", "b")]
    assert r.claims[0].writes == 2 and len(r.writes) == 6 and not r.stale_writes
    assert r.first_revision == 2 and r.last_revision == h.rev
    assert "0 violations" in r.summary() and "/h/owners/00000" in format_events(h.events)


def test_a_write_with_the_old_token_after_a_takeover_is_a_stale_write() -> None:
    h, t = clean_run()
    stale = h.write(0, "a", t["a0"], 300)  # a resumed after b took partition 0 over
    r = check_history(h.events, KS)
    assert not r.ok
    assert [w.revision for w in r.stale_writes] == [stale]
    assert len(r.violations) == 1
    assert f"rev {stale}: partition 0: stale write: checkpoint written by a (token {t['a0']})" in r.violations[0]
    assert "while b" in r.violations[0]


def test_a_write_while_nobody_owns_the_partition_is_a_violation() -> None:
    h = History()
    tok = h.claim(0, "a")
    h.delete(0)
    late = h.write(0, "a", tok, 10)
    r = check_history(h.events, KS)
    assert r.violations == [f"rev {late}: partition 0: stale write: checkpoint written by a (token {tok}) "
                            "while nobody owned the partition"]


def test_the_right_token_under_the_wrong_writer_is_a_violation() -> None:
    h = History()
    tok = h.claim(0, "a")
    h.write(0, "b", tok, 10)
    r = check_history(h.events, KS)
    assert len(r.violations) == 1 and "written by b" in r.violations[0]


def test_an_owner_key_taken_over_while_held_means_two_planners() -> None:
    h = History()
    tok = h.claim(0, "a")
    h.overwrite(0, "b", tok)  # b put over a's key instead of claiming with create_revision == 0
    r = check_history(h.events, KS)
    assert len(r.violations) == 1 and "two planners: b" in r.violations[0], r.violations
    assert [c.node for c in r.claims] == ["a", "b"]


def test_an_owner_refreshing_its_own_key_is_the_same_claim() -> None:
    h = History()
    tok = h.claim(0, "a")
    h.overwrite(0, "a", tok)
    h.write(0, "a", tok, 5)
    r = check_history(h.events, KS)
    assert r.ok, r.summary()
    assert len(r.claims) == 1


def test_an_owner_key_created_while_present_is_a_violation() -> None:
    h = History()
    h.claim(0, "a")
    h.claim(0, "b")  # impossible in etcd without a delete in between: the history is inconsistent
    r = check_history(h.events, KS)
    assert len(r.violations) == 1 and "created by b while a" in r.violations[0]


def test_a_watermark_going_back_is_a_violation() -> None:
    h = History()
    tok = h.claim(0, "a")
    h.write(0, "a", tok, 100)
    back = h.write(0, "a", tok, 99)
    h.write(0, "a", tok, 100)  # compared with the highest so far, not the regressed value
    r = check_history(h.events, KS)
    assert r.violations == [f"rev {back}: partition 0: watermark went back from 100 (rev {back - 1}) to 99 "
                            f"(written by a, token {tok})"]


def test_deleted_checkpoints_undecodable_values_and_missing_history_are_violations() -> None:
    h = History()
    h.events.append(Event(5, EventType.PUT, KS.owner(1), b'{"node":"a","lease":"a1"}', 3, 0xA1))  # created earlier
    h.events.append(Event(6, EventType.DELETE, KS.checkpoint(1)))
    h.events.append(Event(7, EventType.PUT, KS.checkpoint(1), b"not json", 7))
    h.events.append(Event(8, EventType.DELETE, KS.owner(2)))
    h.events.append(Event(9, EventType.PUT, KS.owner(3), b'{"node":"a","lease":"ff"}', 9, 0xA1))
    h.events.append(Event(4, EventType.PUT, KS.owner(9), b'{"node":"a","lease":"a1"}', 4, 0xA1))
    r = check_history(h.events, KS, partitions=4)
    text = "\n".join(r.violations)
    for expected in ("created at rev 3, before the history shows it", "checkpoint deleted",
                     "undecodable checkpoint", "owner key deleted while absent", "names lease ff",
                     "history out of order", "partition 9 outside 0..3"):
        assert expected in text, text


@pytest.mark.etcd
async def test_read_history_replays_a_real_run_from_revision_1(etcd_client: EtcdClient) -> None:
    ks = Keyspace(f"/hist-{id(etcd_client):x}")
    lease = await etcd_client.lease_grant(60)
    value = json.dumps({"node": "a", "lease": f"{lease.id:x}"}).encode()
    claim = await etcd_client.txn([Compare.create_revision(ks.owner(0), "==", 0)],
                                  [put(ks.owner(0), value, lease=lease.id)])
    assert claim.succeeded
    for wm in (10, 20):
        await etcd_client.put(ks.checkpoint(0), json.dumps({"watermark_ms": wm, "writer": "a",
                                                            "token": claim.revision}).encode())
    await etcd_client.lease_revoke(lease.id)  # the owner key goes with the lease
    await etcd_client.put(ks.checkpoint(0), json.dumps({"watermark_ms": 30, "writer": "a",
                                                        "token": claim.revision}).encode())
    until = (await etcd_client.put(ks.member("a"), b"{}")).revision  # not an owners/checkpoints key
    await etcd_client.put("/elsewhere", b"x")  # after `until`: not read

    events = await read_history(etcd_client, ks, until_revision=until)
    assert [(e.type, e.key) for e in events] == [
        (EventType.PUT, ks.owner(0)), (EventType.PUT, ks.checkpoint(0)), (EventType.PUT, ks.checkpoint(0)),
        (EventType.DELETE, ks.owner(0)), (EventType.PUT, ks.checkpoint(0)),
    ]
    assert events[0].create_revision == claim.revision and events[0].lease == lease.id
    report = await read_and_check(etcd_client, ks)  # up to etcd's revision now
    assert len(report.violations) == 1 and "while nobody owned" in report.violations[0], report.summary()
