//! The caller's protocol ([`Protocol`]: chat completions, Messages, Responses) at the edges of
//! a call. The pool, the plan and the stream gate work on chat completions; this module says,
//! per protocol and provider kind, whether a lane is served natively (the caller's body with
//! only `model` rewritten, its answer passed as it comes) or through chat completions, and
//! turns what a lane answers into the caller's shape: unary bodies, stream events, errors.
//!
//! | protocol  | provider kind         | served                                           |
//! |-----------|-----------------------|--------------------------------------------------|
//! | Messages  | anthropic             | natively (`/messages`)                           |
//! | Messages  | any other             | Messages → chat → (answer) chat → Messages       |
//! | Responses | openai                | natively (`/responses`)                          |
//! | Responses | any other (stateless) | Responses → chat (→ Messages for anthropic) → …  |
//! | Gemini    | gemini                | natively (Google's own API, `gemini::native`)    |
//! | Gemini    | any other             | Gemini → chat → … → Gemini (JSON-array streams   |
//! |           |                       | on gemini lanes too)                             |
//!
//! A native lane takes the request whole: unknown fields, roles, blocks and tool types go as
//! they came. A translated lane takes what its translation expresses; a request it cannot
//! express rules that lane out ([`cut_untranslatable`], trail reason `adapter`).

pub mod anthropic;
pub mod context;
pub mod gemini;
pub mod messages;
pub mod prompt_cache;
pub mod responses;

use ai_router_contract::kinds::DailyReset;
use ai_router_proto::v1::ProviderKind;
use serde_json::{json, Value};

use crate::answer::errors::GatewayError;
use crate::classify::{classify_stream_error, failure::Failure};
use crate::plan::{Candidate, Protocol};
use crate::protocols::anthropic::error::AdapterError;
use crate::protocols::messages::request::Fidelity;
use crate::state::State;
use crate::vocab::Usage;
use crate::wire::sse::FromChatStream;
use crate::wire::sse::{Event, Parser};
use ai_router_contract::failure::ErrorClass;

/// Whether a lane of `kind` serves a call of `protocol` in the caller's own API.
pub fn native(protocol: Protocol, kind: ProviderKind) -> bool {
    match protocol {
        Protocol::Chat => false,
        Protocol::Messages => kind == ProviderKind::Anthropic,
        Protocol::Responses => kind == ProviderKind::Openai,
        // Over Google's own API (`gemini::native`; a JSON-array stream goes translated).
        Protocol::Gemini => kind == ProviderKind::Gemini,
    }
}

/// Whether the body the attempts get is already chat completions: a chat caller's, and a
/// Gemini caller's (translated by the front stage, since its model and stream are in the path).
pub fn carries_chat(protocol: Protocol) -> bool {
    matches!(protocol, Protocol::Chat | Protocol::Gemini)
}

/// The body a lane of `kind` is sent for the caller's `request`, before the attempt's own
/// additions (the lane's model id, `stream_options`, prompt-cache marks): the request itself
/// on a native lane, its translation on the others (or the refusal, naming the field).
pub fn lane_request(
    protocol: Protocol,
    kind: ProviderKind,
    request: &Value,
) -> Result<Value, AdapterError> {
    if protocol == Protocol::Chat || native(protocol, kind) {
        return Ok(request.clone());
    }
    let chat = chat_request(protocol, request, Fidelity::Strict)?;
    if kind == ProviderKind::Anthropic {
        let model = chat.get("model").and_then(Value::as_str).unwrap_or("");
        return crate::protocols::anthropic::request::to_messages_request(&chat, model, 4096);
    }
    Ok(chat)
}

/// Whether a lane of `kind` can take the caller's `request` ([`lane_request`] succeeds).
pub fn lane_takes(
    protocol: Protocol,
    kind: ProviderKind,
    request: &Value,
) -> Result<(), AdapterError> {
    if protocol == Protocol::Chat || native(protocol, kind) {
        // Chat callers' anthropic lanes are judged by the resolution (`resolve`).
        return Ok(());
    }
    lane_request(protocol, kind, request).map(drop)
}

