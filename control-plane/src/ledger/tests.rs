use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};

use super::*;
use crate::clock::TestClock;
use crate::config::parse;
use crate::config::secrets::MapEnv;

// 2026-03-15T12:00:00Z
const AT: i64 = 1_773_576_000_000;

const POOL: &str = r#"
providers:
  - id: groq
    kind: groq
    keys:
      - { alias: g1, env: G1, scope: org-a }
      - { alias: g2, env: G2, scope: org-a }
      - { alias: g3, env: G3 }
    models: [{ id: llama }]
  - id: local
    kind: openai-compatible
    baseUrl: http://127.0.0.1:9/v1
    limits: { rpm: 5 }
    keys: [{ alias: l1, env: L1 }]
    models: [{ id: llama }]
"#;

fn ledger() -> (Ledger, Arc<TestClock>) {
    let env = MapEnv::new([("G1", "s1"), ("G2", "s2"), ("G3", "s3"), ("L1", "s4")]);
    let config = match parse(POOL).and_then(|f| f.resolve(&env, Path::new("."))) {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    };
    let clock = Arc::new(TestClock(AtomicI64::new(AT)));
    (Ledger::new(&config, clock.clone()), clock)
}

fn attempt(provider: &str, key: &str, class: pb::ErrorClass) -> pb::AttemptOutcome {
    let mut a = pb::AttemptOutcome {
        provider: provider.to_owned(),
        key: key.to_owned(),
        model: "llama".to_owned(),
        at_ms: AT,
        remaining_requests: -1,
        remaining_tokens: -1,
        usage: Some(pb::Usage {
            prompt_tokens: 30,
            completion_tokens: 10,
            cached_tokens: 0,
            ..Default::default()
        }),
        ..Default::default()
    };
    a.set_error_class(class);
    a
}

fn observe(l: &Ledger, attempts: Vec<pb::AttemptOutcome>) {
    l.observe(&pb::ReportBatch {
        attempts,
        ..Default::default()
    });
}

fn scope<'v>(view: &'v Value, provider: &str, scope: &str) -> &'v Value {
    view["providers"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["provider"] == provider))
        .and_then(|p| p["scopes"].as_array())
        .and_then(|ss| ss.iter().find(|s| s["scope"] == scope))
        .unwrap_or(&Value::Null)
}

#[test]
fn keys_of_one_scope_share_one_budget() {
    let (l, _) = ledger();
    observe(
        &l,
        vec![
            attempt("groq", "g1", pb::ErrorClass::Unspecified),
            attempt("groq", "g2", pb::ErrorClass::Unspecified),
            attempt("groq", "g3", pb::ErrorClass::Unspecified),
        ],
    );
    let view = l.view(&pb::Snapshot::default(), &Listings::new());
    let org = scope(&view, "groq", "org-a");
    assert_eq!(org["keys"].as_array().map(Vec::len), Some(2));
    // 30 a minute from the seed table, two spent by the two keys together.
    assert_eq!(org["windows"]["rpm"]["used"], 2);
    assert_eq!(org["windows"]["rpm"]["remaining"], 28);
    assert_eq!(org["windows"]["rpm"]["source"], "estimated");
    assert_eq!(org["windows"]["rpm"]["limitSource"], "seed");
    assert_eq!(org["windows"]["tpm"]["used"], 80);
    assert_eq!(scope(&view, "groq", "g3")["windows"]["rpm"]["used"], 1);
    assert_eq!(view["providers"][0]["billingScope"], "organization");
}

