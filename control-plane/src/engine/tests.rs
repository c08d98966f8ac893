//! The engine's unit tests: reports, breakers, leases, refresh, the state store, reload.

use std::sync::{Arc, Mutex};

use ai_router_contract::probe_holder;
use ai_router_proto::v1 as pb;

use crate::config::secrets::Env;
use crate::config::Config;
use crate::store::breaker::{BreakerId, BreakerPhase, BreakerScope};
use crate::store::durable::{DurableState, KeyId, LeaseGrant, StateStore};
use crate::store::lock;
use crate::store::memory::MemoryStateStore;

use super::state::*;
use super::*;
use crate::config::parse;
use crate::config::secrets::{fingerprint, MapEnv};
use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};

use crate::clock::TestClock;

/// An env whose variables the test can change while the engine reads it.
#[derive(Default)]
struct SharedEnv(Mutex<MapEnv>);
impl Env for SharedEnv {
    fn var(&self, name: &str) -> Option<String> {
        lock(&self.0).var(name)
    }
    fn names(&self) -> Vec<String> {
        lock(&self.0).names()
    }
}

const POOL: &str = "
resilience: { rateLimitCooldownMs: 5000, quotaBlacklistMs: 60000 }
providers:
  - id: openai
    kind: openai
    keysFromEnv: OPENAI
    headers: { openai-organization: org-1 }
    models: [{ id: gpt-4o-mini, aliases: [fast], cost: { input: 0.15, output: 0.6 } }]
  - id: local
    baseUrl: http://127.0.0.1:9000/v1/
    keys: [{ alias: a, env: LOCAL_A }, { alias: b, env: LOCAL_B, weight: 2, maxConcurrency: 3 }]
    models: [{ id: llama }]
defaults: { deadlineMs: 60000 }
profiles:
  work: { candidates: [[{ model: fast, weight: 3 }, { model: llama }]], maxAttempts: 3 }
";

struct Fixture {
    engine: Arc<Engine>,
    env: Arc<SharedEnv>,
    clock: Arc<TestClock>,
}

fn fixture(text: &str) -> Result<Fixture, String> {
    let env = Arc::new(SharedEnv::default());
    {
        let mut vars = lock(&env.0);
        vars.set("OPENAI_API_KEY", "sk-one");
        vars.set("OPENAI_API_KEY_2", "sk-two");
        vars.set("LOCAL_A", "sk-a");
    }
    let clock = Arc::new(TestClock(AtomicI64::new(1_000_000)));
    let config = parse(text)
        .and_then(|f| f.resolve(env.as_ref(), Path::new(".")))
        .map_err(|e| e.to_string())?;
    let engine = Engine::new(
        Arc::new(config),
        env.clone(),
        clock.clone(),
        Vec::new(),
        DurableState::default(),
    );
    Ok(Fixture { engine, env, clock })
}

fn snapshot(engine: &Engine) -> pb::Snapshot {
    engine.current().snapshot.clone().unwrap_or_default()
}

fn attempt(provider: &str, key: &str, class: &str) -> pb::AttemptOutcome {
    pb::AttemptOutcome {
        provider: provider.into(),
        key: key.into(),
        model: "gpt-4o-mini".into(),
        outcome: pb::AttemptResult::Error.into(),
        error_class: ai_router_contract::failure::ErrorClass::parse(class)
            .map_or(pb::ErrorClass::Unspecified, pb::ErrorClass::from)
            .into(),
        ..Default::default()
    }
}

fn batch(attempts: Vec<pb::AttemptOutcome>) -> pb::ReportBatch {
    pb::ReportBatch {
        attempts,
        ..Default::default()
    }
}

#[test]
fn snapshot_carries_the_pool() -> Result<(), String> {
    let f = fixture(POOL)?;
    let s = snapshot(&f.engine);
    assert_eq!(s.providers.len(), 2);
    let openai = &s.providers[0];
    assert_eq!(
        (
            openai.scheme.as_str(),
            openai.authority.as_str(),
            openai.base_path.as_str()
        ),
        ("https", "api.openai.com", "/v1")
    );
    assert_eq!(openai.auth_header, "authorization");
    assert_eq!(openai.headers[0].name, "openai-organization");
    assert_eq!(openai.keys[0].alias, "openai-1");
    assert_eq!(openai.keys[0].secret, "sk-one");
    assert_eq!(openai.keys[0].fingerprint, fingerprint("sk-one"));
    assert_eq!(
        openai.models[0]
            .capabilities()
            .map(pb::Capability::text)
            .collect::<Vec<_>>(),
        ["chat", "streaming", "tools", "json"]
    );
    assert_eq!(openai.models[0].identity, "gpt-4o-mini");
    let local = &s.providers[1];
    assert_eq!(
        (
            local.scheme.as_str(),
            local.authority.as_str(),
            local.base_path.as_str()
        ),
        ("http", "127.0.0.1:9000", "/v1")
    );
    assert_eq!(local.keys[1].secret, "");
    assert_eq!(local.keys[1].weight, 2.0);
    assert_eq!(local.keys[1].max_concurrency, 3);
    // The unset key is pushed as missing.
    assert_eq!(s.key_health.len(), 1);
    assert_eq!(s.key_health[0].key, "b");
    assert_eq!(s.key_health[0].reason().text(), "missing");
    assert_eq!(s.limits.map(|l| l.max_body_bytes), Some(4 * 1024 * 1024));
    let work = &s.profiles["work"];
    assert_eq!(work.candidates[0].candidates.len(), 2);
    assert_eq!(work.candidates[0].candidates[0].weight, 3.0);
    assert_eq!(work.max_attempts, Some(3));
    assert_eq!(s.defaults.as_ref().and_then(|d| d.deadline_ms), Some(60000));
    assert_eq!(f.engine.health().status, "ok");
    Ok(())
}

/// The pushed defaults carry every per-call number and switch, resolved once here: the file's
/// value where it sets one, else the contract's; the filter applies none of its own.
#[test]
fn the_pushed_defaults_are_resolved() -> Result<(), String> {
    use ai_router_contract::defaults;
    let f = fixture(POOL)?;
    let d = snapshot(&f.engine).defaults.unwrap_or_default();
    assert_eq!(
        (
            d.allow_fallback,
            d.max_attempts,
            d.timeout_ms,
            d.deadline_ms
        ),
        (
            Some(defaults::ALLOW_FALLBACK),
            Some(defaults::MAX_ATTEMPTS),
            Some(defaults::TIMEOUT_MS),
            Some(60_000)
        )
    );
    // A profile still sends only what it sets: it is merged over these.
    assert_eq!(snapshot(&f.engine).profiles["work"].timeout_ms, None);
    Ok(())
}

#[test]
fn rate_limit_cools_the_lane() -> Result<(), String> {
    let f = fixture(POOL)?;
    let mut rx = f.engine.subscribe();
    let v0 = f.engine.version();
    let (v1, _) = f
        .engine
        .apply_report(&batch(vec![attempt("openai", "openai-1", "rate_limit")]));
    assert!(v1 > v0);
    assert!(rx.has_changed().unwrap_or(false));
    let s = snapshot(&f.engine);
    assert_eq!(s.cooldowns.len(), 1);
    assert_eq!(s.cooldowns[0].model, "gpt-4o-mini");
    assert_eq!(s.cooldowns[0].until_ms, 1_005_000);
    // A retry-after wins over the default.
    let mut with_retry = attempt("openai", "openai-2", "rate_limit");
    with_retry.retry_at_ms = 1_030_000;
    f.engine.apply_report(&batch(vec![with_retry]));
    let s = snapshot(&f.engine);
    assert_eq!(s.cooldowns[1].until_ms, 1_030_000);
    // Expiry.
    f.clock.0.store(1_005_001, Ordering::SeqCst);
    assert!(f.engine.expire());
    assert_eq!(snapshot(&f.engine).cooldowns.len(), 1);
    rx.mark_unchanged();
    Ok(())
}

#[test]
fn auth_blacklists_until_the_secret_changes() -> Result<(), String> {
    let f = fixture(POOL)?;
    let mut failed = attempt("openai", "openai-1", "auth");
    failed.fingerprint = fingerprint("sk-one");
    failed.provider_code = "invalid_api_key".into();
    let (_, events) = f.engine.apply_report(&batch(vec![failed.clone()]));
    assert!(matches!(
        &events[..],
        [EngineEvent::KeyDisabled {
            reason: "auth",
            until_ms: 0,
            ..
        }]
    ));
    let health = snapshot(&f.engine).key_health;
    let entry = health
        .iter()
        .find(|h| h.key == "openai-1")
        .cloned()
        .unwrap_or_default();
    assert_eq!(entry.reason().text(), "auth");
    assert_eq!(entry.until_ms, 0);
    assert_eq!(entry.refused_fingerprint, fingerprint("sk-one"));
    // The same report again changes nothing.
    let v = f.engine.version();
    f.engine.apply_report(&batch(vec![failed]));
    assert_eq!(f.engine.version(), v);
    // Never expires on its own.
    f.clock.0.store(i64::MAX / 2, Ordering::SeqCst);
    assert!(!f.engine.expire());
    // Rotating the secret lifts it.
    lock(&f.env.0).set("OPENAI_API_KEY", "sk-one-rotated");
    let events = f.engine.refresh_secrets();
    assert_eq!(
        events,
        vec![EngineEvent::KeyRestored {
            provider: "openai".into(),
            key: "openai-1".into(),
            was: "auth",
            reason: "secret_changed"
        }]
    );
    let s = snapshot(&f.engine);
    assert!(!s.key_health.iter().any(|h| h.key == "openai-1"));
    assert_eq!(s.providers[0].keys[0].secret, "sk-one-rotated");
    Ok(())
}