/// The tiers without the lanes that cannot take `request` (each noted in the trail with
/// reason `adapter`); the first refusal when no lane is left.
pub fn cut_untranslatable(
    state: &State,
    protocol: Protocol,
    request: &Value,
    tiers: &mut Vec<Vec<Candidate>>,
    trail: &mut crate::answer::trail::Trail,
) -> Option<AdapterError> {
    if protocol == Protocol::Chat {
        return None;
    }
    // Judged once per provider kind.
    let mut judged: Vec<(ProviderKind, Option<AdapterError>)> = Vec::new();
    let mut first_refusal = None;
    for tier in tiers.iter_mut() {
        tier.retain(|c| {
            let Some(kind) = state.provider(&c.provider).map(|(_, p)| p.kind()) else {
                return true;
            };
            let refusal = match judged.iter().find(|(k, _)| *k == kind) {
                Some((_, r)) => r.clone(),
                None => {
                    let r = lane_takes(protocol, kind, request).err();
                    judged.push((kind, r.clone()));
                    r
                }
            };
            match refusal {
                None => true,
                Some(e) => {
                    trail.skip(&c.provider, "", &c.model, "adapter");
                    first_refusal.get_or_insert(e);
                    false
                }
            }
        });
    }
    tiers.retain(|t| !t.is_empty());
    if tiers.is_empty() {
        first_refusal
    } else {
        None
    }
}

/// The provider path (under its base URL) of a native call.
pub fn native_path(protocol: Protocol) -> &'static str {
    match protocol {
        Protocol::Chat => "/chat/completions",
        Protocol::Messages => "/messages",
        Protocol::Responses => "/responses",
        Protocol::Gemini => "/chat/completions",
    }
}

/// The caller's body as a chat-completions request: what the front stage routes by
/// ([`Fidelity::Lenient`]) and what a lane that is not native is sent ([`Fidelity::Strict`]).
pub fn chat_request(
    protocol: Protocol,
    body: &Value,
    fidelity: Fidelity,
) -> Result<Value, AdapterError> {
    match protocol {
        Protocol::Chat | Protocol::Gemini => Ok(body.clone()),
        Protocol::Messages => messages::request::to_chat_request(body, fidelity),
        Protocol::Responses if fidelity == Fidelity::Lenient => {
            responses::request::to_chat_request(&responses::request::routing_view(body))
        }
        Protocol::Responses => responses::request::to_chat_request(body),
    }
}

/// Whether the request needs a provider that keeps state (Responses only).
pub fn stateful(protocol: Protocol, body: &Value) -> Option<&'static str> {
    match protocol {
        Protocol::Responses => responses::stateful(body),
        _ => None,
    }
}

/// The tiers cut to the lanes that serve a stateful Responses call (kind openai), or `None`
/// when none is left.
pub fn stateful_tiers(state: &State, tiers: &[Vec<Candidate>]) -> Option<Vec<Vec<Candidate>>> {
    tiers_of_kind(state, tiers, ProviderKind::Openai)
}

/// The tiers cut to the lanes of `kind`, or `None` when none is left.
pub fn tiers_of_kind(
    state: &State,
    tiers: &[Vec<Candidate>],
    kind: ProviderKind,
) -> Option<Vec<Vec<Candidate>>> {
    let cut: Vec<Vec<Candidate>> = tiers
        .iter()
        .map(|tier| {
            tier.iter()
                .filter(|c| {
                    state
                        .provider(&c.provider)
                        .is_some_and(|(_, p)| p.kind() == kind)
                })
                .cloned()
                .collect::<Vec<_>>()
        })
        .filter(|tier| !tier.is_empty())
        .collect();
    (!cut.is_empty()).then_some(cut)
}

/// `anthropic-version` as the caller sent it: absent is the adapter's version; anything
/// that is not a `YYYY-MM-DD` date is refused.
pub fn anthropic_version(header: Option<&str>) -> Result<String, String> {
    let Some(v) = header.map(str::trim) else {
        return Ok(crate::protocols::anthropic::ANTHROPIC_VERSION.to_string());
    };
    let b = v.as_bytes();
    let date_like = b.len() == 10
        && b.iter().enumerate().all(|(i, c)| match i {
            4 | 7 => *c == b'-',
            _ => c.is_ascii_digit(),
        });
    if date_like {
        Ok(v.to_string())
    } else {
        Err(format!(
            "anthropic-version must be a date such as {} (got '{v}').",
            crate::protocols::anthropic::ANTHROPIC_VERSION
        ))
    }
}

