use crate::plan::Operation;
use serde_json::{json, Value};

use super::assemble::assemble_stream;
use super::entry::{lookup, slot_bytes, storable, Entry};
use super::key::{key_of, slot_of};
use super::store::bypassed;

fn answer(finish: &str, content: &str) -> Value {
    json!({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 5, "model": "m1",
        "choices": [{ "index": 0, "finish_reason": finish,
                      "message": { "role": "assistant", "content": content } }],
        "usage": { "prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5 },
    })
}

#[test]
fn the_key_is_the_resolved_request_without_stream() {
    let body = json!({ "model": "chat", "messages": [{ "role": "user", "content": "hi" }],
                       "temperature": 0 });
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({ "include_usage": true });
    streamed["user"] = json!("someone");
    let k = key_of(Operation::Chat, &["m1"], &body);
    assert_eq!(k.len(), 64);
    assert_eq!(k, key_of(Operation::Chat, &["m1"], &streamed));
    // Another resolution, another sampling parameter, another message: another key.
    assert_ne!(k, key_of(Operation::Chat, &["m2"], &body));
    let mut hotter = body.clone();
    hotter["temperature"] = json!(1);
    assert_ne!(k, key_of(Operation::Chat, &["m1"], &hotter));
    let mut tools = body.clone();
    tools["tools"] = json!([{ "type": "function", "function": { "name": "f" } }]);
    assert_ne!(k, key_of(Operation::Chat, &["m1"], &tools));
    assert_ne!(k, key_of(Operation::Embeddings, &["m1"], &body));
}

#[test]
fn no_cache_and_no_store_bypass() {
    assert!(bypassed(Some("no-cache")));
    assert!(bypassed(Some("max-age=0, No-Store")));
    assert!(!bypassed(Some("max-age=60")));
    assert!(!bypassed(None));
}

#[test]
fn only_complete_answers_are_stored() {
    assert!(storable(200, &answer("stop", "hello")));
    assert!(!storable(200, &answer("length", "hel")), "truncated");
    assert!(!storable(200, &answer("stop", "")), "empty");
    assert!(!storable(500, &answer("stop", "hello")), "failed");
    assert!(!storable(200, &json!({ "error": { "code": "x" } })));
    assert!(!storable(200, &json!({ "choices": [] })));
    let tools = json!({ "choices": [{ "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": null,
        "tool_calls": [{ "id": "c1", "type": "function",
                         "function": { "name": "f", "arguments": "{}" } }] } }] });
    assert!(storable(200, &tools));
    assert!(storable(200, &json!({ "data": [{ "embedding": [0.1] }] })));
    assert!(!storable(200, &json!({ "data": [] })));
}

#[test]
fn entries_live_in_bounded_slots_and_expire() {
    let key = key_of(Operation::Chat, &["m1"], &json!({ "messages": [] }));
    let entry = Entry {
        key: key.clone(),
        expires_at_ms: 2_000,
        provider: "p1".into(),
        model: "m1".into(),
        body: b"{}".to_vec(),
    };
    let bytes = entry.encode();
    assert_eq!(Entry::decode(&bytes), Some(entry.clone()));
    assert_eq!(lookup(Some(&bytes), &key, 1_999), Some(entry));
    assert_eq!(lookup(Some(&bytes), &key, 2_000), None, "expired");
    let other = key_of(Operation::Chat, &["m2"], &json!({ "messages": [] }));
    assert_eq!(
        lookup(Some(&bytes), &other, 0),
        None,
        "another key in the slot"
    );
    assert_eq!(lookup(None, &key, 0), None);
    assert_eq!(lookup(Some(b"short"), &key, 0), None);
    for n in [1, 7, 1_000] {
        assert!(slot_of(&key, n) < n);
    }
    assert_eq!(slot_of(&key, 0), 0);
    assert_eq!(slot_bytes(64 << 20, 1_024), 64 << 10);
}

#[test]
fn a_stored_answer_replays_as_sse() {
    let sse = String::from_utf8(crate::cache::shapes::replay_sse(
        crate::plan::Protocol::Chat,
        &answer("stop", "hello"),
    ))
    .unwrap_or_default();
    let events: Vec<Value> = sse
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect();
    assert!(sse.ends_with("data: [DONE]\n\n"));
    assert_eq!(events.len(), 4);
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(events[1]["choices"][0]["delta"]["content"], "hello");
    assert_eq!(events[2]["choices"][0]["finish_reason"], "stop");
    assert_eq!(events[3]["usage"]["total_tokens"], 5);
    assert!(events
        .iter()
        .all(|e| e["object"] == "chat.completion.chunk" && e["id"] == "chatcmpl-1"));
}

#[test]
fn a_clean_stream_assembles_at_every_cut_and_a_broken_one_does_not() {
    let sse = concat!(
        "data: {\"id\":\"c1\",\"created\":9,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
        "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"get\",\"arguments\":\"{\\\"a\"}}]}}]}\n\n",
        "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"\\\":1}\"}}]},\"finish_reason\":\"tool_calls\"}]}\n\n",
        "data: [DONE]\n\n",
    );
    let whole = assemble_stream(sse.as_bytes()).expect("assembled");
    assert_eq!(whole["id"], "c1");
    let call = &whole["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["id"], "call_1");
    assert_eq!(call["function"]["name"], "get");
    assert_eq!(call["function"]["arguments"], "{\"a\":1}");
    assert!(storable(200, &whole), "{whole}");
    // The parser is fed at once here; the front feeds it the collected bytes whatever
    // their cuts, so every cut of the bytes gives the same completion.
    for cut in 1..sse.len() {
        let (a, b) = sse.as_bytes().split_at(cut);
        let joined = [a, b].concat();
        assert_eq!(assemble_stream(&joined).as_ref(), Some(&whole));
    }
    // No [DONE], an error event, an unfinished choice: nothing.
    let no_done = sse.replace("data: [DONE]\n\n", "");
    assert_eq!(assemble_stream(no_done.as_bytes()), None);
    let error = sse.replace(
        "data: [DONE]",
        "data: {\"error\":{\"code\":\"x\"}}\n\ndata: [DONE]",
    );
    assert_eq!(assemble_stream(error.as_bytes()), None);
    let unfinished = sse.replace(",\"finish_reason\":\"tool_calls\"", "");
    assert_eq!(assemble_stream(unfinished.as_bytes()), None);
    assert_eq!(assemble_stream(b""), None);
}
