"""The official clients read answers the gateway's response cache replays: the `anthropic` SDK
on `POST /v1/messages` and the `openai` SDK's `client.responses` on `POST /v1/responses`, each
asked once (a miss, answered by the provider), then the same request again unary and streamed
(hits, answered by the gateway in the caller's protocol); and a streamed miss whose unary
repeat is a hit.

Run by tests/tests/cache_protocols.rs, which counts the provider calls. Environment:
  AI_ROUTER_BASE_URL   the gateway's OpenAI base URL (http://127.0.0.1:<port>/v1)
  AI_ROUTER_API_KEY    a virtual key
  AI_ROUTER_MODEL      a model whose provider answers AI_ROUTER_EXPECT
  AI_ROUTER_EXPECT     the provider's text
Exits 0 when every check passes, 1 otherwise, printing one line per check.
"""

import os
import sys
import traceback

import anthropic
import openai

BASE_URL = os.environ["AI_ROUTER_BASE_URL"]
ROOT_URL = BASE_URL[: -len("/v1")] if BASE_URL.endswith("/v1") else BASE_URL
API_KEY = os.environ["AI_ROUTER_API_KEY"]
MODEL = os.environ["AI_ROUTER_MODEL"]
EXPECT = os.environ["AI_ROUTER_EXPECT"]
CACHE = "x-ai-router-cache"

claude = anthropic.Anthropic(base_url=ROOT_URL, api_key=API_KEY, max_retries=0, timeout=60)
gpt = openai.OpenAI(base_url=BASE_URL, api_key=API_KEY, max_retries=0, timeout=60)

MESSAGES = [{"role": "user", "content": "Cache me, Claude."}]
INPUT = "Cache me, GPT."

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


first = {}


@check("messages: the first call is a miss")
def _():
    raw = claude.messages.with_raw_response.create(model=MODEL, max_tokens=64, messages=MESSAGES)
    expect(raw.headers.get(CACHE) == "miss", dict(raw.headers))
    m = raw.parse()
    expect(m.content[0].text == EXPECT, m)
    first["message"] = m


@check("messages: the same call is a hit, the same message")
def _():
    raw = claude.messages.with_raw_response.create(model=MODEL, max_tokens=64, messages=MESSAGES)
    expect(raw.headers.get(CACHE) == "hit", dict(raw.headers))
    expect(raw.headers.get("x-ai-router-cost") == "0", dict(raw.headers))
    m = raw.parse()
    expect(m.id == first["message"].id and m.content[0].text == EXPECT, m)
    expect(m.stop_reason == "end_turn" and m.usage.output_tokens > 0, m)


@check("messages: a streamed hit reads through the stream helper")
def _():
    kinds = []
    with claude.messages.stream(model=MODEL, max_tokens=64, messages=MESSAGES) as stream:
        expect(stream.response.headers.get(CACHE) == "hit", dict(stream.response.headers))
        for event in stream:
            kinds.append(event.type)
        final = stream.get_final_message()
    expect(kinds[0] == "message_start" and kinds[-1] == "message_stop", kinds)
    expect("content_block_delta" in kinds, kinds)
    expect(final.content[0].text == EXPECT and final.stop_reason == "end_turn", final)
    expect(final.id == first["message"].id, final)
    expect(final.usage.output_tokens == first["message"].usage.output_tokens, final.usage)


@check("messages: a raw streamed hit yields every event type")
def _():
    events = list(claude.messages.create(model=MODEL, max_tokens=64, messages=MESSAGES, stream=True))
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    expect(text == EXPECT, [e.type for e in events])


@check("responses: the first call is a miss")
def _():
    raw = gpt.responses.with_raw_response.create(model=MODEL, input=INPUT)
    expect(raw.headers.get(CACHE) == "miss", dict(raw.headers))
    r = raw.parse()
    expect(r.output_text == EXPECT and r.status == "completed", r)
    first["response"] = r


@check("responses: the same call is a hit, the same response")
def _():
    raw = gpt.responses.with_raw_response.create(model=MODEL, input=INPUT)
    expect(raw.headers.get(CACHE) == "hit", dict(raw.headers))
    r = raw.parse()
    expect(r.id == first["response"].id and r.output_text == EXPECT, r)
    expect(r.usage.output_tokens == first["response"].usage.output_tokens, r.usage)


@check("responses: a streamed hit of typed events")
def _():
    events = list(gpt.responses.create(model=MODEL, input=INPUT, stream=True))
    kinds = [e.type for e in events]
    expect(kinds[0] == "response.created" and kinds[-1] == "response.completed", kinds)
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    expect(text == EXPECT, kinds)
    expect(events[-1].response.id == first["response"].id, events[-1])
    expect([e.sequence_number for e in events] == list(range(len(events))), kinds)


@check("responses: a streamed hit through the stream helper")
def _():
    with gpt.responses.stream(model=MODEL, input=INPUT) as stream:
        for _event in stream:
            pass
        final = stream.get_final_response()
    expect(final.output_text == EXPECT and final.status == "completed", final)


@check("messages: a streamed miss is stored, its unary repeat is a hit")
def _():
    asked = [{"role": "user", "content": "Stream me first, Claude."}]
    with claude.messages.stream(model=MODEL, max_tokens=64, messages=asked) as stream:
        expect(stream.response.headers.get(CACHE) == "miss", dict(stream.response.headers))
        streamed = stream.get_final_message()
    raw = claude.messages.with_raw_response.create(model=MODEL, max_tokens=64, messages=asked)
    expect(raw.headers.get(CACHE) == "hit", dict(raw.headers))
    m = raw.parse()
    expect(m.id == streamed.id and m.content[0].text == EXPECT, m)


@check("responses: a streamed miss is stored, its unary repeat is a hit")
def _():
    asked = "Stream me first, GPT."
    events = list(gpt.responses.create(model=MODEL, input=asked, stream=True))
    expect(events[-1].type == "response.completed", [e.type for e in events])
    raw = gpt.responses.with_raw_response.create(model=MODEL, input=asked)
    expect(raw.headers.get(CACHE) == "hit", dict(raw.headers))
    r = raw.parse()
    expect(r.id == events[-1].response.id and r.output_text == EXPECT, r)


sys.exit(1 if failures else 0)