/// A chat-completions answer in the caller's shape (`request`: the caller's body).
pub fn unary(protocol: Protocol, chat: &Value, request: &Value, now_s: i64) -> Value {
    match protocol {
        Protocol::Chat => chat.clone(),
        Protocol::Messages => messages::response::from_chat_response(chat),
        Protocol::Responses => responses::response::from_chat_response(chat, request, now_s),
        Protocol::Gemini if gemini::embed::is_embeddings_answer(chat) => {
            gemini::embed::from_openai(chat, request)
        }
        Protocol::Gemini => gemini::response::from_chat_response(chat),
    }
}

/// One entry of `GET /v1/models` for a caller of `protocol`.
pub fn model_entry(protocol: Protocol, id: &str) -> Value {
    match protocol {
        Protocol::Messages => json!({ "type": "model", "id": id, "display_name": id,
                                      "created_at": "1970-01-01T00:00:00Z" }),
        Protocol::Gemini => gemini::errors::model_entry(id),
        _ => json!({ "id": id, "object": "model", "created": 0, "owned_by": "ai-router" }),
    }
}

/// The `GET /v1/models` list of `entries` for a caller of `protocol`.
pub fn model_list(protocol: Protocol, entries: Vec<Value>) -> Value {
    match protocol {
        Protocol::Messages => {
            let id =
                |e: Option<&Value>| e.and_then(|e| e.get("id")).cloned().unwrap_or(Value::Null);
            json!({ "first_id": id(entries.first()), "last_id": id(entries.last()),
                    "has_more": false, "data": entries })
        }
        Protocol::Gemini => gemini::errors::model_list(entries),
        _ => json!({ "object": "list", "data": entries }),
    }
}

/// The gateway's error object for a caller of `protocol` (Responses errors are OpenAI's).
pub fn error_body(protocol: Protocol, err: &GatewayError) -> Vec<u8> {
    let body = match protocol {
        Protocol::Messages => {
            messages::errors::error_body(err.status, err.code.as_str(), &err.message)
                .to_string()
                .into_bytes()
        }
        Protocol::Gemini => gemini::errors::error_body(err.status, err.code.as_str(), &err.message)
            .to_string()
            .into_bytes(),
        _ => err.body(),
    };
    // A refusal that ruled out candidates names them, as a final error does.
    match &err.trail {
        Some(trail) => crate::answer::trail::with_trail(&body, trail).unwrap_or(body),
        None => body,
    }
}

/// Whether a final error answer to a caller of `protocol` is re-dressed in its shape.
pub fn redresses_errors(protocol: Protocol) -> bool {
    matches!(protocol, Protocol::Messages | Protocol::Gemini)
}

/// A final error answer (an OpenAI error object from the stages or Envoy) re-dressed for the
/// caller; `None` when it already has the caller's shape.
pub fn redress_error(protocol: Protocol, status: u16, body: &[u8]) -> Option<Vec<u8>> {
    match protocol {
        Protocol::Messages => {
            let parsed: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
            if parsed.get("type").and_then(Value::as_str) == Some("error") {
                // A native provider's refusal is already Anthropic's.
                return None;
            }
            Some(messages::errors::error_from_openai(status, body))
        }
        Protocol::Gemini => {
            let parsed: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
            if parsed
                .pointer("/error/status")
                .is_some_and(Value::is_string)
            {
                return None;
            }
            Some(gemini::errors::error_from_openai(status, body))
        }
        _ => None,
    }
}

/// Usage of a native unary answer: its `usage` (Gemini: its `usageMetadata`).
pub fn answer_usage(protocol: Protocol, answer: &Value) -> Option<Usage> {
    match protocol {
        Protocol::Gemini => crate::protocols::gemini::native::usage(answer.get("usageMetadata")?),
        _ => native_usage(protocol, answer.get("usage")),
    }
}

