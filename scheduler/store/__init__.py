"""The only door to etcd: the thin etcd client (`scheduler.store.etcd`), and later the keyspace,
the session with its fenced writes, and the in-memory twin that passes the same contract tests."""
