//! The call plan the front stage writes for the attempt stage (header `x-ai-router-plan`).

use std::rc::Rc;

use serde::{Deserialize, Serialize};

use crate::vocab::LaneId;

pub const PLAN_HEADER: &str = ai_router_contract::headers::PLAN;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Operation {
    Chat,
    Embeddings,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Chat => "chat",
            Operation::Embeddings => "embeddings",
        }
    }

    /// The API path under a provider's base URL.
    pub fn path(self) -> &'static str {
        match self {
            Operation::Chat => "/chat/completions",
            Operation::Embeddings => "/embeddings",
        }
    }
}

/// The API the caller speaks. Routing is the same for all three (a call is an `Operation::Chat`);
/// what differs is the shape of the request sent to each lane and of the answer returned.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// OpenAI chat completions (and embeddings).
    #[default]
    Chat,
    /// The Anthropic Messages API, `POST /v1/messages`.
    Messages,
    /// The OpenAI Responses API, `POST /v1/responses`.
    Responses,
    /// Google's Gemini API, `POST /v1beta/models/{model}:generateContent` (and the stream).
    /// The front stage translates the request to chat completions once (its model and stream
    /// are in the path), so the attempts carry a chat body; only the answers differ.
    Gemini,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Chat => "chat",
            Protocol::Messages => "messages",
            Protocol::Responses => "responses",
            Protocol::Gemini => "gemini",
        }
    }
}

/// The client protocol a call came in by, as the reports name it: `chat`, `responses`,
/// `messages` or `embeddings` (an embeddings call is OpenAI's, whatever its path).
pub fn client_protocol(op: Operation, protocol: Protocol) -> &'static str {
    match op {
        Operation::Embeddings => "embeddings",
        Operation::Chat => protocol.as_str(),
    }
}

/// One (provider, model) a call may use, with its share of its tier.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    #[serde(rename = "p")]
    pub provider: String,
    #[serde(rename = "m")]
    pub model: String,
    #[serde(rename = "w", default = "one")]
    pub weight: f64,
    /// `when`: the triggers after which this candidate may be tried; empty: unconditional.
    #[serde(rename = "c", default, skip_serializing_if = "Vec::is_empty")]
    pub when: Vec<String>,
}

fn one() -> f64 {
    1.0
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Unique per call within this VM: the key of the call's attempt bookkeeping.
    pub cid: String,
    /// x-request-id.
    pub rid: String,
    /// The `idempotency-key` every attempt sends (`headers::upstream_idempotency_key`); empty:
    /// none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub idempotency_key: String,
    /// The virtual key's id.
    pub vk: String,
    pub op: Operation,
    pub stream: bool,
    /// Whether the client asked for the usage chunk.
    pub include_usage: bool,
    /// Ordered tiers; candidates of one tier share load by weight.
    pub tiers: Vec<Vec<Candidate>>,
    pub max_attempts: u32,
    pub timeout_ms: u64,
    pub deadline_ms: u64,
    pub started_ms: i64,
    /// Estimated prompt tokens plus max_tokens, against reported token headroom.
    #[serde(default)]
    pub tokens: u64,
    /// The client asked for the routing trail on a success too (`x-ai-router-trail: 1`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub trail: bool,
    /// The profile the call resolved to (empty: a direct model call), for the reports.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub profile: String,
    /// The policy's `promptCache` for anthropic lanes ("5m", "1h"); empty: none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub prompt_cache: String,
    /// The call's session digest (`affinity::session_of`), when it has one and affinity is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// The caller's API.
    #[serde(default, skip_serializing_if = "is_chat")]
    pub protocol: Protocol,
    /// Messages: the caller's `anthropic-version` and `anthropic-beta`, for the providers of
    /// kind anthropic that serve it natively.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anthropic_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anthropic_beta: Option<String>,
    /// `POST /v1/messages/count_tokens`, passed to an anthropic lane (the only lanes its tiers
    /// keep) on `/messages/count_tokens`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub count_tokens: bool,
    /// Gemini's `:streamGenerateContent` without `alt=sse`: the stream is one JSON array.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub json_array: bool,
    /// Estimated prompt tokens and the request's output estimate, for a streamed answer's cost.
    #[serde(default)]
    pub prompt_tokens: u64,
    #[serde(default)]
    pub max_tokens: u64,
    /// `resetIntervalMs` (0: none): parked lanes are probed once per interval.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub reset_ms: u64,
    /// The configured first choice, which a cheaper answer's saving is counted against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_choice: Option<Candidate>,
    /// Responses: the stored state the call names and whether its answer is stored
    /// (`response_pins`: the only key it may use, and what the answering lane remembers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub responses: Option<Stored>,
    /// Chat and Messages: the caller's body as the front stage read it, for the attempt stage
    /// to send it as it came without reading it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_top: Option<BodyTop>,
}

