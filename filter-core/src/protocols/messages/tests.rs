use serde_json::{json, Value};

use super::errors::{error_from_openai, error_type};
use super::request::{count_tokens, to_chat_request, Fidelity, DROPPED_FIELDS, REFUSED_FIELDS};
use super::response::{from_chat_response, stop_reason};
use super::stream::StreamEncoder;
use crate::wire::sse::FromChatStream;
use crate::wire::sse::Parser;

fn strict(body: Value) -> Value {
    to_chat_request(&body, Fidelity::Strict).unwrap()
}

#[test]
fn a_minimal_request_becomes_a_chat_request() {
    let out = strict(
        json!({ "model": "claude", "max_tokens": 64, "system": "Be brief.",
        "messages": [{ "role": "user", "content": "Hi" }], "stop_sequences": ["END"],
        "temperature": 0.2, "stream": true, "metadata": { "user_id": "u1" } }),
    );
    assert_eq!(
        out,
        json!({ "model": "claude", "max_tokens": 64, "messages": [
            { "role": "system", "content": "Be brief." },
            { "role": "user", "content": "Hi" },
        ], "stop": ["END"], "temperature": 0.2, "stream": true, "user": "u1" })
    );
}

#[test]
fn max_tokens_and_messages_are_required() {
    let e = to_chat_request(&json!({ "messages": [] }), Fidelity::Lenient).unwrap_err();
    assert_eq!(e.param, Some("max_tokens"));
    let e = to_chat_request(&json!({ "max_tokens": 5 }), Fidelity::Lenient).unwrap_err();
    assert_eq!(e.param, Some("messages"));
    let e = to_chat_request(
        &json!({ "max_tokens": 5, "messages": [{ "role": "tool", "content": "x" }] }),
        Fidelity::Lenient,
    )
    .unwrap_err();
    assert!(e.message.contains("user, assistant or system"));
}

#[test]
fn system_blocks_images_tool_uses_and_results() {
    let out = strict(json!({ "max_tokens": 9,
    "system": [{ "type": "text", "text": "A" }, { "type": "text", "text": "B" }],
    "messages": [
        { "role": "user", "content": [
            { "type": "text", "text": "What is this?" },
            { "type": "image", "source": { "type": "base64", "media_type": "image/png", "data": "iVBO" } },
            { "type": "image", "source": { "type": "url", "url": "https://x.test/c.jpg" } },
        ]},
        { "role": "assistant", "content": [
            { "type": "thinking", "thinking": "hmm", "signature": "s" },
            { "type": "text", "text": "Let me look." },
            { "type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": { "city": "Paris" } },
        ]},
        { "role": "user", "content": [
            { "type": "tool_result", "tool_use_id": "toolu_1", "content": [{ "type": "text", "text": "sunny" }] },
            { "type": "text", "text": "And tomorrow?" },
        ]},
    ]}));
    let messages = out["messages"].as_array().unwrap();
    assert_eq!(
        messages[0],
        json!({ "role": "system", "content": "A\n\nB" })
    );
    assert_eq!(
        messages[1]["content"],
        json!([
            { "type": "text", "text": "What is this?" },
            { "type": "image_url", "image_url": { "url": "data:image/png;base64,iVBO" } },
            { "type": "image_url", "image_url": { "url": "https://x.test/c.jpg" } },
        ])
    );
    assert_eq!(
        messages[2],
        json!({ "role": "assistant", "content": "Let me look.", "tool_calls": [{
            "id": "toolu_1", "type": "function",
            "function": { "name": "get_weather", "arguments": "{\"city\":\"Paris\"}" } }] })
    );
    assert_eq!(
        messages[3],
        json!({ "role": "tool", "tool_call_id": "toolu_1", "content": "sunny" })
    );
    assert_eq!(
        messages[4],
        json!({ "role": "user", "content": "And tomorrow?" })
    );
}

#[test]
fn tools_and_tool_choice() {
    let out = strict(json!({ "max_tokens": 9, "messages": [],
        "tools": [{ "name": "f", "description": "d", "input_schema": { "type": "object", "properties": {} } }],
        "tool_choice": { "type": "any", "disable_parallel_tool_use": true } }));
    assert_eq!(
        out["tools"],
        json!([{ "type": "function", "function": { "name": "f", "description": "d",
            "parameters": { "type": "object", "properties": {} } } }])
    );
    assert_eq!(out["tool_choice"], "required");
    assert_eq!(out["parallel_tool_calls"], false);
    let out = strict(json!({ "max_tokens": 9, "messages": [],
        "tool_choice": { "type": "tool", "name": "f" } }));
    assert_eq!(out["tool_choice"]["function"]["name"], "f");
}

