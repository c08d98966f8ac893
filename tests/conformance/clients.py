"""Real OpenAI clients against the gateway: the `openai` SDK and `langchain-openai`, each with a
unary chat and a stream, plus the SDK's view of the gateway's errors.

Run by tests/tests/conformance.rs with:
  AI_ROUTER_BASE_URL   the gateway's OpenAI base URL (http://127.0.0.1:<port>/v1)
  AI_ROUTER_API_KEY    a virtual key
  AI_ROUTER_MODEL      the model to ask for
  AI_ROUTER_EXPECT     the text every answer must be
Exits 0 when every check passes, 1 otherwise, printing one line per check.
"""

import os
import sys
import traceback

import openai
from langchain_openai import ChatOpenAI

BASE_URL = os.environ["AI_ROUTER_BASE_URL"]
API_KEY = os.environ["AI_ROUTER_API_KEY"]
MODEL = os.environ["AI_ROUTER_MODEL"]
EXPECT = os.environ["AI_ROUTER_EXPECT"]
MESSAGES = [{"role": "user", "content": "Say hello."}]

failures = []


def check(name, fn):
    try:
        fn()
        print(f"ok   {name}")
    except Exception:  # noqa: BLE001 - every failure is reported, then the run fails
        failures.append(name)
        print(f"FAIL {name}")
        traceback.print_exc(file=sys.stdout)


def expect_equal(what, got, want):
    if got != want:
        raise AssertionError(f"{what}: got {got!r}, want {want!r}")


client = openai.OpenAI(base_url=BASE_URL, api_key=API_KEY, max_retries=0, timeout=60)


def openai_chat():
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=MESSAGES)
    completion = raw.parse()
    expect_equal("content", completion.choices[0].message.content, EXPECT)
    expect_equal("object", completion.object, "chat.completion")
    if not raw.headers.get("x-request-id"):
        raise AssertionError("no x-request-id header")


def openai_stream():
    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    roles, parts = 0, []
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        if delta.role:
            roles += 1
        if delta.content:
            parts.append(delta.content)
    expect_equal("streamed content", "".join(parts), EXPECT)
    expect_equal("role chunks", roles, 1)


def openai_stream_with_usage():
    stream = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    parts = []
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
    expect_equal("streamed content", "".join(parts), EXPECT)


def openai_errors():
    bad = openai.OpenAI(base_url=BASE_URL, api_key="sk-starci-e2e-" + "0" * 48, max_retries=0)
    try:
        bad.chat.completions.create(model=MODEL, messages=MESSAGES)
        raise AssertionError("a wrong key was accepted")
    except openai.AuthenticationError as e:
        expect_equal("status", e.status_code, 401)
        expect_equal("code", e.code, "invalid_api_key")
    try:
        client.chat.completions.create(model="no-such-model", messages=MESSAGES)
        raise AssertionError("an unknown model was accepted")
    except openai.NotFoundError as e:
        expect_equal("status", e.status_code, 404)
        expect_equal("code", e.code, "model_not_found")


def openai_models():
    ids = [m.id for m in client.models.list()]
    if MODEL not in ids:
        raise AssertionError(f"{MODEL} not in /v1/models: {ids}")


llm = ChatOpenAI(model=MODEL, api_key=API_KEY, base_url=BASE_URL, max_retries=0, timeout=60)


def langchain_invoke():
    expect_equal("content", llm.invoke("Say hello.").content, EXPECT)


def langchain_stream():
    expect_equal("streamed content", "".join(str(c.content) for c in llm.stream("Say hello.")), EXPECT)


check("openai: chat", openai_chat)
check("openai: stream", openai_stream)
check("openai: stream with include_usage", openai_stream_with_usage)
check("openai: errors", openai_errors)
check("openai: models", openai_models)
check("langchain-openai: invoke", langchain_invoke)
check("langchain-openai: stream", langchain_stream)

if failures:
    print(f"{len(failures)} check(s) failed: {', '.join(failures)}")
    sys.exit(1)
print("all client checks passed")
