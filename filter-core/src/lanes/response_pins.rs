//! Stored responses reach the key that stored them. OpenAI keeps a Responses call's answer
//! (`store` absent or true: the API stores by default) with the account of the key that
//! answered it; a later call naming it (`previous_response_id`), or a call of a conversation
//! (`conversation`), is answered only by a key that can read it: another account's key answers
//! 400 "Previous response with id … not found".
//!
//! - When a lane of kind openai answers a Responses call natively and the answer is stored,
//!   the attempt remembers which lane (provider, key) answered its response id: the unary
//!   answer's `id`, or the stream's `response.created` (else `response.completed`) event's
//!   `response.id` ([`Watch`]). A call that names a `previous_response_id` or a `conversation`
//!   and is answered remembers those ids for that key too (the answer proves the key reads
//!   them; a use refreshes the pin).
//! - The records live in the affinity slot scheme's second table
//!   ([`crate::lanes::affinity::RESPONSES`]): a fixed number of slots per Envoy process, each the
//!   digest of (virtual key, id) and the lane, so the memory is bounded and one virtual key's
//!   ids never pin another's calls. A record unused for [`IDLE_MS`] lapses; a newer id on the
//!   same slot replaces it.
//! - A call whose `previous_response_id` (else `conversation`) the table knows goes only to
//!   that provider's key ([`route`] cuts the tiers to the provider, the attempt's pick to the
//!   key); its model is still the call's. When that key is out (blacklisted, cooling down,
//!   breaker open, …) the call is answered at once with an error naming the field and why
//!   ([`when_out`]), never sent to a key that cannot read the response; a failure of that key
//!   in this call (a 429, a refusal) ends the call the same way, a 429 answered as 429 with
//!   the provider's `Retry-After`.
//! - An id the table does not know (stored through another Envoy, evicted, lapsed, before a
//!   restart, or through a key since removed) pins nothing: the call goes to the openai lanes
//!   as before, any of their keys.

use serde_json::Value;

use crate::answer::errors::GatewayError;
use crate::host::Host;
use crate::lanes::affinity::{digest, RESPONSES};
use crate::lanes::out::OutReason;
use crate::lanes::pick::Skipped;
use crate::plan::{Candidate, KeyPin, Stored, Via};
use crate::state::State;
use crate::vocab::LaneId;
use crate::wire::sse::Parser;
use ai_router_contract::error_code::ErrorCode;
use ai_router_contract::failure::ErrorClass;

/// A stored-response pin unused this long lapses (OpenAI keeps a stored response 30 days; a
/// pin only has to outlive a pause in the conversation, and eviction by newer ids usually
/// comes first).
pub const IDLE_MS: u64 = 24 * 60 * 60 * 1000;

/// The ids a Responses body names, each with its field: `previous_response_id`, then
/// `conversation` (a string id, or an object with its `id`).
fn named_ids(body: &Value) -> Vec<(Via, &str)> {
    let previous = body.get("previous_response_id").and_then(Value::as_str);
    let conversation = body.get("conversation").and_then(|c| match c {
        Value::String(id) => Some(id.as_str()),
        other => other.get("id").and_then(Value::as_str),
    });
    [
        (Via::PreviousResponseId, previous),
        (Via::Conversation, conversation),
    ]
    .into_iter()
    .filter_map(|(via, id)| Some((via, id.filter(|id| !id.trim().is_empty())?)))
    .collect()
}

/// The stored-state rule of a Responses call, decided by the front stage: the tiers cut to the
/// provider whose key stored what the call names, when the table knows it; `None` when the
/// call neither names stored state nor is stored. Refused (naming the field) when that
/// provider serves none of the call's lanes.
pub fn route(
    host: &impl Host,
    state: &State,
    vk_id: &str,
    body: &Value,
    tiers: &mut Vec<Vec<Candidate>>,
    now_ms: i64,
) -> Result<Option<Stored>, GatewayError> {
    let ids = named_ids(body);
    let store = body.get("store").and_then(Value::as_bool) != Some(false);
    if ids.is_empty() && !store {
        return Ok(None);
    }
    let names: Vec<String> = ids
        .iter()
        .map(|(via, id)| digest(vk_id, &via.scoped(id)))
        .collect();
    let pin = ids.iter().zip(&names).find_map(|((via, _), name)| {
        let lane = RESPONSES.pinned(host, name, IDLE_MS, now_ms)?;
        // A key since removed from the pool pins nothing.
        crate::lanes::lane_in(state, &lane)?;
        Some(KeyPin {
            provider: lane.provider,
            key: lane.key,
            via: *via,
        })
    });
    if let Some(pin) = &pin {
        for tier in tiers.iter_mut() {
            tier.retain(|c| c.provider == pin.provider);
        }
        tiers.retain(|tier| !tier.is_empty());
        if tiers.is_empty() {
            return Err(GatewayError::new(
                ErrorCode::InvalidRequest,
                format!(
                    "{}: the response was stored through key '{}' of provider '{}', the only \
                     key that can read it, and that provider serves none of this call's \
                     models. Call a model it serves, or send the conversation as input items \
                     without {}.",
                    pin.via.param(),
                    pin.key,
                    pin.provider,
                    pin.via.param()
                ),
            )
            .with_param(pin.via.param()));
        }
    }
    Ok(Some(Stored { names, pin, store }))
}

