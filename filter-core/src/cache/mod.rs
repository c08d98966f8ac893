//! The response cache (pool `cache: { ttlMs, maxEntries, maxBytes }`): the front stage looks a
//! resolved request up before it plans any attempt, answers a hit itself, and stores a missed
//! call's answer as it passes back. Decisions here; the stage only moves bytes.
//!
//! - The key is the resolved request: the candidates the call resolves to and the body's
//!   messages, tools and sampling parameters; `stream` and `stream_options` do not split it
//!   (a stored answer replays as SSE to a streaming client, [`crate::cache::shapes::replay_sse`]).
//! - Storage is bounded per Envoy process: shared data cannot drop a key, so entries live in
//!   `maxEntries` fixed slots, a key's slot chosen by its hash ([`slot_of`]). The eviction
//!   rule: a new answer replaces whatever its slot holds (direct-mapped); an entry past its
//!   TTL is a miss. An answer larger than `maxBytes / maxEntries` is not stored, so the cache
//!   never holds more than `maxBytes` of answers.
//! - Only complete answers are stored ([`storable`]): a 200 with choices, none cut at
//!   `length`, none empty. A streamed answer is stored as the chat completion its events
//!   assemble to ([`assemble_stream`]) only when the stream ended cleanly: `[DONE]` after
//!   every choice's finish and no error event; a stream that broke off stores nothing.
//! - Whether a call uses the cache ([`applies`]): the key's `cache` when set, else the merged
//!   policy's, else on (with the pool's `cache:`). `Cache-Control: no-cache` or `no-store` from
//!   the client skips the lookup and the store ([`bypassed`]).
//! - Every caller protocol is cached, each in its own key space ([`key_for`]): a chat caller's
//!   entries hold chat completions, a Messages caller's Messages `message`s, a Responses
//!   caller's `response`s (their shapes in [`crate::cache::shapes`]). A stateful Responses call
//!   (`previous_response_id`, `store: true`) is never cached: its answer is the provider's state.

pub mod shapes;

use ai_router_proto::names::sync;
use ai_router_proto::v1::{CacheSettings, CacheStore};
use serde_json::{json, Value};

use crate::host::Host;
use crate::plan::Operation;
use ai_router_contract::sha256_hex;

/// Writes a store tries before it gives the slot up to the workers racing for it.
const STORE_TRIES: usize = 4;

/// How many bytes of SSE a stream may take per byte of its slot while it is collected.
const STREAM_BYTES_PER_SLOT_BYTE: u64 = 8;

/// The body fields that make two requests the same request.
const KEYED_FIELDS: &[&str] = &[
    "messages",
    "input",
    "tools",
    "tool_choice",
    "functions",
    "function_call",
    "parallel_tool_calls",
    "response_format",
    "temperature",
    "top_p",
    "n",
    "stop",
    "seed",
    "max_tokens",
    "max_completion_tokens",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "dimensions",
    "encoding_format",
];

/// The cache key (hex SHA-256) of a chat-completions or embeddings request resolved to `models`.
pub fn key_of(op: Operation, models: &[&str], body: &Value) -> String {
    let mut keyed = serde_json::Map::new();
    for field in KEYED_FIELDS {
        if let Some(v) = body.get(*field) {
            keyed.insert((*field).to_owned(), v.clone());
        }
    }
    // serde_json's map is ordered by key: the same fields give the same text.
    let text = json!({ "op": op.as_str(), "models": models, "body": keyed }).to_string();
    sha256_hex(text.as_bytes())
}

/// The cache key of a caller's request (`body` as the caller sent it) resolved to `models`: a
/// chat caller's is [`key_of`]; a Messages or Responses caller's is in a space of its own
/// protocol, over its body less what does not change the answer, and for Messages the
/// `anthropic-version` and `anthropic-beta` it sent (a beta can change the answer's shape).
pub fn key_for(
    protocol: crate::plan::Protocol,
    op: Operation,
    models: &[&str],
    body: &Value,
    anthropic: (Option<&str>, Option<&str>),
) -> String {
    if protocol == crate::plan::Protocol::Chat {
        return key_of(op, models, body);
    }
    let text = json!({
        "protocol": protocol.as_str(),
        "models": models,
        "body": crate::cache::shapes::keyed_body(protocol, body),
        "anthropic": [anthropic.0, anthropic.1],
    })
    .to_string();
    sha256_hex(text.as_bytes())
}