#[test]
fn a_refusal_of_an_old_secret_is_ignored() -> Result<(), String> {
    let f = fixture(POOL)?;
    let mut stale = attempt("openai", "openai-1", "auth");
    stale.fingerprint = fingerprint("sk-before-rotation");
    let v = f.engine.version();
    f.engine.apply_report(&batch(vec![stale]));
    assert_eq!(f.engine.version(), v);
    Ok(())
}

#[test]
fn auth_disable_ms_bounds_the_blacklist() -> Result<(), String> {
    let f = fixture(&POOL.replace(
        "rateLimitCooldownMs: 5000",
        "rateLimitCooldownMs: 5000, authDisableMs: 1000",
    ))?;
    f.engine
        .apply_report(&batch(vec![attempt("openai", "openai-2", "auth")]));
    let entry = snapshot(&f.engine)
        .key_health
        .into_iter()
        .find(|h| h.key == "openai-2")
        .unwrap_or_default();
    assert_eq!(entry.until_ms, 1_001_000);
    assert_eq!(entry.refused_fingerprint, fingerprint("sk-two"));
    f.clock.0.store(1_001_000, Ordering::SeqCst);
    assert!(f.engine.expire());
    assert!(snapshot(&f.engine)
        .key_health
        .iter()
        .all(|h| h.key != "openai-2"));
    Ok(())
}

/// A failure's hold as the control plane pushes it and as the filter computes it from the
/// same pool's snapshot at the same instant: equal, for every window configured or left out.
#[test]
fn the_filter_and_the_control_plane_hold_a_failure_equally_long() -> Result<(), String> {
    let cases = [
        "resilience: { rateLimitCooldownMs: 5000, quotaBlacklistMs: 60000 }",
        "resilience: { rateLimitCooldownMs: 1, quotaBlacklistMs: 2, authDisableMs: 3 }",
        "",
    ];
    for resilience in cases {
        let pool = POOL.replace(
            "resilience: { rateLimitCooldownMs: 5000, quotaBlacklistMs: 60000 }",
            resilience,
        );
        for (class, code, retry_at) in [
            ("rate_limit", "", 0),
            ("rate_limit", "", 1_500_000),
            ("quota", "", 0),
            ("quota", "", 2_000_000),
            ("auth", "", 0),
            ("auth", ai_router_contract::failure::UNSUPPORTED_KEY_TYPE, 0),
            ("transient", "", 1_200_000),
        ] {
            let f = fixture(&pool)?;
            let now = f.clock.0.load(Ordering::SeqCst);
            let mut failed = attempt("openai", "openai-2", class);
            failed.provider_code = code.into();
            failed.retry_at_ms = retry_at;
            f.engine.apply_report(&batch(vec![failed]));
            let s = snapshot(&f.engine);
            let pushed = s
                .key_health
                .iter()
                .find(|h| h.key == "openai-2")
                .map(|h| h.until_ms)
                .or_else(|| {
                    s.cooldowns
                        .iter()
                        .find(|c| c.key == "openai-2")
                        .map(|c| c.until_ms)
                });
            let filter = ai_router_filter_core::state::State::new(1, s);
            let class =
                ai_router_contract::failure::ErrorClass::parse(class).ok_or("unknown class")?;
            let computed = ai_router_filter_core::state::State::hold_windows(Some(&filter))
                .held_until(
                    class,
                    (retry_at > now).then_some(retry_at),
                    (!code.is_empty()).then_some(code),
                    now,
                )
                .map(|(_, until)| until);
            assert_eq!(
                pushed, computed,
                "{class:?} {code} retry at {retry_at} under `{resilience}`"
            );
        }
    }
    Ok(())
}

#[test]
fn an_unsupported_key_type_is_out_until_its_secret_changes_whatever_auth_disable_ms_says(
) -> Result<(), String> {
    let f = fixture(&POOL.replace(
        "rateLimitCooldownMs: 5000",
        "rateLimitCooldownMs: 5000, authDisableMs: 1000",
    ))?;
    let mut refused = attempt("openai", "openai-2", "auth");
    refused.provider_code = ai_router_contract::failure::UNSUPPORTED_KEY_TYPE.into();
    let (_, events) = f.engine.apply_report(&batch(vec![refused]));
    let entry = snapshot(&f.engine)
        .key_health
        .into_iter()
        .find(|h| h.key == "openai-2")
        .unwrap_or_default();
    assert_eq!(entry.until_ms, 0);
    assert_eq!(entry.refused_fingerprint, fingerprint("sk-two"));
    assert!(
            events.iter().any(|e| matches!(e, EngineEvent::KeyDisabled { code: Some(c), until_ms: 0, .. } if c == "unsupported_key_type")),
            "{events:?}"
        );
    f.clock.0.store(10_000_000, Ordering::SeqCst);
    f.engine.expire();
    assert!(snapshot(&f.engine)
        .key_health
        .iter()
        .any(|h| h.key == "openai-2"));
    Ok(())
}

#[test]
fn quota_blacklists_until_the_window_or_the_default() -> Result<(), String> {
    let f = fixture(POOL)?;
    let mut windowed = attempt("openai", "openai-1", "quota");
    windowed.retry_at_ms = 2_000_000;
    f.engine.apply_report(&batch(vec![
        windowed,
        attempt("openai", "openai-2", "quota"),
    ]));
    let health = snapshot(&f.engine).key_health;
    let until = |key: &str| {
        health
            .iter()
            .find(|h| h.key == key)
            .map(|h| (h.reason().text().to_owned(), h.until_ms))
    };
    assert_eq!(until("openai-1"), Some(("quota".into(), 2_000_000)));
    assert_eq!(until("openai-2"), Some(("quota".into(), 1_060_000)));
    // Every key blacklisted but local/a: still ok; then local/a too: degraded.
    assert_eq!(f.engine.health().status, "ok");
    f.engine
        .apply_report(&batch(vec![attempt("local", "a", "auth")]));
    assert_eq!(f.engine.health().status, "degraded");
    Ok(())
}

#[test]
fn other_outcomes_change_nothing() -> Result<(), String> {
    let f = fixture(POOL)?;
    let v = f.engine.version();
    let mut ok = attempt("openai", "openai-1", "");
    ok.outcome = pb::AttemptResult::Success.into();
    f.engine.apply_report(&batch(vec![
        ok,
        attempt("openai", "openai-1", "transient"),
        attempt("openai", "openai-1", "invalid_request"),
        attempt("nope", "openai-1", "auth"),
    ]));
    assert_eq!(f.engine.version(), v);
    Ok(())
}

#[test]
fn missing_secrets_come_and_go() -> Result<(), String> {
    let f = fixture(POOL)?;
    lock(&f.env.0).set("LOCAL_B", "sk-b");
    let events = f.engine.refresh_secrets();
    assert!(matches!(
        &events[..],
        [EngineEvent::KeyRestored { was: "missing", .. }]
    ));
    assert!(snapshot(&f.engine).key_health.is_empty());
    lock(&f.env.0).remove("LOCAL_A");
    let events = f.engine.refresh_secrets();
    assert!(matches!(
        &events[..],
        [EngineEvent::KeyDisabled {
            reason: "missing",
            ..
        }]
    ));
    let s = snapshot(&f.engine);
    assert_eq!(s.key_health.len(), 1);
    assert_eq!(s.providers[1].keys[0].secret, "");
    assert_eq!(s.providers[1].keys[0].fingerprint, 0);
    // Nothing changed: no new version.
    let v = f.engine.version();
    assert!(f.engine.refresh_secrets().is_empty());
    assert_eq!(f.engine.version(), v);
    Ok(())
}

