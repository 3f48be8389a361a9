// Transcript model tests: `node --test clients/js/test/` (or `npm test` in clients/js).
// Real message sequences recorded from the server (fixtures/record.py), plus hand-made
// ones for the edge cases a live connection can produce.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { Transcript, paragraphs, speakerTurns } from "../src/transcript.js";

const recorded = (name) => JSON.parse(readFileSync(new URL(`./fixtures/${name}`, import.meta.url), "utf8"));

function finalsOf(messages, channel = 0) {
  return messages
    .filter((m) => m.type === "final" && m.channel === channel && m.text)
    .map((m) => m.text)
    .join(" ");
}

const interim = (utterance, offset, text, stable, channel = 0) => ({ type: "interim", channel, utterance, offset, text, stable });
const final = (utterance, offset, text, channel = 0) => ({ type: "final", channel, utterance, offset, text, reason: "endpoint" });

test("a recorded real-time stream rebuilds exactly the finals, with every revision applied in place", () => {
  const { messages } = recorded("librivox_realtime.json");
  const t = new Transcript();
  let revisions = 0;
  let lastOpen = null;
  for (const m of messages) {
    const before = t.view();
    t.apply(m);
    const after = t.view();
    if (m.type === "interim") {
      // What is already final never changes under an interim.
      assert.equal(after.final, before.final);
      // The open utterance shows exactly this interim, split at `stable`.
      assert.equal(after.stable + after.unstable, m.text);
      assert.equal(after.stable, m.text.slice(0, m.stable));
      if (lastOpen !== null && lastOpen.utterance === m.utterance && !m.text.startsWith(lastOpen.text)) revisions++;
      lastOpen = m;
      assert.equal(t.text(), (after.final ? after.final + " " : "") + m.text);
    } else if (m.type === "final") {
      assert.equal(after.stable + after.unstable, "", "a final closes the open utterance");
      lastOpen = null;
    }
  }
  assert.ok(revisions >= 5, `the recording should contain revisions, found ${revisions}`);
  assert.equal(t.finalText(), finalsOf(messages));
  assert.equal(t.text(), finalsOf(messages));
});

test("channels of a recorded stereo call are kept apart", () => {
  const { messages } = recorded("call_stereo.json");
  const t = new Transcript();
  const changes = [];
  t.addEventListener("change", (e) => changes.push(e.detail.channel));
  for (const m of messages) t.apply(m);
  assert.equal(t.finalText(0), finalsOf(messages, 0));
  assert.equal(t.finalText(1), finalsOf(messages, 1));
  assert.ok(t.finalText(0).length > 0 && t.finalText(1).length > 0);
  assert.ok(changes.includes(0) && changes.includes(1));
});

test("a revision replaces exactly the unstable tail, from the message's offset", () => {
  const t = new Transcript();
  t.apply(final(0, 0, "Hello there."));
  t.apply(interim(1, 13, "How are yo", 8));
  assert.deepEqual(t.view(), { final: "Hello there.", stable: "How are ", unstable: "yo", start: null });
  t.apply(interim(1, 13, "How are you doing", 12));
  assert.deepEqual(t.view(), { final: "Hello there.", stable: "How are you ", unstable: "doing", start: null });
  assert.equal(t.text(), "Hello there. How are you doing");
  t.apply(final(1, 13, "How are you doing?"));
  assert.equal(t.text(), "Hello there. How are you doing?");
  assert.deepEqual(t.view(), { final: "Hello there. How are you doing?", stable: "", unstable: "", start: null });
});

test("an empty final takes no room and clears its interim", () => {
  const t = new Transcript();
  t.apply(final(0, 0, "One."));
  t.apply(interim(1, 5, "uh", 0));
  assert.equal(t.text(), "One. uh");
  assert.equal(t.apply(final(1, 5, "")), true);
  assert.equal(t.text(), "One.");
  t.apply(interim(2, 5, "Two", 0));
  t.apply(final(2, 5, "Two."));
  assert.equal(t.text(), "One. Two.");
});

