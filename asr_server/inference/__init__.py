"""The model seam: the only package that imports faster-whisper."""
