//! Discovered models (`discover: true` on a provider): each key's listed catalog, when it is
//! listed again, and what the snapshot says of it.
//!
//! The listing itself (`GET {baseUrl}/models` per kind) is `crate::discovery`, a background
//! task that asks the engine which keys are due ([`due`]) and hands back what it found
//! ([`finish`]). This module keeps, per key, the model ids its last good listing named and
//! the fingerprint of the secret it was made with (another secret lists again from nothing),
//! and schedules: a key is listed at start, again after `discoveryTtlMs`, after a failure
//! within [`FAILED_RETRY_MS`] (its last good listing still serves meanwhile), and soon after an
//! attempt through it was answered "model not found" ([`note_attempt`], at most once per
//! [`RELIST_AFTER_MS`]).
//!
//! What the data plane gets ([`publish_provider`]): every listed key carries `listed` and its
//! sorted ids; models no configuration names are added to the provider with default settings
//! and `discovered: true`. Configured models keep their settings. `ProviderKey::reaches` is
//! the rule both sides apply. Listings live in memory: a restart lists every key again.

use std::collections::{BTreeMap, BTreeSet};

use ai_router_proto::v1 as pb;

use crate::config::catalog::family_of;
use crate::config::secrets::Secret;
use crate::config::{Config, Endpoint, ModelConfig, Provider, ProviderKind};
use crate::store::durable::KeyId;

/// A failed listing is tried again this long after (or after the TTL, when that is shorter).
pub const FAILED_RETRY_MS: i64 = 60_000;
/// A "model not found" answer lists the key again, but not sooner than this after its last
/// listing: a burst of such answers costs one listing.
pub const RELIST_AFTER_MS: i64 = 5_000;

/// One key's catalog as the engine knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyListing {
    /// The model ids of the last good listing, sorted; `None`: never listed (since start or
    /// since its secret changed).
    pub models: Option<Vec<String>>,
    /// The secret the listing is for.
    pub fingerprint: u64,
    /// When the last good listing ended (0: never).
    pub listed_at_ms: i64,
    /// When the last listing, good or not, was made (0: never).
    pub tried_at_ms: i64,
    /// When the key is listed next.
    pub due_ms: i64,
    /// A listing is under way.
    pub in_flight: bool,
    /// Why the last listing failed (no secret in it); `None` after a good one.
    pub error: Option<String>,
}

impl KeyListing {
    fn fresh(fingerprint: u64) -> Self {
        Self {
            models: None,
            fingerprint,
            listed_at_ms: 0,
            tried_at_ms: 0,
            due_ms: 0,
            in_flight: false,
            error: None,
        }
    }
}

/// Every discovering key's listing, by (provider, key alias).
pub type Listings = BTreeMap<KeyId, KeyListing>;

/// A listing to make: where, with which key.
#[derive(Debug, Clone)]
pub struct ListingJob {
    pub provider: String,
    pub key: String,
    pub kind: ProviderKind,
    pub endpoint: Endpoint,
    /// The provider's own extra headers (never a secret: the config refuses those).
    pub headers: Vec<(String, String)>,
    pub secret: Secret,
    pub fingerprint: u64,
}

/// The keys due for a listing now, marked in flight, and whether the published state
/// changed (a key whose secret changed lost its old listing).
pub fn due(
    listings: &mut Listings,
    config: &Config,
    secrets: &BTreeMap<KeyId, Option<Secret>>,
    now_ms: i64,
) -> (Vec<ListingJob>, bool) {
    let mut jobs = Vec::new();
    let mut changed = false;
    for provider in config.providers.iter().filter(|p| p.discover.is_some()) {
        for key in &provider.keys {
            let id = (provider.id.clone(), key.alias.clone());
            // A key without a secret has nothing to list with.
            let Some(Some(secret)) = secrets.get(&id) else {
                continue;
            };
            let fingerprint = secret.fingerprint();
            let entry = listings
                .entry(id)
                .or_insert_with(|| KeyListing::fresh(fingerprint));
            if entry.fingerprint != fingerprint {
                // Another secret may reach other models: list it from nothing.
                changed |= entry.models.is_some();
                *entry = KeyListing {
                    in_flight: entry.in_flight,
                    ..KeyListing::fresh(fingerprint)
                };
            }
            if entry.in_flight || entry.due_ms > now_ms {
                continue;
            }
            entry.in_flight = true;
            jobs.push(ListingJob {
                provider: provider.id.clone(),
                key: key.alias.clone(),
                kind: provider.kind,
                endpoint: provider.endpoint.clone(),
                headers: provider.headers.clone(),
                secret: secret.clone(),
                fingerprint,
            });
        }
    }
    (jobs, changed)
}

