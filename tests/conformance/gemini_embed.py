"""Google's `google-genai` Python SDK's `embed_content` against the gateway's Gemini API (the
SDK calls `:batchEmbedContents` for one text and for many), on the model `AI_ROUTER_MODEL`:
one vector of `AI_ROUTER_DIMENSIONS` floats per text, in order. Run by tests/tests/conformance.rs
on a native gemini lane and on a translated (OpenAI-compatible) one."""

import os

from google import genai
from google.genai import types

client = genai.Client(
    api_key=os.environ["GEMINI_API_KEY"],
    http_options=types.HttpOptions(base_url=os.environ["GOOGLE_GEMINI_BASE_URL"]),
)
MODEL = os.environ["AI_ROUTER_MODEL"]
DIMENSIONS = int(os.environ["AI_ROUTER_DIMENSIONS"])

one = client.models.embed_content(
    model=MODEL,
    contents="hello",
    config=types.EmbedContentConfig(task_type="RETRIEVAL_QUERY"),
)
assert len(one.embeddings) == 1, one
assert len(one.embeddings[0].values) == DIMENSIONS, one
print("ok   embed_content: one text")

many = client.models.embed_content(model=MODEL, contents=["hello", "world", "again"])
assert len(many.embeddings) == 3, many
assert all(len(e.values) == DIMENSIONS for e in many.embeddings), many
assert many.embeddings[0].values == one.embeddings[0].values, (many, one)
assert many.embeddings[1].values != many.embeddings[0].values, many
print("ok   embed_content: a batch, in order")
