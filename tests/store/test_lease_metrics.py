"""The lease keeper reports renew latency, stream failures and the loss to its observer (the planner's
metrics), against a real etcd that stops answering."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from chaos.infra.etcd import EtcdFactory
from scheduler.metrics.planner import PlannerMetrics
from scheduler.store.etcd import EtcdClient, LeaseLostReason


@pytest.mark.etcd
async def test_keeper_reports_renewals_stalls_and_loss(etcd_factory: EtcdFactory) -> None:
    server = etcd_factory()
    metrics = PlannerMetrics()
    async with EtcdClient(server.config()) as etcd:
        lease = await etcd.lease_grant(2)
        keeper = etcd.keep_alive(lease, safety_margin=0.5, renew_interval=0.4, ack_timeout=0.3)
        keeper.observer = metrics
        await asyncio.sleep(1.0)
        assert metrics.renew_latency.count >= 1 and not any(metrics.renew_failures.values())
        assert 0 < metrics.renew_latency.sum / metrics.renew_latency.count < 0.3
        server.pause(0)
        try:
            assert await asyncio.wait_for(keeper.wait_lost(), timeout=3) is LeaseLostReason.LOCAL_DEADLINE
        finally:
            server.resume(0)
        await keeper.stop()
    assert metrics.renew_failures.get("stalled", 0) >= 1
    assert metrics.leases_lost == {"expired": 0, "local_deadline": 1}
    scraped = {(s.name, tuple(s.labels.values())): s.value
               for fam in text_string_to_metric_families(generate_latest(metrics.registry).decode())
               for s in fam.samples}
    assert scraped[("scheduler_leases_lost_total", ("local_deadline",))] == 1
    assert scraped[("scheduler_lease_renew_failures_total", ("stalled",))] >= 1
    assert scraped[("scheduler_lease_renew_latency_seconds_count", ())] >= 1
