//! The response cache through whole calls of the front stage on the fake host: a miss stores
//! the answer as it passes back, the same request is then answered by the stage itself (JSON,
//! or SSE to a streaming client), and what must not be served or stored is not.

use super::*;
use crate::cache::{entry::Entry, store::Lookup};
use crate::testing::{model, open_key, provider, FakeHost};
use crate::vocab::Usage;
use ai_router_proto::v1::{CacheLookup, CacheSettings, CacheStore, Policy, Snapshot};

const KEY: &str = "sk-starci-app-0123456789abcdef";
const OPTED_OUT: &str = "sk-starci-nocache-0123456789abcdef";
const ANSWER: &str = r#"{"id":"chatcmpl-9","object":"chat.completion","created":7,"model":"m1","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"cached words"}}],"usage":{"prompt_tokens":11,"completion_tokens":4,"total_tokens":15}}"#;
const BODY: &str =
    r#"{"model":"chat","messages":[{"role":"user","content":"hi"}],"temperature":0}"#;

fn snapshot(cache: Option<CacheSettings>) -> Snapshot {
    let mut snap = Snapshot {
        cache,
        ..Snapshot::default()
    };
    snap.providers.push(provider(
        "p1",
        "sk-provider-a",
        vec![model("m1", &["chat"]), model("m2", &[])],
    ));
    for (id, secret, cache) in [("key_app", KEY, None), ("key_off", OPTED_OUT, Some(false))] {
        snap.virtual_keys.push(VirtualKey {
            cache,
            ..open_key(id, secret)
        });
    }
    snap.defaults = Some(Policy {
        max_attempts: Some(2),
        ..Default::default()
    });
    snap
}

fn pool_cache() -> CacheSettings {
    CacheSettings {
        ttl_ms: 60_000,
        max_entries: 16,
        max_bytes: 16 * 4096,
        shared_lookup_ms: 0,
    }
}

/// One client: its host (sharing `slots` with the calls before it) and its front stage.
struct Call {
    host: FakeHost,
    front: Front,
    flow: Flow,
}

fn call_with(
    snap: &Snapshot,
    slots: &FakeHost,
    key: &str,
    body: &str,
    headers: &[(&str, &str)],
    path: &str,
) -> Call {
    let mut host = FakeHost::with_state(State::new(1, snap.clone()));
    host.cache = slots.cache.clone();
    host.now = slots.now;
    for (k, v) in [
        (":method", "POST"),
        (":path", path),
        ("x-request-id", "rid-1"),
        ("authorization", &format!("Bearer {key}")),
    ]
    .into_iter()
    .chain(headers.iter().copied())
    {
        host.add(Side::Request, k, v.as_bytes());
    }
    let mut front = Front::default();
    front.on_request_headers(&mut host, false);
    host.request_body = body.as_bytes().to_vec();
    let flow = front.on_request_body(&mut host, body.len(), true);
    Call { host, front, flow }
}

fn call(snap: &Snapshot, slots: &FakeHost, body: &str) -> Call {
    call_with(snap, slots, KEY, body, &[], "/v1/chat/completions")
}

impl Call {
    /// The provider's answer passes back, its body in two chunks.
    fn answer(&mut self, status: u16, body: &str) {
        let h = &mut self.host;
        h.add(Side::Response, ":status", status.to_string().as_bytes());
        h.add(Side::Response, H_ATTEMPT, b"1");
        h.add(Side::Response, H_LANE_MODEL, b"m1");
        h.add(Side::Response, H_LANE_PROVIDER, b"p1");
        self.front.on_response_headers(h, false);
        let (head, tail) = body.split_at(body.len() / 2);
        for (chunk, end) in [(head, false), (tail, true)] {
            h.response_body = chunk.as_bytes().to_vec();
            self.front.on_response_body(h, chunk.len(), end);
        }
    }

    fn finish(mut self) -> (FakeHost, RequestOutcome) {
        self.front.on_log(&mut self.host);
        let report = self.host.reports.pop().expect("a report");
        (self.host, report)
    }

    fn cache_header(&self) -> Option<String> {
        self.host.text(Side::Response, H_CACHE)
    }
}

