// AudioWorklet processor for the WebSocket transport: microphone samples (at the
// AudioContext's rate, 16 kHz when the browser honours it) to little-endian s16,
// posted to the main thread in blocks of about 100 ms.
class PcmSender extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const ms = options?.processorOptions?.blockMs ?? 100;
    this.block = new Int16Array(Math.max(128, Math.round((sampleRate * ms) / 1000)));
    this.filled = 0;
    this.running = true;
    this.port.onmessage = (e) => {
      if (e.data === "flush") {
        this.flush();
        this.port.postMessage({ type: "flushed" });
      } else if (e.data === "stop") {
        this.flush();
        this.running = false;
      }
    };
  }

  flush() {
    if (this.filled === 0) return;
    const out = this.block.slice(0, this.filled);
    this.port.postMessage({ type: "pcm", buffer: out.buffer }, [out.buffer]);
    this.filled = 0;
  }

  process(inputs) {
    const input = inputs[0];
    if (!this.running) return false;
    if (!input || input.length === 0) return true;
    const channels = input.length;
    const n = input[0].length;
    for (let i = 0; i < n; i++) {
      let s = 0;
      for (let c = 0; c < channels; c++) s += input[c][i];
      s /= channels;
      this.block[this.filled++] = s >= 1 ? 32767 : s <= -1 ? -32768 : Math.round(s * 32767);
      if (this.filled === this.block.length) this.flush();
    }
    return true;
  }
}

registerProcessor("asr-pcm-sender", PcmSender);
