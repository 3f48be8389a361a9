"""The text side of the pipeline: model hypotheses in, interim and final results out.

This is *not* audio decoding (bytes to samples), which lives with the other
audio stages in :mod:`asr_server.audio.decode`. Here:

* :mod:`.incremental` - the per-channel incremental decoder (what to decode
  when, offsets, finals);
* :mod:`.stability` - LocalAgreement-2, which part of an interim is stable;
* :mod:`.text` - guards against hallucination, loops and runaway output.
* :mod:`.background` - finals that are other people's talk, well under the talker.
"""

from .incremental import ChannelDecoder

__all__ = ["ChannelDecoder"]
