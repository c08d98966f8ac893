//! The quota ledger: how much each provider budget has left, before a request is spent to find
//! out.
//!
//! A budget belongs to a **billing scope**, not to a key: keys that share an organization,
//! project or account (`scope:` on a key) share one budget, so two Groq keys of one
//! organization never count as twice the capacity. A key without `scope` is its own budget.
//!
//! Three sources are composed per window (rpm, rpd, tpm, tpd, tokens per month):
//! - **reported**: `x-ratelimit-remaining-*` of the provider's answers, as the filter reports
//!   them with each attempt; it stands for 2 minutes (or until the provider's reset);
//! - **mined**: a 429 or quota refusal says nothing is left until the time it named (its
//!   `retry-after`, the body's retry delay, or the end of the window); it stands 5 minutes;
//! - **estimated**: the ledger's own count of the attempts the control plane was told of,
//!   against the limit of the provider's `limits:` or of the bundled seed table.
//!
//! A reported or mined value is an anchor, not an overwrite: what is left now is the anchor's
//! figure less what was counted since. Attempts that never reached the provider (network
//! failures, timeouts) are not counted.
//!
//! The ledger is built from the reports the control plane already receives (a
//! [`ReportObserver`]); `GET /admin/ledger` and `ai-router ledger` show it.

pub mod count;
pub mod limits;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use ai_router_proto::v1 as pb;
use serde_json::{json, Value};

use crate::clock::Clock;
use crate::config::Config;
use crate::engine::{HeadroomSource, ReportObserver};
use ai_router_contract::kinds::RateLimitWindow;
use count::{Counter, Headroom, Source};
use limits::{Limits, Window};

/// One provider's budgets.
#[derive(Debug)]
struct ProviderLedger {
    kind: &'static str,
    limits: Limits,
    /// Key alias to its billing scope.
    scope_of: BTreeMap<String, String>,
    /// Scope to its keys, in configuration order.
    keys_of: BTreeMap<String, Vec<String>>,
    counters: BTreeMap<String, Counter>,
    models: usize,
}

/// The ledger's providers for `config`, taking the counters of `kept` ((provider, scope) ->
/// counter) where a scope carries over.
fn providers_of(
    config: &Config,
    kept: &mut BTreeMap<(String, String), Counter>,
) -> BTreeMap<String, ProviderLedger> {
    let mut providers = BTreeMap::new();
    for p in &config.providers {
        let limits = Limits::resolve(p.kind.as_str(), p.limits.as_ref(), &p.facts);
        let mut scope_of = BTreeMap::new();
        let mut keys_of: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for k in &p.keys {
            let scope = k.scope.clone().unwrap_or_else(|| k.alias.clone());
            keys_of
                .entry(scope.clone())
                .or_default()
                .push(k.alias.clone());
            scope_of.insert(k.alias.clone(), scope);
        }
        let counters = keys_of
            .keys()
            .map(|s| {
                let counter = kept
                    .remove(&(p.id.clone(), s.clone()))
                    .unwrap_or_else(|| Counter::new(limits.day_reset));
                (s.clone(), counter)
            })
            .collect();
        providers.insert(
            p.id.clone(),
            ProviderLedger {
                kind: p.kind.as_str(),
                limits,
                scope_of,
                keys_of,
                counters,
                models: p.models.len(),
            },
        );
    }
    providers
}

