// The live captioning page served by asr-server at "/".
//
// Query parameters: transport=auto|webrtc|websocket, autostart=1, and any
// stream option of the protocol (interim_ms, endpoint_ms, language, ...).
import { AsrClient } from "./client/client.js";
import { PARAGRAPH_GAP_S, paragraphs } from "./client/transcript.js";

const STREAM_OPTIONS = ["language", "interim_results", "interim_ms", "endpoint_ms", "max_utterance_s", "priority", "heartbeat_s",
  "prompt", "revisions", "split_after_s"];
// Errors after which trying again later can work; the rest need the user.
const RETRY_CODES = new Set([
  "overloaded", "not_ready", "shutting_down", "memory_pressure", "audio_overrun",
  "connection_lost", "connect_failed", "timeout", "webrtc_failed", "internal_error", "inference_failed",
]);
const MAX_BACKOFF_S = 30;
const REVISION_MARK_MS = 1500;
const ANNOUNCED_KEPT = 5; // finals kept in the screen reader's live region
const LEVEL_FLOOR_DB = -70; // the meter's bottom (the server raises talkers down to about -62 dBFS): quieter shows as nothing

const $ = (id) => document.getElementById(id);
const ui = {
  start: $("start"),
  transport: $("transport"),
  clear: $("clear"),
  save: $("save"),
  subtitles: $("subtitles"),
  status: $("status"),
  notice: $("notice"),
  noticeText: $("notice-text"),
  retry: $("retry"),
  transcript: $("transcript"),
  announce: $("announce"),
  level: $("level"),
  latency: $("latency"),
  interimLag: $("interim-lag"),
  load: $("load"),
  model: $("model"),
};

const params = new URLSearchParams(location.search);
// Servers with API keys: ?token=T (one stream), or ?token_url=/path on this site, which the page
// POSTs to for a fresh token before each stream (answering {"token": ...}, as POST /v1/tokens does).
const tokenUrl = params.get("token_url");
let firstToken = params.get("token");
async function nextToken() {
  app.tokenSent = false;
  if (firstToken) {
    const token = firstToken;
    firstToken = null; // good once
    app.tokenSent = true;
    return token;
  }
  if (!tokenUrl || !tokenUrl.startsWith("/") || tokenUrl.startsWith("//")) return null; // this site's paths only
  const answer = await fetch(tokenUrl, { method: "POST", credentials: "same-origin" });
  if (!answer.ok) throw new Error(`${tokenUrl} answered ${answer.status}`);
  const token = (await answer.json()).token;
  app.tokenSent = Boolean(token);
  return token;
}
const options = {};
for (const name of STREAM_OPTIONS) if (params.has(name)) options[name] = params.get(name);
if (["auto", "webrtc", "websocket"].includes(params.get("transport"))) ui.transport.value = params.get("transport");

const app = {
  client: null,
  wanted: false, // the user wants captions: retry after failures that allow it
  earlier: [], // earlier sessions on this page: each its final text's paragraphs
  attempts: 0,
  retryTimer: null,
  countdownTimer: null,
  lastFinalLatency: null,
  lastInterimLag: null,
  everStreamed: false, // this page has streamed to the server at least once
  tokenSent: false, // the last connection attempt carried a token
};
window.asrApp = {
  get state() {
    return app.client?.state ?? "idle";
  },
  get transport() {
    return app.client?.transport ?? null;
  },
  finalText: () => [...app.earlier.flat(), app.client?.transcript.finalText() ?? ""].filter(Boolean).join(" "),
  text: () => [...app.earlier.flat(), app.client?.transcript.text() ?? ""].filter(Boolean).join(" "),
  messages: [],
  errors: [],
  latencies: [],
  level: null, // the microphone's level now (dBFS) while streaming
};

function setStatus(state, text) {
  ui.status.dataset.state = state;
  ui.status.textContent = text;
}

function showNotice(text, kind = "warn", retry = false) {
  ui.notice.hidden = false;
  ui.notice.dataset.kind = kind;
  ui.noticeText.textContent = text;
  ui.retry.hidden = !retry;
}

function hideNotice() {
  ui.notice.hidden = true;
}

function setRunning(running) {
  ui.start.textContent = running ? "Stop" : "Start";
  ui.start.dataset.running = String(running);
  ui.transport.disabled = running;
}

