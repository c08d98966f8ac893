use serde_json::{json, Value};

use super::request::{routing_view, to_chat_request};
use super::response::from_chat_response;
use super::response::message_item;
use super::stream::StreamEncoder;
use super::*;
use crate::wire::sse::FromChatStream;
use crate::wire::sse::Parser;

fn chat(body: Value) -> Value {
    to_chat_request(&body).unwrap()
}

#[test]
fn a_string_input_with_instructions() {
    assert_eq!(
        chat(
            json!({ "model": "m", "input": "Hi", "instructions": "Be brief.",
            "max_output_tokens": 50, "stream": true, "temperature": 0.5 })
        ),
        json!({ "model": "m", "messages": [
            { "role": "system", "content": "Be brief." },
            { "role": "user", "content": "Hi" },
        ], "max_tokens": 50, "stream": true, "temperature": 0.5 })
    );
    assert_eq!(
        to_chat_request(&json!({ "model": "m" })).unwrap_err().param,
        Some("input")
    );
}

#[test]
fn items_with_images_function_calls_and_outputs() {
    let out = chat(json!({ "model": "m", "input": [
        { "role": "developer", "content": "Use tools." },
        { "type": "message", "role": "user", "content": [
            { "type": "input_text", "text": "Weather here?" },
            { "type": "input_image", "image_url": "data:image/png;base64,iVBO", "detail": "low" } ] },
        { "type": "reasoning", "id": "rs_1", "summary": [] },
        { "type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}" },
        { "type": "function_call", "call_id": "call_2", "name": "get_time", "arguments": "{}" },
        { "type": "function_call_output", "call_id": "call_1", "output": "sunny" },
        { "type": "function_call_output", "call_id": "call_2", "output": { "t": 1 } },
        { "role": "assistant", "content": [{ "type": "output_text", "text": "Sunny." }] },
    ]}));
    let m = out["messages"].as_array().unwrap();
    assert_eq!(m[0], json!({ "role": "system", "content": "Use tools." }));
    assert_eq!(
        m[1]["content"][1],
        json!({ "type": "image_url", "image_url": { "url": "data:image/png;base64,iVBO", "detail": "low" } })
    );
    assert_eq!(m[2]["tool_calls"].as_array().unwrap().len(), 2);
    assert_eq!(m[2]["tool_calls"][1]["id"], "call_2");
    assert_eq!(
        m[3],
        json!({ "role": "tool", "tool_call_id": "call_1", "content": "sunny" })
    );
    assert_eq!(m[4]["content"], "{\"t\":1}");
    assert_eq!(m[5], json!({ "role": "assistant", "content": "Sunny." }));
}

#[test]
fn function_tools_json_formats_and_refusals() {
    let out = chat(json!({ "model": "m", "input": "x",
        "tools": [{ "type": "function", "name": "f", "description": "d",
                    "parameters": { "type": "object" }, "strict": true }],
        "tool_choice": { "type": "function", "name": "f" },
        "text": { "format": { "type": "json_schema", "name": "answer",
                              "schema": { "type": "object" }, "strict": true } } }));
    assert_eq!(
        out["tools"][0],
        json!({ "type": "function", "function": { "name": "f", "description": "d",
            "parameters": { "type": "object" }, "strict": true } })
    );
    assert_eq!(out["tool_choice"]["function"]["name"], "f");
    assert_eq!(
        out["response_format"],
        json!({ "type": "json_schema", "json_schema": { "name": "answer",
            "schema": { "type": "object" }, "strict": true } })
    );
    let out = chat(json!({ "input": "x", "text": { "format": { "type": "json_object" } } }));
    assert_eq!(out["response_format"]["type"], "json_object");
    let e =
        to_chat_request(&json!({ "input": "x", "tools": [{ "type": "web_search" }] })).unwrap_err();
    assert_eq!(e.param, Some("tools"));
    let e = to_chat_request(&json!({ "input": [{ "type": "item_reference", "id": "x" }] }))
        .unwrap_err();
    assert!(e.message.contains("natively"));
}

