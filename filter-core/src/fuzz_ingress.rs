//! Property runs over the caller protocols' adapters (`ingress`, `responses`,
//! `messages_ingress`), with the harness of [`crate::fuzz`]: the front stage on any Messages or
//! Responses body, the translations to chat completions (strict and lenient) and back (unary,
//! streamed, errors), and the gate's reading of native streams. Seeds are the calls the
//! conformance clients make (`tests/conformance/ingress.py`: string and list inputs,
//! instructions, tools and their results, images, JSON formats, streams, stateful Responses
//! calls), chat answers and streams, native Messages and Responses streams, and the provider
//! error table. Properties: no panic, a bounded time per input, a translation of JSON is JSON,
//! and a stream translates to the same bytes however it is split.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::{json, Value};

use crate::fuzz::{
    anthropic_stream, front_request, input, openai_stream, run, snapshot, table_cases,
};
use crate::plan::Protocol;
use crate::protocols::messages::request::Fidelity;
use crate::protocols::{self, Egress, NativeStream};
use crate::state::State;
use crate::wire::sse::Parser;

const NOW_S: i64 = 1_700_000_000;

fn bodies(values: &[Value]) -> Vec<Vec<u8>> {
    values.iter().map(|v| v.to_string().into_bytes()).collect()
}

fn responses_requests() -> Vec<Vec<u8>> {
    let weather = json!({"type": "function", "name": "get_weather", "description": "Weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}});
    bodies(&[
        json!({"model": "chat", "input": "Say hello.", "instructions": "Be brief.", "max_output_tokens": 64}),
        json!({"model": "chat", "input": [{"role": "developer", "content": "Be brief."},
               {"role": "user", "content": [{"type": "input_text", "text": "Say hello."}]}]}),
        json!({"model": "chat", "input": "Say hello.", "stream": true}),
        json!({"model": "chat", "input": "Weather in Paris?", "tools": [weather.clone()], "tool_choice": "auto"}),
        json!({"model": "chat", "tools": [weather], "input": [{"role": "user", "content": "Weather in Paris?"},
               {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
               {"type": "function_call_output", "call_id": "call_1", "output": "{\"temp\":21}"}]}),
        json!({"model": "chat", "input": "The answer?", "text": {"format": {"type": "json_schema", "name": "a",
               "schema": {"type": "object", "properties": {"answer": {"type": "integer"}}}, "strict": true}}}),
        json!({"model": "chat", "input": [{"role": "user", "content": [{"type": "input_text", "text": "What is it?"},
               {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}]}]}),
        json!({"model": "chat", "input": "Again.", "store": true, "previous_response_id": "resp_1"}),
        json!({"model": "chat", "input": "Hi", "reasoning": {"effort": "low"}, "temperature": 0.2, "top_p": 0.9}),
    ])
}

fn messages_requests() -> Vec<Vec<u8>> {
    bodies(&[
        json!({"model": "claude", "max_tokens": 256, "system": "Be brief.",
               "messages": [{"role": "user", "content": "Say hello."}]}),
        json!({"model": "claude", "max_tokens": 256, "stream": true,
               "messages": [{"role": "user", "content": [{"type": "text", "text": "Say hello."}]}]}),
        json!({"model": "claude", "max_tokens": 256,
               "tools": [{"name": "get_weather", "description": "Weather",
                          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
               "tool_choice": {"type": "auto"},
               "messages": [{"role": "user", "content": "Weather in Paris?"},
                            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "21 C"}]}]}),
        json!({"model": "claude", "max_tokens": 64, "stop_sequences": ["END"], "temperature": 0.5,
               "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
               "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64",
                   "media_type": "image/png", "data": "iVBORw0KGgo="}}, {"type": "text", "text": "What is it?"}]}]}),
        json!({"model": "claude", "max_tokens": 1024, "thinking": {"type": "enabled", "budget_tokens": 512},
               "metadata": {"user_id": "u1"}, "messages": [{"role": "user", "content": "Think."}]}),
    ])
}

fn chat_answers() -> Vec<Vec<u8>> {
    let mut out = bodies(&[
        json!({"id": "chatcmpl-1", "object": "chat.completion", "created": NOW_S, "model": "m1",
               "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello."}, "finish_reason": "stop"}],
               "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7,
                         "prompt_tokens_details": {"cached_tokens": 1}}}),
        json!({"id": "chatcmpl-2", "object": "chat.completion", "model": "m1",
               "choices": [{"index": 0, "message": {"role": "assistant", "content": null,
                 "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
                 "finish_reason": "tool_calls"}]}),
        json!({"id": "chatcmpl-3", "choices": [{"index": 0, "message": {"role": "assistant", "content": "{\"answer\":42}"}, "finish_reason": "length"}]}),
    ]);
    out.extend(table_cases().into_iter().map(|c| c.body));
    out
}

