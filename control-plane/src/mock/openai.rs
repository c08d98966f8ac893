//! The OpenAI shapes: chat completions (unary and SSE chunks), embeddings and error objects.

use serde_json::{json, Value};

use super::answer::{self, Answer, Turn, CREATED};
use super::script::Reply;
use super::sse::{self, Piece, StreamPlan};

const FINGERPRINT: &str = "fp_mock";

fn completion_id(turn: &Turn) -> String {
    format!("chatcmpl-mock-{}", turn.seq)
}

fn finish_reason(answer: &Answer) -> &'static str {
    if answer.tool_calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    }
}

fn usage(answer: &Answer) -> Value {
    let mut usage = json!({
        "prompt_tokens": answer.usage.prompt_tokens,
        "completion_tokens": answer.usage.completion_tokens,
        "total_tokens": answer.usage.prompt_tokens.saturating_add(answer.usage.completion_tokens),
    });
    if answer.usage.cached_tokens > 0 {
        usage["prompt_tokens_details"] = json!({ "cached_tokens": answer.usage.cached_tokens });
    }
    usage
}

/// A `chat.completion`.
pub fn chat_completion(turn: &Turn, answer: &Answer) -> Value {
    let mut message = json!({
        "role": "assistant",
        "content": answer.text,
        "refusal": null,
    });
    if !answer.tool_calls.is_empty() {
        let calls: Vec<Value> = answer
            .tool_calls
            .iter()
            .enumerate()
            .map(|(index, call)| {
                json!({
                    "id": answer::tool_call_id(call, "call", turn.seq, index),
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments_text()},
                })
            })
            .collect();
        message["tool_calls"] = Value::Array(calls);
    }
    let mut completion = json!({
        "id": completion_id(turn),
        "object": "chat.completion",
        "created": CREATED,
        "model": turn.model,
        "system_fingerprint": FINGERPRINT,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": null,
            "finish_reason": finish_reason(answer),
        }],
        "usage": usage(answer),
    });
    if !answer.reports_usage {
        if let Some(fields) = completion.as_object_mut() {
            fields.remove("usage");
        }
    }
    completion
}

/// The `chat.completion.chunk` events of a stream: role, content, tool-call deltas, finish,
/// the usage chunk when asked for, `[DONE]`.
pub fn chat_stream(turn: &Turn, answer: &Answer, include_usage: bool) -> StreamPlan {
    let chunk = |delta: Value, finish: Value| {
        let mut value = json!({
            "id": completion_id(turn),
            "object": "chat.completion.chunk",
            "created": CREATED,
            "model": turn.model,
            "system_fingerprint": FINGERPRINT,
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
        });
        if include_usage {
            // OpenAI puts `usage: null` on every chunk when usage was asked for.
            value["usage"] = Value::Null;
        }
        sse::data(&value)
    };

    let head = vec![chunk(
        json!({"role": "assistant", "content": "", "refusal": null}),
        Value::Null,
    )];
    let mut content: Vec<Piece> = answer
        .chunks
        .iter()
        .map(|text| Piece::content(chunk(json!({"content": text}), Value::Null)))
        .collect();
    for (index, call) in answer.tool_calls.iter().enumerate() {
        content.push(Piece::content(chunk(
            json!({"tool_calls": [{
                "index": index,
                "id": answer::tool_call_id(call, "call", turn.seq, index),
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }]}),
            Value::Null,
        )));
        for part in call.argument_deltas() {
            content.push(Piece::content(chunk(
                json!({"tool_calls": [{"index": index, "function": {"arguments": part}}]}),
                Value::Null,
            )));
        }
    }
    let mut tail = vec![chunk(json!({}), json!(finish_reason(answer)))];
    if include_usage {
        tail.push(sse::data(&json!({
            "id": completion_id(turn),
            "object": "chat.completion.chunk",
            "created": CREATED,
            "model": turn.model,
            "system_fingerprint": FINGERPRINT,
            "choices": [],
            "usage": usage(answer),
        })));
    }
    tail.push(bytes::Bytes::from_static(b"data: [DONE]\n\n"));
    StreamPlan {
        head,
        content,
        tail,
        error_event: stream_error_event(
            "The server had an error while processing your request. Sorry about that!",
        ),
    }
}

/// The error object an OpenAI stream ends with when the server fails mid-answer.
pub fn stream_error_event(message: &str) -> bytes::Bytes {
    sse::data(&json!({"error": {
        "message": message,
        "type": "server_error",
        "param": null,
        "code": null,
    }}))
}

/// The default vector length of an embedding.
pub const DEFAULT_DIMENSIONS: usize = 8;

