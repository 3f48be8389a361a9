import numpy as np
import pytest

from asr_server.errors import InferenceFailed, InvalidAudio, InvalidMessage
from asr_server.events import SubmitJob
from asr_server.options import StreamOptions
from asr_server.session import Session

from .fakes import FakeRunner, SyncDriver, words_for_length
from .harness import MANIFEST, load_channels, load_mono, phone_line

SENTENCE = "the quick brown fox jumps over the lazy dog"


def driver(**options) -> SyncDriver:
    return SyncDriver(Session("test", StreamOptions(**options)), FakeRunner(words_for_length(SENTENCE)))


def speech() -> np.ndarray:
    return load_mono("espeak_16k.wav").reshape(1, -1)


def test_whole_stream_follows_the_protocol_rules():
    d = driver()
    d.feed(speech())
    d.apply(d.session.end_of_stream())
    d.run_jobs()
    seqs = [m["seq"] for m in d.messages]
    assert seqs == list(range(1, len(seqs) + 1))
    assert d.messages[0]["type"] == "session" and d.messages[-1]["type"] == "closed"
    assert d.close.code == 1000
    finals = d.of_type("final")
    assert len(finals) == len(MANIFEST["espeak_16k.wav"]["spans"][0])
    transcript = ""
    for m in d.messages:
        if m["type"] == "final" and m["text"]:
            assert m["offset"] == (len(transcript) + 1 if transcript else 0)
            transcript = (transcript + " " + m["text"]).strip()
        if m["type"] == "interim":
            assert m["offset"] == (len(transcript) + 1 if transcript else 0)
    for f in finals:  # an interim of the same utterance came first, and its speech_start before that
        assert any(i["utterance"] == f["utterance"] and i["seq"] < f["seq"] for i in d.of_type("interim"))
        (start,) = [s for s in d.of_type("speech_start") if s["utterance"] == f["utterance"]]
        assert start["seq"] < f["seq"] and start["at"] <= f["start"] + 0.5
    closed = d.messages[-1]
    assert closed["audio_received_s"] == pytest.approx(speech().shape[1] / 16000, abs=0.01)
    assert 0 < closed["audio_transcribed_s"] < closed["audio_received_s"]


def test_heartbeats_go_in_sequence_while_the_session_streams_or_finishes_and_not_after():
    d = driver(heartbeat_s=5.0)
    d.apply(d.session.heartbeat())
    d.feed(speech()[:, :16000])
    d.apply(d.session.heartbeat())
    beats = d.of_type("heartbeat")
    assert [b["audio_received_s"] for b in beats] == [0.0, 1.0]
    d.apply(d.session.finalize())  # a final decode owed: the session still streams
    d.apply(d.session.end_of_stream())
    assert d.session.draining
    d.apply(d.session.heartbeat())
    d.run_jobs()
    assert d.messages[-1]["type"] == "closed"
    d.apply(d.session.heartbeat())
    assert len(d.of_type("heartbeat")) == 3
    assert d.messages[-1]["type"] == "closed"
    assert [m["seq"] for m in d.messages] == list(range(1, len(d.messages) + 1))


def test_sentence_finals_arrive_at_endpoints_not_at_close():
    d = driver()
    d.feed(speech())
    assert len(d.of_type("final")) == len(MANIFEST["espeak_16k.wav"]["spans"][0])
    assert all(f["reason"] == "endpoint" for f in d.of_type("final"))


def test_silence_is_never_sent_to_the_model():
    d = driver()
    d.feed(np.zeros((1, 16000 * 5), np.float32))
    d.apply(d.session.end_of_stream())
    d.run_jobs()
    assert d.runner.requests == []
    assert [m["type"] for m in d.messages] == ["session", "closed"]


