"""The `openai` SDK on streams the gateway cuts after their first token: each must raise, never
end as if the answer were complete.

Run by tests/tests/conformance.rs with:
  AI_ROUTER_BASE_URL   the gateway's OpenAI base URL (http://127.0.0.1:<port>/v1)
  AI_ROUTER_API_KEY    a virtual key
  AI_ROUTER_CUTS       comma-separated `model=how` pairs: how the SDK must see that model's
                       stream end, `api_error` (an OpenAI error event) or `transport` (a broken
                       transfer)
Prints one line per model, then exits 0 when every stream ended as expected, 1 otherwise.
"""

import os
import sys

import httpx
import openai

client = openai.OpenAI(
    base_url=os.environ["AI_ROUTER_BASE_URL"],
    api_key=os.environ["AI_ROUTER_API_KEY"],
    max_retries=0,
    timeout=60,
)


def how_it_ended(model):
    """Reads the stream to its end: what ended it and the content received before."""
    parts = []
    try:
        stream = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Count."}], stream=True
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
    except openai.APIError as e:
        if isinstance(e, openai.APIConnectionError):
            return "transport", parts, repr(e)
        return "api_error", parts, repr(e)
    except httpx.HTTPError as e:
        return "transport", parts, repr(e)
    return "complete", parts, ""


failed = False
for pair in os.environ["AI_ROUTER_CUTS"].split(","):
    model, want = pair.split("=")
    got, parts, error = how_it_ended(model)
    ok = got == want and parts
    failed |= not ok
    print(f"{'ok  ' if ok else 'FAIL'} {model}: ended by {got} (want {want}) after {parts!r} {error}")
sys.exit(1 if failed else 0)
