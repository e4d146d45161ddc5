"""The Python client for the scheduler's gRPC API (floor 1: generated code and small helpers only).

    async with SchedulerClient("127.0.0.1:7000") as c:
        s = await c.get_schedule("nightly-report")

`SyncSchedulerClient` is the same behind blocking calls. Failures raise `ClientError` (status code,
message, field violations). See docs/api.md, "Python client".
"""

from scheduler.auth.bearer import read_token_file
from scheduler.client.client import SchedulerClient
from scheduler.client.errors import ClientError, FieldViolation
from scheduler.client.retry import NO_RETRY, RetryPolicy
from scheduler.client.settings import DEFAULT_SERVER, ClientSettings, load_client_settings
from scheduler.client.sync import SyncSchedulerClient

__all__ = [
    "DEFAULT_SERVER",
    "NO_RETRY",
    "ClientError",
    "ClientSettings",
    "FieldViolation",
    "RetryPolicy",
    "SchedulerClient",
    "SyncSchedulerClient",
    "load_client_settings",
    "read_token_file",
]