test("stale interims after their final, and out-of-order interims, are ignored", () => {
  const t = new Transcript();
  t.apply(interim(0, 0, "Ten of", 0));
  t.apply(final(0, 0, "Ten of clubs."));
  assert.equal(t.apply(interim(0, 0, "Ten of cl", 6)), false);
  assert.equal(t.text(), "Ten of clubs.");
  t.apply(interim(2, 14, "Seven", 0));
  assert.equal(t.apply(interim(1, 14, "Four", 0)), false);
  assert.equal(t.text(), "Ten of clubs. Seven");
});

test("non-transcript messages change nothing; a repeated interim is not a change", () => {
  const t = new Transcript();
  let changes = 0;
  t.addEventListener("change", () => changes++);
  for (const m of [{ type: "session" }, { type: "speech_start", channel: 0, at: 1 }, { type: "load", level: 1 }, { type: "closed" }, null]) {
    assert.equal(t.apply(m), false);
  }
  assert.equal(t.apply(interim(0, 0, "Hi", 0)), true);
  assert.equal(t.apply(interim(0, 0, "Hi", 0)), false);
  assert.equal(changes, 1);
  assert.equal(t.text(1), "");
});

test("stable beyond the text is clamped", () => {
  const t = new Transcript();
  t.apply(interim(0, 0, "abc", 10));
  assert.deepEqual(t.view(), { final: "", stable: "abc", unstable: "", start: null });
});

const revision = (first, last, offset, text, channel = 0) => ({ type: "revision", channel, utterances: [first, last], offset, text, words: [] });

test("a revision replaces the finals from its offset to their end, and a live interim stays after them", () => {
  for (const replacement of ["he was not ill-disposed", "he was not an ill-disposed young man at all, no"]) {
    const t = new Transcript();
    t.apply(final(0, 0, "And so it began."));
    t.apply(final(1, 17, "He was not an old-sposed young man."));
    t.apply(final(2, 53, "Unless to be cold."));
    t.apply(interim(3, 72, "Had he married", 6));
    const changed = t.apply(revision(1, 2, 17, replacement + " Unless to be cold."));
    assert.equal(changed, true);
    assert.equal(t.finalText(), "And so it began. " + replacement + " Unless to be cold.");
    // The live interim is still shown, after the revised finals.
    assert.equal(t.text(), t.finalText() + " Had he married");
    // What the revision changed: its first utterance's words; the last final came back the same.
    assert.deepEqual(t.revised(), { start: 17, end: 17 + replacement.length });
    // The server sends the interim again at its new offset: nothing moves.
    t.apply(interim(3, t.finalText().length + 1, "Had he married", 6));
    assert.equal(t.text(), t.finalText() + " Had he married");
    // Later finals follow the revised transcript.
    t.apply(final(3, t.finalText().length + 1, "Had he married a kinder woman."));
    assert.equal(t.finalText(), "And so it began. " + replacement + " Unless to be cold. Had he married a kinder woman.");
  }
});

test("a revision marks only the words it changed, not the whole stretch it sent again", () => {
  const t = new Transcript();
  t.apply(final(0, 0, "Good morning everyone and welcome to the review."));
  t.apply(final(1, 49, "Before we begin, please mute your microphones."));
  const before = t.finalText();
  // A late decode writes a comma into the first sentence and sends both again.
  t.apply(revision(0, 1, 0, "Good morning everyone, and welcome to the review. Before we begin, please mute your microphones."));
  const { start, end } = t.revised();
  assert.equal(t.finalText().slice(start, end), "everyone,");
  // Sent again unchanged: the text is the same, and nothing is marked.
  assert.equal(t.apply(revision(0, 1, 0, t.finalText())), false);
  assert.equal(t.revised(), null);
  // A word put in, one taken out, and a word changed at the very start.
  t.apply(revision(1, 1, 50, "Before we begin, please do mute your microphones."));
  assert.equal(t.finalText().slice(t.revised().start, t.revised().end), "do");
  t.apply(revision(1, 1, 50, "Before we begin, please mute your microphones."));
  assert.equal(t.finalText().slice(t.revised().start, t.revised().end), "mute"); // the word after the gap
  t.apply(revision(0, 1, 0, "good" + t.finalText().slice(4)));
  assert.deepEqual(t.revised(), { start: 0, end: 4 });
  assert.notEqual(t.finalText(), before);
});

