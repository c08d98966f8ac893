// The Vercel AI SDK (`ai` with `@ai-sdk/openai`, `@ai-sdk/anthropic` and `@ai-sdk/google`)
// against the gateway, with the settings of the README ("Use it with…"): each provider's
// `baseURL` at the gateway, the virtual key as its `apiKey`.
//
//   node ai_sdk.mjs PROVIDER MODEL CHECK...
//
// PROVIDER: `openai` (the Responses API, the provider's default), `openai-chat` (Chat
// Completions), `anthropic` (Messages) or `google` (the Gemini API). CHECK:
//   text     generateText answers AI_ROUTER_EXPECT
//   stream   streamText streams AI_ROUTER_EXPECT in more than one part
//   tools    a tool with `execute`, multi-step, first with generateText then with streamText:
//            the model calls `get_weather`, the SDK runs it, sends its result back and returns
//            the model's final answer AI_ROUTER_EXPECT_TOOLS
//   refused  the call fails with the SDK's APICallError, status AI_ROUTER_STATUS, its message
//            containing AI_ROUTER_MESSAGE
// Environment: AI_ROUTER_BASE_URL (http://HOST:PORT, no path), AI_ROUTER_API_KEY.
// Run by tests/tests/agents.rs; exits 0 when every check passes, 1 otherwise, printing one
// line per check.

import { APICallError, generateText, jsonSchema, stepCountIs, streamText, tool } from "ai";
import { createAnthropic } from "@ai-sdk/anthropic";
import { createGoogleGenerativeAI } from "@ai-sdk/google";
import { createOpenAI } from "@ai-sdk/openai";

const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
};
const [provider, modelId, ...checks] = process.argv.slice(2);
const ROOT = env("AI_ROUTER_BASE_URL");
const API_KEY = env("AI_ROUTER_API_KEY");

// The settings the README gives, per provider.
const providers = {
  openai: () => createOpenAI({ baseURL: `${ROOT}/v1`, apiKey: API_KEY })(modelId),
  "openai-chat": () => createOpenAI({ baseURL: `${ROOT}/v1`, apiKey: API_KEY }).chat(modelId),
  anthropic: () => createAnthropic({ baseURL: `${ROOT}/v1`, apiKey: API_KEY })(modelId),
  google: () => createGoogleGenerativeAI({ baseURL: `${ROOT}/v1beta`, apiKey: API_KEY })(modelId),
};
if (!providers[provider]) throw new Error(`unknown provider ${provider}`);
const model = providers[provider]();
// The SDK's own retries would hide what the gateway answered first.
const common = { model, maxRetries: 0 };

const failures = [];
async function check(name, fn) {
  try {
    await fn();
    console.log(`ok   ${provider} ${modelId} ${name}`);
  } catch (e) {
    failures.push(name);
    console.log(`FAIL ${provider} ${modelId} ${name}\n${e?.stack ?? e}`);
    if (APICallError.isInstance(e)) console.log(`status ${e.statusCode}: ${e.responseBody}`);
  }
}
function expect(cond, what) {
  if (!cond) throw new Error(typeof what === "string" ? what : JSON.stringify(what));
}

// What the tool returns: the mock's next request must carry it under the call's id.
const TOOL_RESULT = "sunny-and-21C";
const weather = () => {
  const ran = [];
  const t = tool({
    description: "The weather in a city.",
    inputSchema: jsonSchema({
      type: "object",
      properties: { city: { type: "string" } },
      required: ["city"],
      additionalProperties: false,
    }),
    execute: async ({ city }) => {
      ran.push(city);
      return TOOL_RESULT;
    },
  });
  return { ran, tools: { get_weather: t } };
};

const runs = {
  text: async () => {
    const expected = env("AI_ROUTER_EXPECT");
    const r = await generateText({ ...common, system: "Be brief.", prompt: "Say hello." });
    expect(r.text === expected, { text: r.text, finishReason: r.finishReason });
    expect(r.finishReason === "stop", r.finishReason);
    expect(r.usage.outputTokens > 0, r.usage);
  },
  stream: async () => {
    const expected = env("AI_ROUTER_EXPECT");
    let error;
    const r = streamText({ ...common, prompt: "Say hello.", onError: ({ error: e }) => (error = e) });
    const parts = [];
    for await (const part of r.textStream) parts.push(part);
    if (error) throw error;
    expect(parts.join("") === expected && parts.length > 1, { parts });
    expect((await r.finishReason) === "stop", await r.finishReason);
  },
  tools: async () => {
    const expected = env("AI_ROUTER_EXPECT_TOOLS");
    const prompt = "What is the weather in Paris?";
    const unary = weather();
    const r = await generateText({ ...common, tools: unary.tools, stopWhen: stepCountIs(3), prompt });
    expect(unary.ran.join() === "Paris", { ran: unary.ran });
    expect(r.steps.length === 2 && r.steps[0].finishReason === "tool-calls", r.steps.map((s) => s.finishReason));
    expect(r.steps[0].toolResults[0]?.output === TOOL_RESULT, r.steps[0].toolResults);
    expect(r.text === expected, { text: r.text });
    const streamed = weather();
    let error;
    const s = streamText({
      ...common,
      tools: streamed.tools,
      stopWhen: stepCountIs(3),
      prompt,
      onError: ({ error: e }) => (error = e),
    });
    let text = "";
    for await (const part of s.textStream) text += part;
    if (error) throw error;
    expect(streamed.ran.join() === "Paris", { ran: streamed.ran });
    expect((await s.steps).length === 2 && text === expected, { text });
  },
  refused: async () => {
    const status = Number(env("AI_ROUTER_STATUS"));
    const message = env("AI_ROUTER_MESSAGE");
    try {
      await generateText({ ...common, prompt: "Say hello." });
    } catch (e) {
      expect(APICallError.isInstance(e), `${e?.name}: ${e?.message}`);
      expect(e.statusCode === status, `status ${e.statusCode}, want ${status}: ${e.message}`);
      expect(e.message.includes(message), e.message);
      return;
    }
    throw new Error(`not refused (want ${status})`);
  },
};

for (const name of checks) {
  if (!runs[name]) throw new Error(`unknown check ${name}`);
  await check(name, runs[name]);
}
if (failures.length) {
  console.log(`${failures.length} failed: ${failures.join(", ")}`);
  process.exit(1);
}
