"""End to end, real model: the context pass fixes what an utterance decoded alone gets wrong."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest

from ..harness import MANIFEST, replay
from ..wer import wer

pytestmark = pytest.mark.e2e

JS = Path(__file__).resolve().parents[2] / "clients" / "js"
NAME = "librivox_16k.s16le"  # "He was not an ill-disposed young man": alone, tiny.en mishears it


def _context_lags_counted(server) -> float:
    text = urllib.request.urlopen(server.http + "/metrics", timeout=10).read().decode()
    return float(next(line for line in text.splitlines() if line.startswith("asr_context_lag_seconds_count")).split()[-1])


def _revisions_counted(server) -> dict[str, float]:
    """``asr_revisions_total`` by the decode that sent them (``pass``)."""
    text = urllib.request.urlopen(server.http + "/metrics", timeout=10).read().decode()
    lines = [line for line in text.splitlines() if line.startswith("asr_revisions_total{")]
    return {kind: sum(float(line.split()[-1]) for line in lines if f'pass="{kind}"' in line) for kind in ("context", "settle")}


@pytest.mark.parametrize("server_fixture", ["full_pass_server", "settling_server"])
def test_a_context_revision_fixes_a_word_the_isolated_decode_got_wrong(server_fixture, request):
    """The passes' fix: alone (full_pass_server runs no settle decodes), and on a server with time
    to spare (settling_server), where the settle decode at the close hears the whole reading once
    more and decides it for good. On a processor without AVX-512 that decode hears "old-sposed"
    again, as surely as the passes heard theirs, so there the fix is judged before it
    (docs/benchmarks.md, forty-seventh session: a rule that held such a settle decode back was
    worse on held-out recordings)."""
    server = request.getfixturevalue(server_fixture)
    lags_before = _context_lags_counted(server)
    r = asyncio.run(replay(server.url, NAME))
    reference = " ".join(MANIFEST[NAME]["references"][0])
    first_pass = r.final_text()
    second = next(m.message["text"] for m in r.of_type("final") if m.message["utterance"] == 1)
    # Alone, tiny.en mishears "ill-disposed" ("old-sposed", "old supposed"): what the pass is for.
    assert "young man" in second.lower() and "ill-disposed" not in second.lower()
    # Both sentences with "ill-disposed" are misheard alone. Which of them the passes restore
    # depends on the CPU's int8 kernels (replayed: both with Intel's MKL; with AMD's oneDNN the
    # second, while the first stays as two decodes heard it against two): at least one.
    misheard = [m.message["utterance"] for m in r.of_type("final") if "posed" in m.message["text"] and "ill-disposed" not in m.message["text"]]
    assert 1 in misheard
    revisions = [m.message for m in r.of_type("revision")]
    assert any(m["utterances"][0] <= u <= m["utterances"][1] for m in revisions for u in misheard)
    assert any("ill-disposed" in m["text"] for m in revisions)
    closed = next(i for i, m in enumerate(r.messages) if m.message["type"] == "closed")
    assert all(r.messages.index(m) < closed for m in r.of_type("revision"))  # the refined text before closed
    passes = r.transcript(before_settle=True).final_text(0)
    sent = [(m["pass"], m["utterances"], m["text"]) for m in revisions]  # which decode sent what, if this fails
    assert passes.count("ill-disposed") > first_pass.count("ill-disposed"), sent
    assert wer(reference, passes) < wer(reference, first_pass), sent
    assert wer(reference, r.transcript().final_text(0)) <= wer(reference, first_pass), sent
    if server_fixture == "settling_server":  # a settle decode ran, at the close, over the whole reading
        assert r.of_type("settled")[-1].message["utterance"] == r.of_type("final")[-1].message["utterance"]
    # The pass that fixed it decided that final: operators see how far passes lag.
    shown = sum(1 for m in r.of_type("final") if m.message["text"])
    assert 1 <= _context_lags_counted(server) - lags_before <= shown


def test_a_fault_in_handling_passes_costs_the_revisions_only_and_operators_see_it(full_pass_server, monkeypatch, caplog):
    """A server bug in handling every pass's answer (here: raised once the revision is made):
    the stream gets every final, no revision, and its ``closed``, as if the passes had been
    skipped; operators get ``asr_answer_failures_total`` and the traceback in the log. Such a
    bug used to end the session with ``internal_error``."""
    from asr_server.decoding.incremental import ChannelDecoder

    revise = ChannelDecoder._revise

    def revise_then_fail(decoder, *args, **kwargs):
        revise(decoder, *args, **kwargs)
        raise RuntimeError("a fault in handling the answer")

    monkeypatch.setattr(ChannelDecoder, "_revise", revise_then_fail)
    before = _answer_failures_counted(full_pass_server)
    r = asyncio.run(replay(full_pass_server.url, NAME))
    assert r.messages[-1].message["type"] == "closed" and not r.of_type("error") and not r.of_type("revision")
    finals = [m.message["text"] for m in r.of_type("final") if m.message["text"]]
    assert len(finals) >= 2 and r.final_text() == r.transcript().final_text(0) == " ".join(finals)
    assert _answer_failures_counted(full_pass_server) > before
    logged = [rec for rec in caplog.records if "event=answer_failed" in rec.getMessage()]
    assert logged and logged[0].exc_info is not None and str(logged[0].exc_info[1]) == "a fault in handling the answer"
    assert len(logged) >= 2 and all(rec.exc_info is None for rec in logged[1:])  # the traceback once a session, not every pass


def _answer_failures_counted(server) -> float:
    text = urllib.request.urlopen(server.http + "/metrics", timeout=10).read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith('asr_answer_failures_total{decode="context"}'))


def test_revisions_false_never_sends_one(live_server):
    r = asyncio.run(replay(live_server.url, NAME, revisions="false"))
    assert not r.of_type("revision") and r.messages[-1].message["type"] == "closed"
    assert r.messages[0].message["config"]["revisions"] is False


def test_python_and_js_transcripts_agree_after_every_message(live_server, tmp_path):
    """Both clients apply the same messages (revisions included) to the same text, and the same
    turns (utterances with their times), message by message."""
    node = shutil.which("node")
    assert node, "node (>= 20) is needed"
    r = asyncio.run(replay(live_server.url, NAME, realtime=True))  # interims live while revisions come
    messages = [m.message for m in r.messages]
    assert any(m["type"] == "revision" for m in messages)
    from asr_client import Transcript

    python, after = Transcript(), []
    for m in messages:
        python.apply(m)
        turns = [[t.channel, t.utterance, t.start, t.end, t.text] for t in python.turns()]
        after.append([python.text(0), python.final_text(0), python.settled_text(0), turns])
    path = tmp_path / "messages.json"
    path.write_text(json.dumps(messages))
    script = (
        "import { Transcript } from './src/transcript.js';"
        "import { readFileSync } from 'node:fs';"
        "const t = new Transcript(); const out = [];"
        f"for (const m of JSON.parse(readFileSync({json.dumps(str(path))}, 'utf8'))) {{"
        "  t.apply(m); const turns = t.turns().map((x) => [x.channel, x.utterance, x.start, x.end, x.text]);"
        "  out.push([t.text(0), t.finalText(0), t.settledText(0), turns]); }"
        "console.log(JSON.stringify(out));"
    )
    done = subprocess.run([node, "--input-type=module", "-e", script], cwd=JS, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == after


@pytest.fixture(scope="module")
def settling_server(whisper_runner):
    """A real server whose settle decodes always find time to spare, however busy the machine that
    runs the tests (they run only at level 0 and under the busy band), never degrading, and whose
    close waits for them up to a minute (10 s by default: on a busy machine the last passes of a
    fast upload can use it all, and the settle decode at the close then never runs)."""
    from asr_server.decoding.context import ContextOptions
    from asr_server.options import Limits
    from asr_server.scheduler.governor import GovernorOptions, Level

    from ..harness import ServerThread

    server = ServerThread(whisper_runner, Limits(context_close_s=60.0), governor=GovernorOptions(max_level=Level.NORMAL, spare_busy_low=2.0, spare_busy_high=2.0),
                          context=ContextOptions(settle_window_s=30.0)).start()
    yield server
    server.stop()


def test_with_settle_decodes_a_long_reading_is_refined_and_closed_with_the_rule_kept(settling_server):
    """70 s of reading: settle decodes run while it streams (each 30 s stretch once the passes
    decided it and the next sentence would not fit) and at the close, on the real model with
    their 128-token prompts. Revisions keep the rule (the client's transcript, built message by
    message, is the server's), come before ``closed``, and leave the transcript closer to the
    reference than the first pass."""
    name = "ljspeech_babylon_16k.s16le"
    counted = _revisions_counted(settling_server)
    r = asyncio.run(replay(settling_server.url, name))
    assert r.messages[-1].message["type"] == "closed"
    # Each revision names the decode that sent it, as the server's metric counts them.
    sent = {kind: sum(1 for m in r.of_type("revision") if m.message["pass"] == kind) for kind in ("context", "settle")}
    assert sum(sent.values()) == len(r.of_type("revision"))
    assert {k: v - counted[k] for k, v in _revisions_counted(settling_server).items()} == sent
    # Gap-free, on one connection: the server holds back reading this fast upload, and the client's
    # keepalive used to give up then (its pong queued behind its audio) and resume.
    assert not r.of_type("reconnecting")
    seqs = [m.message["seq"] for m in r.messages]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    assert r.of_type("revision")
    reference = " ".join(MANIFEST[name]["references"][0])
    refined = r.transcript().final_text(0)
    assert wer(reference, refined) < wer(reference, r.final_text())
    # Each settled stretch is final for good: its text never changes after its settled message.
    # (How much is settled by ``closed`` depends on the close's time bound on a busy machine.)
    from asr_client import Transcript

    client, settled = Transcript(), ""
    assert r.of_type("settled")
    for m in r.messages:
        client.apply(m.message)
        assert client.final_text(0).startswith(settled)
        settled = client.settled_text(0)
    assert settled and refined.startswith(settled)