/// Takes a listing's result; returns whether the published state changed.
pub fn finish(
    listings: &mut Listings,
    config: &Config,
    job: &ListingJob,
    result: Result<Vec<String>, String>,
    now_ms: i64,
) -> bool {
    let Some(entry) = listings.get_mut(&(job.provider.clone(), job.key.clone())) else {
        return false;
    };
    entry.in_flight = false;
    if entry.fingerprint != job.fingerprint {
        // Made with a secret that has been replaced since: list the new one at once.
        entry.due_ms = now_ms;
        return false;
    }
    let Some(ttl) = ttl_of(config, &job.provider) else {
        return false;
    };
    entry.tried_at_ms = now_ms;
    match result {
        Ok(mut models) => {
            models.sort();
            models.dedup();
            let changed = entry.models.as_ref() != Some(&models);
            entry.models = Some(models);
            entry.listed_at_ms = now_ms;
            entry.due_ms = now_ms.saturating_add(ttl);
            entry.error = None;
            changed
        }
        Err(error) => {
            entry.due_ms = now_ms.saturating_add(ttl.min(FAILED_RETRY_MS));
            entry.error = Some(error);
            false
        }
    }
}

fn ttl_of(config: &Config, provider: &str) -> Option<i64> {
    let discover = config
        .providers
        .iter()
        .find(|p| p.id == provider)?
        .discover?;
    Some(i64::try_from(discover.ttl_ms).unwrap_or(i64::MAX))
}

/// Whether a failed attempt says the provider does not have the model (or not for this key):
/// a 404, or the provider's own code for it.
pub fn names_a_missing_model(attempt: &pb::AttemptOutcome) -> bool {
    attempt.outcome() == pb::AttemptResult::Error
        && (attempt.status == 404
            || matches!(
                attempt.provider_code.as_str(),
                "model_not_found" | "not_found_error"
            ))
}

/// A reported attempt: one answered "model not found" makes its key due for a listing (not
/// sooner than [`RELIST_AFTER_MS`] after the last one). Changes nothing published.
pub fn note_attempt(listings: &mut Listings, attempt: &pb::AttemptOutcome, now_ms: i64) -> bool {
    if !names_a_missing_model(attempt) {
        return false;
    }
    let Some(entry) = listings.get_mut(&(attempt.provider.clone(), attempt.key.clone())) else {
        return false;
    };
    let when = now_ms.max(entry.tried_at_ms.saturating_add(RELIST_AFTER_MS));
    let sooner = when < entry.due_ms;
    if sooner {
        entry.due_ms = when;
        tracing::info!(
            provider = %attempt.provider,
            key = %attempt.key,
            model = %attempt.model,
            "a provider answered model not found: listing the key's models again"
        );
    }
    sooner
}

/// Drops the listings of keys the pool (after a reload) no longer discovers with.
pub fn retain(listings: &mut Listings, config: &Config) {
    let kept: BTreeSet<(&str, &str)> = config
        .providers
        .iter()
        .filter(|p| p.discover.is_some())
        .flat_map(|p| {
            p.keys
                .iter()
                .map(move |k| (p.id.as_str(), k.alias.as_str()))
        })
        .collect();
    listings.retain(|(provider, key), _| kept.contains(&(provider.as_str(), key.as_str())));
}

/// A configured model as the snapshot carries it.
pub fn model_to_proto(m: &ModelConfig) -> pb::Model {
    let family = family_of(m);
    pb::Model {
        id: m.id.clone(),
        aliases: m.aliases.clone(),
        context_window: m.context_window.unwrap_or(0),
        cost: m.cost.map(|c| pb::Cost {
            input: c.input,
            output: c.output,
            cached_input: c.cached_input,
        }),
        capabilities: m
            .capabilities()
            .iter()
            .map(|c| pb::Capability::from(*c).into())
            .collect(),
        weight: m.weight.unwrap_or(1.0),
        identity: m.identity().to_owned(),
        dimensions: m.dimensions.unwrap_or(0),
        family: family.name,
        family_rank: family.rank,
        discovered: false,
    }
}

