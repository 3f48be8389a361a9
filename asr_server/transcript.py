"""A session's whole transcript from the messages it sent, as JSON, SRT or WebVTT. No I/O.

Per channel, each final is one segment (start, end, text, words); a revision
replaces, as the protocol says, everything from its ``offset`` to the end of
the finals: the segments after it go, one that it cuts keeps its part
before, and the revision's text becomes a segment per utterance again (its
``segments`` say where each starts in the text and when it is heard), so a
call's turns stay apart and in time order; the subtitle formats cut them into
cues a player can show (:mod:`asr_server.subtitles`). Channels are named by the call's ``channel_names`` when the session
has them (a phone call: caller, agent), else ``channel N``.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterable
from typing import Any

from .subtitles import CueOptions, cues

__all__ = ["TranscriptLog", "build_transcript", "to_srt", "to_vtt"]


class TranscriptLog:
    """The messages a session's transcript is built from, kept apart from the replay log.

    The replay log (:class:`asr_server.resume.ReplayLog`) holds every message, interims
    included, for a resume and for followers, and only its last ``max_replay_bytes``: about
    40 minutes of continuous speech (0.9 KB a second). The whole transcript (``GET
    /v1/sessions/{id}/transcript``, the webhook's at the end) needs only the session message
    and the finals, revisions, settled messages and ``closed``, about two thirds of the bytes
    (0.6 KB a second) and none of the interims. They are kept here up to ``max_bytes``: past
    it the oldest go (never the session message), and :attr:`truncated` says so."""

    KINDS = frozenset({"session", "final", "revision", "settled", "closed"})

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._session: str | None = None  # the session message (channel names): never dropped
        self._items: deque[str] = deque()
        self._bytes = 0
        self.truncated = False  # some of the session's transcript messages were dropped

    @property
    def bytes(self) -> int:
        return self._bytes

    def add(self, message: dict[str, Any], text: str) -> None:
        """``message`` was sent as ``text``: kept if a transcript is built from it."""
        kind = message["type"]
        if kind not in self.KINDS or (kind == "final" and not message["text"]):
            return
        self._bytes += len(text)
        if kind == "session" and self._session is None:
            self._session = text
            return
        self._items.append(text)
        while self._bytes > self.max_bytes and self._items:
            self._bytes -= len(self._items.popleft())
            self.truncated = True

    def texts(self) -> list[str]:
        """The messages kept, in the order they were sent."""
        return ([self._session] if self._session is not None else []) + list(self._items)

    def transcript(self) -> dict[str, Any]:
        """:func:`build_transcript` of what is kept, with ``truncated``."""
        return {**build_transcript(self.texts()), "truncated": self.truncated}


def build_transcript(texts: Iterable[str]) -> dict[str, Any]:
    """The transcript of a session's messages (JSON texts, in seq order)."""
    session_id, names, ended = "", [], False
    segments: dict[int, list[dict[str, Any]]] = {}
    settled: dict[int, int] = {}  # per channel, the latest settled message's offset
    for text in texts:
        message = json.loads(text)
        kind = message.get("type")
        session_id = message.get("session_id", session_id)
        if kind == "session":
            names = (message.get("call") or {}).get("channel_names", names)
        elif kind == "final" and message["text"]:
            segments.setdefault(message["channel"], []).append({
                "utterances": [message["utterance"], message["utterance"]], "offset": message["offset"], "start": message["start"],
                "end": message["end"], "text": message["text"], "words": message.get("words", []),
            })
        elif kind == "revision":
            _revise(segments.setdefault(message["channel"], []), message)
        elif kind == "settled":
            settled[message["channel"]] = message["offset"]
        elif kind == "closed":
            ended = True
    channels = []
    for channel in sorted(segments):
        speaker = names[channel] if channel < len(names) else f"channel {channel}"
        text = " ".join(s["text"] for s in segments[channel])
        # A log that no longer holds the first messages starts at its first segment's offset.
        fixed = len(text) if ended else min(len(text), max(0, settled.get(channel, 0) - segments[channel][0]["offset"]))
        channels.append({"channel": channel, "speaker": speaker, "segments": segments[channel], "text": text, "settled": fixed})
    return {"session_id": session_id, "complete": ended, "channels": channels}


def _revise(segments: list[dict[str, Any]], revision: dict[str, Any]) -> None:
    offset = revision["offset"]
    kept = []
    for s in segments:
        if s["offset"] + len(s["text"]) < offset:
            kept.append(s)  # wholly before the revision (and its joining space)
        elif s["offset"] < offset:
            kept.append({**s, "text": s["text"][: offset - 1 - s["offset"]], "words": []})  # cut: its part before stays
    segments[:] = kept + _revised_segments(revision)


def _revised_segments(revision: dict[str, Any]) -> list[dict[str, Any]]:
    """A segment per utterance of ``revision``: its text cut where the next one's starts (less the
    joining space), its words those that start from its start on (the words run in time order)."""
    offset, text, parts = revision["offset"], revision["text"], revision["segments"]
    ends = [p["offset"] - 1 for p in parts[1:]] + [offset + len(text)]
    out = [{"utterances": [p["utterance"], p["utterance"]], "offset": p["offset"], "start": p["start"], "end": p["end"],
            "text": text[p["offset"] - offset : end - offset], "words": []} for p, end in zip(parts, ends)]
    for word in revision.get("words") or []:
        k = next((k for k in range(len(parts) - 1, 0, -1) if word["start"] >= parts[k]["start"]), 0)
        out[k]["words"].append(word)
    return out


def _stamp(seconds: float, separator: str) -> str:
    ms = max(0, round(seconds * 1000))
    return f"{ms // 3_600_000:02d}:{ms // 60_000 % 60:02d}:{ms // 1000 % 60:02d}{separator}{ms % 1000:03d}"


def to_srt(transcript: dict[str, Any], options: CueOptions = CueOptions()) -> str:
    """SubRip: numbered cues (:func:`asr_server.subtitles.cues`), the speaker in brackets before
    each (counted in its first line) when there are several channels."""
    several = len(transcript["channels"]) > 1
    blocks = [f"{i}\n{_stamp(cue.start, ',')} --> {_stamp(cue.end, ',')}\n" + "\n".join(cue.lines) + "\n"
              for i, cue in enumerate(cues(transcript, options, labelled=several), 1)]
    return "\n".join(blocks)


def to_vtt(transcript: dict[str, Any], options: CueOptions = CueOptions()) -> str:
    """WebVTT, each cue voiced by its speaker (``<v caller>``) when there are several channels."""
    several = len(transcript["channels"]) > 1
    blocks = [f"{_stamp(cue.start, '.')} --> {_stamp(cue.end, '.')}\n{f'<v {_vtt_escaped(cue.speaker)}>' if several else ''}"
              + "\n".join(map(_vtt_escaped, cue.lines)) + "\n" for cue in cues(transcript, options)]
    return "WEBVTT\n\n" + "\n".join(blocks)


def _vtt_escaped(text: str) -> str:
    """Text as a WebVTT cue holds it: ``&``, ``<`` and ``>`` as character references (a cue's
    ``<`` starts a tag, ``&`` a reference; "AT&T" would not read as said)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