#[test]
fn reported_headroom_anchors_then_counts_down_and_ages_out() {
    let (l, clock) = ledger();
    // Groq's request header is per day.
    let mut a = attempt("groq", "g1", pb::ErrorClass::Unspecified);
    a.remaining_requests = 100;
    a.remaining_tokens = 5_000;
    observe(&l, vec![a]);
    clock.0.store(AT + 10_000, Ordering::SeqCst);
    let mut b = attempt("groq", "g2", pb::ErrorClass::Unspecified);
    b.at_ms = AT + 10_000;
    observe(&l, vec![b]);
    let view = l.view(&pb::Snapshot::default(), &Listings::new());
    let rpd = &scope(&view, "groq", "org-a")["windows"]["rpd"];
    assert_eq!(rpd["remaining"], 99);
    assert_eq!(rpd["source"], "reported");
    assert_eq!(rpd["ageMs"], 10_000);
    assert_eq!(
        scope(&view, "groq", "org-a")["windows"]["tpm"]["remaining"],
        4_960
    );
    clock
        .0
        .store(AT + count::REPORTED_TTL_MS + 1, Ordering::SeqCst);
    let view = l.view(&pb::Snapshot::default(), &Listings::new());
    let rpd = &scope(&view, "groq", "org-a")["windows"]["rpd"];
    assert_eq!(rpd["source"], "estimated");
    assert_eq!(rpd["remaining"], 998);
}

#[test]
fn a_429_is_mined_as_nothing_left_and_network_failures_are_not_counted() {
    let (l, _) = ledger();
    let mut limited = attempt("local", "l1", pb::ErrorClass::RateLimit);
    limited.retry_at_ms = AT + 20_000;
    observe(
        &l,
        vec![
            attempt("local", "l1", pb::ErrorClass::Network),
            attempt("local", "l1", pb::ErrorClass::Timeout),
            limited,
        ],
    );
    let view = l.view(&pb::Snapshot::default(), &Listings::new());
    let s = scope(&view, "local", "l1");
    assert_eq!(s["windows"]["rpm"]["used"], 1);
    assert_eq!(s["windows"]["rpm"]["remaining"], 0);
    assert_eq!(s["windows"]["rpm"]["source"], "mined");
    assert_eq!(s["windows"]["rpm"]["limitSource"], "config");
    assert_eq!(s["state"], "exhausted");
    assert_eq!(s["untilMs"], AT + 20_000);
}

#[test]
fn a_scope_whose_keys_are_all_refused_is_disabled_and_one_spent_is_exhausted() {
    let (l, _) = ledger();
    let mut snapshot = pb::Snapshot::default();
    for (key, reason, until) in [
        ("g1", pb::KeyOutReason::Auth, 0),
        ("g2", pb::KeyOutReason::Auth, 0),
        ("g3", pb::KeyOutReason::Quota, AT + 3_600_000),
    ] {
        let mut h = pb::KeyHealth {
            provider: "groq".to_owned(),
            key: key.to_owned(),
            until_ms: until,
            ..Default::default()
        };
        h.set_reason(reason);
        snapshot.key_health.push(h);
    }
    let view = l.view(&snapshot, &Listings::new());
    let org = scope(&view, "groq", "org-a");
    assert_eq!(org["state"], "disabled");
    assert_eq!(org["reason"], "auth");
    assert_eq!(org["keys"][0]["state"], "auth");
    let own = scope(&view, "groq", "g3");
    assert_eq!(own["state"], "exhausted");
    assert_eq!(own["untilMs"], AT + 3_600_000);
    assert_eq!(scope(&view, "local", "l1")["state"], "healthy");
}