/// Usage of a native answer (unary body, or the usage object of a stream event).
pub fn native_usage(protocol: Protocol, usage: Option<&Value>) -> Option<Usage> {
    let u = usage.filter(|u| u.is_object())?;
    let get = |p: &str| u.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    Some(match protocol {
        Protocol::Messages => {
            let cache_read = get("/cache_read_input_tokens");
            Usage {
                prompt_tokens: get("/input_tokens")
                    + cache_read
                    + get("/cache_creation_input_tokens"),
                completion_tokens: get("/output_tokens"),
                cached_tokens: cache_read,
            }
        }
        Protocol::Responses => Usage {
            prompt_tokens: get("/input_tokens"),
            completion_tokens: get("/output_tokens"),
            cached_tokens: get("/input_tokens_details/cached_tokens"),
        },
        Protocol::Chat | Protocol::Gemini => crate::vocab::usage_of(&json!({ "usage": u }))?,
    })
}

// ---------------------------------------------------------------------------------------------
// Streams
// ---------------------------------------------------------------------------------------------

/// Chat-completion chunk bytes (what the stream gate lets through) -> the caller's events.
pub struct Egress {
    parser: Parser,
    encoder: Box<dyn FromChatStream>,
}

impl Egress {
    /// `None` for chat callers (nothing to translate). `json_array`: a Gemini stream without
    /// `alt=sse`.
    pub fn new(protocol: Protocol, request: &Value, now_s: i64, json_array: bool) -> Option<Self> {
        let encoder: Box<dyn FromChatStream> = match protocol {
            Protocol::Chat => return None,
            Protocol::Gemini => Box::new(gemini::stream::StreamEncoder::new(json_array)),
            Protocol::Messages => Box::new(messages::stream::StreamEncoder::new()),
            Protocol::Responses => Box::new(responses::stream::StreamEncoder::new(
                request.clone(),
                now_s,
            )),
        };
        Some(Self {
            parser: Parser::new(),
            encoder,
        })
    }

    pub fn encode(&mut self, chat: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        for event in self.parser.feed(chat) {
            out.extend(self.encoder.feed(&event));
        }
        out
    }
}

/// How a native stream's event counts for the gate.
#[derive(Debug, Default, PartialEq)]
pub struct NativeEvent {
    /// The first token (content, a tool call, or the end of the answer).
    pub token: bool,
    /// The provider ended the answer properly.
    pub done: bool,
    pub error: Option<Failure>,
}

/// The stream gate's reading of a native (Messages or Responses) stream: tokens, the end,
/// errors and usage.
#[derive(Debug, Clone)]
pub struct NativeStream {
    protocol: Protocol,
    kind: String,
    /// When the provider's days end: a quota error in the stream lasts until then
    /// (`Gate::with_daily_reset`).
    pub(crate) daily_reset: Option<DailyReset>,
    /// Messages sends usage in two parts (`message_start`, then `message_delta`).
    usage: serde_json::Map<String, Value>,
}

fn malformed() -> Failure {
    Failure::local(
        ErrorClass::Stream,
        200,
        "the provider sent malformed stream data",
    )
}

impl NativeStream {
    pub fn new(protocol: Protocol, kind: &str) -> Self {
        Self {
            protocol,
            kind: kind.to_string(),
            daily_reset: None,
            usage: Default::default(),
        }
    }

    pub fn usage(&self) -> Option<Usage> {
        if self.usage.is_empty() {
            return None;
        }
        if self.protocol == Protocol::Gemini {
            return crate::protocols::gemini::native::usage(&Value::Object(self.usage.clone()));
        }
        native_usage(self.protocol, Some(&Value::Object(self.usage.clone())))
    }

    fn take_usage(&mut self, usage: Option<&Value>) {
        if let Some(Value::Object(u)) = usage {
            for (k, v) in u {
                if !v.is_null() {
                    self.usage.insert(k.clone(), v.clone());
                }
            }
        }
    }

