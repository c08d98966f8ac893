use serde_json::{json, Value};

use super::errors::{error_body, error_from_openai};
use super::request::{count_tokens, counted_request, to_chat_request};
use super::response::{finish_reason, from_chat_response};
use super::route::{is_gemini_path, route, take_query_key, wants_sse, Route};
use super::stream::StreamEncoder;
use crate::wire::sse::FromChatStream;
use crate::wire::sse::Parser;

#[test]
fn routes_of_the_gemini_api() {
    assert_eq!(
        route(
            "POST",
            "/v1beta/models/gemini-2.5-pro:streamGenerateContent"
        ),
        Route::Generate {
            model: "gemini-2.5-pro".into(),
            stream: true
        }
    );
    assert_eq!(
        route("POST", "/v1/models/openai%2Fgpt-4o:generateContent"),
        Route::Generate {
            model: "openai/gpt-4o".into(),
            stream: false
        }
    );
    assert_eq!(
        route("POST", "/v1beta/models/a/b:countTokens"),
        Route::CountTokens {
            model: "a/b".into()
        }
    );
    assert_eq!(route("GET", "/v1beta/models"), Route::Models(None));
    assert_eq!(
        route("GET", "/v1beta/models/m1"),
        Route::Models(Some("m1".into()))
    );
    assert_eq!(
        route("POST", "/v1beta/models/m1:embedContent"),
        Route::Embed {
            model: "m1".into(),
            batch: false
        }
    );
    assert_eq!(
        route("POST", "/v1beta/models/m1:batchEmbedContents"),
        Route::Embed {
            model: "m1".into(),
            batch: true
        }
    );
    assert_eq!(route("POST", "/v1beta/models/m1:predict"), Route::Unserved);
    assert_eq!(route("GET", "/v1beta/files"), Route::Unserved);
    assert!(is_gemini_path("/v1beta/models"));
    assert!(is_gemini_path("/v1/models/m1:generateContent"));
    assert!(!is_gemini_path("/v1/models/m1"));
    assert!(!is_gemini_path("/v1/models"));
}

#[test]
fn the_query_key_is_taken_out() {
    assert_eq!(
        take_query_key("alt=sse&key=sk-1%2B2"),
        ("alt=sse".to_string(), Some("sk-1+2".to_string()))
    );
    assert_eq!(
        take_query_key("key=abc"),
        (String::new(), Some("abc".into()))
    );
    assert_eq!(take_query_key("alt=sse"), ("alt=sse".into(), None));
    assert!(wants_sse("key=x&alt=sse"));
    assert!(!wants_sse("alt=json"));
}

#[test]
fn a_request_becomes_a_chat_request() {
    let body = json!({
        "systemInstruction": { "parts": [{ "text": "Be brief." }] },
        "contents": [
            { "role": "user", "parts": [{ "text": "What is 2+2?" },
                { "inlineData": { "mimeType": "image/png", "data": "iVBO" } }] },
            { "role": "model", "parts": [{ "text": "hmm", "thought": true },
                { "functionCall": { "name": "add", "args": { "a": 2, "b": 2 } },
                  "thoughtSignature": "sig" }] },
            { "role": "user", "parts": [{ "functionResponse": { "name": "add",
                "response": { "result": 4 } } }] },
        ],
        "generationConfig": { "temperature": 0.1, "topP": 0.9, "topK": 40,
            "maxOutputTokens": 100, "stopSequences": ["END"], "candidateCount": 1,
            "thinkingConfig": { "thinkingBudget": 0 } },
        "safetySettings": [{ "category": "HARM_CATEGORY_HATE_SPEECH", "threshold": "BLOCK_NONE" }],
        "tools": [{ "functionDeclarations": [
            { "name": "add", "description": "Adds.", "parameters": { "type": "OBJECT",
              "properties": { "a": { "type": "INTEGER" }, "b": { "type": "INTEGER" } },
              "required": ["a", "b"] } },
            { "name": "ls", "parametersJsonSchema": { "type": "object", "properties": {} } },
        ]}],
        "toolConfig": { "functionCallingConfig": { "mode": "ANY", "allowedFunctionNames": ["add"] } },
        "someFieldFromTheFuture": { "x": 1 },
    });
    let out = to_chat_request("m1", true, &body).unwrap();
    assert_eq!(
        out,
        json!({
            "model": "m1",
            "stream": true,
            "messages": [
                { "role": "system", "content": "Be brief." },
                { "role": "user", "content": [
                    { "type": "text", "text": "What is 2+2?" },
                    { "type": "image_url", "image_url": { "url": "data:image/png;base64,iVBO" } },
                ]},
                { "role": "assistant", "content": null, "tool_calls": [{ "id": "call_1_add",
                    "type": "function", "function": { "name": "add", "arguments": "{\"a\":2,\"b\":2}" } }] },
                { "role": "tool", "tool_call_id": "call_1_add", "content": "{\"result\":4}" },
            ],
            "temperature": 0.1, "top_p": 0.9, "max_tokens": 100, "stop": ["END"],
            "tools": [
                { "type": "function", "function": { "name": "add", "description": "Adds.",
                  "parameters": { "type": "object", "properties": { "a": { "type": "integer" },
                    "b": { "type": "integer" } }, "required": ["a", "b"] } } },
                { "type": "function", "function": { "name": "ls",
                  "parameters": { "type": "object", "properties": {} } } },
            ],
            "tool_choice": { "type": "function", "function": { "name": "add" } },
        })
    );
}