test("a revision from offset 0 replaces every final", () => {
  const t = new Transcript();
  t.apply(final(0, 0, "ten of clubs"));
  t.apply(final(1, 13, "for queen of clubs"));
  t.apply(revision(0, 1, 0, "10 of clubs 4 queen of clubs"));
  assert.equal(t.text(), "10 of clubs 4 queen of clubs");
});

test("a settled message marks the start of the finals that no revision will change", () => {
  const t = new Transcript();
  t.apply(final(0, 0, "And so it began."));
  t.apply(final(1, 17, "He was not an old-sposed young man."));
  assert.equal(t.settledText(), "");
  assert.equal(t.apply({ type: "settled", channel: 0, utterance: 0, offset: 16 }), false); // the text is as it was
  assert.equal(t.settledText(), "And so it began.");
  t.apply(revision(1, 1, 17, "He was not an ill-disposed young man."));
  t.apply({ type: "settled", channel: 0, utterance: 1, offset: t.finalText().length });
  assert.equal(t.settledText(), t.finalText());
  assert.equal(t.settledText(1), ""); // per channel
});

const timedFinal = (channel, utterance, offset, text, start, end) => ({ type: "final", channel, utterance, offset, text, start, end, reason: "endpoint" });
const turn = (channel, utterance, start, end, text) => ({ channel, utterance, start, end, text });

test("turns are a call in spoken order, each utterance revised in place by the revision's segments", () => {
  const t = new Transcript();
  t.apply(timedFinal(0, 0, 0, "I lost my card.", 0.4, 1.9));
  t.apply(timedFinal(0, 1, 16, "Yesterday.", 4.2, 4.9)); // the caller's next turn comes before the agent's first final
  t.apply(timedFinal(1, 0, 0, "Sorry to hear.", 2.3, 3.6));
  t.apply(timedFinal(0, 2, 27, "", 6.0, 6.0)); // nothing recognised: no turn
  t.apply(interim(1, 15, "your", 0, 1));
  assert.deepEqual(t.turns(), [turn(0, 0, 0.4, 1.9, "I lost my card."), turn(1, 0, 2.3, 3.6, "Sorry to hear."), turn(0, 1, 4.2, 4.9, "Yesterday.")]);
  t.apply({
    type: "revision", channel: 0, utterances: [0, 1], offset: 0, text: "I lost my card, yesterday.",
    segments: [{ utterance: 0, offset: 0, start: 0.4, end: 2.0 }, { utterance: 1, offset: 16, start: 4.1, end: 4.9 }],
  });
  assert.deepEqual(t.turns(), [turn(0, 0, 0.4, 2.0, "I lost my card,"), turn(1, 0, 2.3, 3.6, "Sorry to hear."), turn(0, 1, 4.1, 4.9, "yesterday.")]);
  assert.deepEqual(t.turns(1), [turn(1, 0, 2.3, 3.6, "Sorry to hear.")]); // the live interim is not a turn
  assert.deepEqual(t.turns(5), []);
  t.apply({ type: "revision", channel: 0, utterances: [1, 1], offset: 16, text: "Yesterday.", segments: [{ utterance: 1, offset: 16, start: 4.1, end: 4.8 }] });
  assert.deepEqual(t.turns(0), [turn(0, 0, 0.4, 2.0, "I lost my card,"), turn(0, 1, 4.1, 4.8, "Yesterday.")]); // the first kept as it was
  t.apply(timedFinal(0, 3, 27, "Bye.", 9.0, 9.5));
  assert.deepEqual(t.turns().map((x) => x.text), ["I lost my card,", "Sorry to hear.", "Yesterday.", "Bye."]);
});

