"""Planner: partition ownership and (issue 4) the per-partition loop, as snapshot -> decide -> act."""
