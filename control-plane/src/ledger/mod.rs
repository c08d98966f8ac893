//! The quota ledger: how much each provider budget has left, before a request is spent to find
//! out.
//!
//! A budget belongs to a **billing scope**, not to a key: keys that share an organization,
//! project or account (`scope:` on a key) share one budget, so two Groq keys of one
//! organization never count as twice the capacity. A key without `scope` is its own budget.
//!
//! Three sources are composed per window (rpm, rpd, tpm, tpd, tokens per month):
//! - **reported**: `x-ratelimit-remaining-*` of the provider's answers, as the filter reports
//!   them with each attempt; it stands for 2 minutes (the pool's `ledger.reportedTtlMs`), or
//!   until the provider's reset. For
//!   OpenRouter keys also the credit `GET {baseUrl}/key` reports ([`key_poll`], every minute
//!   and soon after a 402 or 429): a scope whose credit is spent is exhausted, and pushed to
//!   the filter as having no request left, until an answer says otherwise;
//! - **mined**: a 429 or quota refusal says nothing is left until the time it named (its
//!   `retry-after`, the body's retry delay, or the end of the window); it stands 5 minutes
//!   (`ledger.minedTtlMs`);
//! - **estimated**: the ledger's own count of the attempts the control plane was told of,
//!   against the limit of the provider's `limits:` or of the bundled seed table.
//!
//! A reported or mined value is an anchor, not an overwrite: what is left now is the anchor's
//! figure less what was counted since. Attempts that never reached the provider (network
//! failures, timeouts) are not counted.
//!
//! The ledger is built from the reports the control plane already receives (a
//! [`ReportObserver`]); `GET /admin/ledger` and `ai-router ledger` show it, with what the
//! discovery of `discover: true` providers found per key (how many models, listed when).

pub mod count;
pub mod credit;
pub mod key_poll;
pub mod limits;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use ai_router_proto::v1 as pb;
use serde_json::{json, Value};

use crate::clock::Clock;
use crate::config::Config;
use crate::engine::discovered::Listings;
use crate::engine::{HeadroomSource, ReportObserver};
use ai_router_contract::kinds::RateLimitWindow;
use count::{AnchorLifetimes, Counter, Headroom, Source};
use credit::{KeyCredit, KeyPoll};
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
    /// Per scope: the credit its provider last reported, and when.
    credits: BTreeMap<String, (KeyCredit, i64)>,
    /// Keys whose credit is asked for (OpenRouter's), by alias.
    polls: BTreeMap<String, KeyPoll>,
    /// The pool's `ledger:`: how long reported and mined figures stand.
    lifetimes: AnchorLifetimes,
}

impl ProviderLedger {
    /// The credit of `scope` while it is fresh.
    fn credit(&self, scope: &str, now_ms: i64) -> Option<(&KeyCredit, i64)> {
        self.credits
            .get(scope)
            .filter(|(_, at)| now_ms < at + self.lifetimes.reported_ms)
            .map(|(c, at)| (c, *at))
    }

