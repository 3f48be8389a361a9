// The running transcript of each channel, built from `interim`, `final` and
// `revision` messages.
//
// The protocol's rule (docs/protocol.md, "Offsets"): a message replaces everything
// from its `offset` to the end with its `text`, with one space before it when
// `offset > 0`. Finals are kept; the newest interim of the open utterance is shown
// after them, split at `stable` into the part that will not change and the part
// that may still be revised. A `revision` (the server's context pass) replaces the
// finals from its `offset` to their end; a live interim stays after them. A
// `settled` message says the finals up to its `offset` will never change again.
//
// Plain data in, plain data out: no DOM, no sockets, so it runs under `node --test`.

/**
 * @typedef {{channel: number, utterance: number, start: number | null, end: number | null, text: string}} Turn
 *   One finalized utterance: who spoke (`channel`), when (stream seconds: its first and last words
 *   as the server heard them) and what, revisions applied.
 */

/**
 * @typedef {{final: string, stable: string, unstable: string, start: number | null}} ChannelView
 *   `final` ends with the last final (a space is added before interim text by
 *   `text`); `stable` + `unstable` is the open utterance's newest interim, heard
 *   from `start` (stream seconds; null without an interim).
 */

class ChannelTranscript {
  constructor() {
    /** Finalized text: the non-empty finals joined by single spaces. */
    this.final = "";
    /** Utterances at or below this number are final; their interims are stale. */
    this.lastFinalUtterance = -1;
    /** @type {{utterance: number, offset: number, text: string, stable: number} | null} */
    this.interim = null;
    /** The words of `final` the latest revision changed: {start, end} character positions, or null. */
    this.revised = null;
    /** The length of the start of `final` that no revision will change (a `settled` message). */
    this.settled = 0;
    /** @type {{utterance: number, offset: number, start: number | null, end: number | null}[]}
     * The finalized utterances with text, in order: where each starts in `final`, and when it was heard. */
    this.spans = [];
  }

  /** @returns {boolean} whether the channel's text changed */
  apply(message) {
    const { utterance, offset, text } = message;
    if (message.type === "settled") {
      this.settled = offset;
      return false;
    }
    if (message.type === "revision") {
      const before = this.final;
      this.final = offset > 0 ? this.final.slice(0, offset - 1) + " " + text : text;
      if (this.interim) this.interim = { ...this.interim, offset: this.final.length + 1 }; // stays after the finals
      this.revised = changedWords(before, this.final);
      this.spans = revisedSpans(this.spans, message);
      return this.final !== before;
    }
    if (utterance <= this.lastFinalUtterance) return false; // late interim of a closed utterance
    if (message.type === "interim") {
      if (this.interim && this.interim.utterance > utterance) return false; // out of order
      const next = { utterance, offset, text, stable: clamp(message.stable ?? 0, 0, text.length), start: message.start ?? null };
      const same = this.interim && this.interim.text === next.text && this.interim.stable === next.stable && this.interim.offset === offset;
      this.interim = next;
      return !same;
    }
    // final
    this.lastFinalUtterance = utterance;
    const hadInterim = this.interim !== null;
    this.interim = null;
    if (!text) return hadInterim; // an empty final takes no room
    this.final = offset > 0 ? this.final.slice(0, offset - 1) + " " + text : text;
    this.spans = this.spans.filter((s) => s.offset < offset);
    this.spans.push({ utterance, offset, start: message.start ?? null, end: message.end ?? null });
    return true;
  }

  /** @returns {Turn[]} */
  turns(channel) {
    return this.spans.map((s, i) => {
      const stop = i + 1 < this.spans.length ? this.spans[i + 1].offset - 1 : this.final.length;
      return { channel, utterance: s.utterance, start: s.start, end: s.end, text: this.final.slice(s.offset, stop).trim() };
    });
  }

  /** @returns {ChannelView} */
  view() {
    if (!this.interim) return { final: this.final, stable: "", unstable: "", start: null };
    const { offset, text, stable, start } = this.interim;
    // The interim's offset says where its text starts; finals before it stay as they are.
    const final = offset > 0 ? this.final.slice(0, offset - 1) : "";
    return { final, stable: text.slice(0, stable), unstable: text.slice(stable), start };
  }

  text() {
    const v = this.view();
    const open = v.stable + v.unstable;
    return v.final && open ? v.final + " " + open : v.final + open;
  }
}

/**
 * A channel's utterance spans after a revision: those before its offset as they were, then one per
 * `segments` entry (from a server that sends none, one for the revised range).
 */
function revisedSpans(spans, message) {
  const kept = spans.filter((s) => s.offset < message.offset);
  if (Array.isArray(message.segments)) {
    return kept.concat(message.segments.map((p) => ({ utterance: p.utterance, offset: p.offset, start: p.start ?? null, end: p.end ?? null })));
  }
  if (!message.text) return kept;
  const replaced = spans.filter((s) => s.offset >= message.offset);
  const starts = replaced.map((s) => s.start).filter((x) => x !== null);
  const ends = replaced.map((s) => s.end).filter((x) => x !== null);
  const start = starts.length ? Math.min(...starts) : null;
  const end = ends.length ? Math.max(...ends) : null;
  return kept.concat([{ utterance: message.utterances[0], offset: message.offset, start, end }]);
}

/**
 * Where `after` differs from `before`, widened to whole words: {start, end} in `after`,
 * or null when the text is the same. A revision replaces every final from its first
 * revised utterance to the latest, often 20-30 s of text to change one word or comma;
 * this is the part a reader should look at again.
 */