#[test]
fn durable_state_is_taken_over() -> Result<(), String> {
    let f = fixture(POOL)?;
    f.engine.apply_report(&batch(vec![
        attempt("openai", "openai-1", "auth"),
        attempt("openai", "openai-2", "rate_limit"),
    ]));
    let store = MemoryStateStore::default();
    store.save(&f.engine.durable()).map_err(|e| e.to_string())?;
    let durable = store.load().map_err(|e| e.to_string())?;
    // Same secrets: the blacklist holds.
    let again = Engine::new(
        f.engine.config(),
        f.env.clone(),
        f.clock.clone(),
        Vec::new(),
        durable.clone(),
    );
    assert_eq!(again.durable(), durable);
    // A new secret meanwhile: lifted at start.
    lock(&f.env.0).set("OPENAI_API_KEY", "sk-new");
    let lifted = Engine::new(
        f.engine.config(),
        f.env.clone(),
        f.clock.clone(),
        Vec::new(),
        durable,
    );
    assert!(lifted.durable().blacklists.is_empty());
    assert_eq!(lifted.durable().cooldowns.len(), 1);
    Ok(())
}

#[test]
fn versions_only_increase() -> Result<(), String> {
    let f = fixture(POOL)?;
    let mut last = f.engine.version();
    for class in ["rate_limit", "auth", "quota"] {
        f.engine
            .apply_report(&batch(vec![attempt("local", "a", class)]));
        let v = f.engine.version();
        assert!(v > last, "{class}");
        assert_eq!(f.engine.current().version, v);
        last = v;
    }
    Ok(())
}

// ---- breakers, leases, headroom, budgets, the shared store ------------------------------

const BREAKERS: &str = "
resilience:
  keyBreaker: { failureThreshold: 2, cooldownMs: 1000, maxCooldownMs: 3000 }
  providerBreaker: { failureThreshold: 3, cooldownMs: 2000, maxCooldownMs: 4000 }
providers:
  - id: openai
    kind: openai
    keysFromEnv: OPENAI
    budget: { costPerDay: 1, costPerMonth: 2 }
    models: [{ id: gpt-4o-mini, aliases: [fast], cost: { input: 0.15, output: 0.6 } }]
  - id: local
    baseUrl: http://127.0.0.1:9000/v1/
    keys: [{ alias: a, env: LOCAL_A }]
    models: [{ id: llama }]
";

fn test_env() -> Arc<SharedEnv> {
    let env = Arc::new(SharedEnv::default());
    {
        let mut vars = lock(&env.0);
        vars.set("OPENAI_API_KEY", "sk-one");
        vars.set("OPENAI_API_KEY_2", "sk-two");
        vars.set("LOCAL_A", "sk-a");
    }
    env
}

fn engine_on(
    text: &str,
    env: Arc<SharedEnv>,
    clock: Arc<TestClock>,
    store: Arc<dyn StateStore>,
) -> Result<Arc<Engine>, String> {
    let config = parse(text)
        .and_then(|f| f.resolve(env.as_ref(), Path::new(".")))
        .map_err(|e| e.to_string())?;
    let durable = store.load().map_err(|e| e.to_string())?;
    Ok(Engine::with_store(
        Arc::new(config),
        env,
        clock,
        Vec::new(),
        durable,
        store,
    ))
}

fn breaker_of(engine: &Engine, scope: &str, key: &str) -> Option<(String, i64)> {
    snapshot(engine)
        .breakers
        .into_iter()
        .find(|b| b.scope().text() == scope && b.key == key)
        .map(|b| (b.state().text().to_owned(), b.open_until_ms))
}

fn success(provider: &str, key: &str) -> pb::AttemptOutcome {
    let mut ok = attempt(provider, key, "");
    ok.outcome = pb::AttemptResult::Success.into();
    ok
}