/// What the attempt stage needs of the caller's body to send it as it came: the `model` it
/// names and whether it has `stream_options` of its own (the front stage refused a body that
/// repeats a top-level field, so these are what a provider reads).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BodyTop {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stream_options: bool,
}

impl BodyTop {
    /// The top of the caller's parsed body.
    pub fn of(body: &serde_json::Value) -> Self {
        Self {
            model: body
                .get("model")
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned),
            stream_options: body.get("stream_options").is_some(),
        }
    }
}

fn is_chat(p: &Protocol) -> bool {
    *p == Protocol::Chat
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Plan {
    pub fn encode(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    pub fn decode(text: &str) -> Option<Plan> {
        serde_json::from_str(text).ok()
    }

    /// The call id a plan's header names, read without decoding it: `cid` is the first field
    /// [`Plan::encode`] writes (`None` when the text does not start so, or the id is escaped).
    pub fn cid_of(text: &str) -> Option<&str> {
        let rest = text.strip_prefix(r#"{"cid":""#)?;
        let cid = &rest[..rest.find('"')?];
        (!cid.contains('\\')).then_some(cid)
    }
}

/// A call's plan as the front stage wrote it in its header, kept in the call's bookkeeping
/// ([`crate::vm::call::Call::plan`]): every attempt of the call whose header is this text
/// takes this plan, shared, instead of decoding the text again.
#[derive(Debug, Clone, PartialEq)]
pub struct Written {
    pub text: Rc<str>,
    pub plan: Rc<Plan>,
}

impl Written {
    pub fn new(plan: Plan) -> Written {
        Written {
            text: plan.encode().into(),
            plan: Rc::new(plan),
        }
    }

    /// The plan a header's text is: the one `written` (the bookkeeping of the call the text
    /// names) holds for that very text, otherwise the text decoded (`None`: not a plan).
    pub fn read(text: &str, written: impl FnOnce(&str) -> Option<Written>) -> Option<Rc<Plan>> {
        let kept = Plan::cid_of(text).and_then(written);
        match kept {
            Some(w) if *w.text == *text => Some(w.plan),
            _ => Plan::decode(text).map(Rc::new),
        }
    }
}
/// The field a call's stored state came by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Via {
    PreviousResponseId,
    Conversation,
}

impl Via {
    pub fn param(self) -> &'static str {
        match self {
            Via::PreviousResponseId => "previous_response_id",
            Via::Conversation => "conversation",
        }
    }

    /// The table's name for an id of this kind (a stored response's id is remembered under
    /// the name `previous_response_id` later looks it up by).
    pub(crate) fn scoped(self, id: &str) -> String {
        match self {
            Via::PreviousResponseId => format!("response\u{0}{id}"),
            Via::Conversation => format!("conversation\u{0}{id}"),
        }
    }
}

/// The one provider key a call may use.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyPin {
    #[serde(rename = "p")]
    pub provider: String,
    #[serde(rename = "k")]
    pub key: String,
    /// The field that pinned it.
    pub via: Via,
}

impl KeyPin {
    pub(crate) fn is(&self, lane: &LaneId) -> bool {
        lane.provider == self.provider && lane.key == self.key
    }
}

/// A Responses call's stored state, carried in its plan.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Stored {
    /// The digests of the ids the call names (its `previous_response_id`, its
    /// `conversation`): remembered for the key that answers it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
    /// The key that stored them, when the table knows it: the only key the call may use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pin: Option<KeyPin>,
    /// The provider keeps the answer (`store` absent or true): its id is remembered.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub store: bool,
}