/// Why a key is out, in words, from the pick's reason for it.
fn why_out(reason: OutReason) -> String {
    match reason {
        OutReason::BlacklistedAuth => "is blacklisted (the provider refused it)".into(),
        OutReason::BlacklistedQuota => "is out of quota".into(),
        OutReason::Cooldown => "is cooling down after a rate limit".into(),
        OutReason::Headroom => "has no rate-limit headroom left".into(),
        OutReason::BreakerOpen => "has its circuit breaker open".into(),
        OutReason::ProviderOut => "belongs to a provider that is out".into(),
        OutReason::NoCredit => "has no credit left".into(),
        OutReason::MissingSecret => "has no secret".into(),
        OutReason::ContextWindow => "serves no lane that takes a prompt this long".into(),
        OutReason::MaxConcurrency | OutReason::ProbeElsewhere | OutReason::NotListed => {
            format!("is out ({reason})")
        }
    }
}

fn unsent(class: Option<ErrorClass>) -> Option<ErrorClass> {
    crate::answer::errors::unsent_as_unavailable(class, 0)
}

/// What a pinned call answers when the pick finds no lane: `None` to go on as usual (a wait
/// for the gateway's own queue: a concurrency slot, a probe another call holds), else the
/// call's final error. `class` and `retry_at_ms` are the pick's; `last_failure` the call's.
pub fn when_out(
    pin: &KeyPin,
    tried: &[LaneId],
    skipped: &[Skipped],
    pick: (Option<ErrorClass>, Option<i64>),
    last_failure: Option<(ErrorClass, Option<i64>)>,
    now_ms: i64,
) -> Option<GatewayError> {
    let reason = skipped.iter().find(|s| pin.is(&s.lane)).map(|s| s.reason);
    let (class, retry_at, why) = if tried.iter().any(|t| pin.is(t)) {
        // The key failed this call: its failure is the answer, no other key can serve it.
        let (class, retry_at) = match (pick, last_failure) {
            ((Some(c), r), _) => (Some(c), r),
            ((None, r), Some((c, last_r))) => (Some(c), r.or(last_r)),
            ((None, r), None) => (None, r),
        };
        let what = class.map_or("failed", |c| c.as_str());
        (class, retry_at, format!("failed this call ({what})"))
    } else {
        match reason {
            Some(OutReason::MaxConcurrency | OutReason::ProbeElsewhere) => return None,
            // Not sent: the key is unavailable, not failing upstream.
            Some(reason) => (unsent(pick.0), pick.1, why_out(reason)),
            None => (
                unsent(pick.0),
                pick.1,
                "serves none of this call's lanes".into(),
            ),
        }
    };
    let base = crate::answer::errors::final_error(class, retry_at, now_ms);
    let retry = match base.retry_after_s {
        Some(s) => format!("Retry in {s} s, or send"),
        None => "Send".into(),
    };
    // A rate limit answers as the provider's own 429 would (its window in Retry-After).
    let status = match class {
        Some(ErrorClass::RateLimit) => 429,
        _ => base.status,
    };
    Some(GatewayError {
        status,
        message: format!(
            "{param}: the response was stored through key '{key}' of provider '{provider}', \
             the only key that can read it, and that key {why}. {retry} the conversation as \
             input items without {param}.",
            param = pin.via.param(),
            key = pin.key,
            provider = pin.provider,
        ),
        param: Some(pin.via.param()),
        ..base
    })
}