fn temp_db(name: &str) -> Result<std::path::PathBuf, String> {
    let dir = std::env::temp_dir().join(format!("ai-router-engine-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    Ok(dir.join("state.sqlite"))
}

fn sqlite(path: &Path) -> Result<Arc<dyn StateStore>, String> {
    crate::store::state::SqliteStateStore::open(path)
        .map(|s| Arc::new(s) as Arc<dyn StateStore>)
        .map_err(|e| e.to_string())
}

#[test]
fn key_breaker_opens_half_opens_doubles_and_closes() -> Result<(), String> {
    let f = fixture(BREAKERS)?;
    let e = &f.engine;
    // Classes that never count.
    for class in [
        "rate_limit",
        "quota",
        "auth",
        "invalid_request",
        "cancelled",
    ] {
        e.apply_report(&batch(vec![attempt("local", "a", class)]));
    }
    assert!(snapshot(e).breakers.is_empty());
    // One failure, a success, one failure: never two in a row.
    let (_, events) = e.apply_report(&batch(vec![
        attempt("openai", "openai-1", "transient"),
        success("openai", "openai-1"),
        attempt("openai", "openai-1", "network"),
    ]));
    assert!(events.is_empty());
    assert!(snapshot(e).breakers.is_empty());
    let (_, events) = e.apply_report(&batch(vec![attempt("openai", "openai-1", "timeout")]));
    assert_eq!(
        events,
        vec![EngineEvent::Breaker {
            scope: BreakerScope::Key,
            provider: "openai".into(),
            key: "openai-1".into(),
            from: BreakerPhase::Closed,
            to: BreakerPhase::Open,
        }]
    );
    assert_eq!(
        breaker_of(e, "key", "openai-1"),
        Some(("open".into(), 1_001_000))
    );
    // Closed breakers are not pushed; the provider's has counted 2 of 3 only.
    assert_eq!(snapshot(e).breakers.len(), 1);
    // Past the cooldown: half-open from then.
    f.clock.0.store(1_001_000, Ordering::SeqCst);
    assert!(e.expire());
    assert_eq!(
        breaker_of(e, "key", "openai-1"),
        Some(("half_open".into(), 1_001_000))
    );
    // The probe fails: open for twice the cooldown, then capped at the max.
    let mut probe = attempt("openai", "openai-1", "stream");
    probe.probe = true;
    f.clock.0.store(1_001_500, Ordering::SeqCst);
    let (_, events) = e.apply_report(&batch(vec![probe.clone()]));
    assert!(events.contains(&EngineEvent::Breaker {
        scope: BreakerScope::Key,
        provider: "openai".into(),
        key: "openai-1".into(),
        from: BreakerPhase::HalfOpen,
        to: BreakerPhase::Open,
    }));
    assert_eq!(
        breaker_of(e, "key", "openai-1"),
        Some(("open".into(), 1_003_500))
    );
    f.clock.0.store(1_003_500, Ordering::SeqCst);
    e.expire();
    e.apply_report(&batch(vec![probe.clone()]));
    assert_eq!(
        breaker_of(e, "key", "openai-1"),
        Some(("open".into(), 1_006_500))
    );
    // A retry-after later than the cooldown wins.
    f.clock.0.store(1_006_500, Ordering::SeqCst);
    e.expire();
    probe.retry_at_ms = 1_100_000;
    e.apply_report(&batch(vec![probe]));
    assert_eq!(
        breaker_of(e, "key", "openai-1"),
        Some(("open".into(), 1_100_000))
    );
    // Any success closes it.
    let (_, events) = e.apply_report(&batch(vec![success("openai", "openai-1")]));
    assert!(events.iter().any(|ev| matches!(
        ev,
        EngineEvent::Breaker {
            scope: BreakerScope::Key,
            to: BreakerPhase::Closed,
            ..
        }
    )));
    assert!(snapshot(e).breakers.is_empty());
    Ok(())
}

fn key_breaker(from: BreakerPhase, to: BreakerPhase) -> EngineEvent {
    EngineEvent::Breaker {
        scope: BreakerScope::Key,
        provider: "openai".into(),
        key: "openai-1".into(),
        from,
        to,
    }
}

/// Opens openai-1's breaker (2 failures; cooldown to 1_001_000) and returns the breaker
/// events a subscriber sees from then on.
fn open_key_breaker(e: &Engine) -> crate::engine::events::Subscription {
    e.apply_report(&batch(vec![
        attempt("openai", "openai-1", "transient"),
        attempt("openai", "openai-1", "transient"),
    ]));
    e.events().watch(vec!["breaker"])
}

/// The key breaker events a subscriber got, as (from, to), until none comes for a moment.
async fn breaker_steps(sub: &mut crate::engine::events::Subscription) -> Vec<(String, String)> {
    let mut steps = Vec::new();
    while let Some(crate::engine::events::Next::Event(e)) = next_event(sub).await {
        if let crate::engine::events::Event::Breaker {
            scope: "key",
            from,
            to,
            ..
        } = &*e
        {
            steps.push(((*from).to_owned(), (*to).to_owned()));
        }
    }
    steps
}

fn steps(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(f, t)| ((*f).to_owned(), (*t).to_owned()))
        .collect()
}

/// The probe answers before the expiry tick turned the breaker half-open (it runs once a
/// second): the events still name every transition, in order.
#[tokio::test]
async fn a_probe_that_answers_before_the_expiry_tick_still_goes_through_half_open(
) -> Result<(), String> {
    let f = fixture(BREAKERS)?;
    let e = &f.engine;
    let mut sub = open_key_breaker(e);
    f.clock.0.store(1_001_000, Ordering::SeqCst);
    let mut probe = success("openai", "openai-1");
    probe.probe = true;
    let (_, events) = e.apply_report(&batch(vec![probe]));
    assert_eq!(
        events,
        vec![
            key_breaker(BreakerPhase::Open, BreakerPhase::HalfOpen),
            key_breaker(BreakerPhase::HalfOpen, BreakerPhase::Closed),
        ]
    );
    assert_eq!(
        breaker_steps(&mut sub).await,
        steps(&[("open", "half_open"), ("half_open", "closed")])
    );
    assert!(snapshot(e).breakers.is_empty());
    Ok(())
}

/// The lease that lets the probe through turns the breaker half-open at once (event and
/// push), so the probe's verdict always follows it; a failed probe reopens it.
#[tokio::test]
async fn the_probe_lease_turns_the_breaker_half_open_first() -> Result<(), String> {
    let f = fixture(BREAKERS)?;
    let e = &f.engine;
    let mut sub = open_key_breaker(e);
    let id: BreakerId = (BreakerScope::Key, "openai".into(), "openai-1".into());
    f.clock.0.store(1_001_000, Ordering::SeqCst);
    let version = e.version();
    let reply = e
        .lease(&id, "probe", 5_000)
        .map_err(|err| err.to_string())?;
    assert!(reply.granted);
    assert!(e.version() > version, "the half-open breaker is pushed");
    assert_eq!(
        breaker_of(e, "key", "openai-1"),
        Some(("half_open".into(), 1_001_000))
    );
    let mut probe = attempt("openai", "openai-1", "transient");
    probe.probe = true;
    probe.at_ms = 1_001_050;
    probe.latency_ms = 10;
    f.clock.0.store(1_001_050, Ordering::SeqCst);
    e.apply_report(&batch(vec![probe]));
    assert_eq!(
        breaker_steps(&mut sub).await,
        steps(&[("open", "half_open"), ("half_open", "open")])
    );
    // Nothing ticked it in between: a late expiry changes nothing more.
    e.expire();
    assert_eq!(
        breaker_steps(&mut sub).await,
        Vec::<(String, String)>::new()
    );
    Ok(())
}

/// A success of an attempt in flight when the breaker opened closes it through half-open:
/// there is no open -> closed event.
#[test]
fn a_success_while_open_passes_through_half_open() -> Result<(), String> {
    let f = fixture(BREAKERS)?;
    let e = &f.engine;
    open_key_breaker(e);
    let (_, events) = e.apply_report(&batch(vec![success("openai", "openai-1")]));
    assert_eq!(
        events,
        vec![
            key_breaker(BreakerPhase::Open, BreakerPhase::HalfOpen),
            key_breaker(BreakerPhase::HalfOpen, BreakerPhase::Closed),
        ]
    );
    Ok(())
}

#[test]
fn provider_breaker_is_fed_by_all_its_keys() -> Result<(), String> {
    let f = fixture(BREAKERS)?;
    let e = &f.engine;
    e.apply_report(&batch(vec![
        attempt("openai", "openai-1", "transient"),
        attempt("openai", "openai-2", "transient"),
    ]));
    assert!(snapshot(e).breakers.is_empty());
    // A success on either key resets the provider's count.
    e.apply_report(&batch(vec![success("openai", "openai-2")]));
    e.apply_report(&batch(vec![
        attempt("openai", "openai-1", "transient"),
        attempt("openai", "openai-2", "transient"),
    ]));
    assert_eq!(breaker_of(e, "provider", ""), None);
    let mut failed = attempt("openai", "openai-2", "transient");
    failed.retry_at_ms = 1_500_000;
    let (_, events) = e.apply_report(&batch(vec![failed]));
    assert!(events.iter().any(|ev| matches!(
        ev,
        EngineEvent::Breaker {
            scope: BreakerScope::Provider,
            key,
            from: BreakerPhase::Closed,
            to: BreakerPhase::Open,
            ..
        } if key.is_empty()
    )));
    assert_eq!(
        breaker_of(e, "provider", ""),
        Some(("open".into(), 1_500_000))
    );
    // The retry-after cooled the lane too.
    assert!(snapshot(e)
        .cooldowns
        .iter()
        .any(|c| c.key == "openai-2" && c.until_ms == 1_500_000));
    Ok(())
}

fn probe_lease_contention(engines: &[Arc<Engine>], clock: &TestClock) -> Result<(), String> {
    let e = &engines[0];
    let id: BreakerId = (BreakerScope::Key, "openai".into(), "openai-1".into());
    for _ in 0..2 {
        e.apply_report(&batch(vec![attempt("openai", "openai-1", "transient")]));
    }
    // Still open: refused until the cooldown ends.
    let reply = e
        .lease(&id, "early", 5_000)
        .map_err(|err| err.to_string())?;
    assert_eq!((reply.granted, reply.retry_at_ms), (false, 1_001_000));
    clock.0.store(1_001_000, Ordering::SeqCst);
    for engine in engines {
        engine.expire();
    }
    let barrier = std::sync::Barrier::new(20);
    let replies: Vec<(usize, pb::LeaseReply)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..20)
            .map(|i| {
                let engine = engines[i % engines.len()].clone();
                let (barrier, id) = (&barrier, id.clone());
                scope.spawn(move || {
                    barrier.wait();
                    engine
                        .lease(&id, &probe_holder(&format!("req-{i}"), 1), 5_000)
                        .map(|r| (i, r))
                })
            })
            .collect();
        handles
            .into_iter()
            .filter_map(|h| h.join().ok())
            .filter_map(Result::ok)
            .collect()
    });
    assert_eq!(replies.len(), 20);
    let granted: Vec<usize> = replies
        .iter()
        .filter(|(_, r)| r.granted)
        .map(|(i, _)| *i)
        .collect();
    assert_eq!(granted.len(), 1, "{replies:?}");
    assert!(replies
        .iter()
        .filter(|(_, r)| !r.granted)
        .all(|(_, r)| r.retry_at_ms == 1_006_000));
    // Another request's probe outcome does not end it (a rate limit leaves the breaker
    // half-open); the holder's does.
    let mut other = attempt("openai", "openai-1", "rate_limit");
    other.probe = true;
    other.request_id = "someone-else".into();
    other.attempt = 1;
    e.apply_report(&batch(vec![other]));
    let held = e
        .lease(&id, &probe_holder("next", 1), 5_000)
        .map_err(|err| err.to_string())?;
    assert!(!held.granted);
    let mut mine = attempt("openai", "openai-1", "rate_limit");
    mine.probe = true;
    mine.request_id = format!("req-{}", granted[0]);
    mine.attempt = 1;
    e.apply_report(&batch(vec![mine]));
    let next = e
        .lease(&id, &probe_holder("next", 1), 5_000)
        .map_err(|err| err.to_string())?;
    assert!(next.granted);
    // Now "next" holds it; its probe succeeds: closed, and the lease is gone.
    let mut probe = success("openai", "openai-1");
    probe.probe = true;
    probe.request_id = "next".into();
    probe.attempt = 1;
    e.apply_report(&batch(vec![probe]));
    assert!(breaker_of(e, "key", "openai-1").is_none());
    let again = e
        .lease(&id, "later:1", 5_000)
        .map_err(|err| err.to_string())?;
    assert!(again.granted);
    // A lease that is never released ends with its TTL.
    let blocked = e
        .lease(&id, "blocked:1", 5_000)
        .map_err(|err| err.to_string())?;
    assert!(!blocked.granted);
    clock.0.store(1_006_000, Ordering::SeqCst);
    let after_ttl = e
        .lease(&id, "late:1", 5_000)
        .map_err(|err| err.to_string())?;
    assert!(after_ttl.granted);
    Ok(())
}

/// A probe's outcome frees its own lease only: request `1` never frees `12#1`'s.
fn lease_release_matches_the_whole_holder(store: &dyn StateStore) -> Result<(), String> {
    let id: BreakerId = (BreakerScope::Key, "p".to_string(), "k".to_string());
    let held = |store: &dyn StateStore| -> Result<bool, String> {
        let grant = store
            .lease(&id, "someone-else#1", 1_000, 60_000)
            .map_err(|e| e.to_string())?;
        Ok(!matches!(grant, LeaseGrant::Granted))
    };
    let grant = store
        .lease(&id, &probe_holder("12", 1), 1_000, 60_000)
        .map_err(|e| e.to_string())?;
    assert!(matches!(grant, LeaseGrant::Granted));
    for other in [probe_holder("1", 1), probe_holder("", 1), "12".to_string()] {
        store
            .release(&id, Some(&other))
            .map_err(|e| e.to_string())?;
        assert!(held(store)?, "{other:?} freed the lease of 12#1");
    }
    store
        .release(&id, Some(&probe_holder("12", 1)))
        .map_err(|e| e.to_string())?;
    assert!(!held(store)?, "the holder's own outcome frees it");
    // A breaker that moves on frees whoever holds it.
    store.release(&id, None).map_err(|e| e.to_string())?;
    assert!(!held(store)?);
    Ok(())
}

