//! The cache's part in one call at the front stage.

use ai_router_proto::names::sync;
use ai_router_proto::v1::CacheStore;
use serde_json::{json, Value};

use super::assemble::{assemble_stream, openai_usage};
use super::entry::{lookup, Entry};
use super::key::key_for;
use super::store::{applies, look, store, sync_metadata, Lookup};
use crate::host::Host;
use crate::plan::Operation;

/// How many bytes of SSE a stream may take per byte of its slot while it is collected.
const STREAM_BYTES_PER_SLOT_BYTE: u64 = 8;

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
