from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing in the tests may fetch from a hub

import pytest

from asr_server.decoding.context import ContextOptions
from asr_server.inference.whisper import WhisperRunner, resolve_model
from asr_server.scheduler.governor import GovernorOptions, Level

from .harness import ServerThread


@pytest.fixture(scope="session")
def whisper_runner() -> WhisperRunner:
    runner = WhisperRunner(resolve_model("tiny.en"), compute_type="auto")
    runner.warm_up()
    return runner


@pytest.fixture(scope="session")
def _shared_server(whisper_runner):
    # Like every ServerThread by default, it may degrade interims under load but never
    # refuse streams (tests of refusals run their own servers).
    server = ServerThread(whisper_runner).start()
    yield server
    server.stop()


@pytest.fixture
def live_server(_shared_server):
    """One real server with the real model, shared by the end-to-end tests; each test finds it at load level 0."""
    _shared_server.run(_shared_server.server.reset_load)
    yield _shared_server


@pytest.fixture(scope="session")
def full_pass_server(whisper_runner):
    """A real server that never degrades and runs no settle decodes: for tests of what a context
    pass at load level 0 hears.

    A file sent faster than real time keeps a slow machine's finals waiting long enough to
    raise the shared server's level, and a lean pass (level 1) decodes without the audio
    before its utterances, the context those tests are about (degradation has tests of its own).
    A settle decode runs only where the server has time to spare when the stream closes, which
    on a busy machine is chance, and it decides for good: on a processor without AVX-512 the
    LibriVox reading's settle decode hears "old-sposed" again where the passes heard
    "ill-disposed" (the fresh-clone CI failed so once). Settle decodes have a server of their own
    (tests/e2e/test_revisions.py).
    """
    server = ServerThread(whisper_runner, governor=GovernorOptions(max_level=Level.NORMAL), context=ContextOptions(settle_window_s=0.0)).start()
    yield server
    server.stop()
