// The official npm clients against the gateway: `@anthropic-ai/sdk` on POST /v1/messages and
// the `openai` package's `client.responses` on POST /v1/responses — text, streams, tools
// (unary and streamed), JSON, images, errors and a stream cut after its first token.
// Run by tests/tests/conformance.rs with the environment of ../ingress.py; exits 0 when every
// check passes, 1 otherwise, printing one line per check.

import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";

const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
};
const BASE_URL = env("AI_ROUTER_BASE_URL");
const ROOT_URL = BASE_URL.replace(/\/v1$/, "");
const API_KEY = env("AI_ROUTER_API_KEY");
const CHAT = env("AI_ROUTER_CHAT_MODEL");
const EXPECT = env("AI_ROUTER_EXPECT");
const TOOLS = env("AI_ROUTER_TOOLS_MODEL");
const JSON_MODEL = env("AI_ROUTER_JSON_MODEL");
const CUT = env("AI_ROUTER_CUT_MODEL");
const SCHEMA = { type: "object", properties: { city: { type: "string" } }, required: ["city"] };
const PNG =
  "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";
const HELLO = [{ role: "user", content: "Say hello." }];

const claude = new Anthropic({ baseURL: ROOT_URL, apiKey: API_KEY, maxRetries: 0 });
const gpt = new OpenAI({ baseURL: BASE_URL, apiKey: API_KEY, maxRetries: 0 });
const anthropicTool = { name: "get_weather", description: "The weather in a city.", input_schema: SCHEMA };
const responsesTool = { type: "function", name: "get_weather", parameters: SCHEMA, strict: true };

const failures = [];
async function check(name, fn) {
  try {
    await fn();
    console.log(`ok   ${name}`);
  } catch (e) {
    failures.push(name);
    console.log(`FAIL ${name}\n${e?.stack ?? e}`);
  }
}
function expect(cond, what) {
  if (!cond) throw new Error(typeof what === "string" ? what : JSON.stringify(what));
}
async function refused(promise, status) {
  try {
    await promise;
  } catch (e) {
    expect(e.status === status, `status ${e.status}, want ${status}: ${e.message}`);
    return e;
  }
  throw new Error(`not refused (want ${status})`);
}

await check("messages: text", async () => {
  const r = await claude.messages.create({ model: CHAT, max_tokens: 64, system: "Be brief.", messages: HELLO });
  expect(r.type === "message" && r.content[0].text === EXPECT, r);
  expect(r.usage.output_tokens > 0, r.usage);
});

await check("messages: stream", async () => {
  const stream = claude.messages.stream({ model: CHAT, max_tokens: 64, messages: HELLO });
  let text = "";
  stream.on("text", (t) => (text += t));
  const final = await stream.finalMessage();
  expect(text === EXPECT && final.stop_reason === "end_turn", { text, final });
});

await check("messages: tools, unary and streamed", async () => {
  const messages = [{ role: "user", content: "Weather in Paris?" }];
  const r = await claude.messages.create({ model: TOOLS, max_tokens: 64, tools: [anthropicTool], messages });
  const use = r.content.find((b) => b.type === "tool_use");
  expect(r.stop_reason === "tool_use" && use?.input?.city === "Paris", r);
  const stream = claude.messages.stream({ model: TOOLS, max_tokens: 64, tools: [anthropicTool], messages });
  const final = await stream.finalMessage();
  const streamed = final.content.find((b) => b.type === "tool_use");
  expect(streamed?.input?.city === "Paris", final);
});

await check("messages: JSON and image", async () => {
  const j = await claude.messages.create({ model: JSON_MODEL, max_tokens: 64, messages: HELLO });
  expect(JSON.parse(j.content[0].text).answer === 42, j.content);
  const r = await claude.messages.create({
    model: CHAT,
    max_tokens: 64,
    messages: [{ role: "user", content: [
      { type: "image", source: { type: "base64", media_type: "image/png", data: PNG } },
      { type: "text", text: "What is this?" },
    ] }],
  });
  expect(r.content[0].text === EXPECT, r.content);
});

