//! The admin API's tests over HTTP and gRPC, and the fixture other modules' tests use.

use std::sync::Arc;

use ai_router_proto::v1 as pb;
use axum::http::StatusCode;
use serde_json::{json, Value};
use tonic::Request;

use super::routes::{guarded, routes};
use super::state::AdminApi;
use crate::clock::SystemClock;
use crate::config::parse;
use crate::config::secrets::MapEnv;
use crate::config::secrets::Secret;
use crate::engine::Engine;
use crate::keys::memory::MemoryKeyStore;
use crate::keys::operations::KeyAdmin;
use crate::keys::record::VirtualKeyRecord;
use crate::keys::store::UsageDay;
use crate::store::durable::DurableState;
use axum::body::Body;
use axum::http::Request as HttpRequest;
use http_body_util::BodyExt;
use tower::ServiceExt;

pub(crate) const TOKEN: &str = "admin-test-token";

/// An admin API over a one-provider pool, a memory key store and a mounted key `app`.
pub(crate) fn api(token: Option<&str>) -> Result<Arc<AdminApi>, String> {
    api_on(
        "providers:\n  - { id: p, baseUrl: 'http://h/v1', keys: [{ alias: a, env: K }], models: [{ id: m, aliases: [fast] }] }\nprofiles:\n  work: { model: m }\n",
        token,
    )
}

/// [`api`] over the pool `yaml` (its keys read `K` and `K2`).
pub(crate) fn api_on(yaml: &str, token: Option<&str>) -> Result<Arc<AdminApi>, String> {
    let env = Arc::new(MapEnv::new([("K", "sk-upstream"), ("K2", "sk-upstream-2")]));
    let config = parse(yaml)
        .and_then(|f| f.resolve(env.as_ref(), std::path::Path::new(".")))
        .map_err(|e| e.to_string())?;
    let names = config.names.clone();
    let mounted = VirtualKeyRecord {
        id: crate::keys::mounted::mounted_id("app"),
        label: "app".into(),
        sha256: crate::config::secrets::sha256_hex("sk-starci-app-mounted"),
        hint: "nted".into(),
        profiles: vec!["*".into()],
        models: vec!["*".into()],
        owner: None,
        allow_fallback: true,
        enabled: true,
        quota: None,
        mounted: true,
        quota_block: None,
        cache: None,
    };
    let engine = Engine::new(
        Arc::new(config),
        env,
        Arc::new(SystemClock),
        vec![mounted.clone()],
        DurableState::default(),
    );
    let keys = Arc::new(
        KeyAdmin::new(
            Arc::new(MemoryKeyStore::default()),
            vec![mounted],
            Arc::new(SystemClock),
        )
        .with_pool(names),
    );
    Ok(Arc::new(AdminApi::new(
        keys,
        token.map(Secret::new),
        engine,
    )))
}

async fn send(
    api: &Arc<AdminApi>,
    method: &str,
    uri: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> Result<(StatusCode, Value), Box<dyn std::error::Error>> {
    let mut request = HttpRequest::builder().method(method).uri(uri);
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let body = body.map_or_else(Body::empty, |b| Body::from(b.to_string()));
    let response = guarded(routes(), api.clone())
        .oneshot(request.body(body)?)
        .await?;
    let status = response.status();
    let bytes = response.into_body().collect().await?.to_bytes();
    Ok((status, serde_json::from_slice(&bytes)?))
}

#[tokio::test]
async fn the_admin_token_guards_every_route() -> Result<(), Box<dyn std::error::Error>> {
    let api = api(Some(TOKEN))?;
    let (status, body) = send(&api, "GET", "/admin/keys", None, None).await?;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["error"]["code"], "missing_api_key");
    let (status, body) = send(&api, "GET", "/admin/keys", Some("nope"), None).await?;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["error"]["code"], "invalid_api_key");
    let (status, _) = send(&api, "GET", "/admin/keys", Some(TOKEN), None).await?;
    assert_eq!(status, StatusCode::OK);

    let off = self::api(None)?;
    let (status, body) = send(&off, "GET", "/admin/keys", Some(TOKEN), None).await?;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(body["error"]["code"], "admin_disabled");

    // /health: the pool with the token only, aliases and never a secret.
    let (_, plain) = send(&api, "GET", "/health", None, None).await?;
    assert!(plain.get("providers").is_none(), "{plain}");
    let (_, full) = send(&api, "GET", "/health", Some(TOKEN), None).await?;
    assert_eq!(full["providers"][0]["keys"][0]["alias"], "a", "{full}");
    assert!(!full.to_string().contains("sk-upstream"), "{full}");
    Ok(())
}

