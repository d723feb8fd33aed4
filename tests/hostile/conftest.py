"""What the hostile corpus's files share: one scripted streaming server per module (each case sets
its own script), so `day0 latency --url` cases meet a real HTTP stream without a vLLM engine."""

import pytest

from tests.support.sse_server import SSEServer


@pytest.fixture(scope="module")
def server():
    with SSEServer() as srv:
        yield srv