#[test]
fn what_only_anthropic_runs_is_refused_strictly_and_left_out_leniently() {
    let body = json!({ "max_tokens": 9, "messages": [{ "role": "user", "content": [
            { "type": "document", "source": { "type": "base64", "media_type": "application/pdf", "data": "JVBERi0=" } } ] }],
        "tools": [{ "type": "web_search_20250305", "name": "web_search" }] });
    let e = to_chat_request(&body, Fidelity::Strict).unwrap_err();
    assert!(e.message.contains("'document'"), "{e}");
    let out = to_chat_request(&body, Fidelity::Lenient).unwrap();
    assert!(out.get("tools").is_none());
    assert_eq!(out["messages"], json!([]));
}

#[test]
fn system_turns_fold_into_the_system_prompt_and_unmodelled_fields_follow_the_documented_rule() {
    let out = strict(json!({ "model": "c", "max_tokens": 9, "system": "A",
        "messages": [
            { "role": "user", "content": "hi" },
            { "role": "system", "content": [{ "type": "text", "text": "B" }] },
            { "role": "user", "content": [{ "type": "document",
                "source": { "type": "text", "media_type": "text/plain", "data": "doc" } }] },
        ],
        "thinking": { "type": "adaptive" }, "context_management": { "edits": [] },
        "output_config": { "effort": "high", "format": { "type": "json_schema", "schema": { "type": "object" } } },
        "top_k": 5, "some_field_of_next_year": 1, "temperature": null,
        "tools": [{ "name": "Later", "defer_loading": true, "strict": true,
                    "cache_control": { "type": "ephemeral" }, "input_schema": { "type": "object" } }] }));
    assert_eq!(
        out,
        json!({ "model": "c", "max_tokens": 9, "messages": [
            { "role": "system", "content": "A\n\nB" },
            { "role": "user", "content": "hi" },
            { "role": "user", "content": "doc" },
        ],
        "response_format": { "type": "json_schema", "json_schema": { "name": "output", "schema": { "type": "object" } } },
        "tools": [{ "type": "function", "function": { "name": "Later", "strict": true, "parameters": { "type": "object" } } }] })
    );
    for field in DROPPED_FIELDS {
        let mut body = json!({ "max_tokens": 9, "messages": [] });
        body[field] = json!({ "x": 1 });
        assert!(to_chat_request(&body, Fidelity::Strict).is_ok(), "{field}");
    }
    for field in REFUSED_FIELDS {
        let mut body = json!({ "max_tokens": 9, "messages": [] });
        body[field] = json!([{}]);
        let e = to_chat_request(&body, Fidelity::Strict).unwrap_err();
        assert_eq!(e.param, Some(field));
        assert!(to_chat_request(&body, Fidelity::Lenient).is_ok(), "{field}");
    }
}

#[test]
fn count_tokens_estimates_system_turns_and_tools() {
    let bare = count_tokens(&json!({ "messages": [{ "role": "user", "content": "hello" }] }));
    let more = count_tokens(&json!({ "system": "Be brief and exact.",
        "messages": [{ "role": "user", "content": "hello" }],
        "tools": [{ "name": "Bash", "input_schema": { "type": "object" } }] }));
    assert!(bare["input_tokens"].as_u64().unwrap() > 0);
    assert!(more["input_tokens"].as_u64() > bare["input_tokens"].as_u64());
}

#[test]
fn a_chat_completion_becomes_a_message_with_cache_tokens() {
    let chat = json!({ "id": "chatcmpl-abc", "model": "gpt", "choices": [{ "index": 0,
        "message": { "role": "assistant", "content": "Hi", "tool_calls": [{ "id": "call_1",
            "type": "function", "function": { "name": "f", "arguments": "{\"a\":1}" } }] },
        "finish_reason": "tool_calls" }],
        "usage": { "prompt_tokens": 10, "completion_tokens": 3, "prompt_tokens_details": { "cached_tokens": 4 } } });
    assert_eq!(
        from_chat_response(&chat),
        json!({ "id": "msg_abc", "type": "message", "role": "assistant", "model": "gpt",
            "content": [{ "type": "text", "text": "Hi" },
                        { "type": "tool_use", "id": "call_1", "name": "f", "input": { "a": 1 } }],
            "stop_reason": "tool_use", "stop_sequence": null,
            "usage": { "input_tokens": 6, "cache_creation_input_tokens": 0,
                       "cache_read_input_tokens": 4, "output_tokens": 3 } })
    );
    assert_eq!(stop_reason("length"), "max_tokens");
    assert_eq!(stop_reason("stop"), "end_turn");
}