test("an utterance a revision leaves with no text has no turn, and the next final follows the revised text", () => {
  // The pass heard "Pastorisk." as part of the word before it: www.asterisk.org (docs/protocol.md).
  const t = new Transcript();
  t.apply(timedFinal(0, 0, 0, "Visit www.", 0.5, 1.8));
  t.apply(timedFinal(0, 1, 11, "Pastorisk.", 2.4, 3.0));
  t.apply({
    type: "revision", channel: 0, utterances: [0, 1], changed: [0, 1], offset: 0, text: "Visit www.asterisk.org.",
    segments: [{ utterance: 0, offset: 0, start: 0.5, end: 3.0 }],
  });
  t.apply(timedFinal(0, 2, 24, "Goodbye.", 3.6, 4.1));
  assert.equal(t.finalText(), "Visit www.asterisk.org. Goodbye.");
  assert.deepEqual(t.turns().map((x) => [x.utterance, x.text]), [[0, "Visit www.asterisk.org."], [2, "Goodbye."]]);
});

test("a revision that gives an empty final words appends them as its turn", () => {
  // The context pass heard a last word said alone, whose final was empty (docs/protocol.md): the
  // revision starts where that final stood, one past the end of the text.
  const t = new Transcript();
  t.apply(timedFinal(0, 0, 0, "Thank you for trying out the asterisk open source.", 94.1, 97.2));
  t.apply(timedFinal(0, 1, 51, "", 97.4, 98.1));
  t.apply({
    type: "revision", channel: 0, utterances: [1, 1], changed: [1], offset: 51, text: "PBX.",
    segments: [{ utterance: 1, offset: 51, start: 97.4, end: 98.0 }],
  });
  assert.equal(t.finalText(), "Thank you for trying out the asterisk open source. PBX.");
  assert.deepEqual(t.turns().map((x) => [x.utterance, x.text]), [[0, "Thank you for trying out the asterisk open source."], [1, "PBX."]]);
});

test("without segments a revision's utterances become one turn, from its first start to its last end", () => {
  const t = new Transcript();
  t.apply(timedFinal(0, 0, 0, "And so it began.", 0.5, 2.0));
  t.apply(timedFinal(0, 1, 17, "He was not an old-sposed", 3.0, 5.0));
  t.apply(timedFinal(0, 2, 42, "young man.", 5.2, 6.0));
  t.apply({ type: "revision", channel: 0, utterances: [1, 2], offset: 17, text: "He was not an ill-disposed young man." });
  assert.deepEqual(t.turns(), [turn(0, 0, 0.5, 2.0, "And so it began."), turn(0, 1, 3.0, 6.0, "He was not an ill-disposed young man.")]);
});

test("a recorded stereo call's turns hold each channel's finals, in the order spoken", () => {
  const { messages } = recorded("call_stereo.json");
  const t = new Transcript();
  for (const m of messages) t.apply(m);
  for (const channel of [0, 1]) assert.equal(t.turns(channel).map((x) => x.text).join(" "), t.finalText(channel));
  const starts = t.turns().map((x) => x.start);
  assert.deepEqual(starts, [...starts].sort((a, b) => a - b));
  assert.deepEqual(new Set(t.turns().map((x) => x.channel)), new Set([0, 1]));
});

