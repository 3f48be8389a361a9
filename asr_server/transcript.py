"""A session's whole transcript from the messages it sent, as JSON, SRT or WebVTT. No I/O.

Per channel, each final is one segment (start, end, text, words); a revision
replaces, as the protocol says, everything from its ``offset`` to the end of
the finals: the segments after it go, one that it cuts keeps its part
before, and the revision's text is one segment. Channels are named by the call's ``channel_names`` when the session
has them (a phone call: caller, agent), else ``channel N``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

__all__ = ["build_transcript", "to_srt", "to_vtt"]


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
    offset, (first, last) = revision["offset"], revision["utterances"]
    kept, replaced = [], []
    for s in segments:
        if s["offset"] + len(s["text"]) < offset:
            kept.append(s)  # wholly before the revision (and its joining space)
        elif s["offset"] < offset:
            kept.append({**s, "text": s["text"][: offset - 1 - s["offset"]], "words": []})  # cut: its part before stays
            replaced.append(s)
        else:
            replaced.append(s)
    words = revision.get("words") or []
    start = words[0]["start"] if words else (replaced[0]["start"] if replaced else 0.0)
    end = words[-1]["end"] if words else (replaced[-1]["end"] if replaced else start)
    segments[:] = kept + [{"utterances": [first, last], "offset": offset, "start": start, "end": end, "text": revision["text"], "words": words}]


def _cues(transcript: dict[str, Any]) -> list[tuple[float, float, str, str]]:
    cues = [(s["start"], s["end"], c["speaker"], s["text"]) for c in transcript["channels"] for s in c["segments"]]
    return sorted(cues)


def _stamp(seconds: float, separator: str) -> str:
    ms = max(0, round(seconds * 1000))
    return f"{ms // 3_600_000:02d}:{ms // 60_000 % 60:02d}:{ms // 1000 % 60:02d}{separator}{ms % 1000:03d}"


def to_srt(transcript: dict[str, Any]) -> str:
    """SubRip: numbered cues, speakers in brackets when there are several channels."""
    several = len(transcript["channels"]) > 1
    blocks = [f"{i}\n{_stamp(start, ',')} --> {_stamp(end, ',')}\n{f'[{speaker}] ' if several else ''}{text}\n"
              for i, (start, end, speaker, text) in enumerate(_cues(transcript), 1)]
    return "\n".join(blocks)


def to_vtt(transcript: dict[str, Any]) -> str:
    """WebVTT, each cue voiced by its speaker (``<v caller>``)."""
    cues = [f"{_stamp(start, '.')} --> {_stamp(end, '.')}\n<v {speaker}>{text}\n" for start, end, speaker, text in _cues(transcript)]
    return "WEBVTT\n\n" + "\n".join(cues)
