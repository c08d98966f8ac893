"""The OpenAI Agents SDK (`openai-agents`) against the gateway, with the settings of the README
("Use it with…"): an `AsyncOpenAI` client whose `base_url` is the gateway and whose `api_key` is
the virtual key, given to the SDK's Responses model or its Chat Completions model, tracing off
(its exporter would call OpenAI).

    python agents_sdk.py MODEL_CLASS MODEL CHECK...

MODEL_CLASS: `responses` (OpenAIResponsesModel, /v1/responses) or `chat`
(OpenAIChatCompletionsModel, /v1/chat/completions). CHECK:
  text     Runner.run answers AI_ROUTER_EXPECT
  stream   Runner.run_streamed streams AI_ROUTER_EXPECT in more than one text delta
  tools    a function tool, Runner.run then Runner.run_streamed: the model calls `get_weather`,
           the SDK runs it and sends its result back, the final output is AI_ROUTER_EXPECT_TOOLS
  refused  the run raises the `openai` error with status AI_ROUTER_STATUS, its message
           containing AI_ROUTER_MESSAGE
Environment: AI_ROUTER_BASE_URL (http://HOST:PORT/v1), AI_ROUTER_API_KEY.
Run by tests/tests/agents.rs; exits 0 when every check passes, 1 otherwise, printing one line
per check.
"""

import asyncio
import os
import sys
import traceback

import openai
from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)

set_tracing_disabled(True)

MODEL_CLASS, MODEL, *CHECKS = sys.argv[1:]
client = openai.AsyncOpenAI(
    base_url=os.environ["AI_ROUTER_BASE_URL"],
    api_key=os.environ["AI_ROUTER_API_KEY"],
    max_retries=0,
    timeout=60,
)
MODELS = {
    "responses": lambda: OpenAIResponsesModel(model=MODEL, openai_client=client),
    "chat": lambda: OpenAIChatCompletionsModel(model=MODEL, openai_client=client),
}
model = MODELS[MODEL_CLASS]()

# What the tool returns: the mock's next request must carry it under the call's id.
TOOL_RESULT = "sunny-and-21C"
ran = []


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    ran.append(city)
    return TOOL_RESULT


def agent(tools=()):
    return Agent(name="assistant", instructions="Be brief.", model=model, tools=list(tools))


def expect_equal(what, got, want):
    if got != want:
        raise AssertionError(f"{what}: got {got!r}, want {want!r}")


async def streamed_text(run):
    parts = []
    async for event in run.stream_events():
        if event.type == "raw_response_event" and event.data.type == "response.output_text.delta":
            parts.append(event.data.delta)
    return parts


async def text():
    result = await Runner.run(agent(), "Say hello.")
    expect_equal("final output", result.final_output, os.environ["AI_ROUTER_EXPECT"])


async def stream():
    run = Runner.run_streamed(agent(), "Say hello.")
    parts = await streamed_text(run)
    expect_equal("streamed text", "".join(parts), os.environ["AI_ROUTER_EXPECT"])
    if len(parts) < 2:
        raise AssertionError(f"one delta only: {parts!r}")
    expect_equal("final output", run.final_output, os.environ["AI_ROUTER_EXPECT"])


async def tools():
    want = os.environ["AI_ROUTER_EXPECT_TOOLS"]
    prompt = "What is the weather in Paris?"
    result = await Runner.run(agent([get_weather]), prompt)
    expect_equal("tool runs", ran, ["Paris"])
    expect_equal("final output", result.final_output, want)
    outputs = [i.output for i in result.new_items if i.type == "tool_call_output_item"]
    expect_equal("tool outputs", outputs, [TOOL_RESULT])
    run = Runner.run_streamed(agent([get_weather]), prompt)
    parts = await streamed_text(run)
    expect_equal("tool runs", ran, ["Paris", "Paris"])
    expect_equal("streamed final text", "".join(parts), want)
    expect_equal("streamed final output", run.final_output, want)


async def refused():
    status = int(os.environ["AI_ROUTER_STATUS"])
    message = os.environ["AI_ROUTER_MESSAGE"]
    try:
        await Runner.run(agent(), "Say hello.")
    except openai.APIStatusError as e:
        expect_equal("status", e.status_code, status)
        if message not in str(e):
            raise AssertionError(f"{message!r} not in {e}") from e
        return
    raise AssertionError(f"not refused (want {status})")


async def main():
    failures = []
    for name in CHECKS:
        try:
            await globals()[name]()
            print(f"ok   {MODEL_CLASS} {MODEL} {name}")
        except Exception:  # noqa: BLE001 - every failure is reported, then the run fails
            failures.append(name)
            print(f"FAIL {MODEL_CLASS} {MODEL} {name}")
            traceback.print_exc(file=sys.stdout)
    if failures:
        print(f"{len(failures)} failed: {', '.join(failures)}")
        sys.exit(1)


asyncio.run(main())
