//! The Messages and Responses shapes of the cache: keys, what is stored, and replays that
//! assemble back to the stored answer.

use super::*;
use crate::cache::key::{key_for, key_of};
use crate::plan::Operation;
use crate::wire::sse::FromChatStream;

fn message() -> Value {
    json!({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "m1",
        "content": [
            { "type": "thinking", "thinking": "Let me see.", "signature": "sig" },
            { "type": "text", "text": "It is sunny." },
            { "type": "tool_use", "id": "toolu_1", "name": "get_weather",
              "input": { "city": "Paris" } },
        ],
        "stop_reason": "tool_use", "stop_sequence": null,
        "usage": { "input_tokens": 12, "cache_creation_input_tokens": 0,
                   "cache_read_input_tokens": 3, "output_tokens": 7 },
    })
}

fn response() -> Value {
    json!({
        "id": "resp_1", "object": "response", "created_at": 5, "status": "completed",
        "error": null, "incomplete_details": null, "model": "m1",
        "output": [
            { "type": "message", "id": "msg_resp_1", "status": "completed", "role": "assistant",
              "content": [{ "type": "output_text", "text": "It is sunny.", "annotations": [] }] },
            { "type": "function_call", "id": "fc_resp_1_1", "call_id": "call_1",
              "name": "get_weather", "arguments": "{\"city\":\"Paris\"}", "status": "completed" },
        ],
        "metadata": {},
        "usage": { "input_tokens": 12, "input_tokens_details": { "cached_tokens": 0 },
                   "output_tokens": 7, "output_tokens_details": { "reasoning_tokens": 0 },
                   "total_tokens": 19 },
    })
}

/// The (type, data) of each event of an SSE body.
fn typed(sse: &[u8]) -> Vec<(String, Value)> {
    events(sse).unwrap_or_default()
}

#[test]
fn each_protocol_keys_its_own_space_and_stream_does_not_split_it() {
    let models = ["p1/m1"];
    let messages = json!({ "model": "chat", "max_tokens": 100,
                           "messages": [{ "role": "user", "content": "hi" }] });
    let no_headers = (None, None);
    let k = key_for(
        Protocol::Messages,
        Operation::Chat,
        &models,
        &messages,
        no_headers,
    );
    let mut streamed = messages.clone();
    streamed["stream"] = json!(true);
    streamed["metadata"] = json!({ "user_id": "u1" });
    streamed["model"] = json!("another alias of the same resolution");
    assert_eq!(
        k,
        key_for(
            Protocol::Messages,
            Operation::Chat,
            &models,
            &streamed,
            no_headers
        )
    );
    // Everything else splits it: the system prompt, top_k, a field unknown today, a beta.
    for (field, value) in [
        ("system", json!("Be brief.")),
        ("top_k", json!(5)),
        (
            "thinking",
            json!({ "type": "enabled", "budget_tokens": 1024 }),
        ),
        ("some_future_field", json!(1)),
    ] {
        let mut other = messages.clone();
        other[field] = value;
        assert_ne!(
            k,
            key_for(
                Protocol::Messages,
                Operation::Chat,
                &models,
                &other,
                no_headers
            ),
            "{field}"
        );
    }
    assert_ne!(
        k,
        key_for(
            Protocol::Messages,
            Operation::Chat,
            &models,
            &messages,
            (None, Some("tools-2024"))
        )
    );
    assert_ne!(
        k,
        key_for(
            Protocol::Messages,
            Operation::Chat,
            &["p1/m2"],
            &messages,
            no_headers
        )
    );
    // The same body from another protocol is another key; a chat key is as before.
    assert_ne!(
        k,
        key_for(
            Protocol::Responses,
            Operation::Chat,
            &models,
            &messages,
            no_headers
        )
    );
    assert_ne!(
        k,
        key_for(
            Protocol::Chat,
            Operation::Chat,
            &models,
            &messages,
            no_headers
        )
    );
    assert_eq!(
        key_for(
            Protocol::Chat,
            Operation::Chat,
            &models,
            &messages,
            no_headers
        ),
        key_of(Operation::Chat, &models, &messages)
    );
    let input = json!({ "model": "chat", "input": "hi", "instructions": "Be brief." });
    let mut stored = input.clone();
    stored["stream"] = json!(true);
    stored["store"] = json!(false);
    stored["metadata"] = json!({ "k": "v" });
    assert_eq!(
        keyed_body(Protocol::Responses, &input),
        keyed_body(Protocol::Responses, &stored)
    );
    let mut hotter = input.clone();
    hotter["temperature"] = json!(1);
    assert_ne!(
        keyed_body(Protocol::Responses, &input),
        keyed_body(Protocol::Responses, &hotter)
    );
}