/// Whether the client asked not to be served from a cache (`Cache-Control: no-cache` or
/// `no-store`).
pub fn bypassed(cache_control: Option<&str>) -> bool {
    cache_control.is_some_and(|v| {
        v.split(',')
            .map(|d| d.trim().to_ascii_lowercase())
            .any(|d| d == "no-cache" || d == "no-store")
    })
}

/// The slot of `key` among `max_entries` (at least one).
pub fn slot_of(key: &str, max_entries: u32) -> u32 {
    let head = u64::from_str_radix(key.get(..16).unwrap_or("0"), 16).unwrap_or(0);
    u32::try_from(head % u64::from(max_entries.max(1))).unwrap_or(0)
}

/// Whether a unary answer to a caller of `protocol` may be stored.
pub fn storable_for(protocol: crate::plan::Protocol, status: u16, body: &Value) -> bool {
    match protocol {
        crate::plan::Protocol::Chat => storable(status, body),
        _ => crate::cache::shapes::storable(protocol, status, body),
    }
}

/// Whether a unary chat answer may be stored: a 200 whose every choice is complete.
pub fn storable(status: u16, body: &Value) -> bool {
    if status != 200 || body.get("error").is_some() {
        return false;
    }
    if let Some(data) = body.get("data") {
        // Embeddings.
        return data.as_array().is_some_and(|d| !d.is_empty());
    }
    let Some(choices) = body.get("choices").and_then(Value::as_array) else {
        return false;
    };
    !choices.is_empty()
        && choices.iter().all(|c| {
            let finish = c.get("finish_reason").and_then(Value::as_str);
            let message = c.get("message");
            let text = message
                .and_then(|m| m.get("content"))
                .and_then(Value::as_str)
                .is_some_and(|t| !t.is_empty());
            let tools = message
                .and_then(|m| m.get("tool_calls"))
                .and_then(Value::as_array)
                .is_some_and(|t| !t.is_empty());
            matches!(finish, Some("stop" | "tool_calls" | "function_call")) && (text || tools)
        })
}

/// A stored answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Entry {
    pub key: String,
    pub expires_at_ms: i64,
    /// The provider and pool model that answered: what a hit saves is priced there.
    pub provider: String,
    pub model: String,
    /// The answer's body, as the client got it.
    pub body: Vec<u8>,
}

/// A short name, prefixed by its length (one byte; longer names are cut).
fn put_name(out: &mut Vec<u8>, name: &str) {
    let bytes = name.as_bytes();
    let len = bytes.len().min(255);
    out.push(u8::try_from(len).unwrap_or(u8::MAX));
    out.extend_from_slice(bytes.get(..len).unwrap_or_default());
}

fn take_name(bytes: &[u8], at: &mut usize) -> Option<String> {
    let len = usize::from(*bytes.get(*at)?);
    let name = std::str::from_utf8(bytes.get(*at + 1..*at + 1 + len)?).ok()?;
    *at += 1 + len;
    Some(name.to_owned())
}

impl Entry {
    /// `key (64 hex) | expires (8, big endian) | provider | model | body`, each name prefixed
    /// by its length (one byte).
    pub fn encode(&self) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(74 + self.provider.len() + self.model.len() + self.body.len());
        out.extend_from_slice(self.key.as_bytes());
        out.extend_from_slice(&self.expires_at_ms.to_be_bytes());
        put_name(&mut out, &self.provider);
        put_name(&mut out, &self.model);
        out.extend_from_slice(&self.body);
        out
    }

    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let key = std::str::from_utf8(bytes.get(..64)?).ok()?.to_owned();
        let expires_at_ms = i64::from_be_bytes(bytes.get(64..72)?.try_into().ok()?);
        let mut at = 72;
        let provider = take_name(bytes, &mut at)?;
        let model = take_name(bytes, &mut at)?;
        Some(Self {
            key,
            expires_at_ms,
            provider,
            model,
            body: bytes.get(at..)?.to_vec(),
        })
    }
}