def test_a_quiet_talkers_decodes_carry_the_gain_that_brings_them_to_speaking_level():
    """Every decode of a channel (interims, finals, context passes) carries the talker's gain, from
    the level its VAD heard: a reader 30 dB quieter than recorded reaches the model at about the
    target level, and at the recording's own level (above the target) nothing is raised, beyond a
    fraction of a dB while the first syllables set the level (inference/level.py)."""
    from asr_server.inference.level import TARGET_DBFS
    from asr_server.inference.types import DecodeKind

    def speaking_level(audio: np.ndarray) -> float:  # the loud tenth of its 30 ms frames
        n = len(audio) // 480
        return 20 * np.log10(np.percentile(np.sqrt(np.mean(audio[: n * 480].reshape(n, 480) ** 2, axis=1)), 90))

    for turned in (0.0, -30.0):
        d = driver()
        d.feed((load_mono("librivox_16k.s16le") * 10 ** (turned / 20)).reshape(1, -1).astype(np.float32))
        d.apply(d.session.end_of_stream())
        d.run_jobs()
        requests = d.runner.requests
        assert {r.kind for r in requests} == set(DecodeKind)
        if not turned:
            assert all(r.gain_db < 1.0 for r in requests), sorted({round(r.gain_db, 1) for r in requests})
            continue
        heard = [speaking_level(r.audio) + r.gain_db for r in requests if r.duration >= 1.0]
        assert heard and all(abs(h - TARGET_DBFS) <= 4.0 for h in heard), sorted(round(h, 1) for h in heard)


def test_no_interims_when_disabled():
    d = driver(interim_results=False)
    d.feed(speech())
    assert not d.of_type("interim") and d.of_type("final")


def test_finalize_closes_the_current_utterance_now():
    d = driver()
    audio = speech()
    first_sentence_mid = int(1.2 * 16000)
    d.feed(audio[:, :first_sentence_mid])
    d.apply(d.session.finalize())
    d.run_jobs()
    (final,) = d.of_type("final")
    assert final["reason"] == "finalize"


def test_recoverable_error_keeps_the_session_open():
    d = driver()
    d.apply(d.session.fail(InvalidMessage("bad json")))
    assert d.close is None
    d.feed(speech()[:, : 16000 * 3])
    assert d.of_type("interim")


def test_fatal_client_error_flushes_finals_then_closes_with_its_code():
    d = driver()
    d.feed(speech()[:, : int(1.5 * 16000)])  # mid-sentence
    d.apply(d.session.fail(InvalidAudio("garbage")))
    d.run_jobs()
    types = [m["type"] for m in d.messages]
    assert types.index("error") < types.index("final")
    assert d.close.code == 1007 and "closed" not in types


def test_server_fault_closes_at_once():
    d = driver()
    d.feed(speech()[:, : int(1.5 * 16000)])
    d.apply(d.session.fail(InferenceFailed("boom")))
    assert d.close.code == 1011
    err = d.of_type("error")[0]
    assert err["retryable"] is True and err["code"] == "inference_failed"


def test_two_channels_are_transcribed_apart():
    d = SyncDriver(Session("t", StreamOptions(channels=2)), FakeRunner(words_for_length(SENTENCE)))
    mono = speech()
    stereo = np.vstack([mono, np.zeros_like(mono)])
    d.feed(stereo)
    assert {m["channel"] for m in d.of_type("final")} == {0}
    assert {m["channel"] for m in d.of_type("speech_start")} == {0}


def test_backpressure_when_finals_pile_up():
    from asr_server.options import Limits

    session = Session("t", StreamOptions(interim_results=False), Limits(max_pending_finals=2))
    session.start()
    audio = speech()
    pending = []
    for i in range(0, audio.shape[1], 1600):  # no decode ever finishes
        pending += session.receive_audio(audio[:, i : i + 1600])
        if session.backpressured:
            break
    assert session.backpressured
    # The shell stops reading here; once the model catches up, reading resumes.
    # Each job answered once, as the scheduler does, and the ones its answers submit (a final
    # waits for the channel's decode in flight: here the interim that looks for sentence
    # ends in a long utterance, withdrawn once the utterance ended, answered all the same).
    runner = FakeRunner(words_for_length(SENTENCE))
    jobs = [out.job for out in pending if isinstance(out, SubmitJob)]
    while jobs:
        job = jobs.pop(0)
        jobs += [out.job for out in session.job_done(job, runner.transcribe(job.request)) if isinstance(out, SubmitJob)]
    assert not session.backpressured