function render() {
  const box = ui.transcript;
  box.replaceChildren();
  for (const text of app.earlier.flat()) {
    const p = document.createElement("p");
    p.className = "earlier";
    p.textContent = text;
    box.append(p);
  }
  ui.save.disabled = !(app.earlier.length || app.client?.transcript.finalText());
  ui.subtitles.disabled = !(app.client?.session && app.client.transcript.finalText());
  const view = app.client?.transcript.view();
  if (!view || !(view.final || view.stable || view.unstable)) {
    if (!app.earlier.length) {
      const p = document.createElement("p");
      p.className = "placeholder";
      p.textContent = app.wanted ? "Listening… speak and words appear here." : "Press Start, allow the microphone, and speak.";
      box.append(p);
    }
    return;
  }
  // The words a revision (the server's second pass, with more context) changed are marked briefly.
  const revised = app.client?.transcript.revised();
  const fresh = revised && performance.now() - (app.revisedAt ?? 0) < REVISION_MARK_MS && revised.end <= view.final.length;
  const turns = app.client.transcript.turns(0);
  let p = null;
  for (const range of finalParagraphs(view, turns)) {
    p = paragraph(box);
    addFinal(p, view.final, range, fresh ? revised : null);
  }
  if (view.stable || view.unstable) {
    // The open utterance goes on the last paragraph, or opens one after a long pause.
    if (!p || pausedBefore(view, turns)) p = paragraph(box);
    else p.append(" ");
    addSpan(p, "stable", view.stable);
    addSpan(p, "unstable", view.unstable);
  }
  box.scrollTop = box.scrollHeight;
}

/** The finalized text's paragraphs (at long pauses, see `paragraphs`): {start, end} ranges of `view.final`. */
function finalParagraphs(view, turns) {
  if (!view.final) return [];
  const ranges = paragraphs(turns);
  const whole = ranges.length && ranges.at(-1).end === view.final.length;
  return whole ? ranges : [{ start: 0, end: view.final.length }];
}

/** Whether the open utterance began a long pause after the last finalized one (`turns`: channel 0's). */
function pausedBefore(view, turns) {
  const heard = turns.at(-1)?.end;
  return view.start !== null && heard != null && view.start - heard >= PARAGRAPH_GAP_S;
}

function paragraph(box) {
  const p = document.createElement("p");
  p.className = "current";
  box.append(p);
  return p;
}

function addSpan(p, cls, text) {
  if (!text) return;
  const span = document.createElement("span");
  span.className = cls;
  span.textContent = text;
  p.append(span);
}

/** A paragraph's final text, with the words the latest revision changed (`revised`, or null) marked. */
function addFinal(p, text, range, revised) {
  const from = revised ? Math.min(Math.max(revised.start, range.start), range.end) : range.end;
  const to = revised ? Math.min(Math.max(revised.end, range.start), range.end) : range.end;
  addSpan(p, "final", text.slice(range.start, from));
  addSpan(p, "final revised", text.slice(from, to));
  addSpan(p, "final", text.slice(to, range.end));
}

// The microphone's level, so a user sees that sound arrives (a muted or wrong input sends silence).
const meter = { ctx: null, source: null, analyser: null, samples: null, timer: null };

/** The meter's audio context, made on the Start click (browsers start audio only on a user's gesture);
 * without one the page works on, with no meter. */
function startMeter() {
  try {
    meter.ctx ??= new AudioContext();
    meter.ctx.resume().catch(() => {});
  } catch {
    meter.ctx = null;
  }
}

function watchLevel(stream) {
  stopLevel();
  if (!stream || !meter.ctx) return;
  try {
    meter.source = meter.ctx.createMediaStreamSource(stream);
    meter.analyser = meter.ctx.createAnalyser();
    meter.analyser.fftSize = 2048;
    meter.samples = new Float32Array(meter.analyser.fftSize);
    meter.source.connect(meter.analyser);
    meter.timer = setInterval(showLevel, 100);
  } catch {
    stopLevel(); // a stream the context cannot read (no audio track): no meter, captions go on
  }
}

function showLevel() {
  meter.analyser.getFloatTimeDomainData(meter.samples);
  let power = 0;
  for (const x of meter.samples) power += x * x;
  const db = 10 * Math.log10(power / meter.samples.length + 1e-12); // dBFS of the last ~43 ms
  window.asrApp.level = db;
  ui.level.value = Math.max(LEVEL_FLOOR_DB, Math.min(0, db));
}

function stopLevel() {
  clearInterval(meter.timer);
  meter.source?.disconnect();
  meter.source = meter.analyser = meter.timer = null;
  ui.level.value = LEVEL_FLOOR_DB;
  window.asrApp.level = null;
}