#[test]
fn the_estimates_pushed_are_what_the_local_count_leaves_of_known_limits() {
    let (l, _) = ledger();
    observe(
        &l,
        vec![
            attempt("local", "l1", pb::ErrorClass::Unspecified),
            attempt("local", "l1", pb::ErrorClass::Unspecified),
            attempt("groq", "g1", pb::ErrorClass::Unspecified),
        ],
    );
    // At once, the figure leaves the three to the filter's own count of its sends: it is as of
    // a moment before they were sent.
    let lag = ai_router_contract::ledger::ESTIMATE_LAG_MS;
    let pushed = l.headroom(AT);
    let local = pushed.iter().find(|h| h.provider == "local");
    assert_eq!(
        local.map(|h| (h.remaining_requests, h.as_of_ms)),
        Some((5, AT - lag)),
        "{pushed:?}"
    );
    // Once their reports had time to arrive, it counts them, as of an instant after them.
    let later = AT + lag + 100;
    let pushed = l.headroom(later);
    let local = pushed.iter().find(|h| h.provider == "local");
    assert_eq!(local.map(|h| h.as_of_ms), Some(AT + 100), "{pushed:?}");
    assert_eq!(
        local.map(|h| (
            h.key.as_str(),
            h.model.as_str(),
            h.remaining_requests,
            h.remaining_tokens,
            h.scope.as_str()
        )),
        Some(("l1", "", 3, -1, "")),
        "{pushed:?}"
    );
    // Groq's scope org-a is shared: pushed by its scope, the least of rpm 30 and rpd 1000,
    // and tokens of tpm 8000 and tpd 200000.
    let org = pushed
        .iter()
        .find(|h| h.provider == "groq" && h.scope == "org-a");
    assert_eq!(
        org.map(|h| (h.remaining_requests, h.remaining_tokens)),
        Some((29, 8_000 - 40)),
        "{pushed:?}"
    );
    // A scope spent holds until its window ends.
    observe(
        &l,
        (0..3)
            .map(|_| attempt("local", "l1", pb::ErrorClass::Unspecified))
            .collect(),
    );
    let pushed = l.headroom(later);
    let local = pushed.iter().find(|h| h.provider == "local");
    assert_eq!(local.map(|h| h.remaining_requests), Some(0));
    assert_eq!(local.map(|h| h.reset_at_ms), Some(later + 60_000));
}

#[test]
fn an_attempt_counts_when_it_was_sent_not_when_its_report_came() {
    let (l, clock) = ledger();
    // Sent at AT + 50 (its reservation), answered 1,950 ms later.
    clock.0.store(AT + 2_000, Ordering::SeqCst);
    let mut slow = attempt("local", "l1", pb::ErrorClass::Unspecified);
    slow.at_ms = AT + 2_000;
    slow.latency_ms = 1_950;
    observe(&l, vec![slow]);
    let lag = ai_router_contract::ledger::ESTIMATE_LAG_MS;
    let as_of = |at: i64| {
        l.headroom(at)
            .into_iter()
            .find(|h| h.provider == "local")
            .map(|h| (h.remaining_requests, h.as_of_ms))
    };
    // A figure as of AT + 100 counts it; one as of AT leaves it to the filter, whose sends
    // record holds it from AT on.
    assert_eq!(as_of(AT + lag + 100), Some((4, AT + 100)));
    assert_eq!(as_of(AT + lag + 99), Some((5, AT)));
}

#[test]
fn a_reload_keeps_the_counts_of_the_scopes_it_keeps() {
    let (l, _) = ledger();
    observe(
        &l,
        vec![
            attempt("groq", "g1", pb::ErrorClass::Unspecified),
            attempt("local", "l1", pb::ErrorClass::Unspecified),
        ],
    );
    // The new pool drops `local`, keeps groq's org-a and adds a key to it, and lowers its rpm.
    let reloaded = POOL
        .replace(
            "      - { alias: g3, env: G3 }\n",
            "      - { alias: g3, env: G3, scope: org-a }\n    limits: { rpm: 5 }\n",
        )
        .replace(
            "  - id: local\n    kind: openai-compatible\n    baseUrl: http://127.0.0.1:9/v1\n    limits: { rpm: 5 }\n    keys: [{ alias: l1, env: L1 }]\n    models: [{ id: llama }]\n",
            "",
        );
    let env = MapEnv::new([("G1", "s1"), ("G2", "s2"), ("G3", "s3")]);
    let config = match parse(&reloaded).and_then(|f| f.resolve(&env, Path::new("."))) {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    };
    l.reconfigure(&config);
    let view = l.view(&pb::Snapshot::default(), &Listings::new());
    let org = scope(&view, "groq", "org-a");
    assert_eq!(org["keys"].as_array().map(Vec::len), Some(3), "{org}");
    assert_eq!(org["windows"]["rpm"]["used"], 1, "{org}");
    assert_eq!(org["windows"]["rpm"]["remaining"], 4, "{org}");
    assert_eq!(org["windows"]["rpm"]["limitSource"], "config", "{org}");
    assert_eq!(
        view["providers"].as_array().map(Vec::len),
        Some(1),
        "{view}"
    );
}