class FailingDriver(SyncDriver):
    """The scheduler gave up on some jobs: ``fails(job)`` says which (a fault-injecting model)."""

    def __init__(self, session, runner, fails) -> None:
        self.fails = fails
        super().__init__(session, runner)

    def run_jobs(self) -> None:
        while self._jobs:
            job = self._jobs.pop(0)
            if self.fails(job):
                self.apply(self.session.job_failed(job))
            else:
                self.apply(self.session.job_done(job, self.runner.transcribe(job.request)))


def test_a_final_the_model_cannot_decode_costs_one_utterance_not_the_session():
    from asr_server.inference.types import DecodeKind

    failing = lambda job: job.utterance == 1 and job.request.kind is DecodeKind.FINAL  # noqa: E731
    d = FailingDriver(Session("t", StreamOptions()), FakeRunner(words_for_length(SENTENCE)), failing)
    d.feed(speech())
    d.apply(d.session.end_of_stream())
    d.run_jobs()
    seqs = [m["seq"] for m in d.messages]
    assert seqs == list(range(1, len(seqs) + 1))
    (error,) = d.of_type("error")
    assert error["code"] == "decode_failed" and error["retryable"] is True
    assert (error["channel"], error["utterance"]) == (0, 1)
    finals = d.of_type("final")
    assert len(finals) == len(MANIFEST["espeak_16k.wav"]["spans"][0])  # every utterance still gets its final
    lost = next(f for f in finals if f["utterance"] == 1)
    assert lost["text"] == "" and error["seq"] < lost["seq"]
    assert all(f["text"] for f in finals if f["utterance"] != 1)
    transcript = ""
    for m in d.messages:  # offsets skip the empty final, as for any empty final, and follow revisions
        if m["type"] == "final" and m["text"]:
            assert m["offset"] == (len(transcript) + 1 if transcript else 0)
            transcript = (transcript + " " + m["text"]).strip()
        elif m["type"] == "revision":
            transcript = (transcript[: m["offset"] - 1] + " " + m["text"]) if m["offset"] else m["text"]
    # The context pass heard the lost utterance in its window (its first pass heard no words), so
    # the transcript at the close has its words after all.
    assert any(1 in m["changed"] for m in d.of_type("revision"))
    assert len(transcript) > len(" ".join(f["text"] for f in finals if f["text"]))
    assert d.messages[-1]["type"] == "closed" and d.close.code == 1000


def test_a_failed_interim_or_pause_decode_is_dropped_silently_and_the_next_decode_covers_it():
    from asr_server.inference.types import DecodeKind

    failed = []

    def failing(job):
        if job.request.kind is DecodeKind.INTERIM or job.speculative:
            if len(failed) < 3:
                failed.append(job)
                return True
        return False

    d = FailingDriver(Session("t", StreamOptions()), FakeRunner(words_for_length(SENTENCE)), failing)
    d.feed(speech())
    d.apply(d.session.end_of_stream())
    d.run_jobs()
    assert len(failed) == 3 and not d.of_type("error")
    assert d.of_type("interim") and all(f["text"] for f in d.of_type("final"))
    assert d.close.code == 1000


@pytest.mark.parametrize("rate", [8000, 16000])
def test_a_telephone_stream_finds_every_utterance_of_phone_band_speech(rate):
    """Five card names said by a man, as a phone line carries them (300-3400 Hz, 8 kHz mu-law).
    Silero's 16 kHz network hears such speech as barely speech-like: with the thresholds of
    wideband streams it misses some names outright. A stream that says it is 8 kHz (as every
    telephone source does) takes the narrowband thresholds and finds each name."""
    heard = np.stack(phone_line(list(load_channels("cards_44k.f32le")))[1])
    d = driver(encoding="mulaw", sample_rate=rate) if rate == 8000 else driver(sample_rate=rate)
    d.feed(heard)
    d.apply(d.session.end_of_stream())
    d.run_jobs()
    spans = MANIFEST["cards_44k.f32le"]["spans"][0]
    starts = [m["at"] for m in d.of_type("speech_start")]
    found = [s for s, e in spans if any(s - 0.1 <= at < e for at in starts)]
    if rate == 8000:
        assert found == [s for s, _ in spans] and len(starts) == len(spans)
    else:  # why telephone streams need their own thresholds
        assert len(found) < len(spans)