const CHAT_STREAM: &str = concat!(
    "data: {\"id\":\"chatcmpl-1\",\"model\":\"gpt\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"chatcmpl-1\",\"model\":\"gpt\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"chatcmpl-1\",\"model\":\"gpt\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"chatcmpl-1\",\"model\":\"gpt\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"\"}}]},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"chatcmpl-1\",\"model\":\"gpt\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\\\"a\\\"\"}}]},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"chatcmpl-1\",\"model\":\"gpt\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\":1}\"}}]},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"chatcmpl-1\",\"model\":\"gpt\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
    "data: {\"id\":\"chatcmpl-1\",\"model\":\"gpt\",\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":5}}\n\n",
    "data: [DONE]\n\n",
);

/// The (event name, data) pairs of Messages SSE bytes.
fn events(bytes: &[u8]) -> Vec<(String, Value)> {
    Parser::new()
        .feed(bytes)
        .into_iter()
        .map(|e| {
            (
                e.name.unwrap_or_default(),
                serde_json::from_str(&e.data).unwrap(),
            )
        })
        .collect()
}

fn encode(chat: &[u8]) -> Vec<u8> {
    crate::wire::sse::translated_at_every_cut(chat, || {
        let mut encoder = StreamEncoder::new();
        move |event: &crate::wire::sse::Event| encoder.feed(event)
    })
}

#[test]
fn a_chat_stream_becomes_messages_events_at_any_chunk_boundary() {
    let whole = encode(CHAT_STREAM.as_bytes());
    let got = events(&whole);
    let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "ping",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
    );
    assert_eq!(got[0].1["message"]["id"], "msg_1");
    assert_eq!(got[3].1["delta"]["text"], "Hel");
    assert_eq!(got[6].1["content_block"]["name"], "f");
    assert_eq!(got[6].1["index"], 1);
    assert_eq!(got[7].1["delta"]["type"], "input_json_delta");
    assert_eq!(got[10].1["delta"]["stop_reason"], "tool_use");
    assert_eq!(got[10].1["usage"]["output_tokens"], 5);
    assert_eq!(got[10].1["usage"]["input_tokens"], 7);
}

#[test]
fn an_error_event_becomes_the_anthropic_error_event_and_ends_the_stream() {
    let chat = format!(
        "{}data: {{\"error\":{{\"message\":\"cut\",\"type\":\"api_error\",\"code\":\"stream_interrupted\"}}}}\n\ndata: [DONE]\n\n",
        &CHAT_STREAM[..CHAT_STREAM.find("data: {\"id\":\"chatcmpl-1\",\"model\":\"gpt\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo").unwrap()]
    );
    let got = events(&encode(chat.as_bytes()));
    let last = got.last().unwrap();
    assert_eq!(last.0, "error");
    assert_eq!(last.1["type"], "error");
    assert_eq!(last.1["error"]["message"], "cut");
    assert_eq!(last.1["error"]["code"], "stream_interrupted");
    assert!(!got.iter().any(|(n, _)| n == "message_stop"));
}

#[test]
fn errors_in_the_anthropic_shape() {
    let openai = br#"{"error":{"message":"no such key","type":"authentication_error","code":"invalid_api_key"}}"#;
    let v: Value = serde_json::from_slice(&error_from_openai(401, openai)).unwrap();
    assert_eq!(
        v,
        json!({ "type": "error", "error": { "type": "authentication_error",
            "message": "no such key", "code": "invalid_api_key" } })
    );
    for (status, kind) in [
        (400, "invalid_request_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
        (429, "rate_limit_error"),
        (502, "api_error"),
        (503, "overloaded_error"),
        (504, "timeout_error"),
    ] {
        assert_eq!(error_type(status), kind);
    }
    let v: Value = serde_json::from_slice(&error_from_openai(502, b"not json")).unwrap();
    assert_eq!(v["error"]["code"], "gateway_error");
}
