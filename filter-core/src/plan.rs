//! The call plan the front stage makes for the attempt stage: kept in the call's bookkeeping,
//! named by the ticket in header `x-ai-router-plan`.

use std::rc::Rc;

use serde::{Deserialize, Serialize};

use crate::vocab::LaneId;

pub const PLAN_HEADER: &str = ai_router_contract::headers::PLAN;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
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
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub provider: String,
    pub model: String,
    pub weight: f64,
    /// `when`: the triggers after which this candidate may be tried; empty: unconditional.
    pub when: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Unique per call within this VM: the key of the call's attempt bookkeeping.
    pub cid: String,
    /// x-request-id.
    pub rid: String,
    /// The `idempotency-key` every attempt sends (`headers::upstream_idempotency_key`); empty:
    /// none.
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
    pub tokens: u64,
    /// The client asked for the routing trail on a success too (`x-ai-router-trail: 1`).
    pub trail: bool,
    /// The profile the call resolved to (empty: a direct model call), for the reports.
    pub profile: String,
    /// The policy's `promptCache` for anthropic lanes ("5m", "1h"); empty: none.
    pub prompt_cache: String,
    /// The call's session digest (`affinity::session_of`), when it has one and affinity is on.
    pub session: Option<String>,
    /// The caller's API.
    pub protocol: Protocol,
    /// Messages: the caller's `anthropic-version` and `anthropic-beta`, for the providers of
    /// kind anthropic that serve it natively.
    pub anthropic_version: Option<String>,
    pub anthropic_beta: Option<String>,
    /// `POST /v1/messages/count_tokens`, passed to an anthropic lane (the only lanes its tiers
    /// keep) on `/messages/count_tokens`.
    pub count_tokens: bool,
    /// Gemini's `:streamGenerateContent` without `alt=sse`: the stream is one JSON array.
    pub json_array: bool,
    /// Estimated prompt tokens and the request's output estimate, for a streamed answer's cost.
    pub prompt_tokens: u64,
    pub max_tokens: u64,
    /// `resetIntervalMs` (0: none): parked lanes are probed once per interval.
    pub reset_ms: u64,
    /// The configured first choice, which a cheaper answer's saving is counted against.
    pub first_choice: Option<Candidate>,
    /// Responses: the stored state the call names and whether its answer is stored
    /// (`response_pins`: the only key it may use, and what the answering lane remembers).
    pub responses: Option<Stored>,
    /// Chat and Messages: the caller's body as the front stage read it, for the attempt stage
    /// to send it as it came without reading it again.
    pub body_top: Option<BodyTop>,
}

/// What the attempt stage needs of the caller's body to send it as it came: the `model` it
/// names and whether it has `stream_options` of its own (the front stage refused a body that
/// repeats a top-level field, so these are what a provider reads).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BodyTop {
    pub model: Option<String>,
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

/// A call's plan, kept in the call's bookkeeping ([`crate::vm::call::Call::plan`]), and the
/// ticket the front stage's header carries to the attempt stage: the call's id and a number
/// drawn for the call. Every attempt of the call takes the plan, shared, from the table, where
/// the ticket names it; nothing is encoded or decoded on the way. (The attempt listener runs on
/// the front's worker and in its VM, so the call is always in the table an attempt reads.)
#[derive(Debug, Clone, PartialEq)]
pub struct Written {
    pub ticket: Rc<str>,
    pub plan: Rc<Plan>,
}

impl Written {
    /// The plan with its ticket, `draw` the call's number (any 64 bits the client cannot
    /// choose).
    pub fn new(plan: Plan, draw: u64) -> Written {
        Written {
            ticket: format!("{}.{draw:016x}", plan.cid).into(),
            plan: Rc::new(plan),
        }
    }

    /// The call id a ticket names (`None`: not a ticket).
    pub fn cid_of(ticket: &str) -> Option<&str> {
        let (cid, draw) = ticket.rsplit_once('.')?;
        (!cid.is_empty() && draw.len() == 16).then_some(cid)
    }

    /// The plan a header's ticket names: the one `written` (the bookkeeping of the call the
    /// ticket names) holds for that very ticket; `None` for any other text.
    pub fn read(ticket: &str, written: impl FnOnce(&str) -> Option<Written>) -> Option<Rc<Plan>> {
        let kept = Self::cid_of(ticket).and_then(written)?;
        (*kept.ticket == *ticket).then_some(kept.plan)
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
