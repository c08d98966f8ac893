"""The official clients of the two other caller protocols against the gateway: the `anthropic`
SDK on `POST /v1/messages` and the `openai` SDK's `client.responses` on `POST /v1/responses`,
each with text, streams, tools (unary, streamed, and their results sent back), JSON, images,
errors, a stream cut after its first token and one that fails over before it.

Run by tests/tests/conformance.rs, once with an OpenAI-compatible provider behind the gateway
and once with an Anthropic one. Environment:
  AI_ROUTER_BASE_URL     the gateway's OpenAI base URL (http://127.0.0.1:<port>/v1)
  AI_ROUTER_API_KEY      a virtual key
  AI_ROUTER_CHAT_MODEL   answers AI_ROUTER_EXPECT (unary and streamed)
  AI_ROUTER_EXPECT       the chat model's text
  AI_ROUTER_TOOLS_MODEL  answers with one call of get_weather({"city": "Paris"})
  AI_ROUTER_JSON_MODEL   answers {"answer": 42}
  AI_ROUTER_CUT_MODEL    streams "one", then its stream breaks with an error event
  AI_ROUTER_FLAKY_MODEL  its first stream fails before the first token; then AI_ROUTER_EXPECT
Exits 0 when every check passes, 1 otherwise, printing one line per check.
"""

import json
import os
import sys
import traceback

import anthropic
import openai

BASE_URL = os.environ["AI_ROUTER_BASE_URL"]
ROOT_URL = BASE_URL[: -len("/v1")] if BASE_URL.endswith("/v1") else BASE_URL
API_KEY = os.environ["AI_ROUTER_API_KEY"]
CHAT = os.environ["AI_ROUTER_CHAT_MODEL"]
EXPECT = os.environ["AI_ROUTER_EXPECT"]
TOOLS = os.environ["AI_ROUTER_TOOLS_MODEL"]
JSON_MODEL = os.environ["AI_ROUTER_JSON_MODEL"]
CUT = os.environ["AI_ROUTER_CUT_MODEL"]
FLAKY = os.environ["AI_ROUTER_FLAKY_MODEL"]
WEATHER_ARGS = {"city": "Paris"}
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
# A 1x1 PNG.
PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)

claude = anthropic.Anthropic(base_url=ROOT_URL, api_key=API_KEY, max_retries=0, timeout=60)
claude_bearer = anthropic.Anthropic(
    base_url=ROOT_URL, api_key=None, auth_token=API_KEY, max_retries=0, timeout=60
)
gpt = openai.OpenAI(base_url=BASE_URL, api_key=API_KEY, max_retries=0, timeout=60)

ANTHROPIC_TOOL = {"name": "get_weather", "description": "The weather in a city.", "input_schema": SCHEMA}
RESPONSES_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": SCHEMA,
    "strict": True,
}
HELLO = [{"role": "user", "content": "Say hello."}]

failures = []


def check(name):
    def run(fn):
        try:
            fn()
            print(f"ok   {name}")
        except Exception:  # noqa: BLE001 - every failure is reported, then the script fails
            failures.append(name)
            print(f"FAIL {name}\n{traceback.format_exc()}")
        return fn

    return run


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


# ------------------------------------------------------------------ Anthropic Messages API


@check("messages: text, system, stop_sequences, usage (x-api-key)")
def _():
    r = claude.messages.create(
        model=CHAT, max_tokens=64, system="Be brief.", stop_sequences=["\n\nHuman:"], messages=HELLO
    )
    expect(r.type == "message" and r.role == "assistant", r)
    expect(r.content[0].type == "text" and r.content[0].text == EXPECT, r.content)
    expect(r.stop_reason == "end_turn", r.stop_reason)
    expect(r.usage.output_tokens > 0 and r.usage.input_tokens >= 0, r.usage)
    expect(r.usage.cache_read_input_tokens is not None, r.usage)


@check("messages: Authorization: Bearer")
def _():
    r = claude_bearer.messages.create(model=CHAT, max_tokens=64, messages=HELLO)
    expect(r.content[0].text == EXPECT, r.content)


@check("messages: stream")
def _():
    kinds = []
    with claude.messages.stream(model=CHAT, max_tokens=64, messages=HELLO) as stream:
        for event in stream:
            kinds.append(event.type)
        final = stream.get_final_message()
    expect(kinds[0] == "message_start" and "content_block_delta" in kinds, kinds)
    expect(kinds[-1] == "message_stop", kinds)
    expect(final.content[0].text == EXPECT and final.stop_reason == "end_turn", final)
    expect(final.usage.output_tokens > 0, final.usage)