#[tokio::test]
async fn create_read_change_and_refuse() -> Result<(), Box<dyn std::error::Error>> {
    let api = api(Some(TOKEN))?;
    let t = Some(TOKEN);
    let (status, created) = send(
        &api,
        "POST",
        "/admin/keys",
        t,
        Some(json!({ "label": "app_two", "profiles": ["work"], "quota": { "requestsPerMinute": 5 } })),
    )
    .await?;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["key"]["id"].as_str().unwrap_or_default().to_owned();
    let secret = created["secret"].as_str().unwrap_or_default().to_owned();
    assert!(secret.starts_with("sk-starci-app_two-"));
    assert_eq!(created["key"]["quota"]["requestsPerMinute"], 5);
    // Pushed before the answer.
    let hash = crate::config::secrets::sha256_hex(&secret);
    let snapshot = api.engine.current().snapshot.clone().unwrap_or_default();
    assert!(snapshot.virtual_keys.iter().any(|k| k.sha256 == hash));

    let (status, listed) = send(&api, "GET", "/admin/keys", t, None).await?;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listed["keys"][0]["mounted"], true);
    assert_eq!(listed["keys"][1]["id"], id.as_str());
    assert!(!listed.to_string().contains(&secret) && !listed.to_string().contains(&hash));

    let (status, patched) = send(
        &api,
        "PATCH",
        &format!("/admin/keys/{id}"),
        t,
        Some(json!({ "enabled": false })),
    )
    .await?;
    assert_eq!(status, StatusCode::OK, "{patched}");
    let snapshot = api.engine.current().snapshot.clone().unwrap_or_default();
    assert!(snapshot
        .virtual_keys
        .iter()
        .any(|k| k.sha256 == hash && !k.enabled));
    let (status, body) = send(
        &api,
        "PATCH",
        &format!("/admin/keys/{id}"),
        t,
        Some(json!({ "bogus": 1 })),
    )
    .await?;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");

    let mounted = crate::keys::mounted::mounted_id("app");
    for (method, uri) in [
        ("POST", format!("/admin/keys/{mounted}/revoke")),
        ("POST", format!("/admin/keys/{mounted}/rotate")),
        ("PATCH", format!("/admin/keys/{mounted}")),
    ] {
        let (status, body) = send(&api, method, &uri, t, Some(json!({}))).await?;
        assert_eq!(status, StatusCode::CONFLICT, "{uri}");
        assert_eq!(body["error"]["code"], "key_mounted", "{uri}");
    }
    let (status, body) = send(&api, "GET", "/admin/keys/key_nope", t, None).await?;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"]["code"], "not_found");

    let (status, rotated) =
        send(&api, "POST", &format!("/admin/keys/{id}/rotate"), t, None).await?;
    assert_eq!(status, StatusCode::OK);
    assert_ne!(rotated["secret"], secret.as_str());
    let (status, revoked) =
        send(&api, "POST", &format!("/admin/keys/{id}/revoke"), t, None).await?;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(revoked["revoked"], true);
    let snapshot = api.engine.current().snapshot.clone().unwrap_or_default();
    assert_eq!(snapshot.virtual_keys.len(), 1);
    let (status, body) = send(&api, "POST", &format!("/admin/keys/{id}/rotate"), t, None).await?;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    Ok(())
}