/// Remembers, for the lane that answered a call, the id of its stored answer and the ids the
/// call named.
pub fn remember(
    host: &mut impl Host,
    vk_id: &str,
    stored: &Stored,
    answer_id: Option<&str>,
    lane: &LaneId,
    now_ms: i64,
) {
    let answer = answer_id
        .filter(|_| stored.store)
        .map(|id| digest(vk_id, &Via::PreviousResponseId.scoped(id)));
    for name in stored.names.iter().chain(answer.as_ref()) {
        RESPONSES.remember(host, name, IDLE_MS, lane, now_ms);
    }
}

/// Reads the id of a stored answer as it passes: a unary `response`'s `id`, or a stream's
/// `response.created` / `response.completed` event. Inactive (reads nothing) unless the answer
/// is stored and comes natively from a lane of kind openai.
#[derive(Debug, Default)]
pub struct Watch {
    /// The stream's events so far; `None` when not watching (or the id is found).
    parser: Option<Box<Parser>>,
    active: bool,
    id: Option<String>,
}

impl Watch {
    pub fn new(stored: Option<&Stored>, native: bool) -> Self {
        let active = native && stored.is_some();
        Self {
            parser: active.then(Box::default),
            active,
            id: None,
        }
    }

    /// A whole answer (a `response` object).
    pub fn answer(&mut self, answer: &Value) {
        if self.active && self.id.is_none() {
            self.id = answer.get("id").and_then(Value::as_str).map(str::to_owned);
        }
        self.parser = None;
    }

    /// Bytes of a streamed answer, as they come.
    pub fn stream(&mut self, bytes: &[u8]) {
        let Some(parser) = self.parser.as_mut() else {
            return;
        };
        for event in parser.feed(bytes) {
            let Ok(data) = serde_json::from_str::<Value>(&event.data) else {
                continue;
            };
            let kind = data.get("type").and_then(Value::as_str);
            if matches!(kind, Some("response.created" | "response.completed")) {
                if let Some(id) = data
                    .get("response")
                    .and_then(|r| r.get("id"))
                    .and_then(Value::as_str)
                {
                    self.id = Some(id.to_owned());
                    break;
                }
            }
        }
        if self.id.is_some() || parser.overflowed() {
            self.parser = None;
        }
    }

    /// Whether the answer is watched (the lane that answers is remembered).
    pub fn active(&self) -> bool {
        self.active
    }