fn responses_stream() -> Vec<u8> {
    let mut out = Vec::new();
    for (name, data) in [
        (
            "response.created",
            json!({"type": "response.created", "sequence_number": 0,
            "response": {"id": "resp_1", "object": "response", "status": "in_progress", "output": []}}),
        ),
        (
            "response.output_text.delta",
            json!({"type": "response.output_text.delta", "sequence_number": 1,
            "item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": "Hel"}),
        ),
        (
            "response.completed",
            json!({"type": "response.completed", "sequence_number": 2,
            "response": {"id": "resp_1", "status": "completed", "usage": {"input_tokens": 3, "output_tokens": 2}}}),
        ),
        (
            "error",
            json!({"type": "error", "code": "server_error", "message": "boom"}),
        ),
    ] {
        out.extend_from_slice(format!("event: {name}\ndata: {data}\n\n").as_bytes());
    }
    out
}

const CALLERS: [Protocol; 2] = [Protocol::Messages, Protocol::Responses];

fn path_of(protocol: Protocol) -> &'static str {
    match protocol {
        Protocol::Messages => "/v1/messages",
        Protocol::Responses => "/v1/responses",
        Protocol::Chat => "/v1/chat/completions",
        Protocol::Gemini => "/v1beta/models/m1:generateContent",
    }
}

#[test]
fn fuzz_the_front_stage_on_messages_and_responses_bodies() {
    let mut corpus = messages_requests();
    corpus.extend(responses_requests());
    run(
        "front-ingress",
        |rng| input(rng, &corpus),
        |body| {
            for protocol in CALLERS {
                front_request(State::new(1, snapshot()), path_of(protocol), body);
            }
        },
    );
}

#[test]
fn fuzz_the_requests_of_messages_and_responses_callers() {
    let mut corpus = messages_requests();
    corpus.extend(responses_requests());
    run(
        "ingress-request",
        |rng| input(rng, &corpus),
        |bytes| {
            let Ok(body) = serde_json::from_slice::<Value>(bytes) else {
                return;
            };
            for protocol in CALLERS {
                let _ = protocols::stateful(protocol, &body);
                for fidelity in [Fidelity::Strict, Fidelity::Lenient] {
                    if let Ok(chat) = protocols::chat_request(protocol, &body, fidelity) {
                        assert!(!chat.is_null(), "{protocol:?}: a translation to null");
                        // What the chat-completions lane is sent must serialize.
                        assert!(serde_json::to_vec(&chat).is_ok());
                    }
                }
            }
            let _ = crate::protocols::responses::request::routing_view(&body);
        },
    );
}

#[test]
fn fuzz_the_answers_to_messages_and_responses_callers() {
    let answers = chat_answers();
    let requests = responses_requests();
    run(
        "ingress-unary",
        |rng| input(rng, &answers),
        |bytes| {
            let chat = serde_json::from_slice::<Value>(bytes).unwrap_or(Value::Null);
            let request = serde_json::from_slice::<Value>(&requests[bytes.len() % requests.len()])
                .unwrap_or(Value::Null);
            for protocol in CALLERS {
                let answer = protocols::unary(protocol, &chat, &request, NOW_S);
                assert!(serde_json::to_vec(&answer).is_ok());
                for status in [400u16, 429, 500, 503] {
                    let _ = protocols::redress_error(protocol, status, bytes);
                }
                let _ = protocols::native_usage(protocol, chat.get("usage"));
            }
        },
    );
}

#[test]
fn fuzz_the_stream_translation_to_callers_is_split_invariant() {
    let corpus = vec![openai_stream(), anthropic_stream(), responses_stream()];
    let request = serde_json::from_slice::<Value>(&responses_requests()[2]).unwrap_or(Value::Null);
    run(
        "ingress-egress",
        |rng| input(rng, &corpus),
        |bytes| {
            for protocol in CALLERS {
                let mut whole = Egress::new(protocol, &request, NOW_S, false).unwrap();
                let expected = whole.encode(bytes);
                let step = 1 + bytes.len() % 5;
                let mut split = Egress::new(protocol, &request, NOW_S, false).unwrap();
                let got: Vec<u8> = bytes.chunks(step).flat_map(|c| split.encode(c)).collect();
                assert_eq!(
                    got, expected,
                    "{protocol:?}: the split changed the translation"
                );
            }
        },
    );
}

#[test]
fn fuzz_the_gates_reading_of_native_streams() {
    let corpus = vec![anthropic_stream(), responses_stream(), openai_stream()];
    run(
        "ingress-native",
        |rng| input(rng, &corpus),
        |bytes| {
            for (protocol, kind) in [
                (Protocol::Messages, "anthropic"),
                (Protocol::Responses, "openai"),
            ] {
                let mut stream = NativeStream::new(protocol, kind);
                for event in Parser::new().feed(bytes) {
                    let _ = stream.judge(&event, NOW_S * 1000);
                }
                let _ = stream.usage();
                let _ = stream.error_event("the provider's stream failed");
            }
        },
    );
}