#[tokio::test]
async fn a_quota_patch_merges_limit_by_limit() -> Result<(), Box<dyn std::error::Error>> {
    let api = api(Some(TOKEN))?;
    let t = Some(TOKEN);
    let (status, created) = send(
        &api,
        "POST",
        "/admin/keys",
        t,
        Some(json!({ "label": "app", "models": ["*"], "quota": { "requestsPerMinute": 5, "tokensPerDay": 1000 } })),
    )
    .await?;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let uri = format!(
        "/admin/keys/{}",
        created["key"]["id"].as_str().unwrap_or_default()
    );
    let (status, key) = send(
        &api,
        "PATCH",
        &uri,
        t,
        Some(json!({ "quota": { "costPerDay": 2.5 } })),
    )
    .await?;
    assert_eq!(status, StatusCode::OK, "{key}");
    assert_eq!(
        key["quota"],
        json!({ "requestsPerMinute": 5, "tokensPerDay": 1000, "costPerDay": 2.5, "costPerMonth": null })
    );
    // The engine's copy (what Envoy enforces) keeps the per-minute limit too.
    let snapshot = api.engine.current().snapshot.clone().unwrap_or_default();
    assert!(snapshot
        .virtual_keys
        .iter()
        .any(|k| k.label == "app" && k.requests_per_minute == 5));
    // null clears one limit.
    let (status, key) = send(
        &api,
        "PATCH",
        &uri,
        t,
        Some(json!({ "quota": { "requestsPerMinute": null } })),
    )
    .await?;
    assert_eq!(status, StatusCode::OK, "{key}");
    assert_eq!(key["quota"]["requestsPerMinute"], Value::Null);
    assert_eq!(key["quota"]["tokensPerDay"], 1000);
    assert_eq!(key["quota"]["costPerDay"], 2.5);
    // A bad value in a merge is still refused, naming the field.
    let (status, body) = send(
        &api,
        "PATCH",
        &uri,
        t,
        Some(json!({ "quota": { "costPerMonth": -1 } })),
    )
    .await?;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("quota.costPerMonth")),
        "{body}"
    );
    // quota: null clears them all.
    let (status, key) = send(&api, "PATCH", &uri, t, Some(json!({ "quota": null }))).await?;
    assert_eq!(status, StatusCode::OK, "{key}");
    assert_eq!(
        key["quota"],
        json!({ "requestsPerMinute": null, "tokensPerDay": null, "costPerDay": null, "costPerMonth": null })
    );
    Ok(())
}

#[tokio::test]
async fn bindings_must_name_the_pool() -> Result<(), Box<dyn std::error::Error>> {
    let api = api(Some(TOKEN))?;
    let t = Some(TOKEN);
    for (spec, named) in [
        (json!({ "label": "a", "profiles": ["nope"] }), "`nope`"),
        (
            json!({ "label": "a", "profiles": ["work", "*", "lessons"] }),
            "profiles[2]",
        ),
        (json!({ "label": "a", "models": ["gpt-9"] }), "`gpt-9`"),
    ] {
        let (status, body) = send(&api, "POST", "/admin/keys", t, Some(spec.clone())).await?;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{spec}: {body}");
        assert_eq!(body["error"]["code"], "invalid_request");
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(named)),
            "{spec}: {body}"
        );
    }
    let (status, created) = send(
        &api,
        "POST",
        "/admin/keys",
        t,
        Some(json!({ "label": "a", "profiles": ["work", "*"], "models": ["m", "fast", "*"] })),
    )
    .await?;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let uri = format!(
        "/admin/keys/{}",
        created["key"]["id"].as_str().unwrap_or_default()
    );
    for patch in [
        json!({ "profiles": ["nope"] }),
        json!({ "models": ["gpt-9"] }),
    ] {
        let (status, body) = send(&api, "PATCH", &uri, t, Some(patch.clone())).await?;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{patch}: {body}");
    }
    let (_, key) = send(&api, "GET", &uri, t, None).await?;
    assert_eq!(key["profiles"], json!(["work", "*"]));
    Ok(())
}