#[test]
fn lease_release_matches_the_whole_holder_in_memory() -> Result<(), String> {
    lease_release_matches_the_whole_holder(&MemoryStateStore::default())
}

#[test]
fn lease_release_matches_the_whole_holder_in_sqlite() -> Result<(), String> {
    let path = temp_db("lease_holder")?;
    let store = sqlite(&path)?;
    let result = lease_release_matches_the_whole_holder(store.as_ref());
    let _ = std::fs::remove_dir_all(path.parent().unwrap_or(Path::new("/nonexistent")));
    result
}

#[test]
fn one_probe_lease_among_twenty_in_memory() -> Result<(), String> {
    let f = fixture(BREAKERS)?;
    probe_lease_contention(std::slice::from_ref(&f.engine), &f.clock)
}

#[test]
fn one_probe_lease_among_twenty_across_two_sqlite_engines() -> Result<(), String> {
    let path = temp_db("lease")?;
    let clock = Arc::new(TestClock(AtomicI64::new(1_000_000)));
    let a = engine_on(BREAKERS, test_env(), clock.clone(), sqlite(&path)?)?;
    let b = engine_on(BREAKERS, test_env(), clock.clone(), sqlite(&path)?)?;
    // `b` learns of the breaker through the store.
    let share = |from: &Engine, to: &Engine| -> Result<(), String> {
        from.sync_store(from.store.as_ref())
            .map_err(|e| e.to_string())?;
        to.sync_store(to.store.as_ref())
            .map_err(|e| e.to_string())?;
        Ok(())
    };
    let result = probe_lease_contention(&[a.clone(), b.clone()], &clock);
    share(&a, &b)?;
    let _ = std::fs::remove_dir_all(path.parent().unwrap_or(Path::new("/nonexistent")));
    result
}

#[test]
fn a_reset_clears_one_key_or_everything_and_is_pushed() -> Result<(), String> {
    let f = fixture(BREAKERS)?;
    let e = &f.engine;
    e.apply_report(&batch(vec![
        attempt("openai", "openai-1", "quota"),
        attempt("openai", "openai-1", "rate_limit"),
    ]));
    let s = snapshot(e);
    assert_eq!((s.key_health.len(), s.cooldowns.len()), (1, 1));
    assert_eq!(
        e.reset(None, Some("openai-1")),
        Err(ResetError::KeyWithoutProvider)
    );
    assert!(matches!(
        e.reset(Some("nope"), None),
        Err(ResetError::UnknownProvider(_))
    ));
    assert!(matches!(
        e.reset(Some("openai"), Some("nope")),
        Err(ResetError::UnknownKey { .. })
    ));
    let v = e.version();
    let counts = e.reset(Some("openai"), Some("openai-1"));
    assert_eq!(
        counts,
        Ok(ResetCounts {
            blacklists: 1,
            cooldowns: 1,
            breakers: 0,
            headroom: 0
        })
    );
    assert_eq!(e.version(), v + 1, "published at once");
    let s = snapshot(e);
    assert!(s.key_health.is_empty() && s.cooldowns.is_empty());
    assert_eq!(s.resets.len(), 1);
    assert_eq!(
        (s.resets[0].provider.as_str(), s.resets[0].key.as_str()),
        ("openai", "openai-1")
    );
    // Everything: one mark per provider, the whole provider.
    assert_eq!(e.reset(None, None), Ok(ResetCounts::default()));
    let marks = snapshot(e).resets;
    assert!(marks
        .iter()
        .any(|r| r.provider == "openai" && r.key.is_empty()));
    // Marks are pushed for a minute, then dropped.
    f.clock
        .0
        .fetch_add(RESET_MARK.as_millis() as i64, Ordering::SeqCst);
    assert!(e.expire());
    assert!(snapshot(e).resets.is_empty());
    Ok(())
}

#[test]
fn the_same_headroom_again_without_a_reset_is_no_news() -> Result<(), String> {
    let f = fixture(BREAKERS)?;
    let e = &f.engine;
    let mut ok = success("openai", "openai-1");
    ok.remaining_requests = 5;
    ok.remaining_tokens = 1_000;
    e.apply_report(&batch(vec![ok.clone()]));
    let v = e.version();
    f.clock.0.fetch_add(1_000, Ordering::SeqCst);
    e.apply_report(&batch(vec![ok.clone(), ok.clone()]));
    assert_eq!(e.version(), v, "constant headers publish nothing");
    ok.remaining_requests = 4;
    e.apply_report(&batch(vec![ok]));
    assert_eq!(e.version(), v + 1, "a new value is news");
    Ok(())
}

#[test]
fn headroom_alone_waits_for_the_next_flush_and_holds_do_not() -> Result<(), String> {
    let f = fixture(BREAKERS)?;
    let e = &f.engine;
    e.coalesce_headroom(true);
    let v = e.version();
    let mut ok = success("openai", "openai-1");
    ok.remaining_requests = 5;
    ok.remaining_tokens = 1_000;
    ok.ratelimit_reset_at_ms = 1_030_000;
    e.apply_report(&batch(vec![ok.clone()]));
    ok.remaining_requests = 4;
    e.apply_report(&batch(vec![ok]));
    assert_eq!(e.version(), v, "headroom alone is not published at once");
    assert!(snapshot(e).headroom.is_empty());
    assert!(e.flush());
    assert_eq!(e.version(), v + 1, "two reports, one version");
    assert_eq!(snapshot(e).headroom[0].remaining_requests, 4);
    assert!(!e.flush(), "nothing waits");
    // A cooldown is published at once, with any headroom waiting.
    let mut limited = attempt("openai", "openai-1", "rate_limit");
    limited.remaining_requests = 0;
    limited.ratelimit_reset_at_ms = 1_020_000;
    e.apply_report(&batch(vec![limited]));
    assert_eq!(e.version(), v + 2);
    let s = snapshot(e);
    assert_eq!(s.cooldowns.len(), 1);
    assert_eq!(s.headroom[0].remaining_requests, 0);
    Ok(())
}

#[test]
fn headroom_that_says_what_was_estimated_left_is_no_news_while_its_window_runs(
) -> Result<(), String> {
    let f = fixture(BREAKERS)?;
    let e = &f.engine;
    let kept = |e: &Engine| {
        let h = snapshot(e).headroom;
        (
            h[0].remaining_requests,
            h[0].remaining_tokens,
            h[0].reset_at_ms,
            h[0].as_of_ms,
        )
    };
    let mut ok = success("openai", "openai-1");
    ok.at_ms = 1_000_000;
    ok.usage = Some(pb::Usage {
        prompt_tokens: 100,
        ..Default::default()
    });
    ok.remaining_requests = 10_000;
    ok.remaining_tokens = 2_000_000;
    ok.ratelimit_reset_at_ms = 1_060_000;
    e.apply_report(&batch(vec![ok.clone()]));
    let v = e.version();
    // A provider whose remaining falls with each answer, as the kept figure less what was sent
    // since says: no version, the figure and its time stand (every Envoy counts its sends).
    for n in 1..=600 {
        ok.remaining_requests = 10_000 - n;
        ok.remaining_tokens = 2_000_000 - 100 * n;
        ok.ratelimit_reset_at_ms = 1_060_000 + n;
        e.apply_report(&batch(vec![ok.clone()]));
    }
    assert_eq!(e.version(), v, "no version for what was estimated");
    assert_eq!(kept(e), (10_000, 2_000_000, 1_060_000, 1_000_000));
    // A window that refills as it is used: the figure stays while the estimate falls, and is
    // kept again once they are a sixteenth apart (625 requests here).
    let mut reports = 0;
    while kept(e).2 == 1_060_000 && reports < 1_000 {
        ok.remaining_requests = 10_000;
        ok.remaining_tokens = 2_000_000;
        e.apply_report(&batch(vec![ok.clone()]));
        reports += 1;
    }
    assert_eq!(
        reports, 26,
        "10,000 less 626 sent is 9,374: 626 under 10,000"
    );
    assert_eq!(kept(e), (10_000, 2_000_000, 1_060_600, 1_000_000));
    // Near the end every change counts, and a figure no longer reported is news.
    ok.remaining_requests = 63;
    e.apply_report(&batch(vec![ok.clone()]));
    ok.remaining_requests = 62;
    e.apply_report(&batch(vec![ok.clone()]));
    assert_eq!(kept(e).0, 62);
    ok.remaining_tokens = -1;
    e.apply_report(&batch(vec![ok.clone()]));
    assert_eq!(kept(e).1, -1);
    // Once the kept window has ended, any figure is kept again.
    f.clock.0.store(1_060_601, Ordering::SeqCst);
    ok.at_ms = 1_060_601;
    ok.remaining_requests = 10_000;
    ok.ratelimit_reset_at_ms = 1_200_000;
    e.apply_report(&batch(vec![ok.clone()]));
    assert_eq!(kept(e), (10_000, -1, 1_200_000, 1_060_601));
    ok.remaining_requests = 9_999;
    ok.ratelimit_reset_at_ms = 1_200_001;
    e.apply_report(&batch(vec![ok.clone()]));
    assert_eq!(kept(e).0, 10_000);
    // Until the kept figure is HEADROOM_KEPT_AT_MOST_MS old a close one is passed over; then
    // it takes its place: each Envoy keeps its sends since the oldest figure it checks.
    let at_most = super::report::HEADROOM_KEPT_AT_MOST_MS;
    f.clock.0.store(1_060_601 + at_most - 1, Ordering::SeqCst);
    ok.at_ms = 1_060_601 + at_most - 1;
    ok.remaining_requests = 9_998;
    e.apply_report(&batch(vec![ok.clone()]));
    assert_eq!(kept(e).0, 10_000);
    f.clock.0.store(1_060_601 + at_most, Ordering::SeqCst);
    ok.at_ms = 1_060_601 + at_most;
    ok.remaining_requests = 9_997;
    e.apply_report(&batch(vec![ok]));
    assert_eq!(kept(e), (9_997, -1, 1_200_001, 1_060_601 + at_most));
    Ok(())
}

