"""Per-tenant quotas (issue 14, docs/operations.md "Quotas"): the record (record.py), its etcd store and
watch (store.py), the schedules-held counter written in the same txn as each create and delete (usage.py),
and the planner's executions-per-second pacer (pacer.py)."""