/// Fills the cache with one answer to `body`; the host holding the slots.
fn filled(snap: &Snapshot, body: &str) -> FakeHost {
    let mut first = call(
        snap,
        &FakeHost::with_state(State::new(1, snap.clone())),
        body,
    );
    assert_eq!(first.flow, Flow::Continue, "a miss goes to the providers");
    first.answer(200, ANSWER);
    assert_eq!(first.cache_header().as_deref(), Some("miss"));
    let (host, report) = first.finish();
    assert_eq!(report.cache_lookup(), CacheLookup::Miss);
    assert_eq!(report.cache_store(), CacheStore::Stored);
    assert_eq!(host.cache.len(), 1);
    host
}

#[test]
fn a_second_identical_call_is_answered_from_the_cache_without_a_plan() {
    let snap = snapshot(Some(pool_cache()));
    let slots = filled(&snap, BODY);
    let second = call(&snap, &slots, BODY);
    assert_eq!(second.flow, Flow::Pause);
    assert!(second.host.header(Side::Request, PLAN_HEADER).is_none());
    let a = second.host.answered.clone().expect("answered by the stage");
    assert_eq!(a.status, 200);
    assert_eq!(a.body, ANSWER.as_bytes());
    assert_eq!(a.header(H_CACHE), Some("hit"));
    assert_eq!(a.header(H_COST), Some("0"));
    assert_eq!(a.header(H_MODEL), Some("m1"));
    assert_eq!(a.header("content-type"), Some("application/json"));
    let (_, report) = second.finish();
    assert_eq!(report.outcome(), RequestResult::Success);
    assert!(report.cache_hit);
    assert_eq!(report.cache_lookup(), CacheLookup::Hit);
    assert_eq!(report.attempts, 0);
    assert_eq!(
        (report.provider.as_str(), report.model.as_str()),
        ("p1", "m1")
    );
    let usage = report
        .usage
        .expect("the stored answer's usage: what it saved");
    assert_eq!((usage.prompt_tokens, usage.completion_tokens), (11, 4));
}

#[test]
fn a_streaming_client_gets_the_stored_answer_as_sse() {
    let snap = snapshot(Some(pool_cache()));
    let slots = filled(&snap, BODY);
    let streamed = BODY.replace("\"temperature\":0", "\"temperature\":0,\"stream\":true");
    let hit = call(&snap, &slots, &streamed);
    let a = hit.host.answered.clone().expect("answered");
    assert_eq!(a.header("content-type"), Some("text/event-stream"));
    let text = String::from_utf8(a.body).unwrap_or_default();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert!(text.contains("\"content\":\"cached words\""), "{text}");
    assert!(
        !text.contains("\"usage\""),
        "no usage chunk unasked: {text}"
    );
    let with_usage = BODY.replace(
        "\"temperature\":0",
        "\"temperature\":0,\"stream\":true,\"stream_options\":{\"include_usage\":true}",
    );
    let hit = call(&snap, &slots, &with_usage);
    let text =
        String::from_utf8(hit.host.answered.clone().expect("answered").body).unwrap_or_default();
    assert!(text.contains("\"total_tokens\":15"), "{text}");
}

#[test]
fn another_request_misses_and_a_stream_is_not_stored() {
    let snap = snapshot(Some(pool_cache()));
    let slots = filled(&snap, BODY);
    for other in [
        BODY.replace("\"temperature\":0", "\"temperature\":1"),
        BODY.replace("\"chat\"", "\"m2\""),
        BODY.replace("\"hi\"", "\"hello\""),
    ] {
        let mut c = call(&snap, &slots, &other);
        assert_eq!(c.flow, Flow::Continue, "{other}");
        c.answer(200, ANSWER);
        assert_eq!(c.cache_header().as_deref(), Some("miss"), "{other}");
    }
    // A stream that breaks off (no [DONE]) stores nothing.
    let streamed = BODY
        .replace("\"hi\"", "\"new\"")
        .replace("\"temperature\":0", "\"stream\":true");
    let mut c = call(&snap, &slots, &streamed);
    c.answer(200, &STREAM.replace("data: [DONE]\n\n", ""));
    let (host, report) = c.finish();
    assert_eq!(report.cache_store(), CacheStore::Unstorable);
    assert_eq!(host.cache, slots.cache);
}

const STREAM: &str = "data: {\"id\":\"chatcmpl-s\",\"object\":\"chat.completion.chunk\",\"created\":3,\"model\":\"m1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n\
data: {\"id\":\"chatcmpl-s\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"streamed \"}}]}\n\n\
data: {\"id\":\"chatcmpl-s\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"words\"},\"finish_reason\":\"stop\"}]}\n\n\
data: {\"id\":\"chatcmpl-s\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"total_tokens\":7}}\n\n\
data: [DONE]\n\n";

