"""Earlier activations a new owner still has to plan (planner/activations.py) and the history a
schedule keeps for it (store/schedules.py): pure, plus the store's bound on the in-memory twin."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler.errors import FailedPrecondition
from scheduler.model import Schedule, ScheduleState
from scheduler.planner.activations import in_effect_at, owed_activations, segments_between, withdrawal_rule
from scheduler.store.checkpoint import Checkpoint
from scheduler.store.codec import ScheduleMeta, decode_schedule_meta, encode_schedule, plan_fields
from scheduler.store.keyspace import Keyspace
from scheduler.store.memory import MemoryKV
from scheduler.store.schedules import MAX_UNSEEN_ACTIVATIONS, ScheduleStore, StoredSchedule, pruned_history
from scheduler.timeplan import SkipReason

T = 1_800_000_000_000
BASE = Schedule(id="s", tenant="t", spec="* * * * * *", worker_pool="p", task_type="x")


def fields(spec: str, activated: int, rev: int, state: ScheduleState = ScheduleState.ACTIVE) -> dict[str, object]:
    return plan_fields(replace(BASE, spec=spec, state=state), activated, rev)


# Activations: every second (rev 10, at T), every 2 s (rev 20, at T+4 s), paused (rev 30, at T+8 s),
# and now every 3 s (rev 40, at T+12 s).
HISTORY = (fields("* * * * * *", T, 10), fields("*/2 * * * * *", T + 4_000, 20),
           fields("*/2 * * * * *", T + 8_000, 30, ScheduleState.PAUSED))
NOW = StoredSchedule(replace(BASE, spec="*/3 * * * * *", version=40), T + 12_000, 0, ScheduleMeta(history=HISTORY))


def test_the_writer_knew_the_first_activation_only() -> None:
    owed = owed_activations(NOW, Checkpoint(0, T + 2_000, 1, sched_rev=15))
    assert owed.seen is not None and owed.seen.schedule.spec == "* * * * * *"
    assert (owed.seen.after_ms, owed.seen.until_ms) == (T, T + 4_000)
    assert [(s.schedule.spec, s.after_ms, s.until_ms, s.paused) for s in owed.unseen] == [
        ("*/2 * * * * *", T + 4_000, T + 8_000, False), ("*/2 * * * * *", T + 8_000, T + 12_000, True)]
    assert owed.first_change_ms == T + 4_000


def test_the_writer_knew_the_current_activation_nothing_is_owed() -> None:
    assert owed_activations(NOW, Checkpoint(0, T + 13_000, 1, sched_rev=45)) == owed_activations(
        NOW, Checkpoint(0, T + 13_000, 1, sched_rev=40))
    assert owed_activations(NOW, Checkpoint(0, T + 13_000, 1, sched_rev=40)).seen is None


def test_a_fresh_partition_owes_every_activation_from_its_instant() -> None:
    owed = owed_activations(NOW, Checkpoint(0, 0, 0))
    assert owed.seen is not None and owed.seen.after_ms == T and len(owed.unseen) == 2


def test_the_withdrawal_rule_asks_the_activation_in_effect_at_the_planned_time() -> None:
    owed = owed_activations(NOW, Checkpoint(0, T + 20_000, 1, sched_rev=15))
    rule = withdrawal_rule(owed, NOW.schedule.plan())
    assert rule(T + 5_000) is SkipReason.SCHEDULE_CHANGED  # odd second under */2
    assert rule(T + 6_000) is None  # */2 plans it: the run written ahead stands
    assert rule(T + 9_000) is SkipReason.PAUSED
    assert rule(T + 13_000) is SkipReason.SCHEDULE_CHANGED and rule(T + 15_000) is None  # */3 now


def test_in_effect_at() -> None:
    assert in_effect_at(NOW, T + 5_000).spec == "*/2 * * * * *"
    assert in_effect_at(NOW, T + 9_000).state is ScheduleState.PAUSED
    assert in_effect_at(NOW, T + 12_000).spec == "*/3 * * * * *"


def test_segments_between_cut_each_activation_to_the_span() -> None:
    """A hold from T+2 s to the current activation: the every-second, every-2-s and paused stretches, each its
    own (a claim settles each as the activation that ended it would have)."""
    segs = segments_between(NOW, T + 2_000, T + 12_000)
    assert [(s.schedule.spec, s.after_ms, s.until_ms, s.paused) for s in segs] == [
        ("* * * * * *", T + 2_000, T + 4_000, False), ("*/2 * * * * *", T + 4_000, T + 8_000, False),
        ("*/2 * * * * *", T + 8_000, T + 12_000, True)]
    assert [(s.after_ms, s.until_ms) for s in segments_between(NOW, T + 9_000, T + 12_000)] == [(T + 9_000, T + 12_000)]
    # Before what the history holds: the version in effect at the start (no history: the schedule itself).
    bare = replace(NOW, meta=ScheduleMeta())
    assert [(s.schedule.spec, s.after_ms, s.until_ms) for s in segments_between(bare, T, T + 12_000)] == [
        ("*/3 * * * * *", T, T + 12_000)]


def test_history_is_pruned_to_what_no_checkpoint_covered() -> None:
    assert pruned_history(HISTORY, 40, Checkpoint(0, T, 1, sched_rev=25)) == HISTORY[1:]  # saw rev 20, not 30
    assert pruned_history(HISTORY, 40, Checkpoint(0, T, 1, sched_rev=35)) == HISTORY[2:]
    assert pruned_history(HISTORY, 40, Checkpoint(0, T, 1, sched_rev=45)) == ()
    assert pruned_history(HISTORY, 40, Checkpoint(0, 0, 0)) == HISTORY  # nobody planned: all owed
    assert pruned_history((), 40, Checkpoint(0, T, 1, sched_rev=45)) == ()


def test_a_single_previous_activation_of_an_older_version_still_reads() -> None:
    import json
    value = json.loads(encode_schedule(BASE, activated_ms=T, meta=ScheduleMeta()))
    value["meta"]["pv"] = HISTORY[0]  # what a version keeping one previous activation wrote
    assert decode_schedule_meta(json.dumps(value).encode()).history == (HISTORY[0],)


async def test_changes_beyond_the_bound_without_a_planner_are_refused_and_nothing_is_lost() -> None:
    kv = MemoryKV()
    try:
        store = ScheduleStore(kv, Keyspace("/a"), 4)
        st = await store.create(BASE, T)
        for i in range(MAX_UNSEEN_ACTIVATIONS):  # no planner: no checkpoint covers any of them
            st = await store.update(replace(st.schedule, spec=f"{i % 50} * * * * *"), None, T + i)
        with pytest.raises(FailedPrecondition, match="still wait for a planner of partition"):
            await store.update(replace(st.schedule, spec="*/7 * * * * *"), None, T + 99)
        after = await store.get("s")
        assert after.schedule.version == st.schedule.version and len(after.meta.history) == MAX_UNSEEN_ACTIVATIONS
        # A change that is not an activation (labels) still goes through.
        await store.update(replace(st.schedule, labels={"k": "v"}), None, T + 100)
    finally:
        await kv.close()
