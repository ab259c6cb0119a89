"""Fixtures: clients of the real server started by scripts/sdk-python.sh (serve-throwaway.sh).

Live tests need SANDLANE_TEST_SERVER_URL and the three keys; without them they fail (the
test command never skips), naming the script that sets them.
"""

from __future__ import annotations

import os
import uuid
from typing import Callable, Iterator

import pytest

from sandlane import Sandbox, Sandlane

ORG = "acme"


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set: run these tests with scripts/sdk-python.sh (it starts a server)")
    return value


@pytest.fixture(scope="session")
def server_url() -> str:
    return _env("SANDLANE_TEST_SERVER_URL")


@pytest.fixture(scope="session")
def user_key() -> str:
    return _env("SANDLANE_TEST_USER_KEY")


@pytest.fixture(scope="session")
def user2_key() -> str:
    return _env("SANDLANE_TEST_USER2_KEY")


@pytest.fixture(scope="session")
def service_key() -> str:
    return _env("SANDLANE_TEST_SERVICE_KEY")


@pytest.fixture()
def client(server_url: str, user_key: str) -> Iterator[Sandlane]:
    with Sandlane(server_url, user_key, org=ORG) as c:
        yield c


@pytest.fixture()
def service(server_url: str, service_key: str) -> Iterator[Sandlane]:
    with Sandlane(server_url, service_key, org=ORG) as c:
        yield c


@pytest.fixture()
def other_user(server_url: str, user2_key: str) -> Iterator[Sandlane]:
    with Sandlane(server_url, user2_key, org=ORG) as c:
        yield c


def unique(prefix: str) -> str:
    """A key no other test (or earlier run) uses."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def shared_sandbox(server_url: str, user_key: str) -> Iterator[Sandbox]:
    """One session sandbox of user-ada for the tests that only need somewhere to run."""
    with Sandlane(server_url, user_key, org=ORG) as c:
        session = unique("py-shared")
        sbx = c.ensure_session(session, execution_id="exec-1").require_sandbox()
        yield sbx
        c.deprovision_session(session)


@pytest.fixture()
def sbx(client: Sandlane, shared_sandbox: Sandbox) -> Sandbox:
    """The shared sandbox, through this test's client."""
    return client.sandbox(shared_sandbox.id)


@pytest.fixture(scope="session")
def org_set() -> "Callable[..., None]":
    """Runs ``sandlane org set acme ARGS…`` against the throwaway server's data dir."""
    import subprocess

    binary = _env("SANDLANE_TEST_BIN")
    data_dir = os.path.join(_env("SANDLANE_TEST_SERVER_DIR"), "data")

    def run(*args: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SANDLANE_")}
        env["SANDLANE_DATA_DIR"] = data_dir
        subprocess.run([binary, "org", "set", ORG, *args], env=env, check=True, capture_output=True, timeout=30)

    return run