class ContainingDriver(SyncDriver):
    """A driver that keeps the faults the session contained (``failed``) instead of raising them."""

    def __init__(self, session, runner) -> None:
        self.failed: list = []
        super().__init__(session, runner)

    def apply(self, outputs) -> None:
        from asr_server.events import AnswerFailed

        outputs = list(outputs)
        self.failed += [o for o in outputs if isinstance(o, AnswerFailed)]
        super().apply([o for o in outputs if not isinstance(o, AnswerFailed)])


def _fault_in(monkeypatch, site: str, d: SyncDriver, from_s: float, times: int) -> None:
    """Make ``site`` (the VAD, the chunker, the decoder taking audio; the chunker answering a split or
    closing an utterance) raise ``times`` times, on its first calls once ``from_s`` of audio was received."""
    from asr_server.audio.chunker import Chunker
    from asr_server.audio.vad import VadGate
    from asr_server.decoding.incremental import ChannelDecoder

    sites = {"vad": (VadGate, "feed"), "chunker": (Chunker, "feed"), "decoder": (ChannelDecoder, "_heard_to_now"), "split": (Chunker, "split"), "finalize": (Chunker, "end")}
    owner, name = sites[site]
    original, left = getattr(owner, name), [times]

    def faulty(self, *args):
        if left[0] and d.session.received_samples >= from_s * 16000:
            left[0] -= 1
            d.fault_at = len(d.runner.requests)
            raise RuntimeError(f"a bug in the {site}")
        return original(self, *args)

    monkeypatch.setattr(owner, name, faulty)


@pytest.mark.parametrize("site", ["vad", "chunker", "decoder"])
def test_a_fault_in_taking_audio_drops_the_piece_and_ends_its_utterance_not_the_session(monkeypatch, site):
    from asr_server.inference.types import DecodeKind

    d = ContainingDriver(Session("t", StreamOptions()), FakeRunner(words_for_length(SENTENCE)))
    _fault_in(monkeypatch, site, d, 5.5, times=1)  # inside the second sentence (4.44-7.17 s)
    d.feed(speech())
    d.apply(d.session.end_of_stream())
    d.run_jobs()
    assert [(f.decode, f.utterance, str(f.error)) for f in d.failed] == [("audio", 1, f"a bug in the {site}")]
    seqs = [m["seq"] for m in d.messages]
    assert seqs == list(range(1, len(seqs) + 1))
    (error,) = d.of_type("error")
    assert (error["code"], error["retryable"], error["channel"], error["utterance"]) == ("audio_dropped", True, 0, 1)
    finals = d.of_type("final")
    cut = next(f for f in finals if f["utterance"] == 1)
    assert error["seq"] < cut["seq"] and cut["reason"] == "finalize" and cut["text"]
    # Its final decodes the audio up to the piece dropped (5.4-5.5 s), none of that piece.
    decoded = next(r for r in d.runner.requests[d.fault_at :] if r.kind is DecodeKind.FINAL)
    assert cut["start"] + len(decoded.audio) / 16000 == pytest.approx(5.4)
    # The channel listens afresh: the rest of the sentence and every later one get finals, numbered
    # on from the cut one, timed in the stream.
    assert [f["utterance"] for f in finals] == list(range(len(finals)))
    later = [f for f in finals if f["utterance"] > 1]
    assert len(later) >= 3 and all(f["text"] for f in later)
    assert later[0]["start"] >= 5.5 and later[-1]["end"] <= 19.8
    transcript = ""
    for m in d.messages:
        if m["type"] in ("final", "interim") and m["text"]:
            assert m["offset"] == (len(transcript) + 1 if transcript else 0)
        if m["type"] == "final" and m["text"]:
            transcript = (transcript + " " + m["text"]).strip()
        elif m["type"] == "revision":
            transcript = (transcript[: m["offset"] - 1] + " " + m["text"]) if m["offset"] else m["text"]
    assert d.messages[-1]["type"] == "closed" and d.close.code == 1000


