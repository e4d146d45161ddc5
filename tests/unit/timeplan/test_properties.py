"""Properties that must hold for every spec, zone and DST policy (hypothesis)."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from scheduler.errors import InvalidArgument
from scheduler.timeplan import DstGap, DstOverlap, parse_spec
from scheduler.timeplan.plan import Plan

ZONES = [
    "UTC",
    "America/New_York",
    "Europe/London",
    "Australia/Lord_Howe",
    "Africa/Cairo",
    "America/Santiago",
    "Pacific/Apia",
    "Asia/Kolkata",
    "Europe/Berlin",
    "Pacific/Chatham",
]
T_LO = int(datetime(2010, 1, 1, tzinfo=UTC).timestamp() * 1000)
T_HI = int(datetime(2030, 1, 1, tzinfo=UTC).timestamp() * 1000)


@st.composite
def field(draw: st.DrawFn, lo: int, hi: int) -> str:
    kind = draw(st.sampled_from(["*", "n", "range", "step", "list", "rangestep"]))
    if kind == "*":
        return "*"
    a = draw(st.integers(lo, hi))
    b = draw(st.integers(a, hi))
    if kind == "n":
        return str(a)
    if kind == "range":
        return f"{a}-{b}"
    if kind == "step":
        return f"*/{draw(st.integers(1, max(1, hi - lo)))}"
    if kind == "rangestep":
        return f"{a}-{b}/{draw(st.integers(1, max(1, hi - lo)))}"
    return ",".join(str(x) for x in sorted(set(draw(st.lists(st.integers(lo, hi), min_size=1, max_size=4)))))


@st.composite
def cron_spec(draw: st.DrawFn) -> str:
    dom = draw(st.one_of(field(1, 28), st.sampled_from(["L", "15W", "LW", "1-31"])))
    dow = draw(st.one_of(field(0, 6), st.sampled_from(["5L", "1#2", "MON-FRI", "*"])))
    parts = [draw(field(0, 59)), draw(field(0, 23)), dom, draw(field(1, 12)), dow]
    if draw(st.booleans()):
        parts.insert(0, draw(field(0, 59)))
    return " ".join(parts)


@st.composite
def plans(draw: st.DrawFn) -> Plan:
    if draw(st.integers(0, 9)) == 0:
        return parse_spec(f"@every {draw(st.integers(1, 100_000))}s")
    try:
        return parse_spec(
            draw(cron_spec()),
            tz=draw(st.sampled_from(ZONES)),
            dst_gap=draw(st.sampled_from([None, *DstGap])),
            dst_overlap=draw(st.sampled_from([None, *DstOverlap])),
        )
    except InvalidArgument:  # an impossible day combination (e.g. 31 in February only)
        reject()


SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)


@SETTINGS
@given(plans(), st.integers(T_LO, T_HI))
def test_next_is_strictly_after_and_nothing_in_between(plan: Plan, t: int) -> None:
    n = plan.next_after_ms(t)
    if n is None:
        return
    assert n > t
    p = plan.prev_before_ms(n)
    assert p is None or p <= t, "prev(next(t)) must not fall inside (t, next(t))"


@SETTINGS
@given(plans(), st.integers(T_LO, T_HI))
def test_prev_is_strictly_before_and_nothing_in_between(plan: Plan, t: int) -> None:
    p = plan.prev_before_ms(t)
    if p is None:
        return
    assert p < t
    n = plan.next_after_ms(p)
    assert n is not None and n >= t, "next(prev(t)) must not fall inside (prev(t), t)"


@SETTINGS
@given(plans(), st.integers(T_LO, T_HI))
def test_iteration_is_strictly_increasing_whole_seconds(plan: Plan, t: int) -> None:
    last = t
    for i, u in enumerate(plan.iter_after_ms(t)):
        assert u > last
        assert u % 1000 == 0
        last = u
        if i == 30:
            break


@SETTINGS
@given(plans(), st.integers(T_LO, T_HI), st.integers(0, 40 * 86_400_000))
def test_between_matches_iteration(plan: Plan, a: int, span: int) -> None:
    b = a + span
    got = []
    for u in plan.between_ms(a, b):
        got.append(u)
        if len(got) > 50:
            return  # long ranges: the prefix check below is enough
    expected = []
    t = a
    while (n := plan.next_after_ms(t)) is not None and n <= b:
        expected.append(n)
        t = n
    assert got == expected


@settings(max_examples=300, deadline=None, derandomize=True)
@given(cron_spec(), st.integers(T_LO, T_HI))
def test_utc_instants_match_the_fields(spec: str, t: int) -> None:
    try:
        plan = parse_spec(spec)
    except InvalidArgument:
        reject()
    n = plan.next_after_ms(t)
    assert n is not None
    assert plan.expr.matches_wall(n // 1000)  # type: ignore[attr-defined]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.integers(1, 86_400 * 30), st.integers(T_LO, T_HI))
def test_every_is_evenly_spaced(period_s: int, t: int) -> None:
    plan = parse_spec(f"@every {period_s}s")
    n1 = plan.next_after_ms(t)
    assert n1 is not None
    n2 = plan.next_after_ms(n1)
    assert n2 == n1 + period_s * 1000
    assert n1 - t <= period_s * 1000
