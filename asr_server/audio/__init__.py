"""Audio stages, in data-flow order: decode (bytes to 16 kHz float), vad, chunker."""