#[test]
fn the_family_view_counts_the_routes_of_each_family_and_the_live_ones() {
    let (l, _) = ledger();
    let model = |id: &str, family: &str| pb::Model {
        id: id.to_owned(),
        family: family.to_owned(),
        ..Default::default()
    };
    let mut snapshot = pb::Snapshot::default();
    snapshot.providers.push(pb::Provider {
        id: "groq".to_owned(),
        models: vec![
            model("llama", "llama-3"),
            model("gpt-oss-120b", "gpt-oss-120b"),
        ],
        ..Default::default()
    });
    snapshot.providers.push(pb::Provider {
        id: "local".to_owned(),
        models: vec![model("llama", "llama-3")],
        ..Default::default()
    });
    // Every key of local is refused: its route is not live.
    let mut h = pb::KeyHealth {
        provider: "local".to_owned(),
        key: "l1".to_owned(),
        ..Default::default()
    };
    h.set_reason(pb::KeyOutReason::Auth);
    snapshot.key_health.push(h);
    let view = l.view(&snapshot, &Listings::new());
    let family = |name: &str| {
        view["families"]
            .as_array()
            .and_then(|fs| fs.iter().find(|f| f["family"] == name))
            .cloned()
            .unwrap_or(Value::Null)
    };
    let llama = family("llama-3");
    assert_eq!(
        (llama["routes"].as_u64(), llama["live"].as_u64()),
        (Some(2), Some(1)),
        "{llama}"
    );
    assert_eq!(llama["providers"], json!(["groq", "local"]));
    let oss = family("gpt-oss-120b");
    assert_eq!(
        (oss["routes"].as_u64(), oss["live"].as_u64()),
        (Some(1), Some(1)),
        "{oss}"
    );
}

#[test]
fn each_key_shows_how_many_models_discovery_found_and_when() {
    let (l, _) = ledger();
    let listing = |models: Option<&[&str]>, listed_at_ms| crate::engine::discovered::KeyListing {
        models: models.map(|m| m.iter().map(|s| (*s).to_owned()).collect()),
        fingerprint: 1,
        listed_at_ms,
        tried_at_ms: listed_at_ms,
        due_ms: AT + 60_000,
        in_flight: false,
        error: None,
    };
    let mut listings = Listings::new();
    listings.insert(
        ("groq".to_owned(), "g1".to_owned()),
        listing(Some(&["llama", "qwen", "gemma"]), AT - 5_000),
    );
    listings.insert(
        ("groq".to_owned(), "g2".to_owned()),
        listing(Some(&["llama", "mixtral"]), AT - 4_000),
    );
    // Tried and failed: no figure, no time.
    listings.insert(("groq".to_owned(), "g3".to_owned()), listing(None, 0));
    let view = l.view(&pb::Snapshot::default(), &listings);
    let org = scope(&view, "groq", "org-a");
    assert_eq!(org["keys"][0]["discoveredModels"], 3, "{org}");
    assert_eq!(org["keys"][0]["listedAtMs"], AT - 5_000, "{org}");
    assert_eq!(org["keys"][1]["discoveredModels"], 2, "{org}");
    let own = scope(&view, "groq", "g3");
    assert_eq!(own["keys"][0]["discoveredModels"], Value::Null, "{own}");
    assert_eq!(own["keys"][0]["listedAtMs"], Value::Null, "{own}");
    // The provider: the distinct models its keys listed; none for a provider not listed.
    assert_eq!(view["providers"][0]["discoveredModels"], 4, "{view}");
    assert_eq!(view["providers"][1]["provider"], "local");
    assert_eq!(view["providers"][1]["discoveredModels"], Value::Null);
}