#[test]
fn a_data_plane_clock_far_off_neither_panics_nor_keeps_a_figure_past_its_bound(
) -> Result<(), String> {
    let f = fixture(BREAKERS)?;
    let e = &f.engine;
    let remaining = |e: &Engine| snapshot(e).headroom[0].remaining_requests;
    let mut ok = success("openai", "openai-1");
    ok.at_ms = i64::MIN;
    ok.latency_ms = u64::MAX;
    ok.remaining_requests = 10_000;
    ok.remaining_tokens = -1;
    ok.ratelimit_reset_at_ms = 1_000_000 + 3_600_000;
    e.apply_report(&batch(vec![ok.clone()]));
    ok.at_ms = i64::MAX;
    ok.remaining_requests = 9_990;
    e.apply_report(&batch(vec![ok.clone()]));
    assert_eq!(
        remaining(e),
        10_000,
        "close, and kept within the bound here"
    );
    // The kept figure's age is taken on this control plane's clock.
    f.clock.0.store(
        1_000_000 + super::report::HEADROOM_KEPT_AT_MOST_MS,
        Ordering::SeqCst,
    );
    ok.remaining_requests = 9_980;
    e.apply_report(&batch(vec![ok]));
    assert_eq!(remaining(e), 9_980);
    Ok(())
}

#[test]
fn headroom_is_the_last_report_until_its_reset() -> Result<(), String> {
    let f = fixture(BREAKERS)?;
    let e = &f.engine;
    let mut ok = success("openai", "openai-1");
    ok.remaining_requests = 5;
    ok.remaining_tokens = 1_000;
    ok.ratelimit_reset_at_ms = 1_030_000;
    e.apply_report(&batch(vec![ok.clone()]));
    let h = snapshot(e).headroom;
    assert_eq!(h.len(), 1);
    assert_eq!(
        (
            h[0].model.as_str(),
            h[0].remaining_requests,
            h[0].remaining_tokens,
            h[0].reset_at_ms
        ),
        ("gpt-4o-mini", 5, 1_000, 1_030_000)
    );
    // The last value wins, a 429 included; -1 stays "not reported".
    let mut limited = attempt("openai", "openai-1", "rate_limit");
    limited.remaining_requests = 0;
    limited.remaining_tokens = -1;
    limited.ratelimit_reset_at_ms = 1_020_000;
    e.apply_report(&batch(vec![limited]));
    let h = snapshot(e).headroom;
    assert_eq!(
        (
            h[0].remaining_requests,
            h[0].remaining_tokens,
            h[0].reset_at_ms
        ),
        (0, -1, 1_020_000)
    );
    // Nothing reported (or an unset message): unchanged.
    let v = e.version();
    let mut silent = success("openai", "openai-1");
    silent.remaining_requests = -1;
    silent.remaining_tokens = -1;
    e.apply_report(&batch(vec![silent, success("openai", "openai-1")]));
    assert_eq!(e.version(), v);
    // No reset named: the default window.
    let mut no_reset = success("local", "a");
    no_reset.model = "llama".into();
    no_reset.remaining_requests = 7;
    no_reset.remaining_tokens = -1;
    e.apply_report(&batch(vec![no_reset]));
    assert!(snapshot(e)
        .headroom
        .iter()
        .any(|h| h.key == "a" && h.reset_at_ms == 1_000_000 + HEADROOM_DEFAULT_WINDOW_MS));
    // The reset passes: dropped.
    f.clock.0.store(1_020_000, Ordering::SeqCst);
    assert!(e.expire());
    let h = snapshot(e).headroom;
    assert_eq!(h.len(), 1);
    assert_eq!(h[0].key, "a");
    f.clock
        .0
        .store(1_000_000 + HEADROOM_DEFAULT_WINDOW_MS, Ordering::SeqCst);
    e.expire();
    assert!(snapshot(e).headroom.is_empty());
    Ok(())
}

fn with_usage(prompt: u64, completion: u64) -> pb::AttemptOutcome {
    let mut ok = success("openai", "openai-1");
    ok.usage = Some(pb::Usage {
        prompt_tokens: prompt,
        completion_tokens: completion,
        ..Default::default()
    });
    ok
}

#[test]
fn budgets_roll_over_by_utc_day_and_month() -> Result<(), String> {
    let f = fixture(BREAKERS)?;
    let e = &f.engine;
    const DAY: i64 = 86_400_000;
    // 4M prompt tokens at 0.15 = 0.6; 1M completion at 0.6 = 0.6.
    e.apply_report(&batch(vec![with_usage(4_000_000, 0)]));
    assert!(snapshot(e).provider_health.is_empty());
    let (_, _) = e.apply_report(&batch(vec![with_usage(0, 1_000_000)]));
    let health = snapshot(e).provider_health;
    assert_eq!(health.len(), 1);
    assert_eq!(
        (
            health[0].provider.as_str(),
            health[0].reason().text(),
            health[0].until_ms
        ),
        ("openai", "budget", DAY)
    );
    assert!((e.durable().spend["openai"].day_cost - 1.2).abs() < 1e-9);
    // A model without a cost (and another provider) counts nothing.
    let mut free = with_usage(1_000_000, 1_000_000);
    free.provider = "local".into();
    free.key = "a".into();
    free.model = "llama".into();
    e.apply_report(&batch(vec![free]));
    assert!(!e.durable().spend.contains_key("local"));
    // The next UTC day: back in.
    f.clock.0.store(DAY, Ordering::SeqCst);
    assert!(e.expire());
    assert!(snapshot(e).provider_health.is_empty());
    // 0.6 more today brings the month to 1.8; 0.3 more crosses 2: out until February.
    e.apply_report(&batch(vec![with_usage(4_000_000, 0)]));
    assert!(snapshot(e).provider_health.is_empty());
    f.clock.0.store(2 * DAY, Ordering::SeqCst);
    e.apply_report(&batch(vec![with_usage(2_000_000, 0)]));
    let health = snapshot(e).provider_health;
    assert_eq!(health.len(), 1);
    assert_eq!(health[0].until_ms, 31 * DAY);
    // Still out on another day of January.
    f.clock.0.store(20 * DAY, Ordering::SeqCst);
    e.expire();
    assert_eq!(snapshot(e).provider_health.len(), 1);
    f.clock.0.store(31 * DAY, Ordering::SeqCst);
    assert!(e.expire());
    assert!(snapshot(e).provider_health.is_empty());
    Ok(())
}

async fn next_event(
    sub: &mut crate::engine::events::Subscription,
) -> Option<crate::engine::events::Next> {
    tokio::time::timeout(std::time::Duration::from_millis(200), sub.next())
        .await
        .ok()
        .flatten()
}

