// asr-server browser client: `import { AsrClient, Transcript } from "./index.js"`.
export { AsrClient, AsrError, CLIENT_ERRORS, TRANSPORTS, defaultServerUrl } from "./client.js";
export { Transcript, paragraphs, speakerTurns, PARAGRAPH_GAP_S, PARAGRAPH_CHARS } from "./transcript.js";