#[test]
fn a_stream_that_ended_cleanly_is_stored_as_the_completion_it_assembles_to() {
    let snap = snapshot(Some(pool_cache()));
    let empty = FakeHost::with_state(State::new(1, snap.clone()));
    let streamed = BODY.replace("\"temperature\":0", "\"temperature\":0,\"stream\":true");
    let mut c = call(&snap, &empty, &streamed);
    c.answer(200, STREAM);
    assert_eq!(c.cache_header().as_deref(), Some("miss"));
    let (slots, report) = c.finish();
    assert_eq!(report.cache_store(), CacheStore::Stored);
    // A unary client of the same request gets the assembled completion.
    let hit = call(&snap, &slots, BODY);
    let a = hit.host.answered.clone().expect("a hit");
    let v = a.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["content"], "streamed words");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["total_tokens"], 7);
    let (_, report) = hit.finish();
    assert_eq!(report.usage.map(|u| u.prompt_tokens), Some(5));
}

#[test]
fn a_stream_stored_without_its_usage_chunk_keeps_the_attempts_usage_and_saves_it() {
    let snap = snapshot(Some(pool_cache()));
    let empty = FakeHost::with_state(State::new(1, snap.clone()));
    let streamed = BODY.replace("\"temperature\":0", "\"temperature\":0,\"stream\":true");
    let mut c = call(&snap, &empty, &streamed);
    // The client did not ask for usage: its stream has no usage chunk, but the attempt stage
    // asked the provider for it and noted it on the call.
    let usage = Usage {
        prompt_tokens: 5,
        completion_tokens: 2,
        cached_tokens: 3,
    };
    for call in c.host.calls.values_mut() {
        call.answered_usage = Some(usage);
    }
    let unasked = STREAM.replace(
        "data: {\"id\":\"chatcmpl-s\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"total_tokens\":7}}\n\n",
        "",
    );
    assert!(!unasked.contains("usage"));
    c.answer(200, &unasked);
    let (slots, report) = c.finish();
    assert_eq!(report.cache_store(), CacheStore::Stored);
    // A hit reports the stored usage (its saving), and a client that did not ask still gets
    // no usage chunk.
    let hit = call(&snap, &slots, &streamed);
    let a = hit.host.answered.clone().expect("a hit");
    let text = String::from_utf8(a.body).unwrap_or_default();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert!(!text.contains("usage"), "no usage chunk unasked: {text}");
    let (_, report) = hit.finish();
    assert!(report.cache_hit);
    let saved = report.usage.expect("the stored answer's usage");
    assert_eq!(
        (
            saved.prompt_tokens,
            saved.completion_tokens,
            saved.cached_tokens
        ),
        (5, 2, 3)
    );
    let unary = call(&snap, &slots, BODY);
    let v = unary.host.answered.clone().expect("a hit").json();
    assert_eq!(v["usage"]["total_tokens"], 7);
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 3);
}

#[test]
fn failed_truncated_empty_and_oversized_answers_are_not_stored() {
    let snap = snapshot(Some(pool_cache()));
    let empty = FakeHost::with_state(State::new(1, snap.clone()));
    let truncated = ANSWER.replace("\"stop\"", "\"length\"");
    let blank = ANSWER.replace("cached words", "");
    for (status, answer, stored) in [
        (
            503,
            r#"{"error":{"code":"pool_unavailable"}}"#,
            CacheStore::Unstorable,
        ),
        (200, truncated.as_str(), CacheStore::Unstorable),
        (200, blank.as_str(), CacheStore::Unstorable),
        (
            200,
            "{\"choices\":[{\"finish_reason\":\"st",
            CacheStore::Unstorable,
        ),
    ] {
        let mut c = call(&snap, &empty, BODY);
        c.answer(status, answer);
        let (host, report) = c.finish();
        assert_eq!(report.cache_store(), stored, "{answer}");
        assert!(host.cache.is_empty(), "{answer}");
    }
    let tiny = snapshot(Some(CacheSettings {
        max_bytes: 16 * 1024,
        ..pool_cache()
    }));
    let big = ANSWER.replace("cached words", &"word ".repeat(400));
    let mut c = call(&tiny, &empty, BODY);
    c.answer(200, &big);
    let (host, report) = c.finish();
    assert_eq!(report.cache_store(), CacheStore::TooLarge);
    assert!(host.cache.is_empty());
}