/// The stored answer for `key` in what its slot holds, unless another key's or expired.
pub fn lookup(slot: Option<&[u8]>, key: &str, now_ms: i64) -> Option<Entry> {
    Entry::decode(slot?).filter(|e| e.key == key && e.expires_at_ms > now_ms)
}

/// The largest answer a slot takes: `max_bytes / max_entries`.
pub fn slot_bytes(max_bytes: u64, max_entries: u32) -> u64 {
    max_bytes / u64::from(max_entries.max(1))
}

/// The pool's cache when this call uses it: the key's `cache` when set, else the merged
/// policy's, else on.
pub fn applies(
    pool: Option<&CacheSettings>,
    policy: Option<bool>,
    key: Option<bool>,
) -> Option<CacheSettings> {
    let pool = pool.filter(|c| c.ttl_ms > 0 && c.max_entries > 0)?;
    key.or(policy).unwrap_or(true).then_some(*pool)
}

/// Where a missed call's answer goes.
#[derive(Debug, Clone, PartialEq)]
pub struct Miss {
    pub key: String,
    pub slot: u32,
    pub ttl_ms: u64,
    /// The largest entry the slot takes.
    pub slot_bytes: u64,
    /// The shared tier's wait (a Redis state store); 0: no shared tier.
    pub shared_ms: u64,
    /// The caller's protocol: the shape of the answer stored.
    pub protocol: crate::plan::Protocol,
}

/// What the cache did for a call.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Lookup {
    /// The cache is not on for this call.
    #[default]
    Off,
    /// The client asked not to be served from a cache.
    Bypass,
    Hit(Entry),
    Miss(Miss),
}

impl Lookup {
    /// The `x-ai-router-cache` value.
    pub fn header(&self) -> Option<&'static str> {
        match self {
            Lookup::Off => None,
            Lookup::Bypass => Some("bypass"),
            Lookup::Hit(_) => Some("hit"),
            Lookup::Miss(_) => Some("miss"),
        }
    }

    pub fn to_proto(&self) -> ai_router_proto::v1::CacheLookup {
        use ai_router_proto::v1::CacheLookup as L;
        match self {
            Lookup::Off => L::Unspecified,
            Lookup::Bypass => L::Bypass,
            Lookup::Hit(_) => L::Hit,
            Lookup::Miss(_) => L::Miss,
        }
    }
}

/// Looks the call whose key is `key` up in this process's slots.
pub fn look(
    host: &impl Host,
    cache: &CacheSettings,
    key: String,
    protocol: crate::plan::Protocol,
    cache_control: Option<&str>,
    now_ms: i64,
) -> Lookup {
    if bypassed(cache_control) {
        return Lookup::Bypass;
    }
    let slot = slot_of(&key, cache.max_entries);
    let (held, _) = host.cache_slot(slot);
    match lookup(held.as_deref(), &key, now_ms) {
        Some(entry) => Lookup::Hit(entry),
        None => Lookup::Miss(Miss {
            key,
            slot,
            ttl_ms: cache.ttl_ms,
            slot_bytes: slot_bytes(cache.max_bytes, cache.max_entries),
            shared_ms: cache.shared_lookup_ms,
            protocol,
        }),
    }
}

/// Stores a missed call's unary answer (`status`, `body`) from `provider`'s `model`, when it is
/// complete and fits its slot; says what became of it.
pub fn store(
    host: &mut impl Host,
    miss: &Miss,
    status: u16,
    body: &[u8],
    lane: (&str, &str),
    now_ms: i64,
) -> CacheStore {
    let complete = serde_json::from_slice::<Value>(body)
        .is_ok_and(|v| storable_for(miss.protocol, status, &v));
    if !complete {
        return CacheStore::Unstorable;
    }
    let entry = Entry {
        key: miss.key.clone(),
        expires_at_ms: now_ms.saturating_add(i64::try_from(miss.ttl_ms).unwrap_or(i64::MAX)),
        provider: lane.0.to_owned(),
        model: lane.1.to_owned(),
        body: body.to_vec(),
    };
    let bytes = entry.encode();
    if bytes.len() as u64 > miss.slot_bytes {
        return CacheStore::TooLarge;
    }
    for _ in 0..STORE_TRIES {
        let (held, cas) = host.cache_slot(miss.slot);
        if lookup(held.as_deref(), &miss.key, now_ms).is_some() {
            // Another worker stored the same request meanwhile: the slot has it.
            return CacheStore::Stored;
        }
        if host.set_cache_slot(miss.slot, &bytes, cas) {
            share(host, miss, bytes);
            return CacheStore::Stored;
        }
    }
    // The slot keeps changing under this worker: its last writer keeps it.
    CacheStore::Unstorable
}