def test_a_fault_that_comes_back_with_every_piece_of_audio_ends_the_session(monkeypatch):
    from asr_server.session import MAX_CHANNEL_RESTARTS

    d = ContainingDriver(Session("t", StreamOptions()), FakeRunner(words_for_length(SENTENCE)))
    _fault_in(monkeypatch, "chunker", d, 5.5, times=100)
    with pytest.raises(RuntimeError, match="a bug in the chunker"):
        d.feed(speech())
    assert len(d.failed) == MAX_CHANNEL_RESTARTS == len(d.of_type("error"))
    assert d.session.received_samples < 6.0 * 16000  # the pieces right after, not the rest of the stream


class SentenceRunner(FakeRunner):
    """Hears one sentence end 2.1 s into any long interim, and the next begin after a gap: the
    decoder asks the chunker for a split there."""

    def transcribe(self, request):
        from asr_server.inference.types import DecodeKind, Hypothesis, Word

        if request.kind is DecodeKind.INTERIM and request.word_timestamps and request.duration >= 3.0:
            self.requests.append(request)
            words = (Word(" The", 0.3, 0.5, 0.9), Word(" end.", 0.5, 2.1, 0.9), Word(" Next", 2.4, 2.8, 0.9), Word(" one", 2.8, 3.2, 0.9))
            return Hypothesis("The end. Next one", words)
        return super().transcribe(request)


def _contained_alike(d: ContainingDriver, utterance: int) -> None:
    """What a contained fault in taking audio leaves: its error before the cut utterance's final, and
    the rules of the stream kept."""
    assert [(f.decode, f.utterance) for f in d.failed] == [("audio", utterance)]
    (error,) = d.of_type("error")
    assert (error["code"], error["utterance"]) == ("audio_dropped", utterance)
    finals = d.of_type("final")
    cut = next(f for f in finals if f["utterance"] == utterance)
    assert cut["reason"] == "finalize" and cut["seq"] > error["seq"]
    assert [f["utterance"] for f in finals] == list(range(len(finals))) and finals[-1]["utterance"] > utterance
    seqs = [m["seq"] for m in d.messages]
    assert seqs == list(range(1, len(seqs) + 1)) and d.messages[-1]["type"] == "closed"


def test_a_fault_in_the_chunker_answering_a_split_is_contained_as_one_in_taking_audio(monkeypatch):
    d = ContainingDriver(Session("t", StreamOptions(split_after_s=3.0)), SentenceRunner(words_for_length(SENTENCE)))
    _fault_in(monkeypatch, "split", d, 0.0, times=1)
    d.feed(load_mono("librivox_16k.wav").reshape(1, -1))
    d.apply(d.session.end_of_stream())
    d.run_jobs()
    _contained_alike(d, 0)


def test_a_fault_in_the_chunker_at_a_finalize_is_contained_as_one_in_taking_audio(monkeypatch):
    d = ContainingDriver(Session("t", StreamOptions()), FakeRunner(words_for_length(SENTENCE)))
    audio = speech()
    d.feed(audio[:, : int(5.5 * 16000)])  # inside the second sentence (4.44-7.17 s)
    _fault_in(monkeypatch, "finalize", d, 0.0, times=1)
    d.apply(d.session.finalize())
    d.run_jobs()
    d.feed(audio[:, int(5.5 * 16000) :])
    d.apply(d.session.end_of_stream())
    d.run_jobs()
    _contained_alike(d, 1)