@check("messages: tools, then the tool result sent back; thinking passed on")
def _():
    r = claude.messages.create(
        model=TOOLS, max_tokens=2048, tools=[ANTHROPIC_TOOL], tool_choice={"type": "auto"},
        thinking={"type": "enabled", "budget_tokens": 1024},
        messages=[{"role": "user", "content": "Weather in Paris?"}],
    )
    uses = [b for b in r.content if b.type == "tool_use"]
    expect(r.stop_reason == "tool_use" and len(uses) == 1, r)
    expect(uses[0].name == "get_weather" and uses[0].input == WEATHER_ARGS, uses[0])
    again = claude.messages.create(
        model=CHAT, max_tokens=64, tools=[ANTHROPIC_TOOL],
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": uses[0].id, "content": "sunny"}]},
        ],
    )
    expect(again.content[0].text == EXPECT, again.content)


@check("messages: tools streamed (input_json_delta)")
def _():
    deltas = []
    with claude.messages.stream(
        model=TOOLS, max_tokens=64, tools=[ANTHROPIC_TOOL],
        messages=[{"role": "user", "content": "Weather in Paris?"}],
    ) as stream:
        for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                deltas.append(event.delta.partial_json)
        final = stream.get_final_message()
    uses = [b for b in final.content if b.type == "tool_use"]
    expect(len(deltas) > 1 and json.loads("".join(deltas)) == WEATHER_ARGS, deltas)
    expect(uses and uses[0].input == WEATHER_ARGS and final.stop_reason == "tool_use", final)


@check("messages: JSON answer")
def _():
    r = claude.messages.create(model=JSON_MODEL, max_tokens=64, messages=HELLO)
    expect(json.loads(r.content[0].text) == {"answer": 42}, r.content)


@check("messages: image")
def _():
    r = claude.messages.create(
        model=CHAT, max_tokens=64,
        messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
            {"type": "text", "text": "What is this?"},
        ]}],
    )
    expect(r.content[0].text == EXPECT, r.content)


@check("messages: models listed in the Anthropic shape")
def _():
    ids = [m.id for m in claude.models.list()]
    expect(CHAT in ids and TOOLS in ids, ids)
    expect(claude.models.retrieve(CHAT).type == "model", "retrieve")


@check("messages: errors in the Anthropic shape")
def _():
    bad = anthropic.Anthropic(base_url=ROOT_URL, api_key="sk-not-a-key", max_retries=0)
    try:
        bad.messages.create(model=CHAT, max_tokens=8, messages=HELLO)
        raise AssertionError("a wrong key was let through")
    except anthropic.AuthenticationError as e:
        expect(e.status_code == 401 and e.body["type"] == "error", e.body)
        expect(e.body["error"]["type"] == "authentication_error", e.body)
    try:
        claude.messages.create(model="no-such-model", max_tokens=8, messages=HELLO)
        raise AssertionError("an unknown model was served")
    except anthropic.NotFoundError as e:
        expect(e.body["error"]["type"] == "not_found_error", e.body)
        expect(e.body["error"]["code"] == "model_not_found", e.body)
    try:
        claude.messages.create(
            model=CHAT, max_tokens=8, messages=HELLO, extra_headers={"anthropic-version": "latest"}
        )
        raise AssertionError("a bad anthropic-version was taken")
    except anthropic.BadRequestError as e:
        expect(e.body["error"]["type"] == "invalid_request_error", e.body)
        expect("anthropic-version" in e.body["error"]["message"], e.body)


@check("messages: a stream cut after its first token raises")
def _():
    texts = []
    try:
        with claude.messages.stream(model=CUT, max_tokens=64, messages=HELLO) as stream:
            for text in stream.text_stream:
                texts.append(text)
        raise AssertionError(f"the stream ended cleanly after {texts!r}")
    except anthropic.APIStatusError as e:
        expect(texts and e.body["type"] == "error", (texts, e.body))
        expect(e.body["error"]["code"] == "stream_interrupted", e.body)


@check("messages: a stream that fails before its first token fails over unseen")
def _():
    with claude.messages.stream(model=FLAKY, max_tokens=64, messages=HELLO) as stream:
        text = "".join(stream.text_stream)
    expect(text == EXPECT, text)


# ------------------------------------------------------------------ OpenAI Responses API