/// How long the control plane may take to take a stored entry for the shared tier (the call
/// does not wait for it: its answer is ignored).
const SHARED_PUT_MS: u64 = 2_000;

fn sync_metadata(token: Option<&String>) -> Vec<(&str, &[u8])> {
    match token {
        Some(t) => vec![(ai_router_contract::SYNC_TOKEN_METADATA, t.as_bytes())],
        None => Vec::new(),
    }
}

/// Sends an entry this process just stored up to the shared tier, when there is one; a
/// refusal leaves it local.
fn share(host: &mut impl Host, miss: &Miss, entry: Vec<u8>) {
    if miss.shared_ms == 0 {
        return;
    }
    let request = ai_router_proto::v1::SharedCachePutRequest {
        key: miss.key.clone(),
        entry,
        ttl_ms: miss.ttl_ms,
    };
    let token = host.sync_token();
    let _ = host.dispatch_grpc_call(
        ai_router_contract::clusters::CONTROL_PLANE,
        sync::SERVICE,
        sync::SHARED_CACHE_PUT,
        &sync_metadata(token.as_ref()),
        &prost::Message::encode_to_vec(&request),
        SHARED_PUT_MS,
    );
}

/// The cache's part in one call at the front stage: the lookup, then for a miss the answer
/// collected as it passes back and what became of it.
#[derive(Debug, Default)]
pub struct CallCache {
    pub lookup: Lookup,
    /// A missed call's unary answer so far, while it may still be stored.
    answer: Option<Vec<u8>>,
    /// The provider and model that answered.
    lane: (String, String),
    status: u16,
    /// The answer is an SSE stream (stored as the completion it assembles to).
    stream: bool,
    stored: Option<CacheStore>,
    /// The caller's protocol: the shape of what is stored and replayed.
    protocol: crate::plan::Protocol,
    /// A Responses caller's `metadata`, echoed in a hit's answer.
    metadata: Option<Value>,
}

/// What decides whether and how a call is cached, besides its resolution and body.
#[derive(Debug, Clone, Copy)]
pub struct CacheCall<'a> {
    /// The virtual key's `cache` and the merged policy's.
    pub key_cache: Option<bool>,
    pub policy_cache: Option<bool>,
    pub protocol: crate::plan::Protocol,
    pub op: Operation,
    /// Messages: the caller's `anthropic-version` and `anthropic-beta`.
    pub anthropic: (Option<&'a str>, Option<&'a str>),
}

impl CallCache {
    /// Looks a resolved call up, when the cache applies to it: the pool has a cache, the
    /// key's or the policy's `cache` leaves it on, and the call keeps no provider state (a
    /// stateful Responses call is never cached). `body` is the caller's, in its protocol.
    pub fn begin(
        host: &impl Host,
        state: &crate::state::State,
        call: &CacheCall<'_>,
        tiers: &[Vec<crate::plan::Candidate>],
        body: &Value,
        now_ms: i64,
    ) -> Self {
        let protocol = call.protocol;
        let Some(cache) = applies(
            state.snapshot.cache.as_ref(),
            call.policy_cache,
            call.key_cache,
        )
        .filter(|_| crate::protocols::stateful(protocol, body).is_none()) else {
            return Self::default();
        };
        let lanes: Vec<String> = tiers
            .iter()
            .flatten()
            .map(|c| format!("{}/{}", c.provider, c.model))
            .collect();
        let names: Vec<&str> = lanes.iter().map(String::as_str).collect();
        let cache_control = host.header_text(crate::host::Side::Request, "cache-control");
        Self {
            lookup: look(
                host,
                &cache,
                key_for(protocol, call.op, &names, body, call.anthropic),
                protocol,
                cache_control.as_deref(),
                now_ms,
            ),
            protocol,
            metadata: body.get("metadata").cloned(),
            ..Self::default()
        }
    }

