//! The pool as callers see it (`GET /admin/catalog`, gRPC `Catalog`): profiles, models, routes,
//! discovery listings and the response cache. No secret.

use std::sync::Arc;

use ai_router_proto::v1 as pb;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Extension;
use serde_json::{json, Value};

use super::auth::Caller;
use super::http::{ok, Answer};
use super::state::AdminApi;
use crate::config::Config;
use crate::engine::Engine;
use ai_router_proto::tables::Tables;

impl AdminApi {
    /// The pool as callers see it: profiles (their model, fallbacks and candidates after the
    /// defaults) and models (ids, aliases, which providers serve them, capabilities, cost,
    /// whether configured or discovered and which key aliases reach them), and each
    /// discovering key's listing. No secret.
    pub fn catalog(&self) -> Value {
        let tables = self.engine.tables();
        let config = self.engine.config();
        let settings = &tables.settings;
        let defaults = settings.defaults.clone().unwrap_or_default();
        let view = |p: &pb::Policy| policy(p, &defaults, &config);
        let profiles: Vec<Value> = settings
            .profiles
            .iter()
            .map(|(name, p)| {
                let mut v = view(p);
                v["name"] = json!(name);
                v
            })
            .collect();
        let models = models(&tables, &config);
        let discovery = listings(&self.engine);
        let routes = routes(settings);
        json!({
            "defaults": view(&defaults),
            "profiles": profiles,
            "models": models,
            "routes": routes,
            "autoPrice": config.auto_price,
            "discovery": discovery,
            "cache": config.cache.map(|c| json!({
                "ttlMs": c.ttl_ms, "maxEntries": c.max_entries, "maxBytes": c.max_bytes,
            })),
        })
    }
}

/// A policy as the catalog shows it: its own settings, else the pool's defaults.
fn policy(p: &pb::Policy, defaults: &pb::Policy, config: &Config) -> Value {
    let list = |name: pb::PolicyList, own: &[String], inherited: &[String]| {
        if p.set_lists().any(|s| s == name) {
            own.to_vec()
        } else {
            inherited.to_vec()
        }
    };
    json!({
        "model": p.model.clone().or_else(|| defaults.model.clone()),
        "fallbacks": list(pb::PolicyList::Fallbacks, &p.fallbacks, &defaults.fallbacks),
        "providers": list(pb::PolicyList::Providers, &p.providers, &defaults.providers),
        "require": list(
            pb::PolicyList::Require,
            &capabilities(p.require()),
            &capabilities(defaults.require()),
        ),
        "candidates": p.candidates.iter().map(|t| t.candidates.iter().map(|c| json!({
            "model": c.model,
            "provider": (!c.provider.is_empty()).then_some(&c.provider),
            "weight": c.weight,
            "when": c.when().map(|w| w.text()).collect::<Vec<_>>(),
        })).collect::<Vec<_>>()).collect::<Vec<_>>(),
        "autoSort": p.auto_sort.or(defaults.auto_sort).unwrap_or(false),
        "resetIntervalMs": p.reset_interval_ms.or(defaults.reset_interval_ms),
        // The response cache for the policy's calls (with the pool's `cache`).
        "cache": config.cache.is_some() && p.cache.or(defaults.cache).unwrap_or(true),
        "allowFallback": p.allow_fallback.or(defaults.allow_fallback).unwrap_or(true),
        "maxAttempts": p.max_attempts.or(defaults.max_attempts),
        "timeoutMs": p.timeout_ms.or(defaults.timeout_ms),
        "deadlineMs": p.deadline_ms.or(defaults.deadline_ms),
    })
}

/// Every model: its ids and aliases, and each provider serving it (where its price came from,
/// which key aliases reach it, capabilities, cost).
fn models(tables: &Tables, config: &Config) -> Vec<Value> {
    let mut models: std::collections::BTreeMap<&str, (Vec<&str>, Vec<Value>)> =
        std::collections::BTreeMap::new();
    for p in &tables.providers {
        for m in &p.models {
            let entry = models.entry(m.id.as_str()).or_default();
            for a in &m.aliases {
                if !entry.0.contains(&a.as_str()) {
                    entry.0.push(a);
                }
            }
            // Where the price came from: the pool's own `cost`, the price table
            // (`autoPrice`), or nowhere ("unpriced").
            let priced = if m.discovered {
                // Only the price table prices a discovered model (`autoPrice`).
                let source = match m.cost {
                    Some(_) => crate::config::prices::PriceSource::Table,
                    None => crate::config::prices::PriceSource::Unpriced,
                };
                source.as_str()
            } else {
                config
                    .providers
                    .iter()
                    .find(|cp| cp.id == p.id)
                    .and_then(|cp| cp.price_sources.get(&m.id))
                    .map_or("unpriced", |s| s.as_str())
            };
            entry.1.push(json!({
                "provider": p.id,
                // In the configuration, or found in a key's catalog (`discover: true`).
                "source": if m.discovered { "discovered" } else { "configured" },
                // The key aliases that reach it (a discovering provider's listed keys
                // reach only what their catalog lists).
                "keys": p.keys.iter().filter(|k| k.reaches(m)).map(|k| &k.alias).collect::<Vec<_>>(),
                "priced": priced,
                "kind": p.kind().text(),
                "contextWindow": (m.context_window > 0).then_some(m.context_window),
                "capabilities": capabilities(m.capabilities()),
                "cost": m.cost.map(|c| json!({ "input": c.input, "output": c.output })),
                "dimensions": (m.dimensions > 0).then_some(m.dimensions),
                "weight": m.weight,
            }));
        }
    }
    let models: Vec<Value> = models
        .into_iter()
        .map(|(id, (aliases, served))| {
            let configured = served.iter().any(|s| s["source"] == "configured");
            json!({
                "id": id,
                "aliases": aliases,
                "source": if configured { "configured" } else { "discovered" },
                "servedBy": served,
            })
        })
        .collect();
    models
}

/// Each discovering key's listing.
fn listings(engine: &Engine) -> Vec<Value> {
    engine
        .listings()
        .into_iter()
        .map(|((provider, key), l)| {
            json!({
                "provider": provider,
                "key": key,
                "listed": l.models.is_some(),
                "models": l.models.as_ref().map_or(0, Vec::len),
                "listedAtMs": (l.listed_at_ms > 0).then_some(l.listed_at_ms),
                "nextListingAtMs": l.due_ms,
                "error": l.error,
            })
        })
        .collect()
}

/// The routing rules in the order they are tried: highest priority first.
fn routes(settings: &pb::Settings) -> Vec<Value> {
    // The rules in the order they are tried: highest priority first.
    let mut routes: Vec<&pb::RouteRule> = settings.routes.iter().collect();
    routes.sort_by_key(|r| std::cmp::Reverse(r.priority));
    routes
        .iter()
        .map(|r| {
            json!({
                "name": r.name,
                "priority": r.priority,
                "enabled": r.enabled,
                "match": {
                    "taskType": r.task_type,
                    "userTier": r.user_tier,
                    "feature": r.feature,
                },
                "target": { "profile": r.profile },
            })
        })
        .collect()
}

/// Capabilities as the catalog shows them ("chat", ...).
fn capabilities(list: impl Iterator<Item = pb::Capability>) -> Vec<String> {
    list.map(|c| c.text().to_owned()).collect()
}

/// `GET /admin/catalog`: the pool's profiles and models, with no key.
pub(super) async fn catalog(
    State(api): State<Arc<AdminApi>>,
    Extension(_caller): Extension<Caller>,
) -> Answer {
    ok(StatusCode::OK, api.catalog())
}