#[test]
fn openrouter_credit_is_reported_per_key_and_a_spent_one_has_no_request_left() {
    let pool = "providers:\n  - id: or\n    kind: openrouter\n    keys: [{ alias: o1, env: O1 }, { alias: o2, env: O2 }]\n    models: [{ id: m }]\n  - id: local\n    kind: openai-compatible\n    baseUrl: http://127.0.0.1:9/v1\n    keys: [{ alias: l1, env: L1 }]\n    models: [{ id: m }]\n";
    let env = MapEnv::new([("O1", "s1"), ("O2", "s2"), ("L1", "s3")]);
    let config = match parse(pool).and_then(|f| f.resolve(&env, Path::new("."))) {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    };
    let clock = Arc::new(TestClock(AtomicI64::new(AT)));
    let l = Ledger::new(&config, clock.clone());
    // Only OpenRouter's keys are asked, all at start, once.
    assert_eq!(
        l.key_polls_due(),
        [
            ("or".to_owned(), "o1".to_owned()),
            ("or".to_owned(), "o2".to_owned())
        ]
    );
    assert!(l.key_polls_due().is_empty());
    let credit = |limit: f64, usage: f64| credit::KeyCredit {
        limit: Some(limit),
        usage,
        remaining: Some(limit - usage),
        free_tier: false,
    };
    l.key_polled("or", "o1", Some(credit(10.0, 4.0)));
    l.key_polled("or", "o2", Some(credit(5.0, 5.0)));
    clock.0.store(AT + 3_000, Ordering::SeqCst);
    let view = l.view(&pb::Snapshot::default(), &Listings::new());
    let o1 = scope(&view, "or", "o1");
    assert_eq!(o1["state"], "healthy", "{o1}");
    assert_eq!(o1["credit"]["remaining"], 6.0, "{o1}");
    assert_eq!(o1["credit"]["source"], "reported", "{o1}");
    assert_eq!(o1["credit"]["ageMs"], 3_000, "{o1}");
    let o2 = scope(&view, "or", "o2");
    assert_eq!(
        (&o2["state"], &o2["reason"]),
        (&json!("exhausted"), &json!("no_credit")),
        "{o2}"
    );
    assert_eq!(o2["untilMs"], AT + credit::POLL_INTERVAL_MS, "{o2}");
    assert_eq!(scope(&view, "local", "l1")["credit"], Value::Null);
    // Pushed: o2 has no request left; o1 what its seeded minute leaves.
    let pushed = l.headroom(AT + 3_000);
    let left = |pushed: &[pb::Headroom], key: &str| {
        pushed
            .iter()
            .find(|h| h.provider == "or" && h.key == key)
            .map(|h| h.remaining_requests)
    };
    assert_eq!(left(&pushed, "o2"), Some(0), "{pushed:?}");
    assert!(left(&pushed, "o1") > Some(0), "{pushed:?}");
    // A 429 through o1 asks again soon (5 s after the last ask), not at once in a burst.
    let mut refused = attempt("or", "o1", pb::ErrorClass::RateLimit);
    refused.model = "m".into();
    observe(&l, vec![refused.clone(), refused]);
    assert!(l.key_polls_due().is_empty());
    clock
        .0
        .store(AT + credit::POLL_AFTER_REFUSAL_MS, Ordering::SeqCst);
    assert_eq!(l.key_polls_due(), [("or".to_owned(), "o1".to_owned())]);
    // The credit came back: o2 serves again; a figure not renewed ages out.
    l.key_polled("or", "o2", Some(credit(5.0, 1.0)));
    let pushed = l.headroom(AT + credit::POLL_AFTER_REFUSAL_MS);
    assert!(left(&pushed, "o2") > Some(0), "{pushed:?}");
    let later = AT + credit::POLL_AFTER_REFUSAL_MS + count::REPORTED_TTL_MS;
    clock.0.store(later, Ordering::SeqCst);
    let view = l.view(&pb::Snapshot::default(), &Listings::new());
    assert_eq!(scope(&view, "or", "o1")["credit"], Value::Null);
}