    /// A hit's answer for this call's caller: `(content type, body, the model that answered)`.
    pub fn hit_answer(
        &self,
        stream: bool,
        include_usage: bool,
    ) -> Option<(&'static str, Vec<u8>, String)> {
        let Lookup::Hit(entry) = &self.lookup else {
            return None;
        };
        let (content_type, body) = hit_answer(
            entry,
            self.protocol,
            self.metadata.as_ref(),
            stream,
            include_usage,
        );
        Some((content_type, body, entry.model.clone()))
    }

    /// A local miss with a shared tier: asks the control plane for the entry (bounded by
    /// `sharedLookupMs`); the token of that call, `None` when there is nothing to ask or the
    /// call cannot go out (a miss then).
    pub fn ask_shared(&self, host: &mut impl Host) -> Option<u32> {
        let Lookup::Miss(miss) = &self.lookup else {
            return None;
        };
        if miss.shared_ms == 0 {
            return None;
        }
        let request = ai_router_proto::v1::SharedCacheGetRequest {
            key: miss.key.clone(),
        };
        let token = host.sync_token();
        host.dispatch_grpc_call(
            ai_router_contract::clusters::CONTROL_PLANE,
            sync::SERVICE,
            sync::SHARED_CACHE_GET,
            &sync_metadata(token.as_ref()),
            &prost::Message::encode_to_vec(&request),
            miss.shared_ms,
        )
        .ok()
    }

    /// The shared tier's answer (`None`: an error, a timeout, nothing stored): a live entry of
    /// this call's key becomes a hit and goes into this process's slot; whether it is a hit.
    pub fn shared_answer(
        &mut self,
        host: &mut impl Host,
        entry: Option<&[u8]>,
        now_ms: i64,
    ) -> bool {
        let Lookup::Miss(miss) = &self.lookup else {
            return false;
        };
        let Some(found) = lookup(entry, &miss.key, now_ms) else {
            return false;
        };
        if let Some(bytes) = entry.filter(|b| b.len() as u64 <= miss.slot_bytes) {
            // One try: a worker racing for the slot keeps it, the hit is answered anyway.
            let (_, cas) = host.cache_slot(miss.slot);
            let _ = host.set_cache_slot(miss.slot, bytes, cas);
        }
        self.lookup = Lookup::Hit(found);
        true
    }

