"""Pure parts of the API edge: label selectors, page tokens and sizes, update masks, id checks."""

from __future__ import annotations

import base64
import json

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from scheduler._gen.scheduler.v1 import schedule_pb2 as pb
from scheduler.api import inputs, masks, paging
from scheduler.api.convert import schedule_to_pb
from scheduler.api.selector import parse_selector
from scheduler.errors import InvalidArgument
from scheduler.model import Schedule


@pytest.mark.parametrize(
    ("text", "labels", "want"),
    [
        ("", {}, True),
        ("team=a", {"team": "a"}, True),
        ("team==a", {"team": "b"}, False),
        ("team!=a", {}, True),  # as in Kubernetes: a missing key is "not a"
        ("team!=a", {"team": "a"}, False),
        ("env in (prod, staging)", {"env": "staging"}, True),
        ("env in (prod,staging)", {"env": "dev"}, False),
        ("env notin (prod)", {"env": "dev"}, True),
        ("env notin (prod)", {}, True),
        ("team", {"team": ""}, True),
        ("team", {}, False),
        ("!team", {}, True),
        ("!team", {"team": "x"}, False),
        ("team=a, env in (prod,dev), !legacy", {"team": "a", "env": "dev"}, True),
        ("team=a,env in (prod,dev),!legacy", {"team": "a", "env": "dev", "legacy": "1"}, False),
        ("team=", {"team": ""}, True),
    ],
)
def test_selector_matches(text: str, labels: dict[str, str], want: bool) -> None:
    assert parse_selector(text).matches(labels) is want


@pytest.mark.parametrize("text", ["team=a,", "env in (a", "env in a)", "=a", "env in (a,,b)", "a b c", "té=1",
                                  "k=v w", "x" * 5000])
def test_selector_errors_name_the_field(text: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        parse_selector(text)
    assert e.value.field == "label_selector"


def test_page_size_default_clamp_and_negative() -> None:
    assert paging.page_size(0) == paging.DEFAULT_PAGE_SIZE
    assert paging.page_size(5) == 5
    assert paging.page_size(10**6) == paging.MAX_PAGE_SIZE
    with pytest.raises(InvalidArgument, match="page_size"):
        paging.page_size(-1)


def test_an_altered_page_token_is_refused() -> None:
    # An outside audit (session 36): the position re-encoded by hand (`pg-010`) paged on from there.
    tok = paging.encode_token(["s", "t1"], "pg-003")
    raw = json.loads(base64.urlsafe_b64decode(tok + "=" * (-len(tok) % 4)))
    raw["p"] = "pg-010"
    forged = base64.urlsafe_b64encode(json.dumps(raw).encode()).decode().rstrip("=")
    with pytest.raises(InvalidArgument, match="altered") as e:
        paging.decode_token(forged, ["s", "t1"])
    assert e.value.field == "page_token"


def test_page_token_round_trip_and_tied_to_filters() -> None:
    tok = paging.encode_token(["s", "t1"], "job-7")
    assert paging.decode_token(tok, ["s", "t1"]) == "job-7"
    assert paging.decode_token("", ["s"]) is None
    with pytest.raises(InvalidArgument) as e:
        paging.decode_token(tok, ["s", "t2"])
    assert e.value.field == "page_token"
    for bad in ("!!!", "bm90IGpzb24", tok[:-3], "x" * 5000):
        with pytest.raises(InvalidArgument, match="page_token"):
            paging.decode_token(bad, ["s", "t1"])


def test_timestamps_refuse_sub_millisecond_and_out_of_range() -> None:
    assert inputs.timestamp_ms(Timestamp(seconds=1, nanos=2_000_000), "t") == 1002
    with pytest.raises(InvalidArgument, match="sub-millisecond"):
        inputs.timestamp_ms(Timestamp(seconds=1, nanos=1), "t")
    assert inputs.timestamp_ms(Timestamp(seconds=1, nanos=1), "t", exact=False) == 1000
    with pytest.raises(InvalidArgument, match="outside"):
        inputs.timestamp_ms(Timestamp(seconds=-5), "t")


def _stored() -> pb.Schedule:
    return schedule_to_pb(Schedule(id="a", tenant="t", spec="* * * * *", worker_pool="p", task_type="x",
                                   labels={"k": "v"}, version=7))


def test_mask_paths_replace_listed_fields_only() -> None:
    stored = _stored()
    req = pb.Schedule(id="a", spec="*/5 * * * *", labels={"new": "1"})
    req.policies.retry.max_attempts = 9
    out = masks.apply(stored, req, masks.effective_paths(req, stored, ["spec", "policies.retry.max_attempts"]))
    assert out.spec == "*/5 * * * *"
    assert out.policies.retry.max_attempts == 9
    assert dict(out.labels) == {"k": "v"}  # not in the mask
    assert out.policies.retry.max_backoff == stored.policies.retry.max_backoff


def test_empty_mask_takes_set_leaves_and_listed_unset_field_resets() -> None:
    stored = _stored()
    req = pb.Schedule(id="a", tenant="t", version=99)  # same tenant and any version: ignored
    req.policies.overlap = pb.OVERLAP_POLICY_ALLOW_ALL
    paths = masks.effective_paths(req, stored, [])
    assert paths == ["policies.overlap"]
    out = masks.apply(stored, req, paths)
    assert out.policies.overlap == pb.OVERLAP_POLICY_ALLOW_ALL
    assert out.policies.retry == stored.policies.retry
    out = masks.apply(stored, pb.Schedule(), masks.effective_paths(req, stored, ["labels", "policies.retry"]))
    assert dict(out.labels) == {}
    assert not out.policies.HasField("retry")  # back to the defaults


@pytest.mark.parametrize(("paths", "req", "field"), [
    (["id"], pb.Schedule(), "update_mask"),
    (["state"], pb.Schedule(), "update_mask"),
    (["version"], pb.Schedule(), "update_mask"),
    (["nope"], pb.Schedule(), "update_mask"),
    (["policies.nope"], pb.Schedule(), "update_mask"),
    (["spec.minute"], pb.Schedule(), "update_mask"),
    (["*", "spec"], pb.Schedule(), "update_mask"),
    ([], pb.Schedule(tenant="other"), "schedule.tenant"),
    ([], pb.Schedule(state=pb.SCHEDULE_STATE_PAUSED), "schedule.state"),
])
def test_mask_errors(paths: list[str], req: pb.Schedule, field: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        masks.effective_paths(req, _stored(), paths)
    assert e.value.field == field


def test_star_mask_is_every_mutable_field() -> None:
    assert masks.effective_paths(pb.Schedule(), _stored(), ["*"]) == list(masks.MUTABLE)