#[test]
fn call_ids_are_kept_when_sent() {
    let body = json!({ "contents": [
        { "role": "user", "parts": [{ "text": "hi" }] },
        { "role": "model", "parts": [{ "functionCall": { "id": "c9", "name": "f", "args": {} } }] },
        { "role": "user", "parts": [{ "functionResponse": { "id": "c9", "name": "f", "response": { "output": "ok" } } },
                                    { "text": "and then?" }] },
    ]});
    let out = to_chat_request("m", false, &body).unwrap();
    let messages = out["messages"].as_array().unwrap();
    assert_eq!(messages[1]["tool_calls"][0]["id"], "c9");
    assert_eq!(
        messages[2],
        json!({ "role": "tool", "tool_call_id": "c9", "content": "{\"output\":\"ok\"}" })
    );
    assert_eq!(
        messages[3],
        json!({ "role": "user", "content": "and then?" })
    );
    assert!(out.get("stream").is_none());
}

#[test]
fn what_runs_only_at_google_is_refused_naming_it() {
    let refuse = |body: Value| to_chat_request("m", false, &body).unwrap_err();
    let turn = json!([{ "role": "user", "parts": [{ "text": "hi" }] }]);
    let e = refuse(json!({ "contents": turn, "tools": [{ "googleSearch": {} }] }));
    assert_eq!(e.param, Some("tools"));
    assert!(e.message.contains("googleSearch"), "{}", e.message);
    let e = refuse(json!({ "contents": turn, "cachedContent": "cachedContents/x" }));
    assert_eq!(e.param, Some("cachedContent"));
    let e = refuse(json!({ "contents": turn, "generationConfig": { "candidateCount": 2 } }));
    assert_eq!(e.param, Some("generationConfig"));
    let e = refuse(
        json!({ "contents": turn, "generationConfig": { "responseModalities": ["TEXT", "IMAGE"] } }),
    );
    assert!(e.message.contains("IMAGE"));
    let e = refuse(json!({ "contents": [{ "role": "user", "parts": [
        { "inlineData": { "mimeType": "application/pdf", "data": "JVBE" } }] }] }));
    assert_eq!(e.param, Some("contents"));
    assert!(e.message.contains("application/pdf"));
    let e = refuse(json!({ "contents": [{ "role": "system", "parts": [] }] }));
    assert!(e.message.contains("user or model"));
    assert_eq!(refuse(json!({})).param, Some("contents"));
}

#[test]
fn json_output_becomes_a_response_format() {
    let out = to_chat_request("m", false, &json!({ "contents": [],
        "generationConfig": { "responseMimeType": "application/json",
            "responseSchema": { "type": "OBJECT", "properties": { "n": { "type": "NUMBER" } } } } }))
    .unwrap();
    assert_eq!(
        out["response_format"],
        json!({ "type": "json_schema", "json_schema": { "name": "output",
            "schema": { "type": "object", "properties": { "n": { "type": "number" } } } } })
    );
    let out = to_chat_request(
        "m",
        false,
        &json!({ "contents": [],
        "generationConfig": { "responseMimeType": "application/json" } }),
    )
    .unwrap();
    assert_eq!(out["response_format"], json!({ "type": "json_object" }));
}

#[test]
fn an_answer_becomes_a_generate_content_response() {
    let chat = json!({ "id": "chatcmpl-1", "model": "gpt-x", "choices": [{ "index": 0,
        "message": { "role": "assistant", "content": "Let me add.", "tool_calls": [
            { "id": "call_a", "type": "function", "function": { "name": "add", "arguments": "{\"a\":1}" } }] },
        "finish_reason": "tool_calls" }],
        "usage": { "prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14,
                   "prompt_tokens_details": { "cached_tokens": 3 } } });
    assert_eq!(
        from_chat_response(&chat),
        json!({ "candidates": [{ "content": { "role": "model", "parts": [
                { "text": "Let me add." },
                { "functionCall": { "id": "call_a", "name": "add", "args": { "a": 1 } } } ] },
            "finishReason": "STOP", "index": 0 }],
            "usageMetadata": { "promptTokenCount": 10, "candidatesTokenCount": 4,
                "totalTokenCount": 14, "cachedContentTokenCount": 3 },
            "modelVersion": "gpt-x", "responseId": "chatcmpl-1" })
    );
    let cut = json!({ "choices": [{ "message": { "content": "" }, "finish_reason": "length" }] });
    assert_eq!(
        from_chat_response(&cut)["candidates"][0]["finishReason"],
        "MAX_TOKENS"
    );
    assert_eq!(finish_reason("content_filter"), "SAFETY");
}