/** A final for screen readers: added to the live region, which keeps the last few. */
function announce(text) {
  const p = document.createElement("p");
  p.textContent = text;
  ui.announce.append(p);
  while (ui.announce.childElementCount > ANNOUNCED_KEPT) ui.announce.firstElementChild.remove();
}

function seconds(s) {
  return s === null ? "–" : `${s.toFixed(1)} s`;
}

function keepEarlierText() {
  const kept = currentParagraphs();
  if (kept.length) app.earlier.push(kept);
}

/** The current session's final text, paragraph by paragraph. */
function currentParagraphs() {
  const view = app.client?.transcript.view();
  if (!view?.final) return [];
  return finalParagraphs(view, app.client.transcript.turns(0)).map((r) => view.final.slice(r.start, r.end));
}

/** Everything final on the page (earlier sessions first), paragraphs apart, as a text file. */
function pageText() {
  const all = [...app.earlier.flat(), ...currentParagraphs()];
  return all.length ? all.join("\n\n") + "\n" : "";
}

function save() {
  const text = pageText();
  if (text) download(new Blob([text], { type: "text/plain;charset=utf-8" }), "txt");
}

/** The current (or last) session's subtitles from the server, as an .srt file (read with the
 * session's own resume token, whatever key or token it streamed with). */
async function saveSubtitles() {
  if (!app.client?.session) return;
  try {
    download(new Blob([await app.client.fetchTranscript("srt")], { type: "application/x-subrip;charset=utf-8" }), "srt");
  } catch (err) {
    const why = err.code === "session_not_found" ? "the server no longer holds this session" : err.message;
    showNotice(`Subtitles could not be fetched: ${why}.`);
  }
}

function download(blob, extension) {
  const stamp = new Date().toISOString().slice(0, 16).replace(/[T:]/g, "-");
  const link = document.createElement("a");
  link.href = URL.createObjectURL(blob);
  link.download = `captions-${stamp}.${extension}`;
  link.click();
  setTimeout(() => URL.revokeObjectURL(link.href), 1000);
}

function clearTimers() {
  clearTimeout(app.retryTimer);
  clearInterval(app.countdownTimer);
  app.retryTimer = app.countdownTimer = null;
}

async function startSession() {
  clearTimers();
  hideNotice();
  keepEarlierText();
  const client = new AsrClient({ transport: ui.transport.value, options, token: nextToken });
  app.client = client;
  client.addEventListener("transcript", render);
  client.addEventListener("revision", () => {
    app.revisedAt = performance.now();
    setTimeout(render, REVISION_MARK_MS + 50); // unmark
  });
  client.addEventListener("message", (e) => {
    window.asrApp.messages.push(e.detail);
    if (e.detail.type === "final" && e.detail.text) announce(e.detail.text);
  });
  client.addEventListener("state", (e) => onState(client, e.detail.state));
  client.addEventListener("error", (e) => window.asrApp.errors.push({ code: e.detail.code, message: e.detail.message }));
  client.addEventListener("latency", (e) => {
    window.asrApp.latencies.push(e.detail);
    if (e.detail.kind === "final") app.lastFinalLatency = e.detail.seconds;
    else app.lastInterimLag = e.detail.seconds;
    ui.latency.textContent = seconds(app.lastFinalLatency);
    ui.interimLag.textContent = seconds(app.lastInterimLag);
  });
  client.addEventListener("reconnecting", () => {
    if (client !== app.client) return;
    setStatus("connecting", "Reconnecting…");
    showNotice("The connection dropped; taking the session up again. Nothing is lost.", "warn");
  });
  client.addEventListener("resumed", () => {
    if (client !== app.client) return;
    setStatus("streaming", "Listening");
    hideNotice();
  });
  client.addEventListener("load", (e) => {
    const m = e.detail;
    ui.load.hidden = m.level === 0;
    ui.load.textContent = m.level === 0 ? "" : `Server busy: updates every ${(m.interim_ms / 1000).toFixed(1)} s`;
  });
  render();
  try {
    await client.start();
    app.attempts = 0;
    ui.model.textContent = `${client.session.model} · ${client.transport === "webrtc" ? "WebRTC" : "WebSocket"}`;
  } catch {
    // onState("failed") has reported it
  }
}

