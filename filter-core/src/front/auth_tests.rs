//! Keys (every header a client may send one in) and the key's quotas, checked before
//! anything else.

use super::fixture::*;
use super::*;
use crate::testing::FakeHost;
use crate::vm::minute_lease::{Ask, MinuteLease};
use std::collections::HashMap;

#[test]
fn keys_are_checked_before_anything_else() {
    type Headers = Vec<(&'static str, Vec<u8>)>;
    let cases: Vec<(Headers, u16, &str)> = vec![
        (vec![], 401, "missing_api_key"),
        (
            vec![("authorization", bearer("sk-starci-nope-1"))],
            401,
            "invalid_api_key",
        ),
        (
            vec![("authorization", b"Basic abc".to_vec())],
            401,
            "missing_api_key",
        ),
        (
            vec![("authorization", b"Bearer sk-\xe9\xe9".to_vec())],
            400,
            "invalid_request",
        ),
    ];
    for (headers, status, code) in cases {
        let extra: Vec<(&str, &[u8])> = headers.iter().map(|(k, v)| (*k, v.as_slice())).collect();
        let mut host = client("POST", "/v1/chat/completions", &extra);
        let mut front = Front::default();
        assert_eq!(front.on_request_headers(&mut host, false), Flow::Pause);
        assert_eq!(
            answered_code(&host),
            (status, code.to_string()),
            "{headers:?}"
        );
        front.on_log(&mut host);
        assert!(host.reports[0].outcome_text().starts_with("rejected:"));
    }
}

#[test]
fn requests_per_minute_answer_429_with_retry_after() {
    let auth = bearer("sk-starci-slow-1");
    let mut first = client("POST", "/v1/chat/completions", &[("authorization", &auth)]);
    assert_eq!(
        Front::default().on_request_headers(&mut first, false),
        Flow::Pause
    );
    assert!(first.answered.is_none());
    // The first call of the minute passed at once and asked for the minute's block.
    assert_eq!(first.minute_asks.len(), 1);
    assert_eq!(first.minute_asks[0].0, "key_slow");
    // The same process, the same minute.
    let leases = first.minute_leases.clone();
    let mut second = client("POST", "/v1/chat/completions", &[("authorization", &auth)]);
    second.minute_leases = leases;
    Front::default().on_request_headers(&mut second, false);
    let a = second.answered.clone().expect("refused");
    assert_eq!(a.status, 429);
    assert_eq!(a.json()["error"]["code"], "requests_per_minute_exceeded");
    assert!(a.header("retry-after").is_some());
}

/// A host whose state has `key_busy` (requestsPerMinute 20: blocks of 5), with `leases` as
/// the process's minute records.
fn busy_call(leases: &HashMap<String, MinuteLease>) -> FakeHost {
    let mut s = state().snapshot.clone();
    s.virtual_keys.push(VirtualKey {
        id: "key_busy".into(),
        sha256: sha256_hex(b"sk-starci-busy-1"),
        models: vec!["*".into()],
        enabled: true,
        requests_per_minute: 20,
        ..Default::default()
    });
    let auth = bearer("sk-starci-busy-1");
    let mut host = client("POST", "/v1/chat/completions", &[("authorization", &auth)]);
    host.state = Some(Rc::new(State::new(2, s)));
    host.minute_leases = leases.clone();
    host
}

/// Makes `n` calls of `key_busy`; returns how many were admitted and the asks they made.
fn busy_calls(leases: &mut HashMap<String, MinuteLease>, n: u32) -> (u32, Vec<Ask>) {
    let mut admitted = 0;
    let mut asks = Vec::new();
    for _ in 0..n {
        let mut host = busy_call(leases);
        Front::default().on_request_headers(&mut host, false);
        match &host.answered {
            None => admitted += 1,
            Some(a) => {
                assert_eq!(a.status, 429);
                assert_eq!(a.json()["error"]["code"], "requests_per_minute_exceeded");
            }
        }
        asks.extend(host.minute_asks.iter().map(|(_, ask)| *ask));
        *leases = host.minute_leases;
    }
    (admitted, asks)
}

fn answer(leases: &mut HashMap<String, MinuteLease>, ask: Ask, granted: Option<u32>) {
    let stored = leases.get("key_busy").copied();
    if let Some(lease) = MinuteLease::answered(stored, ask, granted) {
        leases.insert("key_busy".into(), lease);
    }
}

#[test]
fn requests_per_minute_are_admitted_from_the_blocks_the_control_plane_grants() {
    let mut leases = HashMap::new();
    // No answer yet: one block passes on credit, the rest waits for a grant.
    let (admitted, asks) = busy_calls(&mut leases, 8);
    assert_eq!((admitted, asks.len()), (5, 1));
    answer(&mut leases, asks[0], Some(5));
    let (admitted, asks) = busy_calls(&mut leases, 8);
    assert_eq!((admitted, asks.len()), (5, 1));
    // Other Envoys took most of the minute: 2 calls were left.
    answer(&mut leases, asks[0], Some(2));
    let (admitted, asks) = busy_calls(&mut leases, 5);
    assert_eq!(
        (admitted, asks.len()),
        (0, 0),
        "the credit already covered them"
    );
    assert_eq!(leases["key_busy"].used, 10);
}

#[test]
fn requests_per_minute_count_alone_when_the_control_plane_does_not_answer() {
    let mut leases = HashMap::new();
    let (_, asks) = busy_calls(&mut leases, 1);
    answer(&mut leases, asks[0], None);
    let (admitted, asks) = busy_calls(&mut leases, 30);
    // The limit, 20, as one Envoy alone counts it: 19 more.
    assert_eq!((admitted, asks.len()), (19, 0));
}

#[test]
fn chat_takes_the_key_as_x_api_key_too_and_a_missing_key_names_both_headers() {
    let key = KEY.as_bytes().to_vec();
    let mut host = client("POST", "/v1/chat/completions", &[("x-api-key", &key)]);
    let mut front = Front::default();
    assert_eq!(front.on_request_headers(&mut host, false), Flow::Pause);
    assert!(host.answered.is_none(), "{:?}", host.answered);
    assert!(host.header(Side::Request, "x-api-key").is_none());
    for path in ["/v1/chat/completions", "/v1/messages"] {
        let mut host = client("POST", path, &[]);
        Front::default().on_request_headers(&mut host, false);
        let answer = host.answered.as_ref().expect("a local answer");
        assert_eq!(answer.status, 401);
        let text = String::from_utf8_lossy(&answer.body).to_string();
        assert!(
            text.contains("x-api-key") && text.contains("Authorization: Bearer"),
            "{path}: {text}"
        );
    }
}
