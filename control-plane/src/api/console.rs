//! The operator's console: a page in the browser over the admin API, and the few figures its
//! pages need that no other route computes.
//!
//! | route | does |
//! |---|---|
//! | `GET /ui` (and `GET /admin/ui`, which the gateway's listener forwards) | the page; `ui/app.js` and `ui/app.css` beside it. Compiled into the binary; no token needed: they hold no data |
//! | `GET /admin/console` | the last minute's calls per second, success rate and p50/p99 latency (all, per provider, per protocol), spend today and this month (all, per provider, per protocol), and what is wrong now |
//! | `GET /admin/console/ledger` | `GET /admin/ledger` with a `forecast` in each window: at the last five minutes' rate, when what is left runs out; and `inFlight`, the attempts in flight per provider key as the Envoys last reported them |
//! | `GET /admin/console/usage?from=&to=` | usage per day, per key (each with its rows per day, provider, model and protocol: the CSV export), and per day, provider, model and protocol: the key store's usage rows |
//!
//! The page holds the admin token for the tab only (`sessionStorage`) and sends it as
//! `Authorization: Bearer`; the API never reads a cookie, so another site's page cannot act
//! with an operator's browser (no CSRF). Its Content-Security-Policy allows no inline script,
//! no eval and no other origin; every string from the API is put in the page as text.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use serde_json::{json, Value};

use crate::api::admin::auth::Caller;
use crate::api::admin::state::AdminApi;
use crate::api::error::ApiError;
use crate::api::pulse::{forecast, Pulse};
use crate::keys::store::{protocol_name, UsageDay};

/// The page, its script and its style, as shipped.
const PAGE: &str = include_str!("../../ui/index.html");
const SCRIPT: &str = include_str!("../../ui/app.js");
const STYLE: &str = include_str!("../../ui/app.css");

/// What the page may load and do: its own script and style, requests to its own origin, no
/// frame around it.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; object-src 'none'; \
     base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The console's paths that need no token (its page, script and style: they hold no data). The
/// console's router ([`routes`]) serves exactly these; the admin guard lets them through.
pub const ASSETS: &[&str] = &[
    "/ui",
    "/ui/",
    "/ui/app.js",
    "/ui/app.css",
    "/admin/ui",
    "/admin/ui/app.js",
    "/admin/ui/app.css",
];

/// The console's page, script and style, on the admin API's state (its figures' routes are
/// rows of the admin route table, [`crate::api::admin::routes::ROUTES`]).
pub fn routes() -> Router<Arc<AdminApi>> {
    let mut router = Router::new();
    // The assets the guard lets through without a token, one list for both.
    for &path in ASSETS {
        let serve = match path.rsplit('/').next() {
            Some("app.js") => get(script),
            Some("app.css") => get(style),
            Some("") => get(|| async { redirect("/ui") }),
            _ => get(page),
        };
        router = router.route(path, serve);
    }
    router
}

fn redirect(to: &'static str) -> Response {
    (
        StatusCode::PERMANENT_REDIRECT,
        [(header::LOCATION, HeaderValue::from_static(to))],
    )
        .into_response()
}

/// An asset with the headers every answer of the console carries.
fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

async fn page() -> Response {
    asset(PAGE, "text/html; charset=utf-8")
}

async fn script() -> Response {
    asset(SCRIPT, "text/javascript; charset=utf-8")
}

async fn style() -> Response {
    asset(STYLE, "text/css; charset=utf-8")
}

/// Whether a ledger window counts requests (`rpm`, `rpd`) rather than tokens.
fn counts_requests(window: &str) -> bool {
    matches!(window, "rpm" | "rpd")
}