    /// The answer's headers arrived (`status` as the client gets it): a miss collects a
    /// complete unary answer from here; anything else is decided now. The header value for
    /// the client, if the cache is on for the call.
    pub fn on_answer_headers(
        &mut self,
        status: u16,
        stream: bool,
        end_of_stream: bool,
        lane: (String, String),
    ) -> Option<&'static str> {
        if let Lookup::Miss(_) = self.lookup {
            self.status = status;
            self.lane = lane;
            self.stream = stream;
            if status != 200 || end_of_stream {
                // An answer without a body (or a failure) has nothing to store.
                self.stored = Some(CacheStore::Unstorable);
            } else {
                self.answer = Some(Vec::new());
            }
        }
        self.lookup.header()
    }

    /// Whether the answer's body is being collected.
    pub fn collecting(&self) -> bool {
        self.answer.is_some()
    }

    /// A chunk of a missed call's answer; at its end the answer is stored when it may be.
    pub fn on_answer_body(
        &mut self,
        host: &mut impl Host,
        chunk: &[u8],
        end_of_stream: bool,
        usage: Option<crate::vocab::Usage>,
        now_ms: i64,
    ) {
        let (Lookup::Miss(miss), Some(answer)) = (&self.lookup, self.answer.as_mut()) else {
            return;
        };
        answer.extend_from_slice(chunk);
        // A stream's events take several times the bytes of the completion they assemble to.
        let bound = if self.stream {
            miss.slot_bytes.saturating_mul(STREAM_BYTES_PER_SLOT_BYTE)
        } else {
            miss.slot_bytes
        };
        if answer.len() as u64 > bound {
            self.answer = None;
            self.stored = Some(CacheStore::TooLarge);
            return;
        }
        if end_of_stream {
            let lane = (self.lane.0.as_str(), self.lane.1.as_str());
            let assembled;
            let body: &[u8] = if self.stream {
                let whole = match self.protocol {
                    crate::plan::Protocol::Chat => assemble_stream(answer),
                    p => crate::cache::shapes::assemble_stream(p, answer),
                };
                match whole {
                    Some(mut completion) => {
                        // Only a chat stream may leave its usage out (the client did not ask).
                        if completion.get("usage").is_none()
                            && self.protocol == crate::plan::Protocol::Chat
                        {
                            if let Some(u) = usage {
                                completion["usage"] = openai_usage(&u);
                            }
                        }
                        assembled = completion.to_string().into_bytes();
                        &assembled
                    }
                    None => {
                        self.stored = Some(CacheStore::Unstorable);
                        self.answer = None;
                        return;
                    }
                }
            } else {
                answer
            };
            self.stored = Some(store(host, miss, self.status, body, lane, now_ms));
            self.answer = None;
        }
    }

    /// The client went away (or the stream ended) before the answer's end: nothing stored.
    pub fn finish(&mut self) {
        if self.answer.take().is_some() {
            self.stored = Some(CacheStore::Unstorable);
        }
    }

    /// The cache's part of the call's report: a hit is a success whose usage, provider and
    /// model are the stored answer's (what it saved); a miss says what became of its answer.
    pub fn report(&mut self, outcome: &mut ai_router_proto::v1::RequestOutcome) {
        self.finish();
        outcome.cache_lookup = self.lookup.to_proto().into();
        if let Some(stored) = self.stored {
            outcome.cache_store = stored.into();
        }
        if let Lookup::Hit(entry) = &self.lookup {
            outcome.cache_hit = true;
            outcome.provider.clone_from(&entry.provider);
            outcome.model.clone_from(&entry.model);
            let protocol = self.protocol;
            outcome.usage = serde_json::from_slice::<Value>(&entry.body)
                .ok()
                .and_then(|v| match protocol {
                    crate::plan::Protocol::Chat => crate::vocab::usage_of(&v),
                    p => crate::protocols::native_usage(p, v.get("usage")),
                })
                .map(|u| ai_router_proto::v1::Usage {
                    prompt_tokens: u.prompt_tokens,
                    completion_tokens: u.completion_tokens,
                    cached_tokens: u.cached_tokens,
                    source: ai_router_proto::v1::UsageSource::Reported.into(),
                });
        }
    }
}

/// The chat completion a chat-completions SSE stream assembles to, when the stream ended
/// cleanly: `data: [DONE]` last, no error event, every choice finished. Content and tool-call
/// arguments are the concatenation of their deltas; usage is the usage chunk's.
pub fn assemble_stream(sse: &[u8]) -> Option<Value> {
    let mut parser = crate::wire::sse::Parser::new();
    let mut events = parser.feed(sse);
    // A last event without its blank line still counts.
    events.extend(parser.feed(b"\n\n"));
    events.retain(|e| !e.data.trim().is_empty());
    let (done, chunks) = events.split_last()?;
    if done.data.trim() != "[DONE]" {
        return None;
    }
    let mut head: Option<Value> = None;
    let mut usage = None;
    let mut choices: std::collections::BTreeMap<u64, Value> = std::collections::BTreeMap::new();
    for event in chunks {
        let chunk: Value = serde_json::from_str(&event.data).ok()?;
        if chunk.get("error").is_some() || event.data.trim() == "[DONE]" {
            return None;
        }
        if head.is_none() {
            head = Some(chunk.clone());
        }
        if let Some(u) = chunk.get("usage").filter(|u| !u.is_null()) {
            usage = Some(u.clone());
        }
        for c in chunk
            .get("choices")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let index = c.get("index").and_then(Value::as_u64).unwrap_or(0);
            let choice = choices.entry(index).or_insert_with(|| {
                json!({ "index": index, "finish_reason": null,
                        "message": { "role": "assistant", "content": null } })
            });
            merge_delta(choice, c);
        }
    }
    let head = head?;
    let all_finished = !choices.is_empty()
        && choices
            .values()
            .all(|c| c.get("finish_reason").is_some_and(Value::is_string));
    if !all_finished {
        return None;
    }
    let mut completion = json!({
        "id": head.get("id").cloned().unwrap_or(Value::Null),
        "object": "chat.completion",
        "created": head.get("created").cloned().unwrap_or(json!(0)),
        "model": head.get("model").cloned().unwrap_or(Value::Null),
        "choices": choices.into_values().collect::<Vec<_>>(),
    });
    if let Some(u) = usage {
        completion["usage"] = u;
    }
    Some(completion)
}

