"""Fixtures the real-server test modules share: each module starts its own `server` (its flags), and these read it."""

from __future__ import annotations

import pytest
from serve_process import Reference, openai_client


@pytest.fixture(scope="module")
def reference():
    """What `generate` answers, for comparing a server's text (`serve_process.Reference`)."""
    return Reference()


@pytest.fixture(scope="module")
def client(server):
    """The official `openai` client on the module's `server`."""
    return openai_client(server)