/// The usage recorder writes a batch's budget rows, and the key sync takes them in, as soon as
/// the report path hands the batch over; the engine must have counted the batch (and seen the
/// crossing) by then, or the stored rows raise the level silently and no event is ever sent.
#[tokio::test]
async fn a_budget_crossing_is_an_event_even_when_the_stored_rows_are_taken_in_at_once(
) -> Result<(), String> {
    let f = fixture(&format!(
        "{BREAKERS}budgets:\n  - {{ name: day, scope: pool, window: day, limits: {{ maxTokens: 100 }}, enforcement: hard, warnAt: 0.5 }}\n"
    ))?;
    let e = f.engine.clone();
    let mut budget_events = e.events().watch(vec!["budget"]);
    // What the usage writer and the key sync do, at the earliest they can: the rows of the
    // batch, stored and absorbed while the report is still being applied.
    let weak = Arc::downgrade(&e);
    e.add_report_observer(Arc::new(move |batch: &pb::ReportBatch| {
        let Some(engine) = weak.upgrade() else {
            return;
        };
        let config = engine.config();
        let charges = crate::keys::charge::charges(&config, batch);
        let rows = super::budgets::use_of(&config.budgets, charges, 1_000_000);
        engine.absorb_budget_use(&rows);
    }));
    e.apply_report(&batch(vec![with_usage(40, 20)]));
    let warn = next_event(&mut budget_events)
        .await
        .ok_or("no warn event")?;
    let crate::engine::events::Next::Event(warn) = warn else {
        return Err(format!("{warn:?}"));
    };
    assert!(
        matches!(&*warn, crate::engine::events::Event::Budget { level, tokens: 60, .. } if *level == "warn"),
        "{warn:?}"
    );
    e.apply_report(&batch(vec![with_usage(30, 20)]));
    let over = next_event(&mut budget_events)
        .await
        .ok_or("no over event")?;
    let crate::engine::events::Next::Event(over) = over else {
        return Err(format!("{over:?}"));
    };
    assert!(
        matches!(&*over, crate::engine::events::Event::Budget { level, tokens: 110, .. } if *level == "over"),
        "{over:?}"
    );
    // Once per level and window.
    e.apply_report(&batch(vec![with_usage(30, 20)]));
    assert_eq!(next_event(&mut budget_events).await, None);
    Ok(())
}

#[test]
fn state_survives_a_restart_with_sqlite() -> Result<(), String> {
    let path = temp_db("restart")?;
    let clock = Arc::new(TestClock(AtomicI64::new(1_000_000)));
    let env = test_env();
    let first = engine_on(BREAKERS, env.clone(), clock.clone(), sqlite(&path)?)?;
    let mut refused = attempt("openai", "openai-2", "auth");
    refused.fingerprint = fingerprint("sk-two");
    let mut headroom = success("local", "a");
    headroom.model = "llama".into();
    headroom.remaining_requests = 3;
    headroom.remaining_tokens = 300;
    headroom.ratelimit_reset_at_ms = 1_050_000;
    first.apply_report(&batch(vec![
        refused,
        attempt("openai", "openai-1", "rate_limit"),
        headroom,
        attempt("local", "a", "transient"),
        attempt("local", "a", "transient"),
        with_usage(0, 2_000_000),
    ]));
    first
        .sync_store(first.store.as_ref())
        .map_err(|e| e.to_string())?;
    let before = snapshot(&first);
    let saved = first.durable();
    drop(first);

    let second = engine_on(BREAKERS, env, clock.clone(), sqlite(&path)?)?;
    assert_eq!(second.durable(), saved);
    let after = snapshot(&second);
    assert_eq!(after.key_health, before.key_health);
    assert_eq!(after.cooldowns, before.cooldowns);
    assert_eq!(after.breakers, before.breakers);
    assert_eq!(after.breakers.len(), 1);
    assert_eq!(after.headroom, before.headroom);
    assert_eq!(after.provider_health, before.provider_health);
    assert_eq!(after.provider_health.len(), 1);
    assert_eq!(
        after
            .key_health
            .iter()
            .find(|h| h.key == "openai-2")
            .map(|h| h.refused_fingerprint),
        Some(fingerprint("sk-two"))
    );
    let _ = std::fs::remove_dir_all(path.parent().unwrap_or(Path::new("/nonexistent")));
    Ok(())
}

#[test]
fn two_engines_on_one_sqlite_file_share_blacklists_and_spend() -> Result<(), String> {
    let path = temp_db("shared")?;
    let clock = Arc::new(TestClock(AtomicI64::new(1_000_000)));
    let (env_a, env_b) = (test_env(), test_env());
    let a = engine_on(BREAKERS, env_a.clone(), clock.clone(), sqlite(&path)?)?;
    let b = engine_on(BREAKERS, env_b.clone(), clock.clone(), sqlite(&path)?)?;
    let sync = |e: &Engine| {
        e.sync_store(e.store.as_ref())
            .map_err(|err| err.to_string())
    };
    sync(&a)?;
    sync(&b)?;
    let mut refused = attempt("openai", "openai-1", "quota");
    refused.retry_at_ms = 2_000_000;
    a.apply_report(&batch(vec![refused, with_usage(0, 500_000)]));
    b.apply_report(&batch(vec![with_usage(0, 500_000)]));
    sync(&a)?;
    let v = b.version();
    assert!(sync(&b)?);
    assert!(b.version() > v);
    let seen = snapshot(&b)
        .key_health
        .into_iter()
        .find(|h| h.key == "openai-1")
        .map(|h| (h.reason().text().to_owned(), h.until_ms));
    assert_eq!(seen, Some(("quota".into(), 2_000_000)));
    // Spend is added, not overwritten: 0.3 each, 0.6 in all, seen by both.
    sync(&a)?;
    for e in [&a, &b] {
        assert!((e.durable().spend["openai"].day_cost - 0.6).abs() < 1e-9);
    }
    // A blacklist lifted by a rotation in one process is lifted in the other.
    lock(&env_a.0).set("OPENAI_API_KEY", "sk-one-new");
    let events = a.refresh_secrets();
    assert!(matches!(
        &events[..],
        [EngineEvent::KeyRestored { was: "quota", .. }]
    ));
    sync(&a)?;
    assert!(sync(&b)?);
    let key: KeyId = ("openai".into(), "openai-1".into());
    assert!(!b.durable().blacklists.contains_key(&key));
    // Expiry in one process reaches the other.
    let mut refused = attempt("openai", "openai-2", "quota");
    refused.retry_at_ms = 1_500_000;
    b.apply_report(&batch(vec![refused]));
    sync(&b)?;
    sync(&a)?;
    assert!(snapshot(&a).key_health.iter().any(|h| h.key == "openai-2"));
    clock.0.store(1_500_000, Ordering::SeqCst);
    a.expire();
    sync(&a)?;
    sync(&b)?;
    assert!(snapshot(&b).key_health.iter().all(|h| h.key != "openai-2"));
    let _ = std::fs::remove_dir_all(path.parent().unwrap_or(Path::new("/nonexistent")));
    Ok(())
}

#[test]
fn a_rotated_file_secret_lifts_an_auth_blacklist() -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!("ai-router-engine-{}-file", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let secret = dir.join("key");
    std::fs::write(&secret, "sk-file-1\n").map_err(|e| e.to_string())?;
    let text = format!(
            "providers:\n  - {{ id: p, baseUrl: 'http://h/v1', keys: [{{ alias: f, file: {} }}], models: [{{ id: m }}] }}\n",
            secret.display()
        );
    let f = fixture(&text)?;
    let mut refused = attempt("p", "f", "auth");
    refused.fingerprint = fingerprint("sk-file-1");
    f.engine.apply_report(&batch(vec![refused]));
    assert_eq!(snapshot(&f.engine).key_health.len(), 1);
    // Unchanged file: nothing happens.
    assert!(f.engine.refresh_secrets().is_empty());
    std::fs::write(&secret, "sk-file-2\n").map_err(|e| e.to_string())?;
    let events = f.engine.refresh_secrets();
    assert_eq!(
        events,
        vec![EngineEvent::KeyRestored {
            provider: "p".into(),
            key: "f".into(),
            was: "auth",
            reason: "secret_changed"
        }]
    );
    let s = snapshot(&f.engine);
    assert!(s.key_health.is_empty());
    assert_eq!(s.providers[0].keys[0].secret, "sk-file-2");
    std::fs::remove_dir_all(&dir).map_err(|e| e.to_string())?;
    Ok(())
}

#[test]
fn every_snapshot_carries_resilience_and_selection() -> Result<(), String> {
    let f = fixture(BREAKERS)?;
    for _ in 0..2 {
        f.engine
            .apply_report(&batch(vec![attempt("local", "a", "transient")]));
    }
    let s = snapshot(&f.engine);
    assert!(!s.breakers.is_empty());
    let r = s.resilience.unwrap_or_default();
    assert_eq!(r.rate_limit_cooldown_ms, 10_000);
    assert_eq!(r.quota_blacklist_ms, 21_600_000);
    assert_eq!(r.auth_disable_ms, 0);
    assert_eq!(r.backoff.map(|b| b.max_ms), Some(5_000));
    assert_eq!(s.selection.map(|x| x.low_headroom), Some(1));
    Ok(())
}

// A reload (`replace_config`).
fn reload_config(text: &str, env: &crate::config::secrets::MapEnv) -> Result<Arc<Config>, String> {
    parse(text)
        .and_then(|f| f.resolve(env, Path::new(".")))
        .map(Arc::new)
        .map_err(|e| e.to_string())
}