    /// When a spent credit is asked about again: the earliest next ask of the scope's keys.
    fn next_poll(&self, scope: &str) -> Option<i64> {
        self.keys_of
            .get(scope)?
            .iter()
            .filter_map(|k| self.polls.get(k))
            .map(|p| p.due_ms)
            .min()
    }
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
                let mut counter = kept
                    .remove(&(p.id.clone(), s.clone()))
                    .unwrap_or_else(|| Counter::new(limits.day_reset, config.ledger));
                counter.set_lifetimes(config.ledger);
                (s.clone(), counter)
            })
            .collect();
        let polls = if p.kind == crate::config::ProviderKind::Openrouter {
            p.keys
                .iter()
                .map(|k| (k.alias.clone(), KeyPoll::default()))
                .collect()
        } else {
            BTreeMap::new()
        };
        providers.insert(
            p.id.clone(),
            ProviderLedger {
                kind: p.kind.as_str(),
                limits,
                scope_of,
                keys_of,
                counters,
                models: p.models.len(),
                credits: BTreeMap::new(),
                polls,
                lifetimes: config.ledger,
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

    /// The keys whose credit is due to be asked for, as (provider, key alias), marked asked.
    pub fn key_polls_due(&self) -> Vec<(String, String)> {
        let now = self.clock.now_ms();
        let mut providers = lock(&self.providers);
        let mut due = Vec::new();
        for (id, p) in providers.iter_mut() {
            for (alias, poll) in &mut p.polls {
                if poll.take(now) {
                    due.push((id.clone(), alias.clone()));
                }
            }
        }
        due
    }

    /// What asking `provider`/`alias` for its credit gave (`None`: the ask failed, the last
    /// figure ages out).
    pub fn key_polled(&self, provider: &str, alias: &str, credit: Option<KeyCredit>) {
        let now = self.clock.now_ms();
        let mut providers = lock(&self.providers);
        let Some(p) = providers.get_mut(provider) else {
            return;
        };
        if let Some(poll) = p.polls.get_mut(alias) {
            poll.done(now);
        }
        if let (Some(credit), Some(scope)) = (credit, p.scope_of.get(alias).cloned()) {
            p.credits.insert(scope, (credit, now));
        }
    }

    /// Counts one attempt and takes what it says of the provider's limits.
    fn record(&self, a: &pb::AttemptOutcome) {
        let class = a.error_class();
        // Never reached the provider: its counters did not move.
        if matches!(class, pb::ErrorClass::Network | pb::ErrorClass::Timeout) {
            return;
        }
        let now = self.clock.now_ms();
        // Counted when it was sent (its reservation in the filter), as the filter counts it.
        let latency = i64::try_from(a.latency_ms).unwrap_or(0);
        let at = if a.at_ms > 0 {
            a.at_ms.min(now).saturating_sub(latency)
        } else {
            now
        };
        let mut providers = lock(&self.providers);
        let Some(p) = providers.get_mut(&a.provider) else {
            return;
        };
        // A refusal may mean the credit ran out: ask the provider soon.
        if matches!(class, pb::ErrorClass::RateLimit | pb::ErrorClass::Quota) {
            if let Some(poll) = p.polls.get_mut(&a.key) {
                poll.soon(now);
            }
        }
        let Some(scope) = p.scope_of.get(&a.key) else {
            return;
        };
        let Some(counter) = p.counters.get_mut(scope) else {
            return;
        };
        let tokens = a.tokens();
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

    /// The ledger as `GET /admin/ledger` shows it; `snapshot` says which keys are out,
    /// `listings` what discovery found per key.
    pub fn view(&self, snapshot: &pb::Snapshot, listings: &Listings) -> Value {
        let now = self.clock.now_ms();
        let mut providers = lock(&self.providers);
        let out: Vec<Value> = providers
            .iter_mut()
            .map(|(id, p)| provider_view(id, p, snapshot, listings, now))
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
///
/// A figure is as of [`ai_router_contract::ledger::estimate_as_of`] and counts the attempts
/// sent before that instant; the filter counts its own sends from it on. So an attempt is
/// counted once: not twice when its report arrived in the same moment as the next figure, and
/// not never when the figure was computed while its report was on its way.
impl HeadroomSource for Ledger {
    fn headroom(&self, now_ms: i64) -> Vec<pb::Headroom> {
        let as_of_ms = ai_router_contract::ledger::estimate_as_of(now_ms);
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
                    let Some((remaining, resets_at_ms)) =
                        counter.estimate(window, limit, as_of_ms, now_ms)
                    else {
                        continue;
                    };
                    let slot = if window.counts_tokens() {
                        &mut tokens
                    } else {
                        &mut requests
                    };
                    if slot.is_none_or(|(r, _)| remaining < r) {
                        *slot = Some((remaining, resets_at_ms));
                    }
                }
                // A spent credit: no request until an answer says otherwise.
                let spent = p.credit(scope, now_ms).is_some_and(|(c, _)| c.spent());
                if spent {
                    let until = p.next_poll(scope).unwrap_or(now_ms) + credit::POLL_INTERVAL_MS;
                    requests = Some((0, until));
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
                    as_of_ms,
                    spent,
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

/// What discovery found for one key: `null` figures when the provider does not discover or
/// the key was never listed.
fn discovered_json(listings: &Listings, provider: &str, alias: &str) -> (Value, Value) {
    let listing = listings.get(&(provider.to_owned(), alias.to_owned()));
    let count = listing.and_then(|l| l.models.as_ref()).map(Vec::len);
    let at = listing
        .map(|l| l.listed_at_ms)
        .filter(|at| *at > 0 && count.is_some());
    (json!(count), json!(at))
}

fn provider_view(
    id: &str,
    p: &mut ProviderLedger,
    snapshot: &pb::Snapshot,
    listings: &Listings,
    now: i64,
) -> Value {
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
                let (discovered, listed_at) = discovered_json(listings, id, alias);
                json!({
                    "alias": alias,
                    "state": h.map_or("ok", |h| h.reason().text()),
                    "untilMs": h.and_then(|h| h.until()),
                    "discoveredModels": discovered,
                    "listedAtMs": listed_at,
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
        } else if let Some((_, _)) = p.credit(scope, now).filter(|(c, _)| c.spent()) {
            ("exhausted", p.next_poll(scope), Some("no_credit"))
        } else if let Some(u) = spent_until {
            ("exhausted", Some(u), Some("no_headroom"))
        } else {
            ("healthy", None, None)
        };
        let credit = p.credit(scope, now).map(|(c, at)| {
            json!({
                "limit": c.limit,
                "usage": c.usage,
                "remaining": c.remaining,
                "freeTier": c.free_tier,
                "source": Source::Reported.name(),
                "ageMs": now - at,
            })
        });
        scopes.push(json!({
            "scope": scope,
            "keys": key_states,
            "state": state,
            "untilMs": until,
            "reason": reason,
            "windows": windows,
            "credit": credit,
        }));
    }
    // The distinct models the provider's keys listed (`null`: none was listed).
    let mut found: Option<std::collections::BTreeSet<&str>> = None;
    for ((provider, _), l) in listings.range((id.to_owned(), String::new())..) {
        if provider != id {
            break;
        }
        if let Some(models) = &l.models {
            found
                .get_or_insert_with(Default::default)
                .extend(models.iter().map(String::as_str));
        }
    }
    json!({
        "provider": id,
        "kind": p.kind,
        "billingScope": p.limits.scope,
        "models": p.models,
        "discoveredModels": found.map(|f| f.len()),
        "scopes": scopes,
    })
}

#[cfg(test)]
mod tests;
