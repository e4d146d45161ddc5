"""deploy/Dockerfile without a Docker engine: hadolint passes, the final stage is what docs/deploy.md says
(non-root numeric user, no build tools, OCI labels, one HEALTHCHECK through `schedctl health`), the build
context keeps what the build copies, and scripts/build-image.sh passes shellcheck and refuses clearly
where the docker CLI has no engine (as on this project's machines)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.deploy import dockerfile
from tests.deploy.tools import ROOT, run, tool


def test_hadolint_passes() -> None:
    run(tool("hadolint"), "--failure-threshold", "info", str(dockerfile.DOCKERFILE))


def test_final_stage_runs_schedctl_as_a_numeric_non_root_user() -> None:
    final = dockerfile.final_stage()
    (user,) = [i.args for i in final if i.keyword == "USER"]
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) != 0 and gid.isdigit(), "runAsNonRoot can verify only a numeric user"
    assert dockerfile.entrypoint()[-1] == "schedctl"
    assert next(i for i in final if i.keyword == "FROM").args == "${PYTHON_IMAGE}"


def test_no_build_tools_in_the_final_stage() -> None:
    final = dockerfile.final_stage()
    text = " ".join(i.args for i in final if i.keyword == "RUN")
    for tool_name in ("gcc", "build-essential", "pip install", "make "):
        assert tool_name not in text, tool_name
    copies = [i.args for i in final if i.keyword == "COPY"]
    assert copies == ["--from=build /opt/sched /opt/sched"], "only the built virtualenv comes along"


def test_oci_labels() -> None:
    labels = " ".join(i.args for i in dockerfile.final_stage() if i.keyword == "LABEL")
    for key in ("title", "description", "version", "revision", "created", "licenses", "documentation"):
        assert f"org.opencontainers.image.{key}=" in labels, key


def test_one_healthcheck_for_both_roles() -> None:
    opts, cmd = dockerfile.healthcheck()
    assert cmd[:2] == ["schedctl", "health"]
    assert {"interval", "timeout", "start-period", "retries"} <= set(opts)
    env = dockerfile.env()
    # Both roles serve plaintext health on 7001 (the planner's API on 7000 may require client certificates,
    # which no probe has), and the HEALTHCHECK asks there.
    assert env["SCHED_API_PORT"] == "7000" and env["SCHED_HEALTH_ADDRESS"].endswith(":7001")
    assert env["SCHED_HEALTHCHECK_ADDRESS"] == "127.0.0.1:7001"


def test_the_build_context_keeps_what_the_build_copies() -> None:
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    copied = set()
    for i in dockerfile.instructions():
        if i.keyword == "COPY" and not i.args.startswith("--from"):
            copied.update(i.args.split()[:-1])
    assert copied == {"pyproject.toml", "README.md", "scheduler", "chaos"}
    assert not copied & ignored
    assert {".git", ".venv", ".cache", "tests"} <= ignored


def test_build_image_script_passes_shellcheck() -> None:
    run(tool("shellcheck"), str(ROOT / "scripts" / "build-image.sh"))


@pytest.mark.skipif(shutil.which("docker") is None, reason="needs the docker CLI (this kind of machine has it)")
def test_build_image_refuses_without_an_engine() -> None:
    if subprocess.run(["docker", "info"], capture_output=True, timeout=60, check=False).returncode == 0:
        pytest.skip("a Docker engine answers here: the build would run for real")
    r = subprocess.run([str(ROOT / "scripts" / "build-image.sh")], capture_output=True, text=True, timeout=60,
                       check=False)
    assert r.returncode == 2 and "needs one" in r.stderr, r