/// See the module documentation.
pub struct Ledger {
    clock: Arc<dyn Clock>,
    providers: Mutex<BTreeMap<String, ProviderLedger>>,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger").finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Ledger {
    pub fn new(config: &Config, clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            providers: Mutex::new(providers_of(config, &mut BTreeMap::new())),
        }
    }

    /// Takes a reloaded pool: its providers, keys, scopes and limits. A budget the new pool
    /// still has (same provider, same scope) keeps its counts and anchors; the others start
    /// empty or go.
    pub fn reconfigure(&self, config: &Config) {
        let mut providers = lock(&self.providers);
        let mut kept: BTreeMap<(String, String), Counter> = BTreeMap::new();
        for (id, p) in std::mem::take(&mut *providers) {
            for (scope, counter) in p.counters {
                kept.insert((id.clone(), scope), counter);
            }
        }
        *providers = providers_of(config, &mut kept);
    }

    /// Counts one attempt and takes what it says of the provider's limits.
    fn record(&self, a: &pb::AttemptOutcome) {
        let class = a.error_class();
        // Never reached the provider: its counters did not move.
        if matches!(class, pb::ErrorClass::Network | pb::ErrorClass::Timeout) {
            return;
        }
        let now = self.clock.now_ms();
        let at = if a.at_ms > 0 { a.at_ms.min(now) } else { now };
        let mut providers = lock(&self.providers);
        let Some(p) = providers.get_mut(&a.provider) else {
            return;
        };
        let Some(scope) = p.scope_of.get(&a.key) else {
            return;
        };
        let Some(counter) = p.counters.get_mut(scope) else {
            return;
        };
        let tokens = a
            .usage
            .as_ref()
            .map_or(0, |u| u.prompt_tokens.saturating_add(u.completion_tokens));
        counter.add(at, 1, tokens);
        let requests_window = match p.limits.requests_window {
            RateLimitWindow::Minute => Window::Rpm,
            RateLimitWindow::Day => Window::Rpd,
        };
        let tokens_window = match p.limits.tokens_window {
            RateLimitWindow::Minute => Window::Tpm,
            RateLimitWindow::Day => Window::Tpd,
        };
        let reset = a.ratelimit_reset_at_ms.max(0);
        if a.remaining_requests >= 0 {
            counter.anchor(
                requests_window,
                a.remaining_requests.unsigned_abs(),
                reset,
                Source::Reported,
                now,
            );
        }
        if a.remaining_tokens >= 0 {
            counter.anchor(
                tokens_window,
                a.remaining_tokens.unsigned_abs(),
                reset,
                Source::Reported,
                now,
            );
        }
        match class {
            // A per-minute refusal, unless the wait it names is longer than a minute.
            pb::ErrorClass::RateLimit => {
                let long = a.retry_at_ms > 0 && a.retry_at_ms - now > 60_000;
                let window = if long { Window::Rpd } else { Window::Rpm };
                let until = if a.retry_at_ms > 0 {
                    a.retry_at_ms
                } else {
                    now + 60_000
                };
                counter.anchor(window, 0, until, Source::Mined, now);
            }
            pb::ErrorClass::Quota => {
                counter.anchor(Window::Rpd, 0, a.retry_at_ms.max(0), Source::Mined, now);
            }
            _ => {}
        }
    }

    /// The ledger as `GET /admin/ledger` shows it; `snapshot` says which keys are out.
    pub fn view(&self, snapshot: &pb::Snapshot) -> Value {
        let now = self.clock.now_ms();
        let mut providers = lock(&self.providers);
        let out: Vec<Value> = providers
            .iter_mut()
            .map(|(id, p)| provider_view(id, p, snapshot, now))
            .collect();
        let families = family_view(snapshot, &out);
        json!({
            "atMs": now,
            "seedsChecked": limits::seeds_checked(),
            "providers": out,
            "families": families,
        })
    }
}

/// Per model family: the routes (provider x model) serving it and how many of them are live
/// (a billing scope of the provider still healthy, the provider itself not out).
fn family_view(snapshot: &pb::Snapshot, providers: &[Value]) -> Vec<Value> {
    let mut families: BTreeMap<&str, (usize, usize, Vec<&str>)> = BTreeMap::new();
    for p in &snapshot.providers {
        let live = providers
            .iter()
            .find(|v| v["provider"] == p.id.as_str())
            .and_then(|v| v["scopes"].as_array())
            .is_some_and(|scopes| scopes.iter().any(|s| s["state"] == "healthy"));
        for m in &p.models {
            let family = if m.family.is_empty() {
                &m.id
            } else {
                &m.family
            };
            let entry = families.entry(family).or_default();
            entry.0 += 1;
            if live {
                entry.1 += 1;
            }
            if !entry.2.contains(&p.id.as_str()) {
                entry.2.push(&p.id);
            }
        }
    }
    families
        .into_iter()
        .map(|(family, (routes, live, providers))| {
            json!({ "family": family, "routes": routes, "live": live, "providers": providers })
        })
        .collect()
}

