"""Real OpenAI clients against the gateway, beyond plain chat: the `openai` SDK and
`langchain-openai` with streams, tool calls (unary and streamed), JSON mode and embeddings.

Run by tests/tests/conformance.rs, once with an OpenAI-compatible provider behind the gateway
and once with an Anthropic one (embeddings then come from an OpenAI-compatible provider: the
Anthropic kind has no embeddings API). Environment:
  AI_ROUTER_BASE_URL     the gateway's OpenAI base URL (http://127.0.0.1:<port>/v1)
  AI_ROUTER_API_KEY      a virtual key
  AI_ROUTER_CHAT_MODEL   answers AI_ROUTER_EXPECT (unary and streamed)
  AI_ROUTER_EXPECT       the chat model's text
  AI_ROUTER_TOOLS_MODEL  answers with one call of get_weather({"city": "Paris"})
  AI_ROUTER_JSON_MODEL   answers {"answer": 42}
  AI_ROUTER_EMBED_MODEL  an embeddings model of AI_ROUTER_EMBED_DIMENSIONS dimensions
Exits 0 when every check passes, 1 otherwise, printing one line per check.
"""

import json
import os
import sys
import traceback

import openai
from langchain_openai import ChatOpenAI, OpenAIEmbeddings

BASE_URL = os.environ["AI_ROUTER_BASE_URL"]
API_KEY = os.environ["AI_ROUTER_API_KEY"]
CHAT = os.environ["AI_ROUTER_CHAT_MODEL"]
EXPECT = os.environ["AI_ROUTER_EXPECT"]
TOOLS = os.environ["AI_ROUTER_TOOLS_MODEL"]
JSON_MODEL = os.environ["AI_ROUTER_JSON_MODEL"]
EMBED = os.environ["AI_ROUTER_EMBED_MODEL"]
DIMENSIONS = int(os.environ["AI_ROUTER_EMBED_DIMENSIONS"])
MESSAGES = [{"role": "user", "content": "Say hello."}]
WEATHER_ARGS = {"city": "Paris"}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}

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
    completion = client.chat.completions.create(
        model=CHAT,
        messages=[{"role": "system", "content": "Be brief."}] + MESSAGES,
        temperature=0.2,
        max_tokens=64,
    )
    expect_equal("content", completion.choices[0].message.content, EXPECT)
    expect_equal("object", completion.object, "chat.completion")
    expect_equal("finish_reason", completion.choices[0].finish_reason, "stop")
    if completion.usage is None or completion.usage.total_tokens <= 0:
        raise AssertionError(f"no usage: {completion.usage!r}")


def openai_stream():
    roles, parts, usage, finish = 0, [], [], []
    for chunk in client.chat.completions.create(model=CHAT, messages=MESSAGES, stream=True):
        if chunk.usage is not None:
            usage.append(chunk.usage)
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        if delta.role:
            roles += 1
        if delta.content:
            parts.append(delta.content)
        if chunk.choices[0].finish_reason:
            finish.append(chunk.choices[0].finish_reason)
    expect_equal("streamed content", "".join(parts), EXPECT)
    expect_equal("role chunks", roles, 1)
    expect_equal("finish reasons", finish, ["stop"])
    expect_equal("usage chunks without include_usage", usage, [])


def openai_stream_with_usage():
    parts, usage = [], []
    stream = client.chat.completions.create(
        model=CHAT, messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    for chunk in stream:
        if chunk.usage is not None:
            usage.append(chunk.usage)
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
    expect_equal("streamed content", "".join(parts), EXPECT)
    expect_equal("usage chunks", len(usage), 1)
    if usage[0].total_tokens <= 0:
        raise AssertionError(f"empty usage: {usage[0]!r}")


def openai_tool_call():
    completion = client.chat.completions.create(
        model=TOOLS,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    choice = completion.choices[0]
    expect_equal("finish_reason", choice.finish_reason, "tool_calls")
    calls = choice.message.tool_calls or []
    expect_equal("tool calls", len(calls), 1)
    expect_equal("tool name", calls[0].function.name, "get_weather")
    expect_equal("tool arguments", json.loads(calls[0].function.arguments), WEATHER_ARGS)
    if not calls[0].id:
        raise AssertionError("the tool call has no id")
    # The tool's result goes back in the conversation.
    follow_up = client.chat.completions.create(
        model=CHAT,
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": calls[0].id,
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": calls[0].function.arguments},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": calls[0].id, "content": "21 degrees, sunny"},
        ],
        tools=[WEATHER_TOOL],
    )
    expect_equal("answer after the tool result", follow_up.choices[0].message.content, EXPECT)


