// Browser client for asr-server: microphone in, live transcript out.
//
//   import { AsrClient } from "./client.js";
//   const client = new AsrClient({ transport: "webrtc" });
//   client.addEventListener("transcript", () => render(client.transcript.view()));
//   await client.start();   // asks for the microphone, connects, streams
//   ...
//   await client.stop();    // last finals arrive, then everything is released
//
// Two transports carry the audio; results always come back on the WebSocket:
// * "webrtc": the microphone as an Opus track over a peer connection whose
//   offer/answer travel on the session's WebSocket (docs/protocol.md, "WebRTC");
// * "websocket": 16 kHz s16 PCM from an AudioWorklet, in binary frames. Works
//   wherever WebRTC does not.
// "auto" picks webrtc when the browser has RTCPeerConnection.
import { Transcript } from "./transcript.js";

export const TRANSPORTS = ["webrtc", "websocket"];

/** Resumes in a row that got no audio further before the client gives up. */
const MAX_FRUITLESS_RESUMES = 5;

/** Seconds without any message after which a connection is taken as dead: two heartbeats
 * missed, and a margin for a server (or a network) that is slow but alive. */
function quietLimitS(heartbeatS) {
  return 2 * heartbeatS + 5;
}

/** Server errors after which the session goes on (docs/protocol.md, "Errors": no close code). */
export const NON_FATAL_CODES = new Set(["invalid_message", "unknown_message_type", "decode_failed", "audio_dropped"]);

/** Client-side error codes, next to the server's (docs/protocol.md, "Errors"). */
export const CLIENT_ERRORS = {
  microphone_denied: "the microphone permission was refused",
  microphone_unavailable: "no microphone could be opened",
  connect_failed: "could not reach the server",
  connection_lost: "the connection to the server was lost",
  webrtc_unavailable: "this browser cannot use WebRTC",
  timeout: "the server did not answer in time",
};

export class AsrError extends Error {
  /**
   * @param {string} code stable code: a server one, or a key of CLIENT_ERRORS
   * @param {string} message for people
   * @param {{retryable?: boolean, retryAfter?: number|null, fromServer?: boolean}} [info]
   */
  constructor(code, message, info = {}) {
    super(message);
    this.name = "AsrError";
    this.code = code;
    this.retryable = info.retryable ?? false;
    this.retryAfter = info.retryAfter ?? null;
    this.fromServer = info.fromServer ?? false;
  }

  static fromMessage(m) {
    return new AsrError(m.code, m.message, { retryable: m.retryable, retryAfter: m.retry_after ?? null, fromServer: true });
  }
}

/**
 * The server's ws(s) address when none is given: the asr-server this module was imported from
 * (`<server>/client/client.js`: its own page, a page of another origin, or a server behind a
 * proxy path such as `https://host/asr/`), else the page's own host. A copy of this module kept
 * in a site (or bundled) should be given `url`.
 */
export function defaultServerUrl(loc = globalThis.location, moduleUrl = import.meta.url) {
  let base = null;
  try {
    const module = new URL(moduleUrl);
    if (/^https?:$/.test(module.protocol) && module.pathname.endsWith("/client/client.js")) base = new URL("..", module);
  } catch { /* not a URL: a bundler's or a test's module */ }
  if (!base && !loc) return "ws://127.0.0.1:8765";
  const path = base ? base.pathname.replace(/\/$/, "") : "";
  const { protocol, host } = base ?? loc;
  return `${protocol === "https:" ? "wss:" : "ws:"}//${host}${path}`;
}

/**
 * A server address as the client uses it: `http(s)://` (the address the server prints for its page)
 * as `ws(s)://`, without a trailing slash (which made `//v1/listen`, a 404).
 */