#[test]
fn only_complete_answers_of_each_protocol_are_storable() {
    assert!(storable(Protocol::Messages, 200, &message()));
    assert!(!storable(Protocol::Messages, 500, &message()), "failed");
    let mut cut = message();
    cut["stop_reason"] = json!("max_tokens");
    assert!(!storable(Protocol::Messages, 200, &cut), "truncated");
    let mut empty = message();
    empty["content"] = json!([{ "type": "text", "text": "" }]);
    empty["stop_reason"] = json!("end_turn");
    assert!(!storable(Protocol::Messages, 200, &empty), "empty");
    let error = json!({ "type": "error", "error": { "type": "api_error", "message": "x" } });
    assert!(!storable(Protocol::Messages, 200, &error));

    assert!(storable(Protocol::Responses, 200, &response()));
    let mut incomplete = response();
    incomplete["status"] = json!("incomplete");
    assert!(
        !storable(Protocol::Responses, 200, &incomplete),
        "truncated"
    );
    let mut nothing = response();
    nothing["output"] = json!([]);
    assert!(!storable(Protocol::Responses, 200, &nothing), "empty");
    assert!(!storable(Protocol::Responses, 429, &response()), "failed");
    // A chat completion is no answer of either.
    let chat = json!({ "choices": [{ "finish_reason": "stop",
                                     "message": { "content": "hi" } }] });
    assert!(!storable(Protocol::Messages, 200, &chat));
    assert!(!storable(Protocol::Responses, 200, &chat));
}

#[test]
fn a_stored_message_replays_as_messages_events_that_assemble_back_to_it() {
    let sse = replay_sse(Protocol::Messages, &message());
    let got = typed(&sse);
    let kinds: Vec<&str> = got.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(kinds.first(), Some(&"message_start"));
    assert_eq!(kinds.last(), Some(&"message_stop"));
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k == "content_block_start")
            .count(),
        3
    );
    let start = &got[0].1["message"];
    assert_eq!(start["content"], json!([]));
    assert_eq!(start["stop_reason"], Value::Null);
    let text: String = got
        .iter()
        .filter(|(k, d)| k == "content_block_delta" && d["delta"]["type"] == "text_delta")
        .map(|(_, d)| str_of(&d["delta"], "text").to_owned())
        .collect();
    assert_eq!(text, "It is sunny.");
    let (_, delta) = &got[got.len() - 2];
    assert_eq!(delta["delta"]["stop_reason"], "tool_use");
    assert_eq!(delta["usage"]["output_tokens"], 7);
    assert_eq!(
        assemble_stream(Protocol::Messages, &sse),
        Some(message()),
        "{}",
        String::from_utf8_lossy(&sse)
    );
}