#[test]
fn an_entry_past_its_ttl_misses() {
    let snap = snapshot(Some(pool_cache()));
    let mut slots = filled(&snap, BODY);
    slots.now += 59_999;
    assert!(
        call(&snap, &slots, BODY).host.answered.is_some(),
        "still fresh"
    );
    slots.now += 1;
    let c = call(&snap, &slots, BODY);
    assert_eq!(c.flow, Flow::Continue, "expired: to the providers again");
}

#[test]
fn no_cache_from_the_client_bypasses_the_lookup_and_the_store() {
    let snap = snapshot(Some(pool_cache()));
    let slots = filled(&snap, BODY);
    for value in ["no-cache", "no-store"] {
        let headers = [("cache-control", value)];
        let mut c = call_with(&snap, &slots, KEY, BODY, &headers, "/v1/chat/completions");
        assert_eq!(c.flow, Flow::Continue, "{value}");
        c.answer(200, &ANSWER.replace("cached words", "fresh words"));
        assert_eq!(c.cache_header().as_deref(), Some("bypass"));
        let (host, report) = c.finish();
        assert_eq!(report.cache_lookup(), CacheLookup::Bypass);
        assert_eq!(host.cache, slots.cache, "{value}: the stored answer stays");
    }
}

#[test]
fn a_key_or_a_policy_with_cache_false_never_uses_it_and_a_key_wins() {
    let snap = snapshot(Some(pool_cache()));
    let slots = filled(&snap, BODY);
    let mut c = call_with(&snap, &slots, OPTED_OUT, BODY, &[], "/v1/chat/completions");
    assert_eq!(c.flow, Flow::Continue);
    c.answer(200, ANSWER);
    assert_eq!(c.cache_header(), None);
    let (_, report) = c.finish();
    assert_eq!(report.cache_lookup(), CacheLookup::Unspecified);

    let mut off = snap.clone();
    off.defaults = Some(Policy {
        cache: Some(false),
        ..Default::default()
    });
    assert_eq!(call(&off, &slots, BODY).flow, Flow::Continue, "policy off");
    // The key's own `cache: true` wins over the policy's.
    off.virtual_keys[0].cache = Some(true);
    assert!(call(&off, &slots, BODY).host.answered.is_some(), "key on");
    // No pool cache: nothing, whatever the key says.
    assert_eq!(call(&snapshot(None), &slots, BODY).flow, Flow::Continue);
}

const MESSAGES_BODY: &str = r#"{"model":"chat","max_tokens":50,"messages":[{"role":"user","content":"hi"}],"temperature":0}"#;
const MESSAGE: &str = r#"{"id":"msg_9","type":"message","role":"assistant","model":"m1","content":[{"type":"text","text":"cached words"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":8,"cache_creation_input_tokens":0,"cache_read_input_tokens":3,"output_tokens":4}}"#;
const RESPONSES_BODY: &str =
    r#"{"model":"chat","input":"hi","temperature":0,"metadata":{"run":"1"}}"#;
const RESPONSE: &str = r#"{"id":"resp_9","object":"response","created_at":7,"status":"completed","error":null,"model":"m1","output":[{"type":"message","id":"msg_resp_9","status":"completed","role":"assistant","content":[{"type":"output_text","text":"cached words","annotations":[]}]}],"metadata":{"run":"1"},"usage":{"input_tokens":11,"input_tokens_details":{"cached_tokens":0},"output_tokens":4,"total_tokens":15}}"#;

/// A call of `path` (`/v1/messages` or `/v1/responses`) with `body`.
fn protocol_call(snap: &Snapshot, slots: &FakeHost, path: &str, body: &str) -> Call {
    call_with(snap, slots, KEY, body, &[], path)
}

/// Fills the cache with `answer` to a `path` call of `body`; the host holding the slots.
fn filled_by(snap: &Snapshot, path: &str, body: &str, answer: &str) -> FakeHost {
    let empty = FakeHost::with_state(State::new(1, snap.clone()));
    let mut first = protocol_call(snap, &empty, path, body);
    assert_eq!(first.flow, Flow::Continue, "a miss goes to the providers");
    first.answer(200, answer);
    assert_eq!(first.cache_header().as_deref(), Some("miss"));
    let (host, report) = first.finish();
    assert_eq!(report.cache_store(), CacheStore::Stored, "{path}");
    host
}