/// Adds a `forecast` to every window of every scope of a ledger view (`GET /admin/ledger`).
fn with_forecasts(mut ledger: Value, pulse: &Pulse, now_ms: i64) -> Value {
    let Some(providers) = ledger["providers"].as_array_mut() else {
        return ledger;
    };
    for p in providers {
        let provider = p["provider"].as_str().unwrap_or_default().to_owned();
        let Some(scopes) = p["scopes"].as_array_mut() else {
            continue;
        };
        for scope in scopes {
            let keys: Vec<String> = scope["keys"]
                .as_array()
                .map(|k| {
                    k.iter()
                        .filter_map(|k| k["alias"].as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            let (attempts, tokens, span) = pulse.sent(&provider, &keys);
            let Some(windows) = scope["windows"].as_object_mut() else {
                continue;
            };
            for (name, w) in windows.iter_mut() {
                let spent = if counts_requests(name) {
                    attempts
                } else {
                    tokens
                };
                w["forecast"] = forecast(
                    w["remaining"].as_u64(),
                    w["resetsAtMs"].as_i64(),
                    spent,
                    span,
                    now_ms,
                );
            }
        }
    }
    ledger
}

// ---------------------------------------------------------------------------------------------
// What is wrong now
// ---------------------------------------------------------------------------------------------

/// What needs an operator's eye, from the health page (`GET /admin/health`) and the ledger:
/// breakers not closed, providers out, keys out, cooldowns, budgets past their warning, billing
/// scopes exhausted. Each `{ kind, provider?, key?, ..., untilMs }`.
pub fn problems(health: &Value, ledger: &Value) -> Vec<Value> {
    let mut out = Vec::new();
    let list = |v: &Value| v.as_array().cloned().unwrap_or_default();
    for p in list(&health["providerHealth"]) {
        out.push(json!({
            "kind": "provider_out", "provider": p["provider"], "reason": p["reason"],
            "untilMs": p["untilMs"],
        }));
    }
    for b in list(&health["breakers"]) {
        if b["state"] != "closed" {
            out.push(json!({
                "kind": "breaker", "provider": b["provider"], "key": b["key"],
                "state": b["state"], "untilMs": b["openUntilMs"],
            }));
        }
    }
    for p in list(&health["providers"]) {
        for k in list(&p["keys"]) {
            if k["state"] != "ok" {
                out.push(json!({
                    "kind": "key_out", "provider": p["id"], "key": k["alias"],
                    "reason": k["state"], "code": k["code"], "untilMs": k["untilMs"],
                }));
            }
        }
    }
    for c in list(&health["cooldowns"]) {
        out.push(json!({
            "kind": "cooldown", "provider": c["provider"], "key": c["key"],
            "model": c["model"], "untilMs": c["untilMs"],
        }));
    }
    for b in list(&health["budgets"]) {
        for s in list(&b["spent"]) {
            if s["level"] == "warn" || s["level"] == "over" {
                out.push(json!({
                    "kind": "budget", "budget": b["name"], "subject": s["subject"],
                    "level": s["level"], "untilMs": s["untilMs"],
                }));
            }
        }
    }
    for p in list(&ledger["providers"]) {
        for s in list(&p["scopes"]) {
            if s["state"] != "healthy" {
                out.push(json!({
                    "kind": "scope_out", "provider": p["provider"], "scope": s["scope"],
                    "state": s["state"], "reason": s["reason"], "untilMs": s["untilMs"],
                }));
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Handlers
// ---------------------------------------------------------------------------------------------

/// Every key's usage from `from` to `to`: `(from, to, keys)`, each key with its `days`, its
/// `lanes` (rows per day, provider, model and protocol) and its `total`.
async fn key_usage(
    api: &AdminApi,
    from: Option<String>,
    to: Option<String>,
) -> Result<(String, String, Vec<Value>), ApiError> {
    let keys = api.list().await?;
    let (mut first, mut last) = (String::new(), String::new());
    let mut out = Vec::with_capacity(keys.len());
    for key in keys {
        let report = api.usage(key.id.clone(), from.clone(), to.clone()).await?;
        // Its rows per day, provider and model (the CSV export's lines); none without use.
        let lanes = if report.days.is_empty() {
            Vec::new()
        } else {
            let range = (Some(report.from.clone()), Some(report.to.clone()));
            named_protocols(
                api.lane_usage(range.0, range.1, Some(key.id.clone()))
                    .await?
                    .2,
            )
        };
        first = report.from;
        last = report.to;
        out.push(json!({
            "id": key.id, "label": key.label, "owner": key.owner, "mounted": key.mounted,
            "revoked": key.revoked, "enabled": key.enabled,
            "days": report.days, "lanes": lanes, "total": report.total,
        }));
    }
    Ok((first, last, out))
}

/// The keys' days added up by day.
fn by_day(keys: &[Value]) -> Vec<Value> {
    let mut days: BTreeMap<String, UsageDay> = BTreeMap::new();
    for k in keys {
        let rows: Vec<UsageDay> = serde_json::from_value(k["days"].clone()).unwrap_or_default();
        for row in rows {
            days.entry(row.day.clone()).or_default().add(&row);
        }
    }
    days.into_iter()
        .map(|(day, mut row)| {
            row.day = day;
            json!(row)
        })
        .collect()
}

/// Spend today and this month, in all, per provider and per client protocol, from this month's
/// usage rows.
fn spend_of(rows: &[UsageDay], today: &str) -> Value {
    let (mut day, mut month) = (0.0, 0.0);
    let mut providers: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
    let mut protocols: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
    for row in rows {
        month += row.cost;
        let today_cost = if row.day == today { row.cost } else { 0.0 };
        day += today_cost;
        for spent in [
            providers.entry(row.provider.as_str()).or_default(),
            protocols.entry(protocol_name(&row.protocol)).or_default(),
        ] {
            spent.0 += today_cost;
            spent.1 += row.cost;
        }
    }
    let providers: Vec<Value> = providers
        .into_iter()
        .map(|(name, (today, month))| {
            json!({ "name": (!name.is_empty()).then_some(name), "today": today, "month": month })
        })
        .collect();
    let protocols: Vec<Value> = protocols
        .into_iter()
        .map(|(name, (today, month))| json!({ "name": name, "today": today, "month": month }))
        .collect();
    json!({
        "today": day, "month": month, "day": today,
        "providers": providers, "protocols": protocols,
    })
}

/// Usage rows as the console shows them: the protocol named ([`protocol_name`]).
fn named_protocols(mut rows: Vec<UsageDay>) -> Vec<UsageDay> {
    for row in &mut rows {
        row.protocol = protocol_name(&row.protocol).to_owned();
    }
    rows
}

/// `GET /admin/console`.
pub(crate) async fn overview(
    State(api): State<Arc<AdminApi>>,
    Extension(_caller): Extension<Caller>,
) -> Result<Json<Value>, ApiError> {
    let health = api.pool_health();
    let ledger = api.ledger_view();
    let (_, today, rows) = api.lane_usage(None, None, None).await?;
    Ok(Json(json!({
        "atMs": api.console().clock_ms(),
        "status": health["status"],
        "version": health["version"],
        "calls": api.console().rates(),
        "spend": spend_of(&rows, &today),
        "problems": problems(&health, &ledger),
    })))
}

/// `GET /admin/console/ledger`.
pub(crate) async fn ledger(
    State(api): State<Arc<AdminApi>>,
    Extension(_caller): Extension<Caller>,
) -> Result<Json<Value>, ApiError> {
    let now = api.console().clock_ms();
    let mut view = with_forecasts(api.ledger_view(), api.console(), now);
    view["inFlight"] = api.console().in_flight();
    Ok(Json(view))
}

/// `GET /admin/console/usage?from=YYYY-MM-DD&to=YYYY-MM-DD` (default: this month).
pub(crate) async fn usage(
    State(api): State<Arc<AdminApi>>,
    RawQuery(query): RawQuery,
    Extension(_caller): Extension<Caller>,
) -> Result<Json<Value>, ApiError> {
    let (mut from, mut to) = (None, None);
    for pair in query.as_deref().unwrap_or("").split('&') {
        match pair.split_once('=') {
            Some(("from", v)) => from = Some(v.to_owned()),
            Some(("to", v)) => to = Some(v.to_owned()),
            _ => {}
        }
    }
    let (from, to, keys) = key_usage(&api, from, to).await?;
    let days = by_day(&keys);
    let (_, _, lanes) = api
        .lane_usage(Some(from.clone()), Some(to.clone()), None)
        .await?;
    Ok(Json(json!({
        "from": from,
        "to": to,
        "days": days,
        "keys": keys,
        "lanes": named_protocols(lanes),
        "cache": api.engine().stats().cache,
    })))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use std::sync::atomic::{AtomicI64, Ordering};

    use ai_router_proto::v1 as pb;

    use super::*;
    use crate::api::pulse::{percentile, FORECAST_WINDOW_MS};
    use crate::clock::TestClock;

    const T0: i64 = 1_767_225_600_000; // 2026-01-01T00:00:00Z

    fn pulse(clock: &Arc<TestClock>) -> Pulse {
        Pulse::new(clock.clone())
    }

    fn call(ok: bool, latency_ms: u64, provider: &str, protocol: &str) -> pb::RequestOutcome {
        pb::RequestOutcome {
            outcome: if ok {
                pb::RequestResult::Success
            } else {
                pb::RequestResult::Error
            } as i32,
            latency_ms,
            provider: provider.into(),
            protocol: protocol.into(),
            ..Default::default()
        }
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.5), Some(50));
        assert_eq!(percentile(&v, 0.99), Some(99));
        assert_eq!(percentile(&[7], 0.99), Some(7));
        assert_eq!(percentile(&[], 0.5), None);
    }

    #[test]
    fn rates_count_the_last_minute_per_provider_and_protocol() {
        let clock = Arc::new(TestClock(AtomicI64::new(T0)));
        let p = pulse(&clock);
        clock.0.store(T0 + 120_000, Ordering::SeqCst);
        // An old batch, then the last minute's: 3 calls on p1 (one failed), 1 on p2.
        let old = pb::ReportBatch {
            requests: vec![call(true, 5, "p1", "chat")],
            ..Default::default()
        };
        p.record(&old, T0 + 10_000);
        let batch = pb::ReportBatch {
            requests: vec![
                call(true, 100, "p1", "chat"),
                call(true, 200, "p1", "chat"),
                call(false, 300, "p1", "messages"),
                call(true, 400, "p2", "chat"),
            ],
            ..Default::default()
        };
        p.record(&batch, T0 + 110_000);
        let r = p.rates();
        assert_eq!(r["requests"], 4, "{r}");
        assert_eq!(r["windowMs"], 60_000, "{r}");
        assert_eq!(r["requestsPerSecond"], 0.07, "{r}");
        assert_eq!(r["successRate"], 0.75, "{r}");
        assert_eq!(
            (r["p50Ms"].as_u64(), r["p99Ms"].as_u64()),
            (Some(200), Some(400))
        );
        let providers = r["providers"].as_array().unwrap();
        assert_eq!(providers[0]["name"], "p1");
        assert_eq!(providers[0]["requests"], 3);
        assert_eq!(providers[0]["successRate"], 0.67);
        let protocols = r["protocols"].as_array().unwrap();
        assert_eq!(
            protocols
                .iter()
                .map(|p| (p["name"].clone(), p["requests"].clone()))
                .collect::<Vec<_>>(),
            vec![(json!("chat"), json!(3)), (json!("messages"), json!(1))]
        );
    }

    #[test]
    fn in_flight_adds_up_the_nodes_last_counts_and_forgets_a_silent_node() {
        let clock = Arc::new(TestClock(AtomicI64::new(T0)));
        let p = pulse(&clock);
        let load = |node: &str, at: i64, keys: &[(&str, u32)]| pb::ReportBatch {
            node: node.into(),
            in_flight: keys
                .iter()
                .map(|(k, n)| pb::KeyLoad {
                    provider: "p1".into(),
                    key: (*k).into(),
                    attempts: *n,
                })
                .collect(),
            in_flight_at_ms: at,
            ..Default::default()
        };
        p.record(&load("e1", T0, &[("a", 2), ("b", 1)]), T0);
        p.record(&load("e2", T0, &[("a", 1)]), T0);
        // A batch that says nothing of them (0) changes nothing; nor does an older count.
        p.record(&load("e2", 0, &[]), T0);
        p.record(&load("e1", T0 - 1, &[("a", 9)]), T0);
        assert_eq!(
            p.in_flight(),
            json!([
                { "provider": "p1", "key": "a", "attempts": 3 },
                { "provider": "p1", "key": "b", "attempts": 1 },
            ])
        );
        // e1 ends its attempts; e2 stops talking and is forgotten.
        clock.0.store(T0 + 10_000, Ordering::SeqCst);
        p.record(&load("e1", T0 + 10_000, &[]), T0 + 10_000);
        assert_eq!(
            p.in_flight(),
            json!([{ "provider": "p1", "key": "a", "attempts": 1 }])
        );
        clock.0.store(
            T0 + ai_router_contract::IN_FLIGHT_FORGET_MS,
            Ordering::SeqCst,
        );
        assert_eq!(p.in_flight(), json!([]));
    }

    #[test]
    fn no_calls_means_no_rate_and_no_percentile() {
        let clock = Arc::new(TestClock(AtomicI64::new(T0)));
        let r = pulse(&clock).rates();
        assert_eq!(r["requests"], 0);
        assert!(r["successRate"].is_null() && r["p50Ms"].is_null(), "{r}");
    }

    #[test]
    fn a_forecast_says_when_what_is_left_runs_out() {
        // 100 left, 50 used in 5 minutes: 10 a minute, out in 10 minutes.
        let f = forecast(Some(100), Some(T0 + 3_600_000), 50, 300_000, T0);
        assert_eq!(f["verdict"], "runs_out", "{f}");
        assert_eq!(f["ratePerMinute"], 10.0);
        assert_eq!(f["exhaustsAtMs"], T0 + 600_000);
        // The window resets before that: it lasts.
        let f = forecast(Some(100), Some(T0 + 60_000), 50, 300_000, T0);
        assert_eq!(
            (f["verdict"].as_str(), f["exhaustsAtMs"].is_null()),
            (Some("lasts"), true)
        );
        // Nothing used, nothing left, no figure.
        assert_eq!(forecast(Some(100), None, 0, 300_000, T0)["verdict"], "idle");
        assert_eq!(forecast(Some(0), None, 3, 300_000, T0)["verdict"], "out");
        assert_eq!(forecast(None, None, 3, 300_000, T0)["verdict"], "unknown");
    }

    #[test]
    fn ledger_windows_get_a_forecast_from_their_scope_keys_attempts() {
        let clock = Arc::new(TestClock(AtomicI64::new(T0)));
        let p = pulse(&clock);
        clock.0.store(T0 + FORECAST_WINDOW_MS, Ordering::SeqCst);
        let attempt = |key: &str, tokens: u64| pb::AttemptOutcome {
            provider: "p1".into(),
            key: key.into(),
            model: "m1".into(),
            usage: Some(pb::Usage {
                prompt_tokens: tokens,
                ..Default::default()
            }),
            ..Default::default()
        };
        let batch = pb::ReportBatch {
            attempts: vec![attempt("a", 30), attempt("a", 30), attempt("z", 1000)],
            ..Default::default()
        };
        p.record(&batch, T0 + FORECAST_WINDOW_MS);
        let ledger = json!({ "providers": [{ "provider": "p1", "scopes": [{
            "scope": "a", "keys": [{ "alias": "a" }], "state": "healthy",
            "windows": {
                "rpd": { "remaining": 10, "resetsAtMs": T0 + 86_400_000 },
                "tpd": { "remaining": 600, "resetsAtMs": T0 + 86_400_000 },
                "rpm": { "remaining": null, "source": "unknown" },
            },
        }]}]});
        let v = with_forecasts(ledger, &p, T0 + FORECAST_WINDOW_MS);
        let w = &v["providers"][0]["scopes"][0]["windows"];
        // 2 attempts and 60 tokens in 5 minutes on key a (key z is another scope's).
        assert_eq!(w["rpd"]["forecast"]["ratePerMinute"], 0.4, "{w}");
        assert_eq!(
            w["rpd"]["forecast"]["exhaustsAtMs"],
            T0 + FORECAST_WINDOW_MS + 1_500_000
        );
        assert_eq!(w["tpd"]["forecast"]["ratePerMinute"], 12.0, "{w}");
        assert_eq!(w["rpm"]["forecast"]["verdict"], "unknown", "{w}");
    }

    #[test]
    fn spend_adds_up_the_usage_rows_today_and_this_month_per_provider_and_protocol() {
        let row = |day: &str, provider: &str, protocol: &str, cost: f64| UsageDay {
            day: day.into(),
            provider: provider.into(),
            model: "m1".into(),
            protocol: protocol.into(),
            cost,
            ..UsageDay::default()
        };
        let rows = [
            row("2026-01-01", "p1", "chat", 1.0),
            row("2026-01-02", "p1", "chat", 0.5),
            row("2026-01-02", "p1", "messages", 0.125),
            row("2026-01-02", "p2", "messages", 0.25),
            // A row from before usage had a protocol (or from an old data plane).
            row("2026-01-01", "p2", "", 2.0),
            row("2026-01-02", "", "chat", 0.0),
        ];
        let s = spend_of(&rows, "2026-01-02");
        assert_eq!(
            (s["today"].as_f64(), s["month"].as_f64()),
            (Some(0.875), Some(3.875))
        );
        assert_eq!(
            s["providers"],
            json!([
                { "name": null, "today": 0.0, "month": 0.0 },
                { "name": "p1", "today": 0.625, "month": 1.625 },
                { "name": "p2", "today": 0.25, "month": 2.25 },
            ])
        );
        assert_eq!(
            s["protocols"],
            json!([
                { "name": "chat", "today": 0.5, "month": 1.5 },
                { "name": "messages", "today": 0.375, "month": 0.375 },
                { "name": "unknown", "today": 0.0, "month": 2.0 },
            ])
        );
    }

    #[test]
    fn problems_list_what_is_out_now() {
        let health = json!({
            "providers": [{ "id": "p1", "keys": [
                { "alias": "a", "state": "ok" },
                { "alias": "b", "state": "auth", "untilMs": null, "code": "invalid_api_key" },
            ]}],
            "breakers": [
                { "provider": "p1", "key": "a", "state": "closed" },
                { "provider": "p2", "key": "c", "state": "open", "openUntilMs": 5 },
            ],
            "cooldowns": [],
            "providerHealth": [],
            "budgets": [{ "name": "team", "spent": [
                { "subject": null, "level": "warn", "untilMs": 9 },
                { "subject": "k", "level": "", "untilMs": 9 },
            ]}],
        });
        let ledger = json!({ "providers": [{ "provider": "p3", "scopes": [
            { "scope": "x", "state": "exhausted", "reason": "no_headroom", "untilMs": 7 },
            { "scope": "y", "state": "healthy" },
        ]}]});
        let kinds: Vec<(String, String)> = problems(&health, &ledger)
            .iter()
            .map(|p| {
                (
                    p["kind"].as_str().unwrap().to_owned(),
                    p["provider"]
                        .as_str()
                        .or(p["budget"].as_str())
                        .unwrap()
                        .to_owned(),
                )
            })
            .collect();
        let want = [
            ("breaker", "p2"),
            ("key_out", "p1"),
            ("budget", "team"),
            ("scope_out", "p3"),
        ];
        assert_eq!(
            kinds,
            want.iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn the_assets_are_small_and_carry_no_inline_script() {
        let total = PAGE.len() + SCRIPT.len() + STYLE.len();
        assert!(total < 300 * 1024, "{total} bytes");
        assert!(!PAGE.contains("<script>"), "an inline script");
        // No handler attribute (` onclick=`...) and no style attribute: the CSP would refuse them.
        let inline = PAGE.split(|c: char| c.is_whitespace()).any(|word| {
            word.starts_with("style=")
                || (word.starts_with("on")
                    && word
                        .split_once('=')
                        .is_some_and(|(name, _)| name.chars().all(|c| c.is_ascii_alphabetic())))
        });
        assert!(!inline, "an inline handler or style attribute");
        assert!(!SCRIPT.contains("innerHTML") && !SCRIPT.contains("eval("));
        assert!(!SCRIPT.contains("document.cookie"));
    }
}