    /// The answer's id, once seen.
    pub fn id(&self) -> Option<&str> {
        self.id.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attempt::Attempt;
    use crate::host::{Flow, Side};
    use crate::plan::Plan;
    use crate::testing::FakeHost;
    use ai_router_proto::v1::{Model, Provider, ProviderKey, ProviderKind, Snapshot};
    use serde_json::json;

    const NOW: i64 = 1_700_000_000_000;

    /// p1 (kind openai, keys a and b) and p2 (openai-compatible, key c), both serving m1.
    fn state() -> State {
        let provider = |id: &str, kind: ProviderKind, keys: &[&str]| Provider {
            id: id.into(),
            kind: kind.into(),
            scheme: "http".into(),
            authority: format!("{id}.test:8000"),
            base_path: "/v1".into(),
            auth_header: "authorization".into(),
            keys: keys
                .iter()
                .map(|k| ProviderKey {
                    alias: (*k).into(),
                    secret: format!("sk-{id}-{k}"),
                    fingerprint: ai_router_contract::fingerprint(&format!("sk-{id}-{k}")),
                    ..ProviderKey::default()
                })
                .collect(),
            models: vec![Model {
                id: "m1".into(),
                ..Model::default()
            }],
            ..Provider::default()
        };
        let mut snap = Snapshot::default();
        snap.providers
            .push(provider("p1", ProviderKind::Openai, &["a", "b"]));
        snap.providers
            .push(provider("p2", ProviderKind::OpenaiCompatible, &["c"]));
        State::new(1, snap)
    }

    fn tiers(providers: &[&str]) -> Vec<Vec<Candidate>> {
        vec![providers
            .iter()
            .map(|p| Candidate {
                provider: (*p).into(),
                model: "m1".into(),
                weight: 1.0,
                when: Vec::new(),
            })
            .collect()]
    }

    fn host() -> FakeHost {
        let mut host = FakeHost::with_state(state());
        host.now = NOW;
        host
    }

    fn lane(key: &str) -> LaneId {
        LaneId::new("p1", key, "m1")
    }

    #[test]
    fn an_answer_pins_its_id_for_its_virtual_key_and_a_follow_up_goes_to_its_provider() {
        let mut host = host();
        let s = state();
        let first = json!({ "model": "m1", "input": "Hi" });
        let mut t = tiers(&["p1", "p2"]);
        let stored = route(&host, &s, "vk1", &first, &mut t, NOW).ok().flatten();
        let stored = stored.expect("a stored call (store is absent: true)");
        assert!(stored.store && stored.pin.is_none() && stored.names.is_empty());
        assert_eq!(t, tiers(&["p1", "p2"]), "nothing pinned yet");
        remember(&mut host, "vk1", &stored, Some("resp_1"), &lane("b"), NOW);

        let follow_up = json!({ "model": "m1", "input": "And?", "previous_response_id": "resp_1" });
        let mut t = tiers(&["p1", "p2"]);
        let stored = route(&host, &s, "vk1", &follow_up, &mut t, NOW + 1_000)
            .ok()
            .flatten()
            .expect("stored");
        let pin = stored.pin.clone().expect("pinned");
        assert_eq!(
            (pin.provider.as_str(), pin.key.as_str(), pin.via),
            ("p1", "b", Via::PreviousResponseId)
        );
        assert_eq!(t, tiers(&["p1"]), "cut to the provider that stored it");
        assert_eq!(stored.names.len(), 1);

        // Another virtual key's call naming the same id is not pinned by it.
        let mut t = tiers(&["p1", "p2"]);
        let other = route(&host, &s, "vk2", &follow_up, &mut t, NOW)
            .ok()
            .flatten();
        assert_eq!(other.and_then(|o| o.pin), None);
        // An id never seen (another Envoy, evicted, before a restart): today's rule.
        let unknown = json!({ "model": "m1", "previous_response_id": "resp_elsewhere" });
        let mut t = tiers(&["p1", "p2"]);
        let r = route(&host, &s, "vk1", &unknown, &mut t, NOW)
            .ok()
            .flatten();
        assert_eq!(r.and_then(|o| o.pin), None);
        assert_eq!(t, tiers(&["p1", "p2"]));
        // Unused for IDLE_MS: lapsed.
        let mut t = tiers(&["p1"]);
        let late = route(
            &host,
            &s,
            "vk1",
            &follow_up,
            &mut t,
            NOW + IDLE_MS as i64 + 1,
        );
        assert_eq!(late.ok().flatten().and_then(|o| o.pin), None);
        // Neither stored nor naming stored state: nothing to do.
        let mut t = tiers(&["p1"]);
        let stateless = json!({ "model": "m1", "store": false });
        assert_eq!(route(&host, &s, "vk1", &stateless, &mut t, NOW), Ok(None));
    }

    #[test]
    fn a_pin_to_a_provider_outside_the_calls_tiers_is_refused_naming_the_field() {
        let mut host = host();
        let stored = Stored {
            store: true,
            ..Stored::default()
        };
        remember(&mut host, "vk1", &stored, Some("resp_1"), &lane("a"), NOW);
        let body = json!({ "model": "m2", "previous_response_id": "resp_1" });
        let mut t = tiers(&["p2"]);
        let err = route(&host, &state(), "vk1", &body, &mut t, NOW).err();
        let err = err.expect("refused");
        assert_eq!(err.status, 400);
        assert_eq!(err.param, Some("previous_response_id"));
        assert!(
            err.message.contains("key 'a' of provider 'p1'"),
            "{}",
            err.message
        );
    }

    #[test]
    fn a_conversation_is_pinned_like_a_previous_response() {
        let mut host = host();
        let s = state();
        let first = json!({ "model": "m1", "conversation": { "id": "conv_1" }, "store": false });
        let mut t = tiers(&["p1"]);
        let stored = route(&host, &s, "vk1", &first, &mut t, NOW).ok().flatten();
        let stored = stored.expect("names a conversation");
        assert!(!stored.store && stored.pin.is_none() && stored.names.len() == 1);
        // Not stored: the answer's own id is not remembered, the conversation is.
        remember(&mut host, "vk1", &stored, Some("resp_9"), &lane("a"), NOW);
        let again = json!({ "model": "m1", "conversation": "conv_1" });
        let mut t = tiers(&["p1", "p2"]);
        let pin = route(&host, &s, "vk1", &again, &mut t, NOW).ok().flatten();
        let pin = pin.and_then(|p| p.pin).expect("pinned");
        assert_eq!((pin.key.as_str(), pin.via), ("a", Via::Conversation));
        let by_answer = json!({ "model": "m1", "previous_response_id": "resp_9" });
        let mut t = tiers(&["p1"]);
        let r = route(&host, &s, "vk1", &by_answer, &mut t, NOW)
            .ok()
            .flatten();
        assert_eq!(r.and_then(|p| p.pin), None, "store: false keeps nothing");
    }

    #[test]
    fn a_streams_id_is_read_at_every_cut() {
        let stream = concat!(
            "event: response.created\n",
            "data: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_7\",\"status\":\"in_progress\"}}\n\n",
            "event: response.output_text.delta\n",
            "data: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}\n\n",
        )
        .as_bytes();
        let stored = Stored::default();
        for cut in 0..=stream.len() {
            let mut watch = Watch::new(Some(&stored), true);
            watch.stream(&stream[..cut]);
            watch.stream(&stream[cut..]);
            assert_eq!(watch.id(), Some("resp_7"), "cut at {cut}");
        }
        // Only `response.completed` carries it: read there.
        let mut watch = Watch::new(Some(&stored), true);
        watch.stream(
            b"data: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_8\"}}\n\n",
        );
        assert_eq!(watch.id(), Some("resp_8"));
        // A translated lane's answer is not the provider's stored response: not watched.
        let mut watch = Watch::new(Some(&stored), false);
        watch.stream(stream);
        watch.answer(&json!({ "id": "resp_1" }));
        assert!(!watch.active() && watch.id().is_none());
        let mut watch = Watch::new(Some(&stored), true);
        watch.answer(&json!({ "id": "resp_1", "object": "response" }));
        assert_eq!(watch.id(), Some("resp_1"));
    }

    fn pin_a() -> KeyPin {
        KeyPin {
            provider: "p1".into(),
            key: "a".into(),
            via: Via::PreviousResponseId,
        }
    }

    fn skipped(reason: &'static str) -> Vec<Skipped> {
        let reason = OutReason::ALL.into_iter().find(|r| r.as_str() == reason);
        vec![Skipped {
            lane: lane("a"),
            reason: reason.expect("a pick's reason"),
        }]
    }

    #[test]
    fn a_pinned_key_out_is_a_clear_error_and_its_own_429_answers_429() {
        let pin = pin_a();
        let err = when_out(
            &pin,
            &[],
            &skipped("blacklisted:auth"),
            (Some(ErrorClass::Auth), None),
            None,
            NOW,
        )
        .expect("answered");
        assert_eq!(err.param, Some("previous_response_id"));
        assert!(
            err.message.contains("key 'a' of provider 'p1'") && err.message.contains("blacklisted"),
            "{}",
            err.message
        );
        assert_eq!(err.code, ErrorCode::PoolAuthFailed);
        let err = when_out(
            &pin,
            &[],
            &skipped("breaker_open"),
            (Some(ErrorClass::Transient), Some(NOW + 30_000)),
            None,
            NOW,
        )
        .expect("answered");
        assert!(
            err.message.contains("circuit breaker open"),
            "{}",
            err.message
        );
        assert_eq!(err.retry_after_s, Some(30));
        // The key's own 429 in this call: 429 with its window, no other key.
        let err = when_out(
            &pin,
            &[lane("a")],
            &skipped("cooldown"),
            (Some(ErrorClass::RateLimit), Some(NOW + 20_000)),
            Some((ErrorClass::RateLimit, Some(NOW + 20_000))),
            NOW,
        )
        .expect("answered");
        assert_eq!((err.status, err.retry_after_s), (429, Some(20)));
        assert!(
            err.message.contains("failed this call (rate_limit)"),
            "{}",
            err.message
        );
        // The gateway's own short queues are waited out as usual.
        for reason in ["max_concurrency", "probe_elsewhere"] {
            let out = when_out(
                &pin,
                &[],
                &skipped(reason),
                (None, Some(NOW + 50)),
                None,
                NOW,
            );
            assert_eq!(out, None);
        }
    }

    /// Runs an attempt of a Responses call pinned to p1's key `a` (or not pinned).
    fn attempt(host: &mut FakeHost, pin: Option<KeyPin>, n: u32) -> (Attempt, Flow) {
        let mut plan = Plan {
            cid: "call-1".into(),
            rid: "rid-1".into(),
            idempotency_key: String::new(),
            vk: "vk1".into(),
            op: crate::plan::Operation::Chat,
            stream: false,
            include_usage: false,
            tiers: vec![vec![crate::plan::Candidate {
                provider: "p1".into(),
                model: "m1".into(),
                weight: 1.0,
                when: Vec::new(),
            }]],
            max_attempts: 3,
            timeout_ms: 10_000,
            deadline_ms: 30_000,
            started_ms: NOW,
            tokens: 10,
            trail: false,
            profile: String::new(),
            prompt_cache: String::new(),
            session: None,
            protocol: crate::plan::Protocol::Responses,
            anthropic_version: None,
            anthropic_beta: None,
            count_tokens: false,
            json_array: false,
            prompt_tokens: 0,
            max_tokens: 0,
            reset_ms: 0,
            first_choice: None,
            responses: None,
            body_top: None,
        };
        plan.responses = Some(Stored {
            pin,
            store: true,
            ..Stored::default()
        });
        host.request_headers.clear();
        host.add(Side::Request, ":path", b"/v1/responses");
        host.add(
            Side::Request,
            "x-envoy-attempt-count",
            n.to_string().as_bytes(),
        );
        host.hand_plan(&plan);
        host.request_body = json!({ "model": "chat", "input": "Hi" })
            .to_string()
            .into_bytes();
        let mut stage = Attempt::default();
        stage.on_request_headers(host, false);
        let size = host.request_body.len();
        let flow = stage.on_request_body(host, size, true);
        (stage, flow)
    }

    fn key_sent(host: &FakeHost) -> Option<String> {
        host.text(Side::Request, "authorization")
    }

    #[test]
    fn a_pinned_call_reaches_only_its_key_and_answers_clearly_when_it_is_out() {
        let mut host = host();
        // Unpinned, the picker shares the two keys.
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..4 {
            attempt(&mut host, None, 1);
            seen.extend(key_sent(&host));
            host.calls.clear();
        }
        assert_eq!(seen.len(), 2, "{seen:?}");
        // Pinned to a: a, every time.
        for _ in 0..4 {
            let (_, flow) = attempt(&mut host, Some(pin_a()), 1);
            assert_eq!(flow, Flow::Continue);
            assert_eq!(key_sent(&host).as_deref(), Some("Bearer sk-p1-a"));
            host.calls.clear();
        }
        // a blacklisted (b free): the call is answered, naming the field; b is never tried.
        let a = lane("a");
        host.hold_blacklist(&a.provider, &a.key, ErrorClass::Auth, 0, 0);
        let (_, flow) = attempt(&mut host, Some(pin_a()), 1);
        assert_eq!(flow, Flow::Pause);
        let answer = host.answered.clone().expect("answered locally");
        assert_eq!(answer.status, 500, "the final error, for the front stage");
        assert_eq!(answer.header("x-ai-router-final-status"), Some("503"));
        let body = answer.json();
        assert_eq!(body["error"]["param"], "previous_response_id");
        assert_eq!(body["error"]["code"], "pool_auth_failed");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap_or("")
                .contains("blacklisted"),
            "{body}"
        );
        assert!(host.calls.get("call-1").is_some_and(|c| c.tried.is_empty()));
    }

    #[test]
    fn a_stored_answer_remembers_the_lane_that_answered_it() {
        let mut host = host();
        let (mut stage, _) = attempt(&mut host, None, 1);
        let sent = key_sent(&host);
        let key = if sent.as_deref() == Some("Bearer sk-p1-a") {
            "a"
        } else {
            "b"
        };
        host.add(Side::Response, ":status", b"200");
        host.add(Side::Response, "content-type", b"application/json");
        stage.on_response_headers(&mut host, false);
        host.response_body = json!({ "id": "resp_42", "object": "response", "output": [] })
            .to_string()
            .into_bytes();
        let size = host.response_body.len();
        stage.on_response_body(&mut host, size, true);
        let follow_up = json!({ "model": "m1", "previous_response_id": "resp_42" });
        let mut t = tiers(&["p1", "p2"]);
        let r = route(&host, &state(), "vk1", &follow_up, &mut t, NOW)
            .ok()
            .flatten();
        assert_eq!(r.and_then(|s| s.pin).map(|p| p.key).as_deref(), Some(key));
    }
}