/// The SSE events of an answer, as (type, data).
fn typed_events(body: &[u8]) -> Vec<(String, Value)> {
    String::from_utf8_lossy(body)
        .split("\n\n")
        .filter_map(|e| {
            let data = e.lines().find_map(|l| l.strip_prefix("data: "))?;
            let data: Value = serde_json::from_str(data).ok()?;
            Some((data["type"].as_str().unwrap_or("").to_owned(), data))
        })
        .collect()
}

#[test]
fn a_messages_call_is_answered_from_its_own_key_space_unary_and_streamed() {
    let snap = snapshot(Some(pool_cache()));
    let slots = filled_by(&snap, "/v1/messages", MESSAGES_BODY, MESSAGE);
    let hit = protocol_call(&snap, &slots, "/v1/messages", MESSAGES_BODY);
    assert_eq!(hit.flow, Flow::Pause);
    assert!(hit.host.header(Side::Request, PLAN_HEADER).is_none());
    let a = hit.host.answered.clone().expect("answered by the stage");
    assert_eq!(a.body, MESSAGE.as_bytes(), "the message as first answered");
    assert_eq!(a.header(H_CACHE), Some("hit"));
    assert_eq!(a.header(H_COST), Some("0"));
    let (_, report) = hit.finish();
    assert!(report.cache_hit);
    let usage = report.usage.expect("what the hit saved");
    // Messages usage read as such: the cache-read tokens are part of the prompt.
    assert_eq!(
        (
            usage.prompt_tokens,
            usage.completion_tokens,
            usage.cached_tokens
        ),
        (11, 4, 3)
    );

    let streamed = MESSAGES_BODY.replace("\"temperature\":0", "\"temperature\":0,\"stream\":true");
    let hit = protocol_call(&snap, &slots, "/v1/messages", &streamed);
    let a = hit.host.answered.clone().expect("answered");
    assert_eq!(a.header("content-type"), Some("text/event-stream"));
    assert_eq!(a.header(H_CACHE), Some("hit"));
    let events = typed_events(&a.body);
    let kinds: Vec<&str> = events.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert_eq!(events[2].1["delta"]["text"], "cached words");

    // The same conversation from a chat or a Responses caller is another key: a miss.
    let chat = protocol_call(&snap, &slots, "/v1/chat/completions", MESSAGES_BODY);
    assert_eq!(chat.flow, Flow::Continue);
    assert!(matches!(chat.front.cache.lookup, Lookup::Miss(_)));
    // Another system prompt: a miss.
    let other = MESSAGES_BODY.replace("\"temperature\":0", "\"temperature\":0,\"system\":\"x\"");
    let miss = protocol_call(&snap, &slots, "/v1/messages", &other);
    assert!(matches!(miss.front.cache.lookup, Lookup::Miss(_)));
    // no-cache: to the providers.
    let fresh = call_with(
        &snap,
        &slots,
        KEY,
        MESSAGES_BODY,
        &[("cache-control", "no-cache")],
        "/v1/messages",
    );
    assert_eq!(fresh.flow, Flow::Continue);
    assert_eq!(fresh.front.cache.lookup, Lookup::Bypass);
}

#[test]
fn a_streamed_messages_miss_is_stored_as_its_message_and_a_cut_one_is_not() {
    let snap = snapshot(Some(pool_cache()));
    let streamed = MESSAGES_BODY.replace("\"temperature\":0", "\"temperature\":0,\"stream\":true");
    let sse = crate::cache::shapes::replay_sse(
        Protocol::Messages,
        &serde_json::from_str(MESSAGE).unwrap_or_default(),
    );
    let sse = String::from_utf8_lossy(&sse).into_owned();
    // Cut before message_stop: nothing stored.
    let cut_at = sse.find("event: message_stop").unwrap_or(0);
    let empty = FakeHost::with_state(State::new(1, snap.clone()));
    let mut cut = protocol_call(&snap, &empty, "/v1/messages", &streamed);
    cut.answer(200, &sse[..cut_at]);
    let (host, report) = cut.finish();
    assert_eq!(report.cache_store(), CacheStore::Unstorable);
    assert!(host.cache.is_empty());
    // Whole: stored, then a unary caller gets the message it assembles to.
    let mut whole = protocol_call(&snap, &empty, "/v1/messages", &streamed);
    whole.answer(200, &sse);
    let (slots, report) = whole.finish();
    assert_eq!(report.cache_store(), CacheStore::Stored);
    let hit = protocol_call(&snap, &slots, "/v1/messages", MESSAGES_BODY);
    let a = hit.host.answered.clone().expect("answered");
    let got: Value = serde_json::from_slice(&a.body).unwrap_or_default();
    assert_eq!(
        got,
        serde_json::from_str::<Value>(MESSAGE).unwrap_or_default()
    );
}