#[tokio::test]
async fn usage_ranges() -> Result<(), Box<dyn std::error::Error>> {
    let api = api(Some(TOKEN))?;
    let t = Some(TOKEN);
    let mounted = crate::keys::mounted::mounted_id("app");
    let row = |day: &str| UsageDay {
        day: day.into(),
        requests: 2,
        successes: 2,
        ..UsageDay::default()
    };
    api.keys.store().record_usage(&[
        (mounted.clone(), row("2026-01-31")),
        (mounted.clone(), row("2026-02-01")),
        (mounted.clone(), row("2026-02-02")),
    ])?;
    let uri = format!("/admin/keys/{mounted}/usage?from=2026-02-01&to=2026-02-28");
    let (status, body) = send(&api, "GET", &uri, t, None).await?;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["days"].as_array().map(Vec::len), Some(2));
    assert_eq!(body["total"]["requests"], 4);
    assert_eq!(body["from"], "2026-02-01");
    // Default: this month (nothing recorded in it here).
    let (status, body) = send(
        &api,
        "GET",
        &format!("/admin/keys/{mounted}/usage"),
        t,
        None,
    )
    .await?;
    assert_eq!(status, StatusCode::OK);
    assert!(body["from"].as_str().is_some_and(|d| d.ends_with("-01")));
    for bad in [
        "from=2026-02-30",
        "from=2026-03-01&to=2026-02-01",
        "to=yesterday",
    ] {
        let uri = format!("/admin/keys/{mounted}/usage?{bad}");
        let (status, body) = send(&api, "GET", &uri, t, None).await?;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
    }
    let (status, _) = send(&api, "GET", "/admin/keys/key_nope/usage", t, None).await?;
    assert_eq!(status, StatusCode::NOT_FOUND);
    Ok(())
}

/// Every field that names a state, scope, reason, level, window or enforcement in `value`
/// is a word, never a protobuf enum number.
fn assert_words(value: &Value, path: &str) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let named = [
                    "state",
                    "scope",
                    "reason",
                    "level",
                    "window",
                    "enforcement",
                    "kind",
                ];
                if named.contains(&k.as_str()) {
                    assert!(v.is_string() || v.is_null(), "{path}.{k} = {v}");
                }
                assert_words(v, &format!("{path}.{k}"));
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                assert_words(v, &format!("{path}[{i}]"));
            }
        }
        _ => {}
    }
}