/// `usage` in the chat completion's shape (a hit's replay drops it unless the client asked).
fn openai_usage(u: &crate::vocab::Usage) -> Value {
    let mut usage = json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens.saturating_add(u.completion_tokens),
    });
    if u.cached_tokens > 0 {
        usage["prompt_tokens_details"] = json!({ "cached_tokens": u.cached_tokens });
    }
    usage
}

/// Folds one chunk's choice (its `delta` and `finish_reason`) into the assembled choice.
fn merge_delta(choice: &mut Value, chunk: &Value) {
    if let Some(finish) = chunk.get("finish_reason").filter(|f| f.is_string()) {
        choice["finish_reason"] = finish.clone();
    }
    let Some(delta) = chunk.get("delta") else {
        return;
    };
    let message = &mut choice["message"];
    if let Some(text) = delta.get("content").and_then(Value::as_str) {
        let joined = format!("{}{text}", message["content"].as_str().unwrap_or(""));
        message["content"] = json!(joined);
    }
    for call in delta
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let n = call.get("index").and_then(Value::as_u64).unwrap_or(0);
        if !message["tool_calls"].is_array() {
            message["tool_calls"] = json!([]);
        }
        let Some(calls) = message["tool_calls"].as_array_mut() else {
            return;
        };
        let at = usize::try_from(n).unwrap_or(usize::MAX);
        while calls.len() <= at && calls.len() < 128 {
            calls.push(json!({ "id": null, "type": "function",
                               "function": { "name": "", "arguments": "" } }));
        }
        let Some(slot) = calls.get_mut(at) else {
            return;
        };
        for field in ["id", "type"] {
            if let Some(v) = call.get(field).filter(|v| v.is_string()) {
                slot[field] = v.clone();
            }
        }
        for field in ["name", "arguments"] {
            if let Some(part) = call
                .pointer(&format!("/function/{field}"))
                .and_then(Value::as_str)
            {
                let joined = format!("{}{part}", slot["function"][field].as_str().unwrap_or(""));
                slot["function"][field] = json!(joined);
            }
        }
    }
}

/// A hit's answer for a caller of `protocol`: the stored body, or its SSE replay for a
/// streaming caller (chat: with the usage chunk only when the client asked for it). A
/// Responses answer echoes this caller's `metadata`, not the first caller's.
/// `(content type, body)`.
pub fn hit_answer(
    entry: &Entry,
    protocol: crate::plan::Protocol,
    metadata: Option<&Value>,
    stream: bool,
    include_usage: bool,
) -> (&'static str, Vec<u8>) {
    if protocol != crate::plan::Protocol::Chat {
        let mut answer: Value = serde_json::from_slice(&entry.body).unwrap_or(Value::Null);
        if protocol == crate::plan::Protocol::Responses && answer.is_object() {
            answer["metadata"] = metadata.cloned().unwrap_or_else(|| json!({}));
        }
        return if stream {
            (
                "text/event-stream",
                crate::cache::shapes::replay_sse(protocol, &answer),
            )
        } else if protocol == crate::plan::Protocol::Responses {
            ("application/json", answer.to_string().into_bytes())
        } else {
            ("application/json", entry.body.clone())
        };
    }
    if !stream {
        return ("application/json", entry.body.clone());
    }
    let mut answer: Value = serde_json::from_slice(&entry.body).unwrap_or(Value::Null);
    if !include_usage {
        if let Some(map) = answer.as_object_mut() {
            map.remove("usage");
        }
    }
    (
        "text/event-stream",
        crate::cache::shapes::replay_sse(crate::plan::Protocol::Chat, &answer),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