fn chat_stream() -> Vec<u8> {
    let chunks = [
        json!({ "id": "c1", "model": "gpt-x", "choices": [{ "index": 0, "delta": { "role": "assistant", "content": "" } }] }),
        json!({ "id": "c1", "model": "gpt-x", "choices": [{ "index": 0, "delta": { "content": "Hel" } }] }),
        json!({ "id": "c1", "model": "gpt-x", "choices": [{ "index": 0, "delta": { "content": "lo" } }] }),
        json!({ "id": "c1", "model": "gpt-x", "choices": [{ "index": 0, "delta": { "tool_calls": [
            { "index": 0, "id": "call_1", "type": "function", "function": { "name": "ls", "arguments": "{\"di" } }] } }] }),
        json!({ "id": "c1", "model": "gpt-x", "choices": [{ "index": 0, "delta": { "tool_calls": [
            { "index": 0, "function": { "arguments": "r\":\".\"}" } }] }, "finish_reason": "tool_calls" }] }),
        json!({ "id": "c1", "model": "gpt-x", "choices": [], "usage": { "prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7 } }),
    ];
    let mut sse: Vec<u8> = chunks
        .iter()
        .flat_map(|c| format!("data: {c}\n\n").into_bytes())
        .collect();
    sse.extend_from_slice(b"data: [DONE]\n\n");
    sse
}

fn encode(json_array: bool, sse: &[u8], cut: usize) -> Vec<u8> {
    let mut parser = Parser::new();
    let mut encoder = StreamEncoder::new(json_array);
    let mut out = Vec::new();
    for piece in [&sse[..cut], &sse[cut..]] {
        for event in parser.feed(piece) {
            out.extend(encoder.feed(&event));
        }
    }
    out
}

#[test]
fn a_stream_becomes_generate_content_chunks_at_any_chunk_boundary() {
    let sse = chat_stream();
    let whole = encode(false, &sse, 0);
    for cut in 1..sse.len() {
        assert_eq!(encode(false, &sse, cut), whole, "cut at {cut}");
    }
    let mut parser = Parser::new();
    let events: Vec<Value> = parser
        .feed(&whole)
        .iter()
        .map(|e| serde_json::from_str(&e.data).unwrap())
        .collect();
    assert_eq!(events.len(), 3);
    assert_eq!(
        events[0]["candidates"][0]["content"]["parts"][0]["text"],
        "Hel"
    );
    assert_eq!(
        events[1]["candidates"][0]["content"]["parts"][0]["text"],
        "lo"
    );
    assert_eq!(
        events[2]["candidates"][0],
        json!({ "content": { "role": "model", "parts": [{ "functionCall": {
            "id": "call_1", "name": "ls", "args": { "dir": "." } } }] },
            "finishReason": "STOP", "index": 0 })
    );
    assert_eq!(events[2]["usageMetadata"]["totalTokenCount"], 7);
    assert_eq!(events[2]["modelVersion"], "gpt-x");
    // Without alt=sse: one JSON array of the same chunks.
    let array: Value = serde_json::from_slice(&encode(true, &sse, 17)).unwrap();
    assert_eq!(array.as_array().unwrap().len(), 3);
    assert_eq!(array[2], events[2]);
}

#[test]
fn a_cut_stream_ends_with_an_error_in_googles_shape() {
    let mut encoder = StreamEncoder::new(true);
    let mut out = Vec::new();
    encoder.chunk(
        &mut out,
        &json!({ "choices": [{ "delta": { "content": "Hi" } }] }),
    );
    encoder.fail(&mut out, &json!({ "message": "the provider went away" }));
    let array: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(array[1]["error"]["status"], "UNAVAILABLE");
    assert!(encoder.ended());
    let mut empty = StreamEncoder::new(true);
    let mut out = Vec::new();
    empty.close(&mut out);
    assert_eq!(out, b"[]");
}

#[test]
fn errors_take_googles_shape() {
    let v = error_body(401, "invalid_api_key", "bad key");
    assert_eq!(v["error"]["code"], 401);
    assert_eq!(v["error"]["status"], "UNAUTHENTICATED");
    assert_eq!(v["error"]["details"][0]["reason"], "invalid_api_key");
    let openai = br#"{"error":{"message":"All lanes failed.","type":"server_error","code":"upstream_error","trail":{"skipped":[]}}}"#;
    let v: Value = serde_json::from_slice(&error_from_openai(502, openai)).unwrap();
    assert_eq!(v["error"]["message"], "All lanes failed.");
    assert_eq!(v["error"]["status"], "UNAVAILABLE");
    assert_eq!(v["error"]["details"][0]["reason"], "upstream_error");
    assert!(v["error"]["trail"].is_object());
}

#[test]
fn count_tokens_is_estimated() {
    let n = count_tokens(
        &json!({ "contents": [{ "role": "user", "parts": [{ "text": "Hello there" }] }] }),
    );
    assert!(n["totalTokens"].as_u64().unwrap() > 0);
    let wrapped = json!({ "generateContentRequest": { "model": "models/m", "contents": [] } });
    assert_eq!(counted_request(&wrapped)["contents"], json!([]));
}