    /// Judges one event with data.
    pub fn judge(&mut self, event: &Event, now_ms: i64) -> NativeEvent {
        let Ok(value) = serde_json::from_str::<Value>(event.data.trim()) else {
            return NativeEvent {
                error: Some(malformed()),
                ..Default::default()
            };
        };
        if self.protocol == Protocol::Gemini {
            let chunk = crate::protocols::gemini::native::judge(
                &self.kind,
                self.daily_reset,
                &value,
                &mut self.usage,
                now_ms,
            );
            return NativeEvent {
                token: chunk.token,
                done: chunk.done,
                error: chunk.error,
            };
        }
        let kind = value
            .get("type")
            .and_then(Value::as_str)
            .or(event.name.as_deref())
            .unwrap_or("")
            .to_string();
        match self.protocol {
            Protocol::Messages => self.judge_messages(&kind, &value, now_ms),
            _ => self.judge_responses(&kind, &value, now_ms),
        }
    }

    fn judge_messages(&mut self, kind: &str, value: &Value, now_ms: i64) -> NativeEvent {
        let mut judged = NativeEvent::default();
        match kind {
            "error" => {
                judged.error = Some(classify_stream_error(
                    &self.kind,
                    self.daily_reset,
                    value,
                    now_ms,
                ))
            }
            "message_start" => self.take_usage(value.pointer("/message/usage")),
            "content_block_start" => {
                let block = value.get("content_block").unwrap_or(&Value::Null);
                judged.token = match block.get("type").and_then(Value::as_str) {
                    Some("text") => block
                        .get("text")
                        .and_then(Value::as_str)
                        .is_some_and(|t| !t.is_empty()),
                    Some("thinking") | Some("redacted_thinking") => false,
                    // tool_use, server tools and anything newer carry content of their own.
                    _ => true,
                };
            }
            "content_block_delta" => judged.token = true,
            "message_delta" => {
                self.take_usage(value.get("usage"));
                judged.token = true;
            }
            "message_stop" => {
                judged.token = true;
                judged.done = true;
            }
            _ => {}
        }
        judged
    }

    fn judge_responses(&mut self, kind: &str, value: &Value, now_ms: i64) -> NativeEvent {
        let mut judged = NativeEvent::default();
        match kind {
            "error" => {
                let wrapped = json!({ "error": {
                    "message": value.get("message").cloned().unwrap_or(Value::Null),
                    "code": value.get("code").cloned().unwrap_or(Value::Null),
                }});
                judged.error = Some(classify_stream_error(
                    &self.kind,
                    self.daily_reset,
                    &wrapped,
                    now_ms,
                ));
            }
            "response.failed" => {
                let wrapped = json!({ "error": value.pointer("/response/error").cloned().unwrap_or(Value::Null) });
                judged.error = Some(classify_stream_error(
                    &self.kind,
                    self.daily_reset,
                    &wrapped,
                    now_ms,
                ));
            }
            "response.completed" | "response.incomplete" => {
                self.take_usage(value.pointer("/response/usage"));
                judged.token = true;
                judged.done = true;
            }
            "response.output_item.added" => {
                judged.token =
                    value.pointer("/item/type").and_then(Value::as_str) == Some("function_call");
            }
            k if k.ends_with(".delta") => judged.token = true,
            _ => {}
        }
        judged
    }

