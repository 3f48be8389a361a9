// AsrClient.fetchTranscript against a stand-in fetch: the address, the session's resume token, and
// the server's errors as AsrError codes. defaultServerUrl: the server a page finds without a url.
import assert from "node:assert/strict";
import { afterEach, test } from "node:test";

import { AsrClient, AsrError, defaultServerUrl, serverUrl } from "../src/client.js";

const realFetch = globalThis.fetch;
afterEach(() => {
  globalThis.fetch = realFetch;
});

function answering(status, body, asked) {
  globalThis.fetch = async (url, init) => {
    asked.push({ url, headers: init?.headers ?? {} });
    return new Response(typeof body === "string" ? body : JSON.stringify(body), { status });
  };
}

function clientWithSession(url, session) {
  const client = new AsrClient({ url });
  client.session = session;
  return client;
}

test("fetchTranscript asks the server behind the stream's address, with the session's resume token", async () => {
  const asked = [];
  answering(200, "1\n00:00:00,500 --> 00:00:02,000\nHello there.\n", asked);
  const client = clientWithSession("wss://example.org/asr", { session_id: "9f3c", resume_token: "q7Xk" });
  const srt = await client.fetchTranscript("srt", { lineChars: 32, lines: 1 });
  assert.equal(srt, "1\n00:00:00,500 --> 00:00:02,000\nHello there.\n");
  assert.equal(asked[0].url, "https://example.org/asr/v1/sessions/9f3c/transcript?format=srt&line_chars=32&lines=1");
  assert.deepEqual(asked[0].headers, { "Asr-Resume-Token": "q7Xk" });

  answering(200, { session_id: "9f3c", channels: [] }, asked);
  const plain = clientWithSession("ws://127.0.0.1:8765", { session_id: "9f3c" }); // no resume token (--resume-ttl 0)
  assert.deepEqual(await plain.fetchTranscript(), { session_id: "9f3c", channels: [] });
  assert.equal(asked[1].url, "http://127.0.0.1:8765/v1/sessions/9f3c/transcript?format=json");
  assert.deepEqual(asked[1].headers, {});
});

test("fetchTranscript turns the server's error into an AsrError with its code", async () => {
  answering(404, { type: "error", code: "session_not_found", message: "no session '9f3c' to follow", retryable: false }, []);
  const client = clientWithSession("ws://127.0.0.1:8765", { session_id: "9f3c", resume_token: "q7Xk" });
  await assert.rejects(client.fetchTranscript("srt"), (err) => err instanceof AsrError && err.code === "session_not_found" && err.fromServer);
  globalThis.fetch = async () => {
    throw new TypeError("Failed to fetch");
  };
  await assert.rejects(client.fetchTranscript("srt"), (err) => err.code === "connect_failed" && err.retryable);
  await assert.rejects(new AsrClient({ url: "ws://127.0.0.1:8765" }).fetchTranscript(), (err) => err.code === "session_not_found");
});

test("a url given as the page's address or with a trailing slash is the same server", () => {
  // new WebSocket("http://...") fails in older browsers, and "ws://h:1/" + "/v1/listen" was a 404.
  assert.equal(serverUrl("http://localhost:8765/"), "ws://localhost:8765");
  assert.equal(serverUrl("HTTPS://host.example/asr/"), "wss://host.example/asr");
  assert.equal(serverUrl("wss://host.example/asr"), "wss://host.example/asr");
  assert.equal(new AsrClient({ url: "http://127.0.0.1:8765/" }).url, "ws://127.0.0.1:8765");
});

test("without a url the client talks to the server it was imported from, a proxy's path included", () => {
  const page = (href) => new URL(href);
  // The server's own page, at the root and behind a proxy path (TLS at the proxy).
  assert.equal(defaultServerUrl(page("http://127.0.0.1:8765/"), "http://127.0.0.1:8765/client/client.js"), "ws://127.0.0.1:8765");
  assert.equal(defaultServerUrl(page("https://host.example/asr/?token=t"), "https://host.example/asr/client/client.js"), "wss://host.example/asr");
  // A site's page importing the client from the server: the server, not the site.
  assert.equal(defaultServerUrl(page("https://app.example/live"), "https://asr.example:8443/client/client.js"), "wss://asr.example:8443");
  // A copy of the module inside a site (or a bundle, or node): the page's own host, as before.
  assert.equal(defaultServerUrl(page("https://app.example/live"), "https://app.example/js/asr.js"), "wss://app.example");
  assert.equal(defaultServerUrl(page("http://localhost:3000/"), "file:///srv/app/client.js"), "ws://localhost:3000");
  assert.equal(defaultServerUrl(undefined, "file:///srv/app/client.js"), "ws://127.0.0.1:8765");
});
