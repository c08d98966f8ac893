// Google's `@google/genai` SDK against the gateway's Gemini API (`/v1beta/models/…`), with the
// settings of the README ("Use it with…"): `httpOptions.baseUrl` at the gateway, the virtual
// key as `apiKey` (sent as `x-goog-api-key`). A text answer, a streamed one, a function call
// round trip, countTokens, the model list and a refusal in Google's error shape.
// Run by tests/tests/agents.rs; exits 0 when every check passes, 1 otherwise, printing one
// line per check.

import { GoogleGenAI } from "@google/genai";

const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
};
const BASE_URL = env("GOOGLE_GEMINI_BASE_URL");
const API_KEY = env("GEMINI_API_KEY");
const MODEL = env("AI_ROUTER_MODEL");
const EXPECT = env("AI_ROUTER_EXPECT");
const TOOLS = env("AI_ROUTER_TOOLS_MODEL");

const ai = new GoogleGenAI({ apiKey: API_KEY, httpOptions: { baseUrl: BASE_URL } });

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

await check("generateContent: text", async () => {
  const r = await ai.models.generateContent({
    model: MODEL,
    contents: "Say hello.",
    config: { systemInstruction: "Be brief.", temperature: 0, maxOutputTokens: 64 },
  });
  expect(r.text === EXPECT, r);
  expect(r.candidates[0].finishReason === "STOP", r.candidates);
  expect(r.usageMetadata.totalTokenCount > 0, r.usageMetadata);
});

await check("generateContentStream: text", async () => {
  const stream = await ai.models.generateContentStream({ model: MODEL, contents: "Say hello." });
  let text = "";
  let chunks = 0;
  let last;
  for await (const chunk of stream) {
    text += chunk.text ?? "";
    chunks += 1;
    last = chunk;
  }
  expect(text === EXPECT, { text });
  expect(chunks > 1, { chunks });
  expect(last.candidates[0].finishReason === "STOP", last);
});

const weather = {
  name: "get_weather",
  description: "The weather in a city.",
  parametersJsonSchema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
};

await check("function call round trip", async () => {
  const contents = [{ role: "user", parts: [{ text: "Weather in Paris?" }] }];
  const config = { tools: [{ functionDeclarations: [weather] }] };
  const first = await ai.models.generateContent({ model: TOOLS, contents, config });
  const calls = first.functionCalls ?? [];
  expect(calls.length === 1 && calls[0].name === "get_weather" && calls[0].args.city === "Paris", first);
  contents.push(first.candidates[0].content);
  contents.push({
    role: "user",
    parts: [{ functionResponse: { id: calls[0].id, name: "get_weather", response: { output: "sunny" } } }],
  });
  const second = await ai.models.generateContentStream({ model: TOOLS, contents, config });
  let text = "";
  for await (const chunk of second) text += chunk.text ?? "";
  expect(text.length > 0, { text });
});

await check("countTokens", async () => {
  const r = await ai.models.countTokens({ model: MODEL, contents: "How many tokens is this?" });
  expect(r.totalTokens > 0, r);
});

await check("models: list and get", async () => {
  const names = [];
  for await (const m of await ai.models.list()) names.push(m.name);
  expect(names.includes(`models/${MODEL}`), names);
  // The SDK lists on /v1/models; the Gemini CLI's API version is v1beta.
  const raw = await fetch(`${BASE_URL}/v1beta/models`, { headers: { "x-goog-api-key": API_KEY } });
  const listed = await raw.json();
  expect(listed.models.some((m) => m.name === `models/${MODEL}`), listed);
  const m = await ai.models.get({ model: MODEL });
  expect(m.name === `models/${MODEL}`, m);
});

await check("an unknown model is refused in Google's shape", async () => {
  try {
    await ai.models.generateContent({ model: "no-such-model", contents: "hi" });
  } catch (e) {
    expect(e.status === 404, `status ${e.status}: ${e.message}`);
    expect(e.message.includes("NOT_FOUND"), e.message);
    return;
  }
  throw new Error("not refused");
});

await check("a wrong key is refused in Google's shape", async () => {
  const stranger = new GoogleGenAI({ apiKey: "sk-not-a-key", httpOptions: { baseUrl: BASE_URL } });
  try {
    await stranger.models.generateContent({ model: MODEL, contents: "hi" });
  } catch (e) {
    expect(e.status === 401, `status ${e.status}: ${e.message}`);
    expect(e.message.includes("UNAUTHENTICATED"), e.message);
    return;
  }
  throw new Error("not refused");
});

if (failures.length) {
  console.log(`${failures.length} failed: ${failures.join(", ")}`);
  process.exit(1);
}
