// responses_clients.mjs — the npm clients users reach for, calling the Responses API of a Baton
// router: openai (responses.create, streamed and not), the Vercel AI SDK's default OpenAI
// provider (generateText, streamText) and LangChain's ChatOpenAI with useResponsesApi.
// Usage: node responses_clients.mjs NODE_MODULES BASE_URL INPUT MAX_OUTPUT_TOKENS
// Prints one JSON object: each client's text, or its error.
import { createRequire } from "node:module";
import path from "node:path";
import { pathToFileURL } from "node:url";

const [nodeModules, baseURL, input, maxTokens] = process.argv.slice(2);
const require = createRequire(path.join(nodeModules, "noop.js"));
const load = async (name) => import(pathToFileURL(require.resolve(name)).href);

const out = {};
async function run(name, fn) {
  try {
    out[name] = await fn();
  } catch (e) {
    out[name] = { error: String(e && e.stack ? e.stack : e) };
  }
}

const { default: OpenAI } = await load("openai");
const client = new OpenAI({ baseURL, apiKey: "unused" });
const max = Number(maxTokens);

await run("openai_create", async () => {
  const r = await client.responses.create({ model: "m", input, max_output_tokens: max });
  return r.output_text;
});
await run("openai_stream", async () => {
  const s = await client.responses.create({ model: "m", input, max_output_tokens: max, stream: true });
  let text = "";
  const types = [];
  for await (const ev of s) {
    types.push(ev.type);
    if (ev.type === "response.output_text.delta") text += ev.delta;
  }
  return { text, last: types[types.length - 1] };
});

const ai = await load("ai");
const { createOpenAI } = await load("@ai-sdk/openai");
const provider = createOpenAI({ baseURL, apiKey: "unused" });
await run("ai_generateText", async () => {
  const r = await ai.generateText({ model: provider("m"), prompt: input, maxOutputTokens: max });
  return r.text;
});
await run("ai_streamText", async () => {
  let err = null;
  const r = ai.streamText({
    model: provider("m"), prompt: input, maxOutputTokens: max,
    onError: ({ error }) => { err = error; },
  });
  let text = "";
  for await (const t of r.textStream) text += t;
  if (err) throw err;
  return text;
});

const { ChatOpenAI } = await load("@langchain/openai");
await run("langchain_responses", async () => {
  const llm = new ChatOpenAI({
    model: "m", apiKey: "unused", useResponsesApi: true, maxTokens: max,
    configuration: { baseURL },
  });
  const m = await llm.invoke(input);
  return typeof m.content === "string" ? m.content
    : m.content.map((p) => p.text || "").join("");
});

process.stdout.write(JSON.stringify(out) + "\n");
