"""sched: a sharded, multi-region cron scheduler on etcd."""

__version__ = "0.1.0"
