"""Drill harness: tools that judge a run of the scheduler from etcd's own record of it.

`chaos.history` replays the watch history of the owners/ and checkpoints/ prefixes revision by
revision and reports every breach of the ownership and fencing invariants (DESIGN.md, Ownership and
fencing) as a human-readable line.
"""