test("paragraphs break at a pause of two seconds between utterances and after a long stretch", () => {
  const t = new Transcript();
  t.apply(timedFinal(0, 0, 0, "Good morning.", 0.5, 1.4));
  t.apply(timedFinal(0, 1, 14, "Let us begin.", 2.2, 3.1)); // 0.8 s later: the same paragraph
  t.apply(timedFinal(0, 2, 28, "First, the budget.", 6.0, 7.2)); // 2.9 s of quiet: a new one
  const final = t.finalText();
  const ranges = paragraphs(t.turns(0));
  assert.deepEqual(ranges.map((r) => final.slice(r.start, r.end)), ["Good morning. Let us begin.", "First, the budget."]);
  assert.equal(ranges.map((r) => final.slice(r.start, r.end)).join(" "), final);
  // A revision that rewrites both sides of the pause keeps the break where the pause is.
  t.apply({
    type: "revision", channel: 0, utterances: [1, 2], offset: 14, text: "Let's begin. First: the budget.",
    segments: [{ utterance: 1, offset: 14, start: 2.2, end: 3.0 }, { utterance: 2, offset: 27, start: 6.0, end: 7.2 }],
  });
  const revised = t.finalText();
  assert.deepEqual(paragraphs(t.turns(0)).map((r) => revised.slice(r.start, r.end)), ["Good morning. Let's begin.", "First: the budget."]);
  // Talk with no long pause still breaks, at an utterance's end, once a paragraph is long.
  const talk = Array.from({ length: 30 }, (_, i) => ({ channel: 0, utterance: i, start: i * 3, end: i * 3 + 2.5, text: `Sentence number ${i} is here.` }));
  const long = paragraphs(talk, { maxChars: 100 });
  assert.ok(long.length > 5 && long.every((r) => r.end - r.start < 100 + 30));
  assert.deepEqual(paragraphs([]), []);
  assert.equal(paragraphs(talk, { gapS: 0.4 }).length, 30); // every pause counts when asked to
});

test("speakerTurns join a party's utterances until the other speaks or it pauses", () => {
  const t = new Transcript();
  t.apply(timedFinal(0, 0, 0, "I lost my card,", 0.4, 1.9));
  t.apply(timedFinal(0, 1, 16, "yesterday, at the station.", 2.3, 4.0)); // 0.4 s later: the same turn
  t.apply(timedFinal(1, 0, 0, "Sorry to hear.", 4.5, 5.6));
  t.apply(timedFinal(0, 2, 43, "Can you block it?", 6.0, 7.0));
  t.apply(timedFinal(0, 3, 61, "Please.", 9.0, 9.4)); // after a 2 s pause: a turn of its own
  t.apply(timedFinal(1, 1, 15, "Of course.", 9.2, 9.9)); // said over "Please.": it starts later
  assert.deepEqual(speakerTurns(t.turns()), [
    { channel: 0, utterance: 0, start: 0.4, end: 4.0, text: "I lost my card, yesterday, at the station." },
    { channel: 1, utterance: 0, start: 4.5, end: 5.6, text: "Sorry to hear." },
    { channel: 0, utterance: 2, start: 6.0, end: 7.0, text: "Can you block it?" },
    { channel: 0, utterance: 3, start: 9.0, end: 9.4, text: "Please." },
    { channel: 1, utterance: 1, start: 9.2, end: 9.9, text: "Of course." },
  ]);
  assert.deepEqual(speakerTurns(t.turns(), { gapS: 3 }).slice(2).map((x) => x.text), ["Can you block it? Please.", "Of course."]);
  assert.deepEqual(speakerTurns(t.turns(), { maxChars: 10 }).slice(0, 2).map((x) => x.text), ["I lost my card,", "yesterday, at the station."]);
  for (const channel of [0, 1]) {
    assert.equal(speakerTurns(t.turns()).filter((x) => x.channel === channel).map((x) => x.text).join(" "), t.finalText(channel));
  }
  assert.deepEqual(speakerTurns([]), []);
});

test("the view says when the open utterance's interim was heard from", () => {
  const t = new Transcript();
  t.apply({ ...interim(0, 0, "hello", 2), start: 4.5, end: 5.1 });
  assert.equal(t.view().start, 4.5);
  t.apply(timedFinal(0, 0, 0, "Hello.", 4.5, 5.2));
  assert.equal(t.view().start, null);
});