#[test]
fn namespace_tools_are_flattened_for_chat_and_their_calls_named_back() {
    let request = json!({ "model": "m", "input": [
            { "type": "function_call", "call_id": "c0", "namespace": "agents",
              "name": "spawn", "arguments": "{}" },
            { "type": "function_call_output", "call_id": "c0", "output": "ok" }],
        "tools": [{ "type": "function", "name": "exec_command", "parameters": {} },
                  { "type": "namespace", "name": "agents", "description": "Sub-agents.",
                    "tools": [{ "type": "function", "name": "spawn", "parameters": {} },
                              { "type": "function", "name": "close", "parameters": {} }] }] });
    let out = chat(request.clone());
    let names: Vec<&str> = out["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["exec_command", "agents__spawn", "agents__close"]);
    assert_eq!(
        out["messages"][0]["tool_calls"][0]["function"]["name"],
        "agents__spawn"
    );
    let answer = json!({ "id": "chatcmpl-1", "model": "m", "choices": [{ "index": 0,
        "message": { "role": "assistant", "content": null, "tool_calls": [
            { "id": "c1", "type": "function", "function": { "name": "agents__close", "arguments": "{}" } },
            { "id": "c2", "type": "function", "function": { "name": "exec_command", "arguments": "{}" } },
            { "id": "c3", "type": "function", "function": { "name": "other__x", "arguments": "{}" } }] },
        "finish_reason": "tool_calls" }] });
    let r = from_chat_response(&answer, &request, 0);
    assert_eq!(
        (
            r["output"][0]["name"].clone(),
            r["output"][0]["namespace"].clone()
        ),
        (json!("close"), json!("agents"))
    );
    assert_eq!(r["output"][1]["name"], "exec_command");
    assert!(r["output"][1].get("namespace").is_none());
    // Not a declared namespace: the name as it came.
    assert_eq!(r["output"][2]["name"], "other__x");
    // A hosted tool is refused, its type named.
    let e = to_chat_request(&json!({ "input": "x", "tools": [
        { "type": "namespace", "name": "n", "tools": [] }, { "type": "web_search" }] }))
    .unwrap_err();
    assert!(e.message.contains("'web_search'"), "{e}");
}

#[test]
fn the_routing_view_leaves_out_what_only_openai_runs() {
    let body = json!({ "model": "m", "tools": [{ "type": "web_search" },
            { "type": "function", "name": "f", "parameters": {} }],
        "input": [{ "type": "item_reference", "id": "x" },
            { "role": "user", "content": [{ "type": "input_file", "file_id": "f" },
                                          { "type": "input_text", "text": "hi" }] }] });
    let out = to_chat_request(&routing_view(&body)).unwrap();
    assert_eq!(out["tools"].as_array().map(Vec::len), Some(1));
    assert_eq!(
        out["messages"],
        json!([{ "role": "user", "content": "hi" }])
    );
    assert!(to_chat_request(&body).is_err(), "strictly, refused");
}

#[test]
fn stateful_requests_are_named() {
    assert_eq!(
        stateful(&json!({ "previous_response_id": "resp_1" })),
        Some("previous_response_id")
    );
    assert_eq!(stateful(&json!({ "store": true })), Some("store"));
    assert_eq!(
        stateful(&json!({ "conversation": { "id": "conv_1" } })),
        Some("conversation")
    );
    assert_eq!(
        stateful(&json!({ "store": false, "previous_response_id": null })),
        None
    );
    assert_eq!(stateful(&json!({})), None);
}

#[test]
fn a_chat_completion_becomes_a_response() {
    let chat = json!({ "id": "chatcmpl-9", "model": "gpt", "choices": [{ "index": 0,
        "message": { "role": "assistant", "content": "Hi", "tool_calls": [{ "id": "call_1",
            "type": "function", "function": { "name": "f", "arguments": "{}" } }] },
        "finish_reason": "tool_calls" }],
        "usage": { "prompt_tokens": 10, "completion_tokens": 3, "prompt_tokens_details": { "cached_tokens": 4 } } });
    let r = from_chat_response(&chat, &json!({ "instructions": "Be brief." }), 7);
    assert_eq!(r["id"], "resp_9");
    assert_eq!(r["object"], "response");
    assert_eq!(r["status"], "completed");
    assert_eq!(r["created_at"], 7);
    assert_eq!(r["instructions"], "Be brief.");
    assert_eq!(
        r["output"][0],
        message_item("msg_resp_9", "Hi", "completed")
    );
    assert_eq!(r["output"][1]["type"], "function_call");
    assert_eq!(r["output"][1]["call_id"], "call_1");
    assert_eq!(r["usage"]["input_tokens"], 10);
    assert_eq!(r["usage"]["input_tokens_details"]["cached_tokens"], 4);
    assert_eq!(r["usage"]["total_tokens"], 13);
    let cut = json!({ "choices": [{ "message": { "content": "x" }, "finish_reason": "length" }] });
    let r = from_chat_response(&cut, &json!({}), 0);
    assert_eq!(
        (
            r["status"].clone(),
            r["incomplete_details"]["reason"].clone()
        ),
        (json!("incomplete"), json!("max_output_tokens"))
    );
}

const CHAT_STREAM: &str = concat!(
    "data: {\"id\":\"chatcmpl-1\",\"model\":\"gpt\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hel\"},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"chatcmpl-1\",\"model\":\"gpt\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"chatcmpl-1\",\"model\":\"gpt\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\"\"}}]},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"chatcmpl-1\",\"model\":\"gpt\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\":1}\"}}]},\"finish_reason\":\"tool_calls\"}]}\n\n",
    "data: {\"id\":\"chatcmpl-1\",\"model\":\"gpt\",\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":5}}\n\n",
    "data: [DONE]\n\n",
);