await check("messages: errors", async () => {
  const bad = new Anthropic({ baseURL: ROOT_URL, apiKey: "sk-not-a-key", maxRetries: 0 });
  const e = await refused(bad.messages.create({ model: CHAT, max_tokens: 8, messages: HELLO }), 401);
  expect(e.error?.type === "error" && e.error?.error?.type === "authentication_error", e.error);
  const n = await refused(claude.messages.create({ model: "no-such-model", max_tokens: 8, messages: HELLO }), 404);
  expect(n.error?.error?.code === "model_not_found", n.error);
});

await check("messages: a stream cut after its first token rejects", async () => {
  const stream = claude.messages.stream({ model: CUT, max_tokens: 64, messages: HELLO });
  let text = "";
  stream.on("text", (t) => (text += t));
  try {
    await stream.finalMessage();
  } catch (e) {
    expect(text.length > 0, "no text before the cut");
    return;
  }
  throw new Error(`the stream ended cleanly after ${JSON.stringify(text)}`);
});

await check("responses: text, items, image", async () => {
  const r = await gpt.responses.create({ model: CHAT, input: "Say hello.", instructions: "Be brief." });
  expect(r.output_text === EXPECT && r.status === "completed", r);
  const i = await gpt.responses.create({
    model: CHAT,
    input: [{ role: "user", content: [
      { type: "input_text", text: "What is this?" },
      { type: "input_image", image_url: `data:image/png;base64,${PNG}` },
    ] }],
  });
  expect(i.output_text === EXPECT, i.output);
});

await check("responses: stream", async () => {
  const events = [];
  for await (const e of await gpt.responses.create({ model: CHAT, input: "Say hello.", stream: true })) events.push(e);
  const text = events.filter((e) => e.type === "response.output_text.delta").map((e) => e.delta).join("");
  expect(text === EXPECT && events.at(-1).type === "response.completed", events.map((e) => e.type));
});

await check("responses: tools, unary and streamed; JSON", async () => {
  const r = await gpt.responses.create({ model: TOOLS, input: "Weather in Paris?", tools: [responsesTool] });
  const call = r.output.find((o) => o.type === "function_call");
  expect(JSON.parse(call.arguments).city === "Paris", r.output);
  let args = "";
  for await (const e of await gpt.responses.create({ model: TOOLS, input: "Weather?", tools: [responsesTool], stream: true })) {
    if (e.type === "response.function_call_arguments.delta") args += e.delta;
  }
  expect(JSON.parse(args).city === "Paris", args);
  const j = await gpt.responses.create({ model: JSON_MODEL, input: "x", text: { format: { type: "json_object" } } });
  expect(JSON.parse(j.output_text).answer === 42, j.output_text);
});

await check("responses: errors", async () => {
  const bad = new OpenAI({ baseURL: BASE_URL, apiKey: "sk-not-a-key", maxRetries: 0 });
  const e = await refused(bad.responses.create({ model: CHAT, input: "x" }), 401);
  expect(e.code === "invalid_api_key", e.error);
  const s = await refused(gpt.responses.create({ model: CHAT, input: "x", previous_response_id: "resp_1" }), 400);
  expect(s.code === "invalid_request", s.error);
});

await check("responses: a stream cut after its first token rejects", async () => {
  // The npm client raises on the `error` event (the Python one yields it, then response.failed).
  const types = [];
  try {
    for await (const e of await gpt.responses.create({ model: CUT, input: "Count.", stream: true })) types.push(e.type);
  } catch (e) {
    expect(types.includes("response.output_text.delta"), types);
    expect(/stream failed after the answer had started/.test(e.message), e.message);
    return;
  }
  throw new Error(`the stream ended without an error: ${types}`);
});

process.exit(failures.length ? 1 : 0);