#[test]
fn a_messages_stream_is_stored_only_when_it_ended_cleanly() {
    // What the gateway's own encoder streams to a Messages caller of a chat lane.
    let chat = concat!(
        "data: {\"id\":\"chatcmpl-4\",\"model\":\"m1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hel\"}}]}\n\n",
        "data: {\"id\":\"chatcmpl-4\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"},\"finish_reason\":\"stop\"}]}\n\n",
        "data: {\"id\":\"chatcmpl-4\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}\n\n",
        "data: [DONE]\n\n",
    );
    let mut encoder = crate::protocols::messages::stream::StreamEncoder::new();
    let mut parser = crate::wire::sse::Parser::new();
    let sse: Vec<u8> = parser
        .feed(chat.as_bytes())
        .iter()
        .flat_map(|e| encoder.feed(e))
        .collect();
    let whole = assemble_stream(Protocol::Messages, &sse).expect("assembled");
    assert_eq!(
        whole["content"],
        json!([{ "type": "text", "text": "Hello" }])
    );
    assert_eq!(whole["stop_reason"], "end_turn");
    assert_eq!(whole["usage"]["output_tokens"], 2);
    assert!(storable(Protocol::Messages, 200, &whole), "{whole}");
    // Cut before message_stop, or ended by an error event: nothing.
    let text = String::from_utf8_lossy(&sse).into_owned();
    let cut = text.replace(
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        "",
    );
    assert_ne!(cut, text);
    assert_eq!(assemble_stream(Protocol::Messages, cut.as_bytes()), None);
    let at = text.find("event: message_delta").unwrap_or(0);
    let broken = format!(
        "{}event: error\ndata: {{\"type\":\"error\",\"error\":{{\"type\":\"api_error\",\"message\":\"cut\"}}}}\n\n",
        &text[..at]
    );
    assert_eq!(assemble_stream(Protocol::Messages, broken.as_bytes()), None);
    assert_eq!(assemble_stream(Protocol::Messages, b""), None);
}

#[test]
fn a_stored_response_replays_as_numbered_typed_events_that_assemble_back_to_it() {
    let sse = replay_sse(Protocol::Responses, &response());
    let got = typed(&sse);
    let kinds: Vec<&str> = got.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    for (n, (kind, data)) in got.iter().enumerate() {
        assert_eq!(data["type"], kind.as_str());
        assert_eq!(data["sequence_number"], n, "{kind}");
    }
    assert_eq!(got[0].1["response"]["status"], "in_progress");
    assert_eq!(got[0].1["response"]["output"], json!([]));
    assert_eq!(got[4].1["delta"], "It is sunny.");
    assert_eq!(got[4].1["item_id"], "msg_resp_1");
    assert_eq!(got[9].1["delta"], "{\"city\":\"Paris\"}");
    assert_eq!(assemble_stream(Protocol::Responses, &sse), Some(response()));
}

#[test]
fn a_responses_stream_is_stored_only_when_it_completed() {
    let request = json!({ "model": "chat", "input": "hi" });
    let chat = concat!(
        "data: {\"id\":\"chatcmpl-4\",\"model\":\"m1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"},\"finish_reason\":\"stop\"}]}\n\n",
        "data: [DONE]\n\n",
    );
    let mut encoder = crate::protocols::responses::stream::StreamEncoder::new(request.clone(), 5);
    let mut parser = crate::wire::sse::Parser::new();
    let sse: Vec<u8> = parser
        .feed(chat.as_bytes())
        .iter()
        .flat_map(|e| encoder.feed(e))
        .collect();
    let whole = assemble_stream(Protocol::Responses, &sse).expect("assembled");
    assert_eq!(whole["output"][0]["content"][0]["text"], "Hello");
    assert!(storable(Protocol::Responses, 200, &whole), "{whole}");
    // Truncated (response.incomplete), cut before its completion, or failed: nothing.
    let truncated = chat.replace("\"stop\"", "\"length\"");
    let mut encoder = crate::protocols::responses::stream::StreamEncoder::new(request, 5);
    let sse_cut: Vec<u8> = crate::wire::sse::Parser::new()
        .feed(truncated.as_bytes())
        .iter()
        .flat_map(|e| encoder.feed(e))
        .collect();
    assert_eq!(assemble_stream(Protocol::Responses, &sse_cut), None);
    let text = String::from_utf8_lossy(&sse).into_owned();
    let at = text.find("event: response.completed").unwrap_or(0);
    assert_eq!(
        assemble_stream(Protocol::Responses, &text.as_bytes()[..at]),
        None
    );
    let failed = format!(
        "{}event: error\ndata: {{\"type\":\"error\",\"code\":\"x\"}}\n\n{}",
        &text[..at],
        &text[at..]
    );
    assert_eq!(
        assemble_stream(Protocol::Responses, failed.as_bytes()),
        None
    );
}