/// What the ledger pushes to the filter: per billing scope, what its local count leaves of the
/// known limits (the `estimated` source only: providers' own figures are pushed per model by
/// the engine, 429s act as cooldowns). Model empty: the whole scope; the filter's reservations
/// count every send of the scope against it.
impl HeadroomSource for Ledger {
    fn headroom(&self, now_ms: i64) -> Vec<pb::Headroom> {
        let mut out = Vec::new();
        let mut providers = lock(&self.providers);
        for (id, p) in providers.iter_mut() {
            for (scope, keys) in &p.keys_of {
                let (Some(counter), Some(first)) = (p.counters.get_mut(scope), keys.first()) else {
                    continue;
                };
                let mut requests: Option<(u64, i64)> = None;
                let mut tokens: Option<(u64, i64)> = None;
                for window in Window::ALL {
                    let Some((limit, _)) = p.limits.limit(window) else {
                        continue;
                    };
                    let Some(h) = counter.headroom(window, Some(limit), now_ms) else {
                        continue;
                    };
                    if h.source != Source::Estimated {
                        continue;
                    }
                    let slot = if window.counts_tokens() {
                        &mut tokens
                    } else {
                        &mut requests
                    };
                    if slot.is_none_or(|(r, _)| h.remaining < r) {
                        *slot = Some((h.remaining, h.resets_at_ms));
                    }
                }
                if requests.is_none() && tokens.is_none() {
                    continue;
                }
                let figure = |v: Option<(u64, i64)>| {
                    v.map_or(-1, |(r, _)| i64::try_from(r).unwrap_or(i64::MAX))
                };
                // Valid until the binding window ends; a minute at least, so that a figure
                // with room left stays until the next push.
                let reset_at_ms = [requests, tokens]
                    .into_iter()
                    .flatten()
                    .filter(|(r, _)| *r == 0)
                    .map(|(_, at)| at)
                    .max()
                    .unwrap_or(now_ms + 60_000)
                    .max(now_ms + 1_000);
                let shared = keys.len() > 1 || scope != first;
                out.push(pb::Headroom {
                    provider: id.clone(),
                    key: first.clone(),
                    model: String::new(),
                    remaining_requests: figure(requests),
                    remaining_tokens: figure(tokens),
                    reset_at_ms,
                    scope: if shared { scope.clone() } else { String::new() },
                    as_of_ms: now_ms,
                });
            }
        }
        out
    }
}

impl ReportObserver for Ledger {
    fn observe(&self, batch: &pb::ReportBatch) {
        for a in &batch.attempts {
            self.record(a);
        }
    }
}

fn headroom_json(h: Option<Headroom>) -> Value {
    match h {
        Some(h) => json!({
            "remaining": h.remaining,
            "source": h.source.name(),
            "ageMs": h.age_ms,
            "resetsAtMs": h.resets_at_ms,
        }),
        None => json!({ "remaining": null, "source": "unknown" }),
    }
}

fn provider_view(id: &str, p: &mut ProviderLedger, snapshot: &pb::Snapshot, now: i64) -> Value {
    let provider_out = snapshot
        .provider_health
        .iter()
        .find(|h| h.provider == id && h.until_ms > now);
    let mut scopes = Vec::new();
    for (scope, keys) in &p.keys_of {
        let Some(counter) = p.counters.get_mut(scope) else {
            continue;
        };
        let mut windows = serde_json::Map::new();
        let mut spent_until: Option<i64> = None;
        for window in Window::ALL {
            let limit = p.limits.limit(window);
            let used = counter.count(window, now);
            let headroom = counter.headroom(window, limit.map(|(l, _)| l), now);
            if let Some(h) = headroom.filter(|h| h.remaining == 0) {
                spent_until = Some(spent_until.map_or(h.resets_at_ms, |u| u.max(h.resets_at_ms)));
            }
            let mut entry = headroom_json(headroom);
            entry["used"] = json!(used);
            entry["limit"] = json!(limit.map(|(l, _)| l));
            entry["limitSource"] = json!(limit.map(|(_, s)| s.name()));
            windows.insert(window.name().to_owned(), entry);
        }
        let out: Vec<&pb::KeyHealth> = keys
            .iter()
            .filter_map(|alias| {
                snapshot.key_health.iter().find(|h| {
                    h.provider == id && h.key == *alias && (h.until_ms == 0 || h.until_ms > now)
                })
            })
            .collect();
        let key_states: Vec<Value> = keys
            .iter()
            .map(|alias| {
                let h = out.iter().find(|h| h.key == *alias);
                json!({
                    "alias": alias,
                    "state": h.map_or("ok", |h| h.reason().text()),
                    "untilMs": h.map(|h| h.until_ms),
                })
            })
            .collect();
        let all_out = !keys.is_empty() && out.len() == keys.len();
        let (state, until, reason) = if let Some(h) = provider_out {
            ("exhausted", Some(h.until_ms), Some(h.reason().text()))
        } else if all_out {
            let quota = out.iter().all(|h| h.reason() == pb::KeyOutReason::Quota);
            let until = out.iter().map(|h| h.until_ms).max();
            if quota {
                ("exhausted", until, Some("quota"))
            } else {
                let reason = out
                    .iter()
                    .find(|h| h.reason() != pb::KeyOutReason::Quota)
                    .map(|h| h.reason().text());
                ("disabled", until.filter(|u| *u > 0), reason)
            }
        } else if let Some(u) = spent_until {
            ("exhausted", Some(u), Some("no_headroom"))
        } else {
            ("healthy", None, None)
        };
        scopes.push(json!({
            "scope": scope,
            "keys": key_states,
            "state": state,
            "untilMs": until,
            "reason": reason,
            "windows": windows,
        }));
    }
    json!({
        "provider": id,
        "kind": p.kind,
        "billingScope": p.limits.scope,
        "models": p.models,
        "scopes": scopes,
    })
}

#[cfg(test)]
mod tests;