#[tokio::test]
async fn health_speaks_words_says_null_for_no_end_and_shows_budgets(
) -> Result<(), Box<dyn std::error::Error>> {
    let api = api_on(
        "providers:\n  - { id: p, baseUrl: 'http://h/v1', keys: [{ alias: a, env: K }, { alias: b, env: K2 }], models: [{ id: m, cost: { input: 1, output: 1 } }] }\n\
         resilience: { keyBreaker: { failureThreshold: 1, cooldownMs: 60000, maxCooldownMs: 60000 } }\n\
         budgets:\n  - { name: daily, scope: pool, window: day, limits: { maxTokens: 100 }, enforcement: hard, warnAt: 0.5 }\n",
        Some(TOKEN),
    )?;
    let lane = |key: &str, ok: bool, class: pb::ErrorClass| pb::AttemptOutcome {
        provider: "p".into(),
        key: key.into(),
        model: "m".into(),
        outcome: if ok {
            pb::AttemptResult::Success
        } else {
            pb::AttemptResult::Error
        }
        .into(),
        error_class: class.into(),
        usage: ok.then_some(pb::Usage {
            prompt_tokens: 40,
            completion_tokens: 20,
            ..Default::default()
        }),
        ..Default::default()
    };
    api.engine.apply_report(&pb::ReportBatch {
        attempts: vec![
            lane("a", true, pb::ErrorClass::Unspecified),
            lane("a", false, pb::ErrorClass::Transient),
            lane("b", false, pb::ErrorClass::Auth),
        ],
        ..Default::default()
    });
    let (status, health) = send(&api, "GET", "/admin/health", Some(TOKEN), None).await?;
    assert_eq!(status, StatusCode::OK, "{health}");
    assert_words(&health, "health");
    let breaker = &health["breakers"][0];
    assert_eq!(
        (&breaker["scope"], &breaker["state"], &breaker["key"]),
        (&json!("key"), &json!("open"), &json!("a")),
        "{health}"
    );
    assert!(breaker["openUntilMs"].as_i64() > Some(0), "{health}");
    let keys = &health["providers"][0]["keys"];
    assert_eq!(keys[0]["state"], "ok", "{health}");
    // Out until its secret changes: no end, null (as the gateway's /health says).
    assert_eq!(
        (&keys[1]["alias"], &keys[1]["state"], &keys[1]["untilMs"]),
        (&json!("b"), &json!("auth"), &Value::Null),
        "{health}"
    );
    let budget = &health["budgets"][0];
    assert_eq!(
        (
            &budget["name"],
            &budget["scope"],
            &budget["window"],
            &budget["enforcement"]
        ),
        (
            &json!("daily"),
            &json!("pool"),
            &json!("day"),
            &json!("hard")
        ),
        "{health}"
    );
    assert_eq!(budget["limits"]["maxTokens"], 100, "{health}");
    assert_eq!(budget["limits"]["maxCost"], Value::Null, "{health}");
    let spent = &budget["spent"][0];
    assert_eq!(
        (&spent["subject"], &spent["tokens"], &spent["level"]),
        (&Value::Null, &json!(60), &json!("warn")),
        "{health}"
    );
    assert!(spent["untilMs"].as_i64() > Some(0), "{health}");
    // The same pool with the token on /health, and the ledger: words and null too.
    let (_, full) = send(&api, "GET", "/health", Some(TOKEN), None).await?;
    assert_eq!(full["providers"], health["providers"]);
    let (status, ledger) = send(&api, "GET", "/admin/ledger", Some(TOKEN), None).await?;
    assert_eq!(status, StatusCode::OK, "{ledger}");
    assert_words(&ledger, "ledger");
    let b = &ledger["providers"][0]["scopes"][1]["keys"][0];
    assert_eq!(
        (&b["state"], &b["untilMs"]),
        (&json!("auth"), &Value::Null),
        "{ledger}"
    );
    for page in ["/admin/stats", "/admin/catalog", "/admin/keys"] {
        let (status, body) = send(&api, "GET", page, Some(TOKEN), None).await?;
        assert_eq!(status, StatusCode::OK, "{page}: {body}");
        assert_words(&body, page);
    }
    Ok(())
}

/// `message` with the admin token.
pub(crate) fn authed<T>(message: T) -> Request<T> {
    let mut request = Request::new(message);
    if let Ok(value) = format!("Bearer {TOKEN}").parse() {
        request.metadata_mut().insert("authorization", value);
    }
    request
}

/// Each row is a route the router serves, under the method it names (not the router's 404
/// or 405).
#[tokio::test]
async fn every_row_is_served() -> Result<(), Box<dyn std::error::Error>> {
    let api = api(Some(TOKEN))?;
    for r in super::routes::ROUTES {
        let uri = r.path.replace("{id}", "none");
        let request = HttpRequest::builder()
            .method(r.method)
            .uri(&uri)
            .header("authorization", format!("Bearer {TOKEN}"))
            .body(Body::from("{}"))?;
        let response = guarded(routes(), api.clone()).oneshot(request).await?;
        let status = response.status();
        assert_ne!(status, axum::http::StatusCode::METHOD_NOT_ALLOWED, "{r:?}");
        if status == axum::http::StatusCode::NOT_FOUND {
            // A handler's 404 says what is missing; the router's has no body.
            let bytes = response.into_body().collect().await?.to_bytes();
            assert!(!bytes.is_empty(), "{r:?}: no such route");
        }
    }
    Ok(())
}