const RELOAD_OLD: &str = "providers:\n  - { id: p, baseUrl: 'http://h/v1', keys: [{ alias: a, env: A }, { alias: b, env: B }], models: [{ id: m }] }\n";
const RELOAD_NEW: &str = "providers:\n  - { id: p, baseUrl: 'http://h/v1', keys: [{ alias: a, env: A }], models: [{ id: m }] }\n  - { id: q, baseUrl: 'http://q/v1', keys: [{ alias: x, env: X }], models: [{ id: m }] }\n";

#[test]
fn a_new_pool_keeps_what_it_keeps_and_drops_the_rest() -> Result<(), String> {
    let env = crate::config::secrets::MapEnv::new([("A", "sk-a"), ("B", "sk-b"), ("X", "sk-x")]);
    let lane = |k: &str| ("p".to_owned(), k.to_owned(), "m".to_owned());
    let mut durable = DurableState::default();
    durable.cooldowns.insert(lane("a"), i64::MAX);
    durable.cooldowns.insert(lane("b"), i64::MAX);
    let engine = Engine::new(
        reload_config(RELOAD_OLD, &env)?,
        Arc::new(env.clone()),
        Arc::new(crate::clock::SystemClock),
        Vec::new(),
        durable,
    );
    let before = engine.version();
    let change = engine.replace_config(reload_config(RELOAD_NEW, &env)?);
    assert_eq!(
        change,
        reload::PoolChange {
            providers_added: vec!["q".into()],
            providers_removed: vec![],
            keys_added: vec!["q/x".into()],
            keys_removed: vec!["p/b".into()],
        }
    );
    assert!(engine.version() > before, "published");
    let cooldowns: Vec<_> = engine.durable().cooldowns.into_keys().collect();
    assert_eq!(
        cooldowns,
        vec![lane("a")],
        "the dropped key's cooldown went"
    );
    let snapshot = engine.current().snapshot.unwrap_or_default();
    let keys: Vec<(String, String, bool)> = snapshot
        .providers
        .iter()
        .flat_map(|p| {
            p.keys
                .iter()
                .map(|k| (p.id.clone(), k.alias.clone(), !k.secret.is_empty()))
        })
        .collect();
    assert_eq!(
        keys,
        vec![
            ("p".into(), "a".into(), true),
            ("q".into(), "x".into(), true)
        ],
        "the new key is resolved at once"
    );
    assert_eq!(engine.config().providers.len(), 2);
    Ok(())
}

// ---- a shared Redis store -----------------------------------------------------------------

#[test]
fn two_engines_on_one_redis_share_blacklists_and_one_probe() -> Result<(), String> {
    let redis = crate::store::servers::RedisServer::start().map_err(|e| e.to_string())?;
    let open = || -> Result<Arc<dyn StateStore>, String> {
        Ok(Arc::new(
            crate::store::redis::RedisStateStore::open(&redis.url(), "engines", None)
                .map_err(|e| e.to_string())?,
        ))
    };
    let clock = Arc::new(TestClock(AtomicI64::new(1_000_000)));
    let a = engine_on(BREAKERS, test_env(), clock.clone(), open()?)?;
    let b = engine_on(BREAKERS, test_env(), clock.clone(), open()?)?;
    a.apply_report(&batch(vec![attempt("openai", "openai-2", "auth")]));
    a.sync_store(a.store.as_ref()).map_err(|e| e.to_string())?;
    assert!(b.sync_store(b.store.as_ref()).map_err(|e| e.to_string())?);
    let out: Vec<String> = snapshot(&b)
        .key_health
        .iter()
        .map(|h| h.key.clone())
        .collect();
    assert_eq!(out, ["openai-2"], "b pushes the blacklist a saw");
    probe_lease_contention(&[a, b], &clock)
}

#[test]
fn after_an_outage_the_store_gets_back_what_it_lost() -> Result<(), String> {
    let store: Arc<dyn StateStore> = Arc::new(MemoryStateStore::default());
    let clock = Arc::new(TestClock(AtomicI64::new(1_000_000)));
    let e = engine_on(BREAKERS, test_env(), clock.clone(), store.clone())?;
    e.apply_report(&batch(vec![attempt("openai", "openai-2", "auth")]));
    e.sync_store(store.as_ref()).map_err(|e| e.to_string())?;
    // The store restarts empty, and someone else writes a cooldown meanwhile.
    let mut other = DurableState::default();
    other
        .cooldowns
        .insert(("local".into(), "a".into(), "llama".into()), 2_000_000);
    store.save(&other).map_err(|e| e.to_string())?;
    e.forget_store_base();
    e.sync_store(store.as_ref()).map_err(|e| e.to_string())?;
    let held = store.load().map_err(|e| e.to_string())?;
    assert_eq!(held.blacklists.len(), 1, "ours is written back");
    assert_eq!(held.cooldowns.len(), 1, "theirs is kept");
    let s = snapshot(&e);
    assert_eq!((s.key_health.len(), s.cooldowns.len()), (1, 1));
    // Without forgetting the base, the empty store would have read as "deleted".
    store
        .save(&DurableState::default())
        .map_err(|e| e.to_string())?;
    e.sync_store(store.as_ref()).map_err(|e| e.to_string())?;
    assert!(snapshot(&e).key_health.is_empty());
    Ok(())
}

/// A store that shares a cache: what it was asked to keep.
#[derive(Default)]
struct CacheRecorder {
    inner: MemoryStateStore,
    puts: Mutex<Vec<(String, usize, u64)>>,
}

impl StateStore for CacheRecorder {
    fn load(&self) -> Result<DurableState, crate::store::durable::StoreError> {
        self.inner.load()
    }
    fn apply(
        &self,
        changes: &crate::store::durable::DurableChanges,
    ) -> Result<(), crate::store::durable::StoreError> {
        self.inner.apply(changes)
    }
    fn lease(
        &self,
        id: &BreakerId,
        holder: &str,
        now_ms: i64,
        ttl_ms: i64,
    ) -> Result<LeaseGrant, crate::store::durable::StoreError> {
        self.inner.lease(id, holder, now_ms, ttl_ms)
    }
    fn release(
        &self,
        id: &BreakerId,
        holder: Option<&str>,
    ) -> Result<(), crate::store::durable::StoreError> {
        self.inner.release(id, holder)
    }
    fn cache_put(&self, key: &str, entry: Vec<u8>, ttl_ms: u64) -> bool {
        if let Ok(mut puts) = self.puts.lock() {
            puts.push((key.to_owned(), entry.len(), ttl_ms));
        }
        true
    }
}

#[test]
fn shared_cache_entries_are_bounded_by_a_slot_and_the_pools_ttl() -> Result<(), String> {
    let recorder = Arc::new(CacheRecorder::default());
    let store: Arc<dyn StateStore> = recorder.clone();
    let clock = Arc::new(TestClock(AtomicI64::new(1_000_000)));
    let text = format!("cache: {{ ttlMs: 5000, maxEntries: 2, maxBytes: 4096 }}\n{BREAKERS}");
    let e = engine_on(&text, test_env(), clock.clone(), store)?;
    assert!(e.shared_cache_put("k1", vec![0; 2048], 60_000));
    assert!(
        !e.shared_cache_put("k2", vec![0; 2049], 1_000),
        "larger than a slot"
    );
    let puts = recorder.puts.lock().map(|p| p.clone()).unwrap_or_default();
    assert_eq!(
        puts,
        vec![("k1".to_owned(), 2048, 5_000)],
        "the TTL at most ttlMs"
    );
    // A pool without a cache shares nothing.
    let none = engine_on(
        BREAKERS,
        test_env(),
        clock,
        Arc::new(CacheRecorder::default()),
    )?;
    assert!(!none.shared_cache_put("k1", vec![0; 10], 1_000));
    assert_eq!(none.shared_cache_get("k1"), None);
    Ok(())
}

/// The stats' lane latency follows the filter's rule with the pool's `selection.ewmaAlpha`,
/// not a default of their own.
#[test]
fn the_stats_latency_average_weighs_the_newest_attempt_by_the_pools_ewma_alpha(
) -> Result<(), String> {
    let f = fixture(&format!("{POOL}selection: {{ ewmaAlpha: 0.5 }}\n"))?;
    let timed = |latency_ms| pb::AttemptOutcome {
        outcome: pb::AttemptResult::Success.into(),
        latency_ms,
        ..attempt("openai", "openai-1", "")
    };
    f.engine.apply_report(&batch(vec![timed(100)]));
    f.engine.apply_report(&batch(vec![timed(200)]));
    let lanes = f.engine.stats().lanes;
    assert_eq!(lanes.len(), 1, "{lanes:?}");
    let expected = ai_router_contract::latency::ewma_step(100.0, 200.0, 0.5);
    assert_eq!(expected, 150.0);
    assert_eq!(lanes[0].latency_ewma_ms, expected);
    Ok(())
}
