"""Dispatch: the fair queue of due executions and the WorkerService streams that carry them."""
