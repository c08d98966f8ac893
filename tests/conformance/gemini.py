"""Google's `google-genai` Python SDK against the gateway's Gemini API, with the README's
settings ("Use it with…"): `http_options.base_url` at the gateway, the virtual key as `api_key`.
A text answer, a streamed one and a function call round trip. Run by tests/tests/agents.rs."""

import os

from google import genai
from google.genai import types

client = genai.Client(
    api_key=os.environ["GEMINI_API_KEY"],
    http_options=types.HttpOptions(base_url=os.environ["GOOGLE_GEMINI_BASE_URL"]),
)
MODEL = os.environ["AI_ROUTER_MODEL"]
EXPECT = os.environ["AI_ROUTER_EXPECT"]
TOOLS = os.environ["AI_ROUTER_TOOLS_MODEL"]

r = client.models.generate_content(
    model=MODEL,
    contents="Say hello.",
    config=types.GenerateContentConfig(system_instruction="Be brief.", max_output_tokens=64),
)
assert r.text == EXPECT, r
assert r.usage_metadata.total_token_count > 0, r.usage_metadata
print("ok   generate_content: text")

text = "".join(c.text or "" for c in client.models.generate_content_stream(model=MODEL, contents="Say hello."))
assert text == EXPECT, text
print("ok   generate_content_stream: text")

weather = types.FunctionDeclaration(
    name="get_weather",
    description="The weather in a city.",
    parameters=types.Schema(
        type=types.Type.OBJECT,
        properties={"city": types.Schema(type=types.Type.STRING)},
        required=["city"],
    ),
)
config = types.GenerateContentConfig(
    tools=[types.Tool(function_declarations=[weather])],
    automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
)
contents = [types.Content(role="user", parts=[types.Part(text="Weather in Paris?")])]
first = client.models.generate_content(model=TOOLS, contents=contents, config=config)
calls = first.function_calls or []
assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].args["city"] == "Paris", first
contents.append(first.candidates[0].content)
contents.append(
    types.Content(
        role="user",
        parts=[types.Part.from_function_response(name="get_weather", response={"output": "sunny"})],
    )
)
second = client.models.generate_content(model=TOOLS, contents=contents, config=config)
assert second.text, second
print("ok   function call round trip")