/// A model only a catalog names: the defaults of a model configured with its id alone (no
/// context window, the default capabilities, its family from the bundled table), priced from
/// the price table with `autoPrice` (`Provider::cost_of`), else unpriced.
fn discovered_model(provider: &Provider, id: &str, auto_price: bool) -> pb::Model {
    let config = ModelConfig {
        cost: provider.cost_of(id, auto_price),
        ..ModelConfig::with_id(id)
    };
    pb::Model {
        discovered: true,
        ..model_to_proto(&config)
    }
}

/// The provider as published, with its keys' listings and the models only they name.
pub fn publish_provider(
    mut published: pb::Provider,
    provider: &Provider,
    listings: &Listings,
    auto_price: bool,
) -> pb::Provider {
    if provider.discover.is_none() {
        return published;
    }
    let mut found: BTreeSet<&str> = BTreeSet::new();
    for key in &mut published.keys {
        let listing = listings
            .get(&(provider.id.clone(), key.alias.clone()))
            .filter(|l| l.fingerprint == key.fingerprint);
        if let Some(models) = listing.and_then(|l| l.models.as_ref()) {
            key.listed = true;
            key.models = models.clone();
            found.extend(models.iter().map(String::as_str));
        }
    }
    let configured: BTreeSet<String> = published.models.iter().map(|m| m.id.clone()).collect();
    published.models.extend(
        found
            .into_iter()
            .filter(|id| !configured.contains(*id))
            .map(|id| discovered_model(provider, id, auto_price)),
    );
    published
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse;
    use crate::config::secrets::MapEnv;

    fn resolved(yaml: &str, env: &MapEnv) -> Config {
        parse(yaml)
            .and_then(|f| f.resolve(env, std::path::Path::new(".")))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn config(ttl: &str) -> Config {
        let env = MapEnv::new([("K_A", "sk-a"), ("K_B", "sk-b")]);
        let yaml = format!(
            "providers:\n  - id: p\n    kind: openai-compatible\n    baseUrl: http://127.0.0.1:9/v1\n    discover: true\n{ttl}    keys: [{{ alias: a, env: K_A }}, {{ alias: b, env: K_B }}]\n    models: [{{ id: m-conf, aliases: [chat] }}]\n"
        );
        resolved(&yaml, &env)
    }

    fn secrets(a: &str) -> BTreeMap<KeyId, Option<Secret>> {
        BTreeMap::from([
            (("p".into(), "a".into()), Some(Secret::new(a))),
            (("p".into(), "b".into()), Some(Secret::new("sk-b"))),
        ])
    }

    fn job_for<'a>(jobs: &'a [ListingJob], key: &str) -> &'a ListingJob {
        jobs.iter()
            .find(|j| j.key == key)
            .unwrap_or_else(|| panic!("no job for {key}"))
    }

    #[test]
    fn keys_are_listed_at_start_after_the_ttl_and_sooner_after_a_failure() {
        let config = config("    discoveryTtlMs: 600000\n");
        let mut listings = Listings::new();
        let (jobs, _) = due(&mut listings, &config, &secrets("sk-a"), 1_000);
        assert_eq!(jobs.len(), 2);
        // In flight: not handed out twice.
        assert!(due(&mut listings, &config, &secrets("sk-a"), 1_000)
            .0
            .is_empty());
        let a = job_for(&jobs, "a").clone();
        let b = job_for(&jobs, "b").clone();
        assert!(finish(
            &mut listings,
            &config,
            &a,
            Ok(vec!["m-z".into(), "m-conf".into(), "m-z".into()]),
            2_000
        ));
        assert!(!finish(
            &mut listings,
            &config,
            &b,
            Err("503".into()),
            2_000
        ));
        let la = &listings[&("p".into(), "a".into())];
        assert_eq!(
            la.models.clone(),
            Some(vec!["m-conf".to_owned(), "m-z".to_owned()])
        );
        assert_eq!(la.due_ms, 602_000);
        let lb = &listings[&("p".into(), "b".into())];
        assert_eq!(
            (lb.models.clone(), lb.due_ms),
            (None, 2_000 + FAILED_RETRY_MS)
        );
        assert_eq!(lb.error.as_deref(), Some("503"));
        // b again after the retry delay, a after the TTL.
        let (jobs, _) = due(
            &mut listings,
            &config,
            &secrets("sk-a"),
            2_000 + FAILED_RETRY_MS,
        );
        assert_eq!(
            jobs.iter().map(|j| j.key.as_str()).collect::<Vec<_>>(),
            ["b"]
        );
        let (jobs, _) = due(&mut listings, &config, &secrets("sk-a"), 602_000);
        assert_eq!(
            jobs.iter().map(|j| j.key.as_str()).collect::<Vec<_>>(),
            ["a"]
        );
        // The same listing again changes nothing published.
        assert!(!finish(
            &mut listings,
            &config,
            job_for(&jobs, "a"),
            Ok(vec!["m-conf".into(), "m-z".into()]),
            603_000
        ));
    }

    #[test]
    fn the_default_ttl_is_a_day() {
        let config = config("");
        assert_eq!(ttl_of(&config, "p"), Some(86_400_000));
    }

    #[test]
    fn the_config_checks_discovery_fields() {
        let env = MapEnv::new([("K_A", "sk-a")]);
        let provider = |extra: &str, models: &str| {
            format!(
                "providers:\n  - id: p\n    baseUrl: http://127.0.0.1:9/v1\n    keys: [{{ alias: a, env: K_A }}]\n{extra}{models}"
            )
        };
        let error = |yaml: String| {
            parse(&yaml)
                .and_then(|f| f.resolve(&env, std::path::Path::new(".")))
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        // A discovering provider needs no configured model.
        let config = resolved(&provider("    discover: true\n", ""), &env);
        assert!(config.providers[0].models.is_empty());
        assert!(error(provider("", "")).contains("needs at least one model"));
        assert!(error(provider(
            "    discoveryTtlMs: 5000\n",
            "    models: [{ id: m }]\n"
        ))
        .contains("only with discover: true"));
        assert!(
            error(provider("    discover: true\n    discoveryTtlMs: 10\n", ""))
                .contains("at least 1000")
        );
    }

    /// Every key due at `at`, key a's listing then answered `models`.
    fn list_a(listings: &mut Listings, config: &Config, models: &[&str], at: i64) {
        let (jobs, _) = due(listings, config, &secrets("sk-a"), at);
        let models = models.iter().map(|m| (*m).to_owned()).collect();
        finish(listings, config, job_for(&jobs, "a"), Ok(models), at + 10);
    }

    #[test]
    fn a_new_secret_forgets_the_old_listing() {
        let config = config("");
        let mut listings = Listings::new();
        list_a(&mut listings, &config, &["m-x"], 0);
        let (jobs, changed) = due(&mut listings, &config, &secrets("sk-a2"), 20);
        assert!(changed);
        assert_eq!(listings[&("p".into(), "a".into())].models, None);
        let a2 = job_for(&jobs, "a");
        assert_eq!(a2.secret.expose(), "sk-a2");
        // A listing made with the old secret is not taken for the new one.
        let mut stale = a2.clone();
        stale.fingerprint = Secret::new("sk-a").fingerprint();
        assert!(!finish(
            &mut listings,
            &config,
            &stale,
            Ok(vec!["m-x".into()]),
            30
        ));
        assert_eq!(listings[&("p".into(), "a".into())].models, None);
    }

    fn not_found(key: &str) -> pb::AttemptOutcome {
        pb::AttemptOutcome {
            provider: "p".into(),
            key: key.into(),
            model: "m-z".into(),
            outcome: pb::AttemptResult::Error.into(),
            error_class: pb::ErrorClass::InvalidRequest.into(),
            status: 404,
            provider_code: "model_not_found".into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_model_not_found_answer_lists_the_key_again_soon_and_once() {
        let config = config("");
        let mut listings = Listings::new();
        list_a(&mut listings, &config, &["m-z"], 990);
        assert!(note_attempt(&mut listings, &not_found("a"), 2_000));
        // Not sooner than RELIST_AFTER_MS after the last listing; a second answer changes
        // nothing.
        assert_eq!(
            listings[&("p".into(), "a".into())].due_ms,
            1_000 + RELIST_AFTER_MS
        );
        assert!(!note_attempt(&mut listings, &not_found("a"), 2_500));
        assert!(due(&mut listings, &config, &secrets("sk-a"), 2_500)
            .0
            .iter()
            .all(|j| j.key != "a"));
        let (jobs, _) = due(
            &mut listings,
            &config,
            &secrets("sk-a"),
            1_000 + RELIST_AFTER_MS,
        );
        assert!(jobs.iter().any(|j| j.key == "a"));
        // Other failures list nothing.
        let mut limited = not_found("a");
        limited.status = 429;
        limited.provider_code = "rate_limit_exceeded".into();
        assert!(!names_a_missing_model(&limited));
        let mut anthropic = not_found("a");
        anthropic.provider_code = "not_found_error".into();
        anthropic.status = 400;
        assert!(names_a_missing_model(&anthropic));
    }

    #[test]
    fn the_snapshot_adds_found_models_and_each_keys_listing() {
        let config = config("");
        let mut listings = Listings::new();
        list_a(&mut listings, &config, &["m-found", "m-conf"], 0);
        let provider = &config.providers[0];
        let published = pb::Provider {
            id: "p".into(),
            keys: vec![
                pb::ProviderKey {
                    alias: "a".into(),
                    fingerprint: Secret::new("sk-a").fingerprint(),
                    ..Default::default()
                },
                pb::ProviderKey {
                    alias: "b".into(),
                    fingerprint: Secret::new("sk-b").fingerprint(),
                    ..Default::default()
                },
            ],
            models: provider.models.iter().map(model_to_proto).collect(),
            ..Default::default()
        };
        let out = publish_provider(published.clone(), provider, &listings, false);
        let ids: Vec<(&str, bool)> = out
            .models
            .iter()
            .map(|m| (m.id.as_str(), m.discovered))
            .collect();
        assert_eq!(ids, [("m-conf", false), ("m-found", true)]);
        // The configured model keeps its settings.
        assert_eq!(out.models[0].aliases, ["chat"]);
        let found = &out.models[1];
        assert!(found.cost.is_none() && found.context_window == 0 && found.aliases.is_empty());
        assert_eq!(found.capabilities.len(), 4);
        let (a, b) = (&out.keys[0], &out.keys[1]);
        assert!(a.listed && a.models == ["m-conf", "m-found"]);
        assert!(!b.listed && b.models.is_empty());
        assert!(a.reaches(found) && !b.reaches(found));
        assert!(a.reaches(&out.models[0]) && b.reaches(&out.models[0]));
        // With autoPrice, a found model the price table knows is priced from it.
        // (listed again after the TTL)
        list_a(
            &mut listings,
            &config,
            &["m-conf", "gpt-4o-mini"],
            86_400_100,
        );
        let priced = publish_provider(published, provider, &listings, true);
        let found = priced.models.iter().find(|m| m.id == "gpt-4o-mini");
        let table = crate::config::prices::table_cost("gpt-4o-mini", None);
        assert!(table.is_some());
        assert_eq!(
            found.and_then(|m| m.cost).map(|c| (c.input, c.output)),
            table.map(|c| (c.input, c.output))
        );
        assert_eq!(
            provider
                .cost_of("gpt-4o-mini", true)
                .map(|c| (c.input, c.output)),
            table.map(|c| (c.input, c.output))
        );
        assert!(provider.cost_of("gpt-4o-mini", false).is_none());
        // A reload without discovery drops the listings.
        let plain = resolved(
            "providers:\n  - id: p\n    kind: openai-compatible\n    baseUrl: http://127.0.0.1:9/v1\n    keys: [{ alias: a, env: K_A }]\n    models: [{ id: m-conf }]\n",
            &MapEnv::new([("K_A", "sk-a")]),
        );
        retain(&mut listings, &plain);
        assert!(listings.is_empty());
    }
}
