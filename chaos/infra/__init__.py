"""Real processes for drills and tests: etcd clusters, planners, loopback ports, and the spawn/stop
discipline that leaves nothing running (stopped by pid, parent-death signal, atexit backstop).

They lived in tests/ until the drill runner (chaos/runner.py) needed the same etcd, planner and port
handling: one implementation, used by the test fixtures and by `schedctl drill run`.
"""