@check("responses: string input, instructions, max_output_tokens, usage")
def _():
    r = gpt.responses.create(model=CHAT, input="Say hello.", instructions="Be brief.", max_output_tokens=64)
    expect(r.object == "response" and r.status == "completed", r)
    expect(r.output_text == EXPECT, r.output)
    expect(r.usage.output_tokens > 0 and r.usage.total_tokens >= r.usage.output_tokens, r.usage)


@check("responses: message items")
def _():
    r = gpt.responses.create(
        model=CHAT,
        input=[{"role": "developer", "content": "Be brief."},
               {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say hello."}]}],
    )
    expect(r.output_text == EXPECT, r.output)


@check("responses: stream of typed events")
def _():
    events = list(gpt.responses.create(model=CHAT, input="Say hello.", stream=True))
    kinds = [e.type for e in events]
    expect(kinds[0] == "response.created" and kinds[-1] == "response.completed", kinds)
    expect("response.output_item.added" in kinds, kinds)
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    expect(text == EXPECT, text)
    expect(events[-1].response.output_text == EXPECT, events[-1].response)
    expect([e.sequence_number for e in events] == list(range(len(events))), "sequence numbers")


@check("responses: function tools, then the call's output sent back")
def _():
    r = gpt.responses.create(model=TOOLS, input="Weather in Paris?", tools=[RESPONSES_TOOL])
    calls = [o for o in r.output if o.type == "function_call"]
    expect(len(calls) == 1 and calls[0].name == "get_weather", r.output)
    expect(json.loads(calls[0].arguments) == WEATHER_ARGS, calls[0].arguments)
    again = gpt.responses.create(
        model=CHAT, tools=[RESPONSES_TOOL],
        input=[{"role": "user", "content": "Weather in Paris?"},
               {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather",
                "arguments": calls[0].arguments},
               {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"}],
    )
    expect(again.output_text == EXPECT, again.output)


@check("responses: function call arguments streamed")
def _():
    events = list(gpt.responses.create(model=TOOLS, input="Weather in Paris?", tools=[RESPONSES_TOOL], stream=True))
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    expect(len(deltas) > 1 and json.loads("".join(deltas)) == WEATHER_ARGS, deltas)
    done = events[-1]
    expect(done.type == "response.completed", [e.type for e in events])
    expect(done.response.output[0].type == "function_call", done.response.output)


@check("responses: text.format json_schema")
def _():
    r = gpt.responses.create(
        model=JSON_MODEL, input="The answer?",
        text={"format": {"type": "json_schema", "name": "answer", "strict": True,
                         "schema": {"type": "object", "properties": {"answer": {"type": "integer"}},
                                    "required": ["answer"], "additionalProperties": False}}},
    )
    expect(json.loads(r.output_text) == {"answer": 42}, r.output_text)


@check("responses: image input")
def _():
    r = gpt.responses.create(
        model=CHAT,
        input=[{"role": "user", "content": [
            {"type": "input_text", "text": "What is this?"},
            {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}"}]}],
    )
    expect(r.output_text == EXPECT, r.output)


@check("responses: errors, and state refused")
def _():
    bad = openai.OpenAI(base_url=BASE_URL, api_key="sk-not-a-key", max_retries=0)
    try:
        bad.responses.create(model=CHAT, input="x")
        raise AssertionError("a wrong key was let through")
    except openai.AuthenticationError as e:
        expect(e.status_code == 401 and e.code == "invalid_api_key", e.body)
    for extra in ({"previous_response_id": "resp_123"}, {"store": True}):
        try:
            gpt.responses.create(model=CHAT, input="x", **extra)
            raise AssertionError(f"{extra} was served")
        except openai.BadRequestError as e:
            expect(e.code == "invalid_request" and next(iter(extra)) in e.message, e.body)


@check("responses: a stream cut after its first token ends with error and response.failed")
def _():
    events = list(gpt.responses.create(model=CUT, input="Count.", stream=True))
    kinds = [e.type for e in events]
    expect(any(e.type == "response.output_text.delta" for e in events), kinds)
    expect(kinds[-2:] == ["error", "response.failed"], kinds)
    expect("response.completed" not in kinds, kinds)
    expect(events[-1].response.status == "failed", events[-1])


@check("responses: a stream that fails before its first token fails over unseen")
def _():
    events = list(gpt.responses.create(model=FLAKY, input="Say hello.", stream=True))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    expect(text == EXPECT and events[-1].type == "response.completed", [e.type for e in events])


sys.exit(1 if failures else 0)