#[test]
fn a_responses_call_is_answered_from_its_own_key_space_unary_and_streamed() {
    let snap = snapshot(Some(pool_cache()));
    let slots = filled_by(&snap, "/v1/responses", RESPONSES_BODY, RESPONSE);
    // Another caller's metadata does not split the key; the answer echoes this caller's.
    let body = RESPONSES_BODY.replace("\"run\":\"1\"", "\"run\":\"2\"");
    let hit = protocol_call(&snap, &slots, "/v1/responses", &body);
    let a = hit.host.answered.clone().expect("answered by the stage");
    assert_eq!(a.header(H_CACHE), Some("hit"));
    let got: Value = serde_json::from_slice(&a.body).unwrap_or_default();
    assert_eq!(got["id"], "resp_9");
    assert_eq!(got["metadata"], json!({ "run": "2" }));
    assert_eq!(got["output"][0]["content"][0]["text"], "cached words");
    let (_, report) = hit.finish();
    let usage = report.usage.expect("what the hit saved");
    assert_eq!((usage.prompt_tokens, usage.completion_tokens), (11, 4));

    let streamed = RESPONSES_BODY.replace("\"temperature\":0", "\"temperature\":0,\"stream\":true");
    let hit = protocol_call(&snap, &slots, "/v1/responses", &streamed);
    let a = hit.host.answered.clone().expect("answered");
    assert_eq!(a.header("content-type"), Some("text/event-stream"));
    let events = typed_events(&a.body);
    assert_eq!(
        events.first().map(|(k, _)| k.as_str()),
        Some("response.created")
    );
    assert_eq!(
        events.last().map(|(k, _)| k.as_str()),
        Some("response.completed")
    );
    assert!(events
        .iter()
        .any(|(k, d)| k == "response.output_text.delta" && d["delta"] == "cached words"));

    // The chat caller of the same conversation: another key space.
    let chat = call(
        &snap,
        &slots,
        r#"{"model":"chat","messages":[{"role":"user","content":"hi"}],"temperature":0}"#,
    );
    assert!(matches!(chat.front.cache.lookup, Lookup::Miss(_)));
    // A stateful call is not cached at all.
    let stored = RESPONSES_BODY.replace("\"temperature\":0", "\"temperature\":0,\"store\":true");
    let stateful = protocol_call(&snap, &slots, "/v1/responses", &stored);
    assert_eq!(stateful.front.cache.lookup, Lookup::Off);
}

#[test]
fn an_incomplete_response_is_not_stored() {
    let snap = snapshot(Some(pool_cache()));
    let empty = FakeHost::with_state(State::new(1, snap.clone()));
    let mut c = protocol_call(&snap, &empty, "/v1/responses", RESPONSES_BODY);
    c.answer(200, &RESPONSE.replace("\"completed\"", "\"incomplete\""));
    let (host, report) = c.finish();
    assert_eq!(report.cache_store(), CacheStore::Unstorable);
    assert!(host.cache.is_empty());
}

#[test]
fn a_store_that_races_another_worker_tries_again() {
    let snap = snapshot(Some(pool_cache()));
    let mut slots = FakeHost::with_state(State::new(1, snap.clone()));
    slots.cache_races = 1;
    let mut c = call(&snap, &slots, BODY);
    c.host.cache_races = 1;
    c.answer(200, ANSWER);
    let (host, report) = c.finish();
    assert_eq!(report.cache_store(), CacheStore::Stored);
    let (slot, _) = host.cache.iter().next().expect("a slot");
    let entry = Entry::decode(&host.cache[slot].0).expect("the answer, not the other write");
    assert_eq!(entry.body, ANSWER.as_bytes());
}