/// An embeddings response: one vector per input, float lists or base64 as the request asks.
pub fn embeddings(turn: &Turn, reply: &Reply, request: &Value) -> Value {
    let inputs = embedding_inputs(request.get("input"));
    let requested = request
        .get("dimensions")
        .and_then(Value::as_u64)
        .and_then(|n| usize::try_from(n).ok())
        .filter(|n| (1..=65_536).contains(n));
    let dimensions = reply.dimensions.or(requested).unwrap_or(DEFAULT_DIMENSIONS);
    let base64 = request.get("encoding_format").and_then(Value::as_str) == Some("base64");
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(index, input)| {
            let vector = match &reply.embedding {
                Some(vector) => vector.clone(),
                None => vector_for(input, dimensions),
            };
            let embedding = if base64 {
                json!(base64_f32(&vector))
            } else {
                json!(vector)
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    let prompt_tokens = reply
        .usage
        .map_or(turn.prompt_tokens, |usage| usage.prompt_tokens);
    json!({
        "object": "list",
        "data": data,
        "model": turn.model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    })
}

/// The inputs: a string, a list of strings, a token list, or a list of token lists.
fn embedding_inputs(input: Option<&Value>) -> Vec<String> {
    match input {
        Some(Value::Array(items)) if items.iter().all(Value::is_number) && !items.is_empty() => {
            vec![Value::Array(items.clone()).to_string()]
        }
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| match item {
                Value::String(text) => text.clone(),
                other => other.to_string(),
            })
            .collect(),
        Some(Value::String(text)) => vec![text.clone()],
        Some(other) => vec![other.to_string()],
        None => vec![String::new()],
    }
}

/// A deterministic unit vector derived from the input text.
pub fn vector_for(input: &str, dimensions: usize) -> Vec<f32> {
    // FNV-1a seeds an xorshift generator.
    let mut state = input.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    let mut values: Vec<f64> = (0..dimensions)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            // Top 53 bits to [0, 1), then to [-1, 1).
            ((state >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        })
        .collect();
    let norm = values.iter().map(|v| v * v).sum::<f64>().sqrt();
    if norm > 0.0 {
        for value in &mut values {
            *value /= norm;
        }
    }
    values.into_iter().map(|v| v as f32).collect()
}

/// Little-endian f32s in standard base64, as OpenAI answers `encoding_format: base64`.
fn base64_f32(vector: &[f32]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes: Vec<u8> = vector.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for group in bytes.chunks(3) {
        let b = [
            group.first().copied().unwrap_or(0),
            group.get(1).copied().unwrap_or(0),
            group.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (position, shift) in [18u32, 12, 6, 0].into_iter().enumerate() {
            if position <= group.len() {
                let index = usize::try_from((n >> shift) & 63).unwrap_or(0);
                out.push(char::from(ALPHABET.get(index).copied().unwrap_or(b'A')));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// An OpenAI error object for a scripted status without a body.
pub fn error_body(status: u16, message: &str) -> Value {
    let kind = match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        500..=599 => "server_error",
        _ => "invalid_request_error",
    };
    json!({"error": {"message": message, "type": kind, "param": null, "code": null}})
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::mock::script::{StreamSpec, ToolCall, Usage};
    use crate::mock::sse::{schedule, Step};

    fn turn() -> Turn {
        Turn {
            seq: 7,
            model: "gpt-mock".into(),
            prompt_tokens: 3,
            usage_requested: false,
        }
    }

    fn events(plan: StreamPlan) -> Vec<String> {
        schedule(plan, &StreamSpec::default())
            .into_iter()
            .filter_map(|step| match step {
                Step::Send { bytes, .. } => Some(String::from_utf8_lossy(&bytes).into_owned()),
                Step::Abort { .. } => None,
            })
            .collect()
    }

    fn json_of(event: &str) -> Value {
        serde_json::from_str(event.trim_start_matches("data: ").trim_end()).unwrap()
    }

    #[test]
    fn unary_default() {
        let answer = Answer::new(&Reply::default(), 3);
        let body = chat_completion(&turn(), &answer);
        assert_eq!(body["id"], "chatcmpl-mock-7");
        assert_eq!(body["object"], "chat.completion");
        assert_eq!(body["model"], "gpt-mock");
        assert_eq!(
            body["choices"][0]["message"]["content"],
            answer::DEFAULT_TEXT
        );
        assert_eq!(body["choices"][0]["finish_reason"], "stop");
        assert_eq!(body["usage"]["total_tokens"], 11);
    }

    #[test]
    fn unary_tool_calls() {
        let reply = Reply {
            tool_calls: vec![ToolCall {
                id: Some("call_1".into()),
                name: "get_weather".into(),
                arguments: Some(json!({"city": "Hanoi"})),
                argument_chunks: None,
            }],
            ..Reply::default()
        };
        let body = chat_completion(&turn(), &Answer::new(&reply, 1));
        let message = &body["choices"][0]["message"];
        assert!(message["content"].is_null());
        assert_eq!(message["tool_calls"][0]["id"], "call_1");
        assert_eq!(
            message["tool_calls"][0]["function"]["arguments"],
            r#"{"city":"Hanoi"}"#
        );
        assert_eq!(body["choices"][0]["finish_reason"], "tool_calls");
    }

    #[test]
    fn stream_without_usage() {
        let answer = Answer::new(&Reply::default(), 3);
        let events = events(chat_stream(&turn(), &answer, false));
        assert_eq!(events.len(), 1 + 5 + 1 + 1);
        let first = json_of(&events[0]);
        assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(first["choices"][0]["delta"]["content"], "");
        assert!(first.get("usage").is_none());
        let text: String = events[1..6]
            .iter()
            .map(|e| {
                json_of(e)["choices"][0]["delta"]["content"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect();
        assert_eq!(text, answer::DEFAULT_TEXT);
        assert_eq!(json_of(&events[6])["choices"][0]["finish_reason"], "stop");
        assert_eq!(events[7], "data: [DONE]\n\n");
    }

    #[test]
    fn stream_with_usage_and_tool_call_deltas() {
        let reply = Reply {
            tool_calls: vec![ToolCall {
                id: None,
                name: "f".into(),
                arguments: None,
                argument_chunks: Some(vec!["{\"a\":".into(), "1}".into()]),
            }],
            usage: Some(Usage {
                prompt_tokens: 5,
                completion_tokens: 6,
                cached_tokens: 0,
            }),
            ..Reply::default()
        };
        let events = events(chat_stream(&turn(), &Answer::new(&reply, 1), true));
        // role, tool call head, two argument deltas, finish, usage, DONE
        assert_eq!(events.len(), 7);
        let head = json_of(&events[1]);
        assert_eq!(
            head["choices"][0]["delta"]["tool_calls"][0]["id"],
            "call_mock_7_0"
        );
        assert_eq!(
            head["choices"][0]["delta"]["tool_calls"][0]["function"]["name"],
            "f"
        );
        assert_eq!(
            json_of(&events[3])["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"],
            "1}"
        );
        assert_eq!(
            json_of(&events[4])["choices"][0]["finish_reason"],
            "tool_calls"
        );
        let usage = json_of(&events[5]);
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(usage["usage"]["total_tokens"], 11);
        assert_eq!(events[6], "data: [DONE]\n\n");
    }

    #[test]
    fn embeddings_one_vector_per_input() {
        let request = json!({"model": "e", "input": ["a", "b", "c"]});
        let body = embeddings(&turn(), &Reply::default(), &request);
        let data = body["data"].as_array().unwrap();
        assert_eq!(data.len(), 3);
        assert_eq!(data[2]["index"], 2);
        assert_eq!(
            data[0]["embedding"].as_array().unwrap().len(),
            DEFAULT_DIMENSIONS
        );
        assert_ne!(data[0]["embedding"], data[1]["embedding"]);
        // Deterministic.
        assert_eq!(body, embeddings(&turn(), &Reply::default(), &request));

        let single = embeddings(
            &turn(),
            &Reply::default(),
            &json!({"input": "x", "dimensions": 4}),
        );
        assert_eq!(single["data"][0]["embedding"].as_array().unwrap().len(), 4);
        let tokens = embeddings(&turn(), &Reply::default(), &json!({"input": [1, 2, 3]}));
        assert_eq!(tokens["data"].as_array().unwrap().len(), 1);

        let scripted = Reply {
            embedding: Some(vec![0.5, 0.25]),
            ..Reply::default()
        };
        let body = embeddings(&turn(), &scripted, &json!({"input": ["a", "b"]}));
        assert_eq!(body["data"][1]["embedding"], json!([0.5, 0.25]));
        let sized = Reply {
            dimensions: Some(1536),
            ..Reply::default()
        };
        let body = embeddings(&turn(), &sized, &json!({"input": "a"}));
        assert_eq!(body["data"][0]["embedding"].as_array().unwrap().len(), 1536);
    }

    #[test]
    fn embeddings_in_base64() {
        let scripted = Reply {
            embedding: Some(vec![1.0, -2.0]),
            ..Reply::default()
        };
        let body = embeddings(
            &turn(),
            &scripted,
            &json!({"input": "a", "encoding_format": "base64"}),
        );
        // 1.0f32 = 00 00 80 3f, -2.0f32 = 00 00 00 c0
        assert_eq!(body["data"][0]["embedding"], "AACAPwAAAMA=");
        assert_eq!(base64_f32(&[1.0]), "AACAPw==");
    }

    #[test]
    fn vectors_are_unit_length() {
        let v = vector_for("hello", 16);
        let norm: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4);
    }
}