function changedWords(before, after) {
  if (before === after) return null;
  const most = Math.min(before.length, after.length);
  let head = 0;
  while (head < most && before[head] === after[head]) head++;
  let tail = 0;
  while (tail < most - head && before[before.length - 1 - tail] === after[after.length - 1 - tail]) tail++;
  let start = head;
  if (after[start] === " ") start++; // the change starts with the next word
  else while (start > 0 && after[start - 1] !== " ") start--;
  let end = after.length - tail;
  if (end > start && after[end - 1] === " ") end--; // the change ends where a word does
  else while (end < after.length && after[end] !== " ") end++;
  // A change that only removed text (end <= start) marks the word it joined, if any.
  if (end <= start) {
    end = start;
    while (end < after.length && after[end] !== " ") end++;
  }
  return end > start ? { start, end } : null;
}

/**
 * Where a channel's finalized text breaks into paragraphs, for a reader of a long session: at a
 * pause of `gapS` seconds or more between two utterances, and at the end of an utterance once a
 * paragraph holds `maxChars` characters. `turns` are the channel's (`Transcript.turns(channel)`);
 * the answer is `{start, end}` character ranges of its `finalText`, in order, covering it but for
 * the single spaces between them.
 * @param {Turn[]} turns
 * @returns {{start: number, end: number}[]}
 */
export function paragraphs(turns, { gapS = PARAGRAPH_GAP_S, maxChars = PARAGRAPH_CHARS } = {}) {
  const out = [];
  let at = 0;
  let heardTo = null;
  for (const turn of turns) {
    const last = out.at(-1);
    const paused = heardTo !== null && turn.start !== null && turn.start - heardTo >= gapS;
    if (!last || paused || last.end - last.start >= maxChars) out.push({ start: at, end: at + turn.text.length });
    else last.end = at + turn.text.length;
    at += turn.text.length + 1;
    heardTo = turn.end ?? heardTo;
  }
  return out;
}

/**
 * Utterances in spoken order (`Transcript.turns()`) joined into turns for a reader, as
 * `asr-client --turns` prints them: an utterance joins the one before it when the same channel
 * spoke both, nobody else's came between, it starts less than `gapS` seconds after that one ends
 * (unknown times count as no pause) and the turn so far holds fewer than `maxChars` characters. A
 * joined turn keeps its first utterance's number and start, and its last one's end.
 * @param {Turn[]} turns
 * @returns {Turn[]}
 */
export function speakerTurns(turns, { gapS = PARAGRAPH_GAP_S, maxChars = PARAGRAPH_CHARS } = {}) {
  const out = [];
  for (const turn of turns) {
    const last = out.at(-1);
    const paused = last !== undefined && last.end !== null && turn.start !== null && turn.start - last.end >= gapS;
    if (last === undefined || last.channel !== turn.channel || paused || last.text.length >= maxChars) out.push({ ...turn });
    else out[out.length - 1] = { ...last, end: turn.end ?? last.end, text: `${last.text} ${turn.text}` };
  }
  return out;
}

/** A pause this long (seconds) between utterances starts a paragraph (`paragraphs`). */
export const PARAGRAPH_GAP_S = 2.0;
/** ... and so does an utterance after a paragraph of this many characters. */
export const PARAGRAPH_CHARS = 600;

function clamp(x, lo, hi) {
  return Math.max(lo, Math.min(hi, x));
}

/**
 * Every channel's transcript. `apply(message)` takes any server message and
 * returns true when a channel's text changed; other message types are ignored.
 * Dispatches a `change` event ({detail: {channel}}) on every change.
 */
export class Transcript extends EventTarget {
  constructor() {
    super();
    /** @type {Map<number, ChannelTranscript>} */
    this.channels = new Map();
  }

  apply(message) {
    if (!message || !["interim", "final", "revision", "settled"].includes(message.type)) return false;
    const channel = message.channel ?? 0;
    let ch = this.channels.get(channel);
    if (!ch) {
      ch = new ChannelTranscript();
      this.channels.set(channel, ch);
    }
    const changed = ch.apply(message);
    if (changed) this.dispatchEvent(new CustomEvent("change", { detail: { channel } }));
    return changed;
  }

  /** @returns {ChannelView} */
  view(channel = 0) {
    const ch = this.channels.get(channel);
    return ch ? ch.view() : { final: "", stable: "", unstable: "", start: null };
  }

  /** The whole text of a channel: finals, then the open utterance's interim. */
  text(channel = 0) {
    const ch = this.channels.get(channel);
    return ch ? ch.text() : "";
  }

  /** The words the latest revision changed in a channel's finalized text ({start, end}), or null. */
  revised(channel = 0) {
    return this.channels.get(channel)?.revised ?? null;
  }

  /**
   * The finalized utterances with text, revisions applied (by each revision's `segments`): of one
   * channel, or of every channel in the order they were spoken (by start time: a call's turns).
   * A channel's turns' texts joined by spaces are its `finalText`.
   * @returns {Turn[]}
   */
  turns(channel) {
    if (channel !== undefined) return this.channels.get(channel)?.turns(channel) ?? [];
    const all = [...this.channels.keys()].sort((a, b) => a - b).flatMap((ch) => this.channels.get(ch).turns(ch));
    const at = (t) => (t.start === null ? Infinity : t.start);
    return all.sort((a, b) => at(a) - at(b) || a.channel - b.channel); // stable: a channel's own order kept on ties
  }

  /** Only the finalized text of a channel. */
  finalText(channel = 0) {
    const ch = this.channels.get(channel);
    return ch ? ch.final : "";
  }

  /** The start of a channel's finalized text that the server said no revision will change
   * (after `closed`, all of it is). */
  settledText(channel = 0) {
    const ch = this.channels.get(channel);
    return ch ? ch.final.slice(0, ch.settled) : "";
  }

  clear() {
    this.channels.clear();
    this.dispatchEvent(new CustomEvent("change", { detail: { channel: 0 } }));
  }
}