/// The gRPC calls a stage made, by method, with their messages.
fn grpc_calls(host: &FakeHost, wanted: &str) -> Vec<Vec<u8>> {
    host.dispatched
        .iter()
        .filter_map(|d| match d {
            crate::testing::Dispatched::Grpc {
                method, message, ..
            } if method == wanted => Some(message.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn without_a_shared_tier_a_miss_asks_nobody() {
    let snap = snapshot(Some(pool_cache()));
    let slots = filled(&snap, BODY);
    let miss = call(
        &snap,
        &slots,
        r#"{"model":"chat","messages":[{"role":"user","content":"other"}]}"#,
    );
    assert_eq!(miss.flow, Flow::Continue);
    assert!(grpc_calls(&miss.host, "SharedCacheGet").is_empty());
    assert!(grpc_calls(&slots, "SharedCachePut").is_empty());
}

#[test]
fn a_shared_tier_miss_goes_on_and_its_stored_answer_is_a_hit_at_another_envoy() {
    use ai_router_proto::v1::{SharedCacheGetReply, SharedCacheGetRequest, SharedCachePutRequest};
    use prost::Message;
    let snap = snapshot(Some(CacheSettings {
        shared_lookup_ms: 25,
        ..pool_cache()
    }));
    let empty = FakeHost::with_state(State::new(1, snap.clone()));
    // Envoy A: a local miss asks the shared tier and waits.
    let mut a = call(&snap, &empty, BODY);
    assert_eq!(a.flow, Flow::Pause);
    assert!(a.host.header(Side::Request, PLAN_HEADER).is_none());
    let asked = grpc_calls(&a.host, "SharedCacheGet");
    assert_eq!(asked.len(), 1);
    let key = SharedCacheGetRequest::decode(asked[0].as_slice())
        .map(|r| r.key)
        .unwrap_or_default();
    assert_eq!(key.len(), 64);
    // The shared tier fails (unavailable): a miss, the call goes on to the providers.
    a.front.on_grpc_call_response(&mut a.host, 1, 14, 0);
    assert_eq!(a.host.resumed, 1);
    assert!(a.host.header(Side::Request, PLAN_HEADER).is_some());
    a.answer(200, ANSWER);
    assert_eq!(a.cache_header().as_deref(), Some("miss"));
    let puts = grpc_calls(&a.host, "SharedCachePut");
    assert_eq!(puts.len(), 1, "the stored entry goes up");
    let put = SharedCachePutRequest::decode(puts[0].as_slice()).unwrap_or_default();
    assert_eq!((put.key.as_str(), put.ttl_ms), (key.as_str(), 60_000));
    let (_, report) = a.finish();
    assert_eq!(report.cache_store(), CacheStore::Stored);

    // Envoy B (its own empty slots): the shared tier has it.
    let mut b = call(&snap, &empty, BODY);
    assert_eq!(b.flow, Flow::Pause);
    // An answer to another call is not the shared tier's.
    b.front.on_grpc_call_response(&mut b.host, 99, 0, 0);
    assert!(b.host.answered.is_none());
    b.host.grpc_body = Some(
        SharedCacheGetReply {
            entry: put.entry.clone(),
        }
        .encode_to_vec(),
    );
    b.front.on_grpc_call_response(&mut b.host, 1, 0, 1);
    let answered = b
        .host
        .answered
        .clone()
        .expect("a hit answered by the stage");
    assert_eq!(answered.status, 200);
    assert_eq!(answered.body, ANSWER.as_bytes());
    assert_eq!(answered.header(H_CACHE), Some("hit"));
    assert!(b.host.header(Side::Request, PLAN_HEADER).is_none());
    assert_eq!(b.host.resumed, 0);
    assert_eq!(b.host.cache.len(), 1, "the hit is in B's slots now");
    let (_, report) = b.finish();
    assert!(report.cache_hit);

    // An expired or foreign entry is a miss.
    let mut c = call(
        &snap,
        &empty,
        r#"{"model":"chat","messages":[{"role":"user","content":"else"}]}"#,
    );
    c.host.grpc_body = Some(SharedCacheGetReply { entry: put.entry }.encode_to_vec());
    c.front.on_grpc_call_response(&mut c.host, 1, 0, 1);
    assert!(c.host.answered.is_none());
    assert_eq!(c.host.resumed, 1);
}