    /// The event that ends a native stream which broke after its first token.
    pub fn error_event(&self, message: &str) -> Vec<u8> {
        let code = ai_router_contract::error_code::ErrorCode::StreamInterrupted.as_str();
        match self.protocol {
            Protocol::Messages => format!(
                "event: error\ndata: {}\n\n",
                messages::errors::stream_error(message)
            )
            .into_bytes(),
            Protocol::Gemini => crate::protocols::gemini::native::error_event(message),
            _ => {
                let error =
                    json!({ "type": "error", "code": code, "message": message, "param": null });
                let failed = json!({ "type": "response.failed", "response": {
                    "object": "response", "status": "failed",
                    "error": { "code": code, "message": message } } });
                format!("event: error\ndata: {error}\n\nevent: response.failed\ndata: {failed}\n\n")
                    .into_bytes()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ai_router_contract::error_code::ErrorCode;

    #[test]
    fn which_lanes_serve_natively() {
        use ProviderKind::*;
        assert!(native(Protocol::Messages, Anthropic));
        assert!(!native(Protocol::Messages, Openai));
        assert!(native(Protocol::Responses, Openai));
        assert!(!native(Protocol::Responses, OpenaiCompatible));
        assert!(!native(Protocol::Chat, Anthropic));
        assert_eq!(native_path(Protocol::Responses), "/responses");
    }

    #[test]
    fn anthropic_version_defaults_and_is_checked() {
        assert_eq!(anthropic_version(None).unwrap(), "2023-06-01");
        assert_eq!(anthropic_version(Some("2024-10-22")).unwrap(), "2024-10-22");
        assert!(anthropic_version(Some("latest")).is_err());
        assert!(anthropic_version(Some("2023-6-1")).is_err());
    }

    #[test]
    fn errors_take_the_callers_shape() {
        let err = GatewayError::of(ErrorCode::RequestsPerMinuteExceeded);
        let v: Value = serde_json::from_slice(&error_body(Protocol::Messages, &err)).unwrap();
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "rate_limit_error");
        assert_eq!(v["error"]["code"], "requests_per_minute_exceeded");
        assert_eq!(error_body(Protocol::Responses, &err), err.body());
        assert_eq!(error_body(Protocol::Chat, &err), err.body());
        // A refusal's trail goes in `error.trail` in either shape.
        let mut trail = crate::answer::trail::Trail::default();
        trail.skip("gem", "", "m", "region_blocked");
        let refused = GatewayError::of(ErrorCode::ModelNotSupported).with_trail(trail);
        for protocol in [Protocol::Chat, Protocol::Messages] {
            let v: Value = serde_json::from_slice(&error_body(protocol, &refused)).unwrap();
            assert_eq!(
                v["error"]["trail"]["skipped"][0]["reason"], "region_blocked",
                "{v}"
            );
        }
        let redressed = redress_error(
            Protocol::Messages,
            503,
            &GatewayError::of(ErrorCode::PoolUnavailable).body(),
        )
        .unwrap();
        let v: Value = serde_json::from_slice(&redressed).unwrap();
        assert_eq!(v["error"]["type"], "overloaded_error");
        // A native refusal already in the Anthropic shape is left as it is.
        let native = br#"{"type":"error","error":{"type":"invalid_request_error","message":"x"}}"#;
        assert_eq!(redress_error(Protocol::Messages, 400, native), None);
        assert_eq!(redress_error(Protocol::Responses, 400, &err.body()), None);
    }

    #[test]
    fn model_lists_per_protocol() {
        let list = model_list(
            Protocol::Messages,
            vec![
                model_entry(Protocol::Messages, "a"),
                model_entry(Protocol::Messages, "b"),
            ],
        );
        assert_eq!(
            (list["first_id"].clone(), list["last_id"].clone()),
            (json!("a"), json!("b"))
        );
        assert_eq!(list["data"][0]["type"], "model");
        assert_eq!(list["has_more"], false);
        let list = model_list(Protocol::Chat, vec![model_entry(Protocol::Chat, "a")]);
        assert_eq!(
            (list["object"].clone(), list["data"][0]["object"].clone()),
            (json!("list"), json!("model"))
        );
    }

    #[test]
    fn native_usage_per_protocol() {
        let u = json!({ "input_tokens": 5, "cache_read_input_tokens": 3, "cache_creation_input_tokens": 2, "output_tokens": 4 });
        assert_eq!(
            native_usage(Protocol::Messages, Some(&u)),
            Some(Usage {
                prompt_tokens: 10,
                completion_tokens: 4,
                cached_tokens: 3
            })
        );
        let u = json!({ "input_tokens": 5, "output_tokens": 4, "input_tokens_details": { "cached_tokens": 1 } });
        assert_eq!(
            native_usage(Protocol::Responses, Some(&u)),
            Some(Usage {
                prompt_tokens: 5,
                completion_tokens: 4,
                cached_tokens: 1
            })
        );
        assert_eq!(native_usage(Protocol::Messages, None), None);
    }

    fn event(name: &str, data: Value) -> Event {
        Event {
            raw: Vec::new(),
            name: Some(name.into()),
            data: data.to_string(),
        }
    }

    #[test]
    fn a_native_messages_stream_is_judged() {
        let mut s = NativeStream::new(Protocol::Messages, "anthropic");
        let start = s.judge(&event("message_start", json!({ "type": "message_start",
            "message": { "usage": { "input_tokens": 9, "cache_read_input_tokens": 1, "output_tokens": 1 } } })), 0);
        assert!(!start.token);
        let text_start = s.judge(
            &event(
                "content_block_start",
                json!({ "type": "content_block_start",
            "index": 0, "content_block": { "type": "text", "text": "" } }),
            ),
            0,
        );
        assert!(!text_start.token);
        let tool_start = s.judge(
            &event(
                "content_block_start",
                json!({ "type": "content_block_start",
            "index": 1, "content_block": { "type": "tool_use", "name": "f" } }),
            ),
            0,
        );
        assert!(tool_start.token);
        assert!(
            s.judge(
                &event(
                    "content_block_delta",
                    json!({ "type": "content_block_delta" })
                ),
                0
            )
            .token
        );
        s.judge(
            &event(
                "message_delta",
                json!({ "type": "message_delta", "usage": { "output_tokens": 7 } }),
            ),
            0,
        );
        let stop = s.judge(&event("message_stop", json!({ "type": "message_stop" })), 0);
        assert!(stop.done);
        assert_eq!(
            s.usage(),
            Some(Usage {
                prompt_tokens: 10,
                completion_tokens: 7,
                cached_tokens: 1
            })
        );
        let e = s.judge(&event("error", json!({ "type": "error", "error": { "type": "overloaded_error", "message": "busy" } })), 0);
        assert!(e.error.is_some());
        let bad = s.judge(
            &Event {
                raw: Vec::new(),
                name: None,
                data: "{oops".into(),
            },
            0,
        );
        assert_eq!(bad.error.map(|f| f.class), Some(ErrorClass::Stream));
        let end = String::from_utf8(s.error_event("cut")).unwrap();
        assert!(end.starts_with("event: error\ndata: {"), "{end}");
        assert!(end.contains("\"stream_interrupted\""));
    }

    #[test]
    fn a_native_responses_stream_is_judged() {
        let mut s = NativeStream::new(Protocol::Responses, "openai");
        assert!(
            !s.judge(
                &event("response.created", json!({ "type": "response.created" })),
                0
            )
            .token
        );
        assert!(
            s.judge(
                &event(
                    "response.output_text.delta",
                    json!({ "type": "response.output_text.delta", "delta": "x" })
                ),
                0
            )
            .token
        );
        let done = s.judge(
            &event(
                "response.completed",
                json!({ "type": "response.completed",
            "response": { "usage": { "input_tokens": 3, "output_tokens": 2 } } }),
            ),
            0,
        );
        assert!(done.done);
        assert_eq!(s.usage().map(|u| u.completion_tokens), Some(2));
        let failed = s.judge(
            &event(
                "response.failed",
                json!({ "type": "response.failed",
            "response": { "error": { "code": "server_error", "message": "x" } } }),
            ),
            0,
        );
        assert!(failed.error.is_some());
        let end = String::from_utf8(s.error_event("cut")).unwrap();
        assert!(end.contains("event: response.failed"));
    }

    #[test]
    fn egress_translates_chat_chunks_for_the_caller() {
        assert!(Egress::new(Protocol::Chat, &Value::Null, 0, false).is_none());
        let mut e = Egress::new(Protocol::Messages, &Value::Null, 0, false).unwrap();
        let chunk = b"data: {\"id\":\"chatcmpl-1\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n";
        let out = String::from_utf8(e.encode(&chunk[..20])).unwrap();
        assert!(out.is_empty());
        let out = String::from_utf8(e.encode(&chunk[20..])).unwrap();
        assert!(out.starts_with("event: message_start"), "{out}");
        assert!(out.contains("\"text\":\"Hi\""));
    }
}