export function serverUrl(url) {
  return url.trim().replace(/^http(s?):\/\//i, (_, secure) => (secure ? "wss://" : "ws://")).replace(/\/+$/, "");
}

const MIC_CONSTRAINTS = { echoCancellation: false, noiseSuppression: false, autoGainControl: false, channelCount: 1 };

/**
 * States: idle -> connecting -> streaming -> stopping -> closed, or -> failed
 * from any of them. Events (all CustomEvent, payload in `detail`):
 * `state` {state}, `message` (each server message), `transcript` {channel},
 * `error` (an AsrError), `load` (the server's load message), `revision` (the
 * server's second pass changed finals; already applied to `transcript`),
 * `settled` (the finals up to its `offset` will not change again; also in
 * `transcript.settledText`),
 * `latency` {kind, seconds}: how far behind live an interim or final arrived,
 * `reconnecting` {attempt}: the connection dropped and the client is taking the
 * session up again, `resumed` (the server's resumed message): it did, with
 * every message it had missed and nothing twice (docs/protocol.md, "Resuming").
 */
export class AsrClient extends EventTarget {
  /**
   * @param {object} [config]
   * @param {string} [config.url] ws(s)://host:port of the server (or http(s)://), with a proxy's path if any (default:
   *   the server the module was imported from, else the page's own; see defaultServerUrl)
   * @param {"auto"|"webrtc"|"websocket"} [config.transport]
   * @param {Record<string, string|number|boolean>} [config.options] query options (interim_ms, endpoint_ms, ...)
   * @param {MediaTrackConstraints} [config.audio] extra microphone constraints (deviceId, ...)
   * @param {number} [config.connectTimeoutMs] session, answer and ICE, each
   * @param {number} [config.stopTimeoutMs] how long stop() waits for the last finals
   * @param {string|(() => Promise<string>)} [config.token] for servers with API keys: a token from the
   *   server's POST /v1/tokens (minted by a backend that holds a key), or a function that fetches a
   *   fresh one (a token is good for one stream, so a function is what a client that restarts or
   *   resumes needs)
   * @param {boolean} [config.resume] reconnect and resume the session when the connection drops (default true)
   * @param {number} [config.resumeBufferBytes] audio kept to send again after a resume (websocket transport)
   * @param {number} [config.heartbeatS] ask the server for a heartbeat message after this many seconds
   *   without one (its heartbeat_s option; 0: none); a connection that brings nothing for
   *   2 * heartbeatS + 5 s is taken as dropped (default 5: noticed within 15 s)
   */
  constructor(config = {}) {
    super();
    this.url = serverUrl(config.url ?? defaultServerUrl());
    this.transportChoice = config.transport ?? "auto";
    this.options = config.options ?? {};
    this.audioConstraints = config.audio ?? {};
    this.connectTimeoutMs = config.connectTimeoutMs ?? 15000;
    this.stopTimeoutMs = config.stopTimeoutMs ?? 30000;
    this.token = config.token ?? null;
    this._token = null;
    this.resume = config.resume ?? true;
    this.resumeBufferBytes = config.resumeBufferBytes ?? 8 << 20;
    this.heartbeatS = config.heartbeatS ?? 5;
    this._heardAt = 0; // performance.now() of the last message
    this._watchTimer = null;
    this._abandoned = null; // a connection given up as dead, to close once the session is resumed
    this.reconnects = 0;
    this._lastSeq = 0;
    this._online = false; // false while a dropped connection is being resumed: sends only go to the buffer
    this._resuming = false;
    this._stuck = 0; // resumes in a row at the same audio position
    this._resumedAt = -1;
    this._sent = []; // for a resume: {kind: "audio", pos, buf} and {kind: "text", index, text, resend}
    this._sentBytes = 0;
    this._audioBytes = 0;
    this._texts = 0;
    this.transcript = new Transcript();
    this.transport = null;
    this.session = null;
    this.state = "idle";
    this.lastError = null;
    this._ws = null;
    this._pc = null;
    this._stream = null;
    this._ownStream = false;
    this._audioContext = null;
    this._source = null;
    this._worklet = null;
    this._audioStartedAt = null;
    this._closedMessage = null;
    this._stopped = null; // stop() waiting for the end
    this._waiters = new Set();
  }

  /** The audio being streamed (a `MediaStream`: the microphone, or the one given to `start`), or null
   * before `start` has it; e.g. for a level meter. */
  get microphone() {
    return this._stream;
  }

  /** Open the microphone (unless `stream` is given), connect and start streaming. */
  async start(stream = null) {
    if (this.state !== "idle") throw new Error(`start() in state ${this.state}; make a new AsrClient`);
    this._setState("connecting");
    try {
      this.transport = this._pickTransport();
      this._stream = stream ?? (await this._openMicrophone());
      this._ownStream = !stream;
      if (this.transport === "websocket") await this._startAudioContext();
      this._token = typeof this.token === "function" ? await this._fetchToken() : this.token;
      await this._openSocket(this._query());
      this._online = true;
      this.session = await this._next((m) => m.type === "session", "the server did not start a session");
      this._watchQuiet();
      if (this.transport === "webrtc") await this._negotiate();
      else this._pipePcm();
      this._setState("streaming");
    } catch (err) {
      this._fail(err instanceof AsrError ? err : new AsrError("connect_failed", String(err?.message ?? err), { retryable: true }));
      throw this.lastError;
    }
  }

  /**
   * This session's whole transcript from the server (`GET /v1/sessions/{id}/transcript`), revisions
   * applied: `"json"` (parsed), or subtitles as text, `"srt"` or `"vtt"` (`lineChars`, `lines` for
   * the cues). Read with the session's own resume token, whatever the stream was let in with; the
   * server keeps an ended session for `--ended-session-ttl` (300 s by default). Throws an `AsrError`:
   * `session_not_found` (no longer held), another server code, or `connect_failed`.
   */
  async fetchTranscript(format = "json", { lineChars, lines } = {}) {
    if (!this.session) throw new AsrError("session_not_found", "no session has started yet");
    const query = new URLSearchParams({ format });
    if (lineChars) query.set("line_chars", String(lineChars));
    if (lines) query.set("lines", String(lines));
    const headers = this.session.resume_token ? { "Asr-Resume-Token": this.session.resume_token } : {};
    const url = `${this.url.replace(/^ws/, "http")}/v1/sessions/${encodeURIComponent(this.session.session_id)}/transcript?${query}`;
    let answer;
    try {
      answer = await fetch(url, { headers });
    } catch (err) {
      throw new AsrError("connect_failed", `could not fetch the transcript: ${err.message}`, { retryable: true });
    }
    if (!answer.ok) {
      const body = await answer.json().catch(() => ({}));
      throw new AsrError(body.code ?? "connect_failed", body.message ?? `the server answered ${answer.status}`, { fromServer: Boolean(body.code) });
    }
    return format === "json" ? answer.json() : answer.text();
  }

  /** Close the current utterance now: its final comes at once. */
  finalize() {
    this._send({ type: "finalize" });
  }

  /** Stop sending audio; resolves once the last finals have arrived and everything is released. */
  async stop() {
    if (this.state !== "streaming") {
      if (this.state === "connecting") this.abort();
      return;
    }
    this._setState("stopping");
    this._releaseMicrophone();
    if (this._worklet) {
      await new Promise((resolve) => {
        const timer = setTimeout(resolve, 500);
        this._worklet.port.onmessage = (e) => {
          if (e.data?.type === "pcm") this._sendBinary(e.data.buffer);
          else if (e.data?.type === "flushed") {
            clearTimeout(timer);
            resolve();
          }
        };
        this._worklet.port.postMessage("flush");
      });
    }
    this._send({ type: "close" });
    // The end: the server's close after `closed` (on a resumed connection, if this one drops
    // meanwhile), or a failure.
    const ended = new Promise((resolve) => (this._stopped = resolve));
    const finished = await Promise.race([ended, delay(this.stopTimeoutMs).then(() => false)]);
    this._stopped = null;
    if (finished === false) this._ws?.close(1000, "client gave up waiting");
    this._release();
    if (this.state === "stopping") this._setState("closed");
  }

  /** Drop everything at once (what was received stays in `transcript`). */
  abort() {
    this._release();
    if (this.state !== "failed") this._setState("closed");
  }

  // -- set-up -----------------------------------------------------------------------

  _pickTransport() {
    const choice = this.transportChoice === "auto" ? (typeof RTCPeerConnection === "function" ? "webrtc" : "websocket") : this.transportChoice;
    if (!TRANSPORTS.includes(choice)) throw new AsrError("connect_failed", `unknown transport ${choice}`);
    if (choice === "webrtc" && typeof RTCPeerConnection !== "function") {
      throw new AsrError("webrtc_unavailable", CLIENT_ERRORS.webrtc_unavailable + "; choose the WebSocket transport");
    }
    return choice;
  }

  async _openMicrophone() {
    if (!navigator.mediaDevices?.getUserMedia) {
      throw new AsrError("microphone_unavailable", "the microphone needs a secure page: open it over https, or on localhost");
    }
    try {
      return await navigator.mediaDevices.getUserMedia({ audio: { ...MIC_CONSTRAINTS, ...this.audioConstraints } });
    } catch (err) {
      if (err?.name === "NotAllowedError" || err?.name === "SecurityError") {
        throw new AsrError("microphone_denied", "microphone access was refused; allow it in the browser's site settings and try again");
      }
      throw new AsrError("microphone_unavailable", `no microphone could be opened (${err?.name ?? err})`);
    }
  }

  async _startAudioContext() {
    // 16 kHz is what the model wants, and the browser resamples well. Firefox cannot
    // connect a microphone to a context at another rate than the device's: there the
    // context runs at its own rate, which goes in the query, and the server resamples.
    for (const rate of [16000, undefined]) {
      const ctx = new AudioContext(rate ? { sampleRate: rate } : {});
      try {
        this._source = ctx.createMediaStreamSource(this._stream);
      } catch (err) {
        await ctx.close().catch(() => {});
        if (rate === undefined) throw new AsrError("microphone_unavailable", `the microphone could not be read (${err?.name ?? err})`);
        continue;
      }
      try {
        await ctx.audioWorklet.addModule(new URL("./pcm-worklet.js", import.meta.url));
      } catch (err) {
        this._source = null;
        await ctx.close().catch(() => {});
        throw new AsrError("connect_failed", `could not load the audio worklet from the server (${err?.name ?? err})`, { retryable: true });
      }
      await ctx.resume();
      this._audioContext = ctx;
      return;
    }
  }

  async _fetchToken() {
    try {
      return await this.token();
    } catch (err) {
      throw new AsrError("unauthorized", `no token for the server (${err?.message ?? err})`, { retryable: true });
    }
  }

  _query() {
    const q = new URLSearchParams();
    if (this._token) q.set("token", this._token);
    if (this.transport === "webrtc") q.set("encoding", "webrtc");
    else {
      q.set("encoding", "pcm_s16le");
      q.set("sample_rate", String(Math.round(this._audioContext.sampleRate)));
    }
    if (this.heartbeatS > 0) q.set("heartbeat_s", String(this.heartbeatS));
    for (const [k, v] of Object.entries(this.options)) if (v !== undefined && v !== null && v !== "") q.set(k, String(v));
    return q.toString();
  }

  _resumeQuery() {
    const q = new URLSearchParams();
    if (this._token) q.set("token", this._token);
    q.set("resume", this.session.resume_token);
    q.set("last_seq", String(this._lastSeq));
    return q.toString();
  }

  _openSocket(query) {
    return new Promise((resolve, reject) => {
      let ws;
      try {
        ws = new WebSocket(`${this.url}/v1/listen?${query}`);
      } catch (err) {
        reject(new AsrError("connect_failed", `bad server address ${this.url}: ${err.message}`));
        return;
      }
      ws.binaryType = "arraybuffer";
      this._ws = ws;
      const timer = setTimeout(() => reject(new AsrError("timeout", "the server did not accept the connection in time", { retryable: true })), this.connectTimeoutMs);
      let opened = false;
      ws.onclose = (e) => {
        clearTimeout(timer);
        // Never opened (unreachable, or the handshake refused: browsers hide its status): a connection
        // that failed, not one that was lost, which _onSocketClosed would have made of it first.
        if (!opened) reject(new AsrError("connect_failed", `could not connect to ${this.url}`, { retryable: true }));
        else this._onSocketClosed(e, ws);
      };
      ws.onopen = () => {
        opened = true;
        clearTimeout(timer);
        resolve();
      };
      ws.onmessage = (e) => this._onMessage(e.data);
    });
  }

  // -- resuming ---------------------------------------------------------------------

  _mayResume() {
    return this.resume && this._stuck < MAX_FRUITLESS_RESUMES && this._live() && Boolean(this.session?.resume_token) && !this._closedMessage && !this.lastError?.fromServer;
  }

  /** Streaming, or stopping: after stop()'s close the last finals and revisions are still to come. */
  _live() {
    return this.state === "streaming" || this.state === "stopping";
  }

  /** The connection dropped: reconnect with backoff and take the session up again, until the server's resume_ttl_s. */
  async _resume() {
    this._resuming = true;
    this._online = false;
    const deadline = performance.now() + (this.session.limits?.resume_ttl_s ?? 30) * 1000;
    let wait = 50;
    try {
      for (let attempt = 1; this._live() && performance.now() < deadline; attempt++) {
        this._emit("reconnecting", { attempt });
        try {
          if (typeof this.token === "function") this._token = await this._fetchToken();
          await this._openSocket(this._resumeQuery());
          const resumed = await this._next((m) => m.type === "resumed" || m.type === "closed", "the server did not resume the session");
          this._abandoned?.close(1000);
          this._abandoned = null;
          if (resumed.type === "closed") return; // it finished while we were away: what we missed came, then the close
          this._resend(resumed);
          if (this.state === "streaming" && this.transport === "webrtc" && this._pc?.connectionState !== "connected") await this._renegotiate();
          this.reconnects += 1;
          this._emit("resumed", resumed);
          return;
        } catch (err) {
          if (err instanceof AsrError && err.fromServer && !err.retryable) {
            this._fail(err); // resume_failed: the session is gone
            return;
          }
        }
        await delay(Math.min(wait, Math.max(0, deadline - performance.now())));
        wait = Math.min(2000, wait * 2);
      }
      if (this._live()) this._fail(new AsrError("connection_lost", `${CLIENT_ERRORS.connection_lost}; it could not be resumed`, { retryable: true }));
    } finally {
      this._resuming = false;
    }
  }

  /** With the server's heartbeats (config.heartbeat_s), check that something keeps arriving. */
  _watchQuiet() {
    const beat = Number(this.session?.config?.heartbeat_s) || 0;
    if (beat <= 0 || this._watchTimer !== null) return;
    this._heardAt = performance.now();
    this._watchTimer = setInterval(() => this._checkQuiet(quietLimitS(beat)), Math.min(1000, beat * 500));
  }

  /** A connection that brought nothing for `limitS` while streaming (or stopping) is dead, though
   * still open: a network gone without a word (a laptop lid, a changed Wi-Fi, a NAT that forgot it). */
  _checkQuiet(limitS) {
    if (!this._live() || !this._online || this._resuming) return;
    if (performance.now() - this._heardAt < limitS * 1000) return;
    const ws = this._ws;
    const lost = new AsrError("connection_lost", `${CLIENT_ERRORS.connection_lost} (nothing from the server for ${limitS} s)`, { retryable: true });
    if (!this._mayResume()) {
      this._fail(lost);
      return;
    }
    // Left open, not closed: a close frame would end the session if the server can still hear
    // us. The resume takes the session over, and the server drops this connection then; we
    // close it once resumed.
    if (ws) ws.onmessage = ws.onclose = null;
    this._abandoned = ws;
    for (const waiter of [...this._waiters]) waiter(lost);
    this._resume();
  }

  /** Send again what the server had not read: audio after audio_received_bytes, commands after commands_received. */
  _resend(resumed) {
    const received = resumed.audio_received_bytes;
    // Resumes in a row that bring no audio further: something cuts the connection each time.
    this._stuck = received === this._resumedAt ? this._stuck + 1 : 0;
    this._resumedAt = received;
    const oldest = this._sent.find((item) => item.kind === "audio")?.pos ?? this._audioBytes;
    if (received < oldest) resumed.client_gap_bytes = oldest - received; // older than the buffer holds
    this._online = true;
    for (const item of this._sent) {
      if (item.kind === "audio" && item.pos + item.buf.byteLength > received) this._ws.send(item.buf.slice(Math.max(0, received - item.pos)));
      else if (item.kind === "text" && item.resend && item.index >= resumed.commands_received) this._ws.send(item.text);
    }
  }

  /** A resumed WebRTC session whose peer connection went down with the network: negotiate a new one. */
  async _renegotiate() {
    this._pc?.close();
    this._pc = null;
    await this._negotiate();
  }

  _remember(item, size) {
    if (!this.resume) return;
    this._sent.push(item);
    this._sentBytes += size;
    while (this._sentBytes > this.resumeBufferBytes && this._sent.length > 1) {
      const old = this._sent.shift();
      this._sentBytes -= old.kind === "audio" ? old.buf.byteLength : old.text.length;
    }
  }

  async _negotiate() {
    const iceServers = this.session?.webrtc?.ice_servers ?? [];
    const pc = (this._pc = new RTCPeerConnection({ iceServers }));
    for (const track of this._stream.getAudioTracks()) pc.addTrack(track, this._stream);
    await pc.setLocalDescription(await pc.createOffer());
    await this._gathered(pc);
    this._send({ type: "webrtc_offer", sdp: pc.localDescription.sdp });
    const answer = await this._next((m) => m.type === "webrtc_answer", "the server did not answer the WebRTC offer");
    await pc.setRemoteDescription({ type: "answer", sdp: answer.sdp });
    await this._connected(pc);
    this._audioStartedAt = performance.now();
    pc.addEventListener("connectionstatechange", () => {
      if (pc.connectionState === "failed" && this.state === "streaming") {
        this._fail(new AsrError("connection_lost", "the WebRTC audio connection failed", { retryable: true }));
      }
    });
  }

  _gathered(pc) {
    // Non-trickle: the offer carries every candidate found within the time limit.
    if (pc.iceGatheringState === "complete") return Promise.resolve();
    return new Promise((resolve) => {
      const done = () => {
        if (pc.iceGatheringState === "complete") finish();
      };
      const finish = () => {
        clearTimeout(timer);
        pc.removeEventListener("icegatheringstatechange", done);
        resolve();
      };
      const timer = setTimeout(finish, 3000);
      pc.addEventListener("icegatheringstatechange", done);
    });
  }

  _connected(pc) {
    return new Promise((resolve, reject) => {
      const check = () => {
        if (pc.connectionState === "connected") finish(resolve);
        else if (pc.connectionState === "failed" || pc.connectionState === "closed") {
          finish(() => reject(new AsrError("connection_lost", "the WebRTC connection could not be set up", { retryable: true })));
        }
      };
      const finish = (then) => {
        clearTimeout(timer);
        pc.removeEventListener("connectionstatechange", check);
        this._waiters.delete(cancel);
        then();
      };
      // Called for every message (err null) and when the socket closes (err set): only the latter aborts.
      const cancel = (err) => {
        if (err) finish(() => reject(err));
      };
      const timer = setTimeout(
        () => finish(() => reject(new AsrError("timeout", "the WebRTC connection did not come up in time (is UDP blocked?)", { retryable: true }))),
        this.connectTimeoutMs,
      );
      this._waiters.add(cancel);
      pc.addEventListener("connectionstatechange", check);
      check();
    });
  }

  _pipePcm() {
    const ctx = this._audioContext;
    const source = this._source;
    this._worklet = new AudioWorkletNode(ctx, "asr-pcm-sender", { numberOfOutputs: 0, processorOptions: { blockMs: 100 } });
    this._worklet.port.onmessage = (e) => {
      if (e.data?.type !== "pcm") return;
      if (this._audioStartedAt === null) this._audioStartedAt = performance.now() - (e.data.buffer.byteLength / 2 / ctx.sampleRate) * 1000;
      this._sendBinary(e.data.buffer);
    };
    source.connect(this._worklet);
  }

  // -- messages ---------------------------------------------------------------------

  _onMessage(data) {
    if (typeof data !== "string") return;
    this._heardAt = performance.now();
    let m;
    try {
      m = JSON.parse(data);
    } catch {
      return;
    }
    if (typeof m.seq === "number") {
      if (m.seq <= this._lastSeq) return; // already had it
      this._lastSeq = m.seq;
    }
    this._emit("message", m);
    for (const waiter of [...this._waiters]) waiter(null, m);
    switch (m.type) {
      case "interim":
      case "final":
        if (this.transcript.apply(m)) this._emit("transcript", { channel: m.channel ?? 0 });
        if (this._audioStartedAt !== null && (m.type === "final" ? m.text : true)) {
          const seconds = (performance.now() - this._audioStartedAt) / 1000 - m.end;
          this._emit("latency", { kind: m.type, seconds: Math.max(0, seconds) });
        }
        break;
      case "revision":
        if (this.transcript.apply(m)) this._emit("transcript", { channel: m.channel ?? 0 });
        this._emit("revision", m);
        break;
      case "settled":
        this.transcript.apply(m);
        this._emit("settled", m);
        break;
      case "load":
        this._emit("load", m);
        break;
      case "error": {
        const error = AsrError.fromMessage(m);
        if (!NON_FATAL_CODES.has(m.code)) this.lastError = error; // the session goes on after the others
        this._emit("error", error);
        break;
      }
      case "closed":
        this._closedMessage = m;
        break;
    }
  }

  /** The next message matching `pred`; an error message or a close first rejects. */
  _next(pred, what) {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => finish(new AsrError("timeout", what, { retryable: true })), this.connectTimeoutMs);
      const finish = (err, m) => {
        clearTimeout(timer);
        this._waiters.delete(waiter);
        if (err) reject(err);
        else resolve(m);
      };
      const waiter = (err, m) => {
        if (err) finish(err);
        else if (m.type === "error" && !NON_FATAL_CODES.has(m.code)) finish(AsrError.fromMessage(m));
        else if (pred(m)) finish(null, m);
      };
      this._waiters.add(waiter);
    });
  }

  _onSocketClosed(event, ws) {
    if (ws !== this._ws) return; // an older connection's late close
    const lost = new AsrError("connection_lost", `${CLIENT_ERRORS.connection_lost} (close code ${event.code})`, { retryable: true });
    for (const waiter of [...this._waiters]) waiter(this.lastError?.fromServer ? this.lastError : lost);
    if (this._resuming) return; // the resume loop tries again
    // Only a connection lost without a close frame (1006) is resumed: a close frame is an end.
    if (this._online && event.code === 1006 && this._mayResume()) {
      this._resume();
      return;
    }
    if (this.state === "stopping") this._stopped?.(true);
    if (this.state === "stopping" || this.state === "closed" || this.state === "failed") return;
    // The server ended the session: cleanly after our close or a track end, or with an error it sent.
    if (this._closedMessage && event.code === 1000) {
      this._release();
      this._setState("closed");
      return;
    }
    this._fail(this.lastError?.fromServer ? this.lastError : lost);
  }

  // -- plumbing ---------------------------------------------------------------------

  _send(message) {
    const text = JSON.stringify(message);
    // A WebRTC offer is never sent again: a resumed session negotiates a new peer connection.
    this._remember({ kind: "text", index: this._texts++, text, resend: message.type !== "webrtc_offer" }, text.length);
    if (this._online && this._ws?.readyState === WebSocket.OPEN) this._ws.send(text);
  }

  _sendBinary(buffer) {
    if (this.state === "closed") return;
    this._remember({ kind: "audio", pos: this._audioBytes, buf: buffer }, buffer.byteLength);
    this._audioBytes += buffer.byteLength;
    if (this._online && this._ws?.readyState === WebSocket.OPEN) this._ws.send(buffer);
  }

  _fail(error) {
    if (this.state === "failed" || this.state === "closed") return;
    if (this.lastError !== error) {
      this.lastError = error;
      if (!error.fromServer) this._emit("error", error);
    }
    this._release();
    this._setState("failed");
    this._stopped?.(false);
  }

  _releaseMicrophone() {
    if (this._ownStream && this._stream) for (const t of this._stream.getTracks()) t.stop();
  }

  _release() {
    clearInterval(this._watchTimer);
    this._watchTimer = null;
    this._releaseMicrophone();
    this._worklet?.port.postMessage("stop");
    this._worklet?.disconnect();
    this._worklet = null;
    this._source?.disconnect();
    this._source = null;
    this._audioContext?.close().catch(() => {});
    this._audioContext = null;
    this._pc?.close();
    this._pc = null;
    if (this._ws && this._ws.readyState <= WebSocket.OPEN) this._ws.close(1000);
    this._abandoned?.close(1000);
    this._abandoned = null;
  }

  _setState(state) {
    if (this.state === state) return;
    this.state = state;
    this._emit("state", { state });
  }

  _emit(type, detail) {
    this.dispatchEvent(new CustomEvent(type, { detail }));
  }
}

function delay(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