fn encode(chat: &[u8]) -> Vec<u8> {
    crate::wire::sse::translated_at_every_cut(chat, || {
        let mut encoder = StreamEncoder::new(json!({ "model": "m" }), 1);
        move |event: &crate::wire::sse::Event| encoder.feed(event)
    })
}

fn events(bytes: &[u8]) -> Vec<Value> {
    Parser::new()
        .feed(bytes)
        .into_iter()
        .map(|e| {
            let v: Value = serde_json::from_str(&e.data).unwrap();
            assert_eq!(e.name.as_deref(), v["type"].as_str(), "event name = type");
            v
        })
        .collect()
}

#[test]
fn a_chat_stream_becomes_typed_events_at_any_chunk_boundary() {
    let whole = encode(CHAT_STREAM.as_bytes());
    let got = events(&whole);
    let types: Vec<&str> = got.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        types,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    for (i, e) in got.iter().enumerate() {
        assert_eq!(e["sequence_number"], i);
    }
    assert_eq!(got[6]["text"], "Hello");
    assert_eq!(got[9]["output_index"], 1);
    assert_eq!(got[12]["arguments"], "{\"a\":1}");
    let done = &got[14]["response"];
    assert_eq!(done["status"], "completed");
    assert_eq!(done["output"].as_array().unwrap().len(), 2);
    assert_eq!(done["usage"]["output_tokens"], 5);
}

#[test]
fn an_error_event_fails_the_response() {
    let head = &CHAT_STREAM[..CHAT_STREAM.find("data: {\"id\":\"chatcmpl-1\",\"model\":\"gpt\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo").unwrap()];
    let chat = format!("{head}data: {{\"error\":{{\"message\":\"cut\",\"code\":\"stream_interrupted\"}}}}\n\ndata: [DONE]\n\n");
    let got = events(&encode(chat.as_bytes()));
    let n = got.len();
    assert_eq!(got[n - 2]["type"], "error");
    assert_eq!(got[n - 2]["code"], "stream_interrupted");
    assert_eq!(got[n - 1]["type"], "response.failed");
    assert_eq!(got[n - 1]["response"]["status"], "failed");
    assert_eq!(got[n - 1]["response"]["error"]["message"], "cut");
    assert!(!got.iter().any(|e| e["type"] == "response.completed"));
}
