from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing in the tests may fetch from a hub

import pytest

from asr_server.inference.whisper import WhisperRunner, resolve_model

from .harness import ServerThread


@pytest.fixture(scope="session")
def whisper_runner() -> WhisperRunner:
    runner = WhisperRunner(resolve_model("tiny.en"), compute_type="auto")
    runner.warm_up()
    return runner


@pytest.fixture(scope="session")
def live_server(whisper_runner):
    """One real server with the real model, shared by the end-to-end tests."""
    server = ServerThread(whisper_runner).start()
    yield server
    server.stop()