def openai_streamed_tool_call():
    calls, finish = {}, []
    stream = client.chat.completions.create(
        model=TOOLS,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER_TOOL],
        stream=True,
    )
    for chunk in stream:
        if not chunk.choices:
            continue
        for d in chunk.choices[0].delta.tool_calls or []:
            call = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
            if d.id:
                call["id"] = d.id
            if d.function and d.function.name:
                call["name"] += d.function.name
            if d.function and d.function.arguments:
                call["arguments"] += d.function.arguments
        if chunk.choices[0].finish_reason:
            finish.append(chunk.choices[0].finish_reason)
    expect_equal("streamed tool calls", len(calls), 1)
    expect_equal("tool name", calls[0]["name"], "get_weather")
    expect_equal("tool arguments", json.loads(calls[0]["arguments"]), WEATHER_ARGS)
    if not calls[0]["id"]:
        raise AssertionError("the streamed tool call has no id")
    expect_equal("finish reasons", finish, ["tool_calls"])


def openai_json_mode():
    completion = client.chat.completions.create(
        model=JSON_MODEL,
        messages=[{"role": "user", "content": "The answer, as JSON."}],
        response_format={"type": "json_object"},
    )
    expect_equal("JSON content", json.loads(completion.choices[0].message.content), {"answer": 42})


def openai_embeddings():
    # The SDK asks for base64 unless told otherwise, and decodes it.
    result = client.embeddings.create(model=EMBED, input=["alpha", "beta"])
    expect_equal("vectors", len(result.data), 2)
    expect_equal("dimensions", [len(d.embedding) for d in result.data], [DIMENSIONS, DIMENSIONS])
    expect_equal("indexes", [d.index for d in result.data], [0, 1])
    floats = client.embeddings.create(model=EMBED, input="alpha", encoding_format="float")
    expect_equal("float dimensions", len(floats.data[0].embedding), DIMENSIONS)
    for a, b in zip(floats.data[0].embedding, result.data[0].embedding):
        if abs(a - b) > 1e-6:
            raise AssertionError("base64 and float encodings of one input differ")


llm = ChatOpenAI(model=CHAT, api_key=API_KEY, base_url=BASE_URL, max_retries=0, timeout=60)
tool_llm = ChatOpenAI(model=TOOLS, api_key=API_KEY, base_url=BASE_URL, max_retries=0, timeout=60)


def langchain_invoke():
    expect_equal("content", llm.invoke("Say hello.").content, EXPECT)


def langchain_stream():
    chunks = list(llm.stream("Say hello."))
    expect_equal("streamed content", "".join(str(c.content) for c in chunks), EXPECT)
    if len([c for c in chunks if c.content]) < 2:
        raise AssertionError(f"the answer came in one piece: {chunks!r}")


def langchain_bind_tools():
    message = tool_llm.bind_tools([WEATHER_TOOL], tool_choice="get_weather").invoke("Weather in Paris?")
    expect_equal("tool calls", [(c["name"], c["args"]) for c in message.tool_calls], [("get_weather", WEATHER_ARGS)])


def langchain_stream_tools():
    gathered = None
    for chunk in tool_llm.bind_tools([WEATHER_TOOL]).stream("Weather in Paris?"):
        gathered = chunk if gathered is None else gathered + chunk
    if gathered is None:
        raise AssertionError("no chunks")
    expect_equal(
        "streamed tool calls", [(c["name"], c["args"]) for c in gathered.tool_calls], [("get_weather", WEATHER_ARGS)]
    )


def langchain_json_mode():
    json_llm = ChatOpenAI(
        model=JSON_MODEL, api_key=API_KEY, base_url=BASE_URL, max_retries=0, timeout=60
    ).bind(response_format={"type": "json_object"})
    expect_equal("JSON content", json.loads(json_llm.invoke("The answer, as JSON.").content), {"answer": 42})


def langchain_embeddings():
    # check_embedding_ctx_length=False: send the text itself, as for any non-OpenAI model name
    # (the token-splitting path needs tiktoken's files from the internet).
    emb = OpenAIEmbeddings(
        model=EMBED, api_key=API_KEY, base_url=BASE_URL, max_retries=0, check_embedding_ctx_length=False
    )
    docs = emb.embed_documents(["alpha", "beta", "gamma"])
    expect_equal("documents", [len(v) for v in docs], [DIMENSIONS] * 3)
    expect_equal("query", len(emb.embed_query("alpha")), DIMENSIONS)


check("openai: chat", openai_chat)
check("openai: stream", openai_stream)
check("openai: stream with include_usage", openai_stream_with_usage)
check("openai: tool call and tool result", openai_tool_call)
check("openai: streamed tool call", openai_streamed_tool_call)
check("openai: JSON mode", openai_json_mode)
check("openai: embeddings", openai_embeddings)
check("langchain-openai: invoke", langchain_invoke)
check("langchain-openai: stream", langchain_stream)
check("langchain-openai: bind_tools", langchain_bind_tools)
check("langchain-openai: streamed tool calls", langchain_stream_tools)
check("langchain-openai: JSON mode", langchain_json_mode)
check("langchain-openai: OpenAIEmbeddings", langchain_embeddings)

if failures:
    print(f"{len(failures)} check(s) failed: {', '.join(failures)}")
    sys.exit(1)
print("all client checks passed")