function onState(client, state) {
  if (client !== app.client) return;
  switch (state) {
    case "connecting":
      setStatus("connecting", "Connecting…");
      setRunning(true);
      break;
    case "streaming":
      app.everStreamed = true;
      setStatus("streaming", "Listening");
      hideNotice();
      watchLevel(client.microphone);
      break;
    case "stopping":
      setStatus("stopping", "Finishing…");
      break;
    case "closed":
      stopLevel();
      setStatus("idle", app.wanted ? "Ended" : "Stopped");
      setRunning(false);
      if (app.wanted) {
        // The server ended the session cleanly (its audio path closed): offer to go on.
        app.wanted = false;
        showNotice("The session ended. Press Start to go on.", "warn");
      }
      break;
    case "failed":
      stopLevel();
      onFailure(client.lastError);
      break;
  }
  render();
}

function onFailure(error) {
  const code = error?.code ?? "connection_lost";
  if (!app.wanted || !RETRY_CODES.has(code)) {
    app.wanted = false;
    setRunning(false);
    setStatus("failed", code === "microphone_denied" ? "Microphone blocked" : "Stopped");
    const advice = code === "microphone_denied"
      ? "Microphone access was refused. Allow it for this site in the browser's settings, then press Start."
      : `${error?.message ?? "Something went wrong."} (${code})`;
    showNotice(advice, "error");
    return;
  }
  // Retry: after the server's retry_after when it gave one, else with backoff.
  app.attempts += 1;
  const wait = Math.min(MAX_BACKOFF_S, error?.retryAfter ?? 2 ** Math.min(app.attempts - 1, 5));
  const busy = ["overloaded", "not_ready", "memory_pressure", "audio_overrun", "shutting_down"].includes(code);
  let why = busy ? "The server is busy" : code === "connect_failed" ? "Could not connect to the server" : "The connection was lost";
  setStatus("retrying", busy ? "Server busy" : "Reconnecting");
  let left = Math.ceil(wait);
  const tell = () => showNotice(`${why} (${code}). Trying again in ${left} s…`, "warn", true);
  tell();
  clearTimers();
  if (code === "connect_failed") {
    const client = app.client;
    whyNoConnection(client.url).then((found) => {
      if (app.client !== client || !app.retryTimer) return; // a later attempt, or the user stopped
      why = found;
      tell();
    });
  }
  app.countdownTimer = setInterval(() => {
    left = Math.max(0, left - 1);
    tell();
  }, 1000);
  app.retryTimer = setTimeout(startSession, wait * 1000);
}

// A handshake the server refuses (an origin it does not allow, a key or token it does not take, its
// connection limit) looks to a page just like a server that is down: browsers hide the answer.
// /healthz answers anyone, so asking it tells them apart.
async function whyNoConnection(url) {
  let answer, health;
  try {
    answer = await fetch(new URL("healthz", `${url.replace(/^ws/, "http")}/`), { cache: "no-store", signal: AbortSignal.timeout(10_000) });
    health = await answer.json().catch(() => ({}));
  } catch {
    return "The server cannot be reached";
  }
  if (health.code === "overloaded") return "The server is at its connection limit";
  if (health.status === "starting" || health.status === "stopping") return `The server is ${health.status}`;
  if (!answer.ok) return `Could not connect to the server (it answered ${answer.status})`;
  const origin = `or this page's origin is not allowed (--allowed-origin ${location.origin})`;
  if (health.api_keys && !app.tokenSent) {
    return tokenUrl ? `The server needs a token, and ${tokenUrl} gave none` : "The server needs an API key: open this page with ?token_url= (or ?token=), as the README says";
  }
  if (health.api_keys) return `The server refused this page's token (expired, or its key revoked?), ${origin}`;
  return app.everStreamed
    ? "The server is up but refused this page's connection (was its --allowed-origin changed?)"
    : `The server is up but refused this page's connection (if it runs behind a proxy, it must be started with --allowed-origin ${location.origin})`;
}

ui.start.addEventListener("click", async () => {
  if (ui.start.dataset.running === "true") {
    app.wanted = false;
    clearTimers();
    hideNotice();
    ui.start.disabled = true;
    if (app.client && (app.client.state === "streaming" || app.client.state === "connecting")) await app.client.stop();
    else {
      setRunning(false);
      setStatus("idle", "Stopped");
    }
    ui.start.disabled = false;
    return;
  }
  app.wanted = true;
  app.attempts = 0;
  setRunning(true);
  startMeter();
  await startSession();
});

ui.retry.addEventListener("click", () => {
  clearTimers();
  startSession();
});

ui.save.addEventListener("click", save);
ui.subtitles.addEventListener("click", saveSubtitles);

ui.clear.addEventListener("click", () => {
  app.earlier = [];
  app.client?.transcript.clear();
  ui.announce.replaceChildren();
  render();
});

if (params.get("autostart") === "1") ui.start.click();
