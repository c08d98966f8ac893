//! What the filters report: attempts and calls change breakers, blacklists, cooldowns,
//! headroom, spend and budgets, and become events.

use ai_router_contract::failure::{ErrorClass, Hold};
use ai_router_contract::{headroom, probe_holder};
use ai_router_proto::v1 as pb;

use super::{budgets, events};

use super::events::Event;
use super::state::*;
use crate::config::secrets::Secret;
use crate::config::Config;
use crate::store::breaker::{Breaker, BreakerId, BreakerPhase, BreakerScope};
use crate::store::durable::{
    lane_names, lane_of, Blacklist, BlacklistReason, DurableState, KeyId, LaneHeadroom, LaneId,
    Names,
};
use crate::store::lock;
use crate::store::spend::Spend;

impl Engine {
    /// Counts `batch`'s charges in the budgets and emits an event for each level that rose;
    /// returns whether one rose (what is pushed changed).
    fn charge_budgets(&self, config: &Config, batch: &pb::ReportBatch) -> bool {
        if config.budgets.is_empty() {
            return false;
        }
        let now = self.clock.now_ms();
        let mut state = lock(&self.state);
        let mut crossings = Vec::new();
        for charge in crate::keys::charge::charges(config, batch) {
            crossings.extend(state.budgets.charge(&config.budgets, &charge, now));
        }
        for crossing in &crossings {
            self.events.emit(budgets::event(crossing, now));
        }
        !crossings.is_empty()
    }

    /// Applies a batch of outcomes; returns the version after it.
    pub fn apply_report(&self, batch: &pb::ReportBatch) -> (u64, Vec<EngineEvent>) {
        let config = self.config();
        // The budgets count the batch before the usage recorder sees it: the key sync takes
        // the stored rows in silently (`BudgetLedger::absorb`), so a row written before its
        // charge was counted here would raise the level with no event.
        let budgets_moved = self.charge_budgets(&config, batch);
        self.observe_report(batch);
        self.count_in_stats(&config, batch);
        self.emit_call_events(&config, batch);
        let now = self.clock.now_ms();
        let mut state = lock(&self.state);
        let mut effects = ReportEffects {
            changed: budgets_moved,
            ..ReportEffects::default()
        };
        for attempt in &batch.attempts {
            apply_attempt(&config, &mut state, attempt, now, &mut effects);
        }
        self.emit(&effects.events);
        self.publish_after_report(&mut state, &effects, now);
        let version = state.version;
        drop(state);
        self.release_leases(effects.releases);
        (version, effects.events)
    }

    /// Counts the batch in this process's stats: attempts with their cost and cache saving,
    /// requests with the cost of their usage.
    fn count_in_stats(&self, config: &Config, batch: &pb::ReportBatch) {
        self.stats.observe(
            batch,
            config.selection.ewma_alpha,
            |a| attempt_cost(config, a).unwrap_or(0.0),
            |a| crate::keys::usage::saving_of(config, a),
        );
        self.stats.observe_cache(batch, |r| {
            r.usage.as_ref().map_or(0.0, |u| {
                crate::keys::charge::cost_of(config, &r.provider, &r.model, u)
            })
        });
    }

    /// The attempt and request events of the batch, when someone listens for them.
    fn emit_call_events(&self, config: &Config, batch: &pb::ReportBatch) {
        if self.events.wants_calls() {
            for event in call_events(config, batch) {
                self.events.emit(event);
            }
        }
    }

    /// Publishes what the batch changed; a change of headroom alone waits for the next flush
    /// while headroom is coalesced.
    fn publish_after_report(&self, state: &mut State, effects: &ReportEffects, now: i64) {
        let coalesce = self
            .coalesce_headroom
            .load(std::sync::atomic::Ordering::Relaxed);
        if effects.changed || (effects.headroom_moved && !coalesce) {
            self.publish(state, now);
        } else if effects.headroom_moved {
            state.pending = true;
        }
    }

    pub(super) fn release_leases(&self, releases: Vec<(BreakerId, Option<String>)>) {
        for (id, holder) in releases {
            if let Err(err) = self.store.release(&id, holder.as_deref()) {
                tracing::error!(%err, scope = id.0.as_str(), provider = %id.1, "cannot release a probe lease");
            }
        }
    }

    /// The estimated cost of an attempt's usage, when it has usage and its model a price.
    pub fn attempt_cost(&self, a: &pb::AttemptOutcome) -> Option<f64> {
        attempt_cost(&self.config(), a)
    }
}

/// What applying a batch's attempts did: the events to emit, the probe leases to end once the
/// state lock is released (the store may block), and whether the pushed state changed.
#[derive(Default)]
struct ReportEffects {
    events: Vec<EngineEvent>,
    releases: Vec<(BreakerId, Option<String>)>,
    changed: bool,
    /// Only headroom changed (it may wait for the next flush).
    headroom_moved: bool,
}

/// One attempt's outcome: the key's listing, then, for a key of the pool, its lane's headroom,
/// its provider's spend, its probe lease and its breakers; a failure may hold the lane or the
/// key, or count in the breakers.
fn apply_attempt(
    config: &Config,
    state: &mut State,
    attempt: &pb::AttemptOutcome,
    now: i64,
    effects: &mut ReportEffects,
) {
    super::discovered::note_attempt(&mut state.listings, attempt, now);
    let names = (attempt.provider.as_str(), attempt.key.as_str());
    if state.secrets.contains_key(&names as &dyn Names<2>) {
        note_key_attempt(config, state, attempt, now, effects);
    }
    if attempt.outcome() == pb::AttemptResult::Error {
        let id: KeyId = (attempt.provider.clone(), attempt.key.clone());
        note_failure(config, state, id, attempt, now, effects);
    }
}

/// Any outcome of a key of the pool: headroom, spend, the probe lease it held, and a success
/// in the breakers.
fn note_key_attempt(
    config: &Config,
    state: &mut State,
    attempt: &pb::AttemptOutcome,
    now: i64,
    effects: &mut ReportEffects,
) {
    let names = lane_names(attempt);
    let kept = state
        .headroom_as_of
        .get_mut(&names as &dyn Names<3>)
        .map(|k| {
            k.attempts = k.attempts.saturating_add(1);
            k.tokens = k.tokens.saturating_add(attempt.tokens());
            *k
        });
    if note_headroom(&mut state.durable, attempt, kept, now) {
        effects.headroom_moved = true;
        note_headroom_as_of(state, lane_of(attempt), attempt, now);
    }
    effects.changed |= note_spend(config, &mut state.durable, attempt, now);
    if attempt.probe {
        // Only the attempt that holds the lease ends it.
        let holder = Some(probe_holder(&attempt.request_id, attempt.attempt));
        for id in breaker_ids(&attempt.provider, &attempt.key) {
            effects.releases.push((id, holder.clone()));
        }
    }
    if attempt.outcome() == pb::AttemptResult::Success {
        effects.changed |= update_breakers(
            &mut state.durable,
            &attempt.provider,
            &attempt.key,
            |_, b| b.on_success(now),
            &mut effects.events,
            &mut effects.releases,
        );
    }
}

/// Remembers when the attempt that reported its lane's headroom began (pushed as `as_of_ms`),
/// dropping the entries of lanes whose headroom is gone once they pile up.
fn note_headroom_as_of(state: &mut State, lane: LaneId, attempt: &pb::AttemptOutcome, now: i64) {
    let began = attempt
        .at_ms
        .saturating_sub(i64::try_from(attempt.latency_ms).unwrap_or(0));
    if state.headroom_as_of.len() > state.durable.headroom.len() + 64 {
        let kept = &state.durable.headroom;
        state.headroom_as_of.retain(|l, _| kept.contains_key(l));
    }
    let since = KeptSince {
        as_of_ms: began,
        kept_at_ms: now,
        ..KeptSince::default()
    };
    state.headroom_as_of.insert(lane, since);
}

/// A failed attempt: the one failure -> hold rule (the filter applies it too) holds the lane
/// or the key; a failure that is not the key's counts in the breakers when its class does.
/// An unknown class changes nothing, nor do invalid requests and cancellations.
fn note_failure(
    config: &Config,
    state: &mut State,
    id: KeyId,
    attempt: &pb::AttemptOutcome,
    now: i64,
    effects: &mut ReportEffects,
) {
    let Some(current) = state.secrets.get(&id) else {
        tracing::debug!(provider = %id.0, key = %id.1, "report for an unknown key");
        return;
    };
    let current_fp = current.as_ref().map_or(0, Secret::fingerprint);
    let retry_at = (attempt.retry_at_ms > now).then_some(attempt.retry_at_ms);
    let Some(class) = attempt.class() else {
        return;
    };
    let resilience = &config.resilience;
    let provider_code =
        (!attempt.provider_code.is_empty()).then_some(attempt.provider_code.as_str());
    match resilience
        .hold_windows()
        .held_until(class, retry_at, provider_code, now)
    {
        Some((Hold::Lane, until)) => {
            effects.changed |= hold_lane(&mut state.durable, &id, &attempt.model, until);
        }
        Some((Hold::Key, until)) => {
            let refusal = KeyRefusal {
                class,
                until,
                current_fp,
            };
            effects.changed |= blacklist_key(
                &mut state.durable,
                id,
                attempt,
                refusal,
                &mut effects.events,
            );
            // A key's failure, not the lane's: no breaker counts it.
            return;
        }
        Some((Hold::Nothing, _)) | None => {}
    }
    if class.counts_for_breakers() {
        let started = if attempt.at_ms > 0 {
            attempt.at_ms.saturating_sub(ms(attempt.latency_ms))
        } else {
            0
        };
        effects.changed |= update_breakers(
            &mut state.durable,
            &id.0,
            &id.1,
            |scope, b| {
                let config = match scope {
                    BreakerScope::Key => &resilience.key_breaker,
                    BreakerScope::Provider => &resilience.provider_breaker,
                };
                b.on_failure(config, now, retry_at, started)
            },
            &mut effects.events,
            &mut effects.releases,
        );
    }
}

/// Cools the lane down until `until` (a rate limit until its window or the default; a failure
/// of the lane with a retry-after until then); returns whether that extended its cooldown.
fn hold_lane(durable: &mut DurableState, id: &KeyId, model: &str, until: i64) -> bool {
    let lane = (id.0.clone(), id.1.clone(), model.to_owned());
    let entry = durable.cooldowns.entry(lane).or_insert(0);
    if until > *entry {
        *entry = until;
        return true;
    }
    false
}

/// Why a key is being blacklisted: its failure's class, until when, and the fingerprint of
/// its current secret (0 when it has none).
struct KeyRefusal {
    class: ErrorClass,
    until: i64,
    current_fp: u64,
}

/// Blacklists the key for an auth or quota failure, unless the refused secret has since been
/// replaced or the key is already blacklisted at least as long for the same reason; emits
/// `KeyDisabled` when it changes. Returns whether it changed.
fn blacklist_key(
    durable: &mut DurableState,
    id: KeyId,
    attempt: &pb::AttemptOutcome,
    refusal: KeyRefusal,
    events: &mut Vec<EngineEvent>,
) -> bool {
    let KeyRefusal {
        class,
        until,
        current_fp,
    } = refusal;
    let refused = if attempt.fingerprint != 0 {
        attempt.fingerprint
    } else {
        current_fp
    };
    if current_fp != 0 && refused != current_fp {
        // The secret was replaced after this attempt used it: the refusal is about the old one.
        return false;
    }
    let reason = if class == ErrorClass::Auth {
        BlacklistReason::Auth
    } else {
        BlacklistReason::Quota
    };
    let code = (!attempt.provider_code.is_empty()).then(|| attempt.provider_code.clone());
    let same = durable.blacklists.get(&id).is_some_and(|old| {
        old.reason == reason
            && old.refused_fingerprint == refused
            && (old.until_ms == 0 || (until != 0 && old.until_ms >= until))
    });
    if same {
        return false;
    }
    events.push(EngineEvent::KeyDisabled {
        provider: id.0.clone(),
        key: id.1.clone(),
        reason: reason.as_str(),
        until_ms: until,
        code: code.clone(),
    });
    let entry = Blacklist {
        reason,
        until_ms: until,
        refused_fingerprint: refused,
        code,
    };
    durable.blacklists.insert(id, entry);
    true
}

/// Runs `step` on the key's and the provider's breakers; records events and the leases that
/// end (a breaker that leaves half-open or closes). Returns whether the pushed state changed
/// (a failure counted while closed is stored, not pushed).
pub(super) fn update_breakers(
    durable: &mut DurableState,
    provider: &str,
    key: &str,
    step: impl Fn(BreakerScope, &mut Breaker) -> crate::store::breaker::Transitions,
    events: &mut Vec<EngineEvent>,
    releases: &mut Vec<(BreakerId, Option<String>)>,
) -> bool {
    let mut visible = false;
    for id in breaker_ids(provider, key) {
        let before = durable.breakers.get(&id).copied().unwrap_or_default();
        let mut breaker = before;
        let steps = step(id.0, &mut breaker);
        for &(from, to) in &steps {
            events.push(breaker_event(&id, from, to));
        }
        if steps
            .iter()
            .any(|&(from, to)| from == BreakerPhase::HalfOpen || to == BreakerPhase::Closed)
        {
            releases.push((id.clone(), None));
        }
        if breaker == before {
            continue;
        }
        visible |= breaker.phase != before.phase
            || (breaker.phase != BreakerPhase::Closed
                && breaker.open_until_ms != before.open_until_ms);
        if breaker.is_idle() {
            durable.breakers.remove(&id);
        } else {
            durable.breakers.insert(id, breaker);
        }
    }
    visible
}

/// Keeps the lane's last reported headroom; returns whether it changed. Absent values are -1
/// (remaining) and 0 (reset); with no reset the entry holds [`HEADROOM_DEFAULT_WINDOW_MS`].
/// Any outcome counts (a 429 reports headroom too).
pub(super) fn note_headroom(
    durable: &mut DurableState,
    attempt: &pb::AttemptOutcome,
    kept: Option<KeptSince>,
    now: i64,
) -> bool {
    if attempt.remaining_requests < 0 && attempt.remaining_tokens < 0 {
        return false;
    }
    // 0/0 with no reset is what a message that never set the fields decodes to.
    if attempt.remaining_requests == 0
        && attempt.remaining_tokens == 0
        && attempt.ratelimit_reset_at_ms <= 0
    {
        return false;
    }
    let reset_at_ms = if attempt.ratelimit_reset_at_ms > 0 {
        attempt.ratelimit_reset_at_ms
    } else {
        now.saturating_add(HEADROOM_DEFAULT_WINDOW_MS)
    };
    if reset_at_ms <= now {
        return false;
    }
    let entry = LaneHeadroom {
        remaining_requests: attempt.remaining_requests.max(-1),
        remaining_tokens: attempt.remaining_tokens.max(-1),
        reset_at_ms,
    };
    let names = lane_names(attempt);
    if let Some(old) = durable.headroom.get(&names as &dyn Names<3>) {
        let same_values = old.remaining_requests == entry.remaining_requests
            && old.remaining_tokens == entry.remaining_tokens;
        // Without a reset from the provider, the same values again are no news: keep the
        // window they were first seen with (a provider sending constant headers would
        // otherwise publish a version per answer).
        if same_values && (attempt.ratelimit_reset_at_ms <= 0 || old.reset_at_ms == reset_at_ms) {
            return false;
        }
        // Nor is a figure within a sixteenth of what every Envoy estimates is left (the kept
        // figure less what was sent on the lane since), while the kept window runs and the
        // kept figure is recent: a provider's remaining requests falling by one an answer
        // would otherwise publish (and store) a version per answer and per key. A window that
        // refills as it is used (the estimate falling, the figure not) is news.
        if let Some(kept) =
            kept.filter(|k| now.saturating_sub(k.kept_at_ms) < HEADROOM_KEPT_AT_MOST_MS)
        {
            let requests = headroom::left(old.remaining_requests, kept.attempts);
            let tokens = headroom::left(old.remaining_tokens, kept.tokens);
            if old.reset_at_ms > now
                && close(requests, entry.remaining_requests)
                && close(tokens, entry.remaining_tokens)
            {
                return false;
            }
        }
    }
    durable.headroom.insert(lane_of(attempt), entry);
    true
}

/// How old a lane's kept headroom figure may get while newer ones close to the estimate are
/// passed over: what each Envoy keeps of its sends for a scope with no figure to check
/// (`UNCHECKED_KEPT_MS` in the filter). Each Envoy keeps its sends since the oldest figure it
/// checks, and reads and rewrites that record on every reservation: a figure a minute old made
/// a busy key's record 12 KB and a reservation 15 times the work of a fresh figure's
/// (docs/benchmarks.md); one no older than this costs what a scope with no figure costs.
pub(super) const HEADROOM_KEPT_AT_MOST_MS: i64 = 10_000;

/// Below this many requests or tokens left, every change of a lane's headroom is kept.
const HEADROOM_EXACT_BELOW: i64 = 64;

/// Whether a lane's reported headroom figure `new` says about what was estimated left
/// (`estimate`, negative: not reported): both absent, or both at least
/// [`HEADROOM_EXACT_BELOW`] and within a sixteenth of the larger.
fn close(estimate: i64, new: i64) -> bool {
    match (estimate < 0, new < 0) {
        (true, true) => true,
        (false, false) => {
            estimate.min(new) >= HEADROOM_EXACT_BELOW
                && estimate.abs_diff(new).saturating_mul(16) <= estimate.max(new).unsigned_abs()
        }
        _ => false,
    }
}

/// The cost of an attempt's usage, when it has usage and its model a price: what the usage
/// rows charge it (`keys::charge::cost_of`), so stats, events, metrics and rows agree.
pub(super) fn attempt_cost(config: &Config, a: &pb::AttemptOutcome) -> Option<f64> {
    let usage = a.usage.as_ref()?;
    let c = crate::keys::charge::cost_of(config, &a.provider, &a.model, usage);
    (c > 0.0 && c.is_finite()).then_some(c)
}

/// The attempt and request events of a report batch.
pub(super) fn call_events(config: &Config, batch: &pb::ReportBatch) -> Vec<Event> {
    let mut out = Vec::with_capacity(batch.attempts.len() + batch.requests.len());
    for a in &batch.attempts {
        let cost = attempt_cost(config, a);
        out.push(Event::Attempt {
            at_ms: a.at_ms,
            request_id: a.request_id.clone(),
            operation: a.operation.clone(),
            attempt: a.attempt,
            provider: a.provider.clone(),
            key: a.key.clone(),
            model: a.model.clone(),
            latency_ms: a.latency_ms,
            outcome: a.outcome().text().to_owned(),
            error_class: a.class().map(|c| c.as_str().to_owned()),
            status: a.status,
            usage: a.usage.map(|u| events::Usage {
                prompt_tokens: u.prompt_tokens,
                completion_tokens: u.completion_tokens,
            }),
            usage_source: a.usage.map(|u| match u.source() {
                pb::UsageSource::Estimated => "estimated",
                pb::UsageSource::Reported | pb::UsageSource::Unspecified => "reported",
            }),
            cost,
            // Only while the pool says so: a report queued before includeContent was turned
            // off keeps its content out of the events.
            content: a
                .content
                .as_ref()
                .filter(|_| config.include_content)
                .map(events::Content::from_report),
        });
    }
    for r in &batch.requests {
        let (outcome, class) = r.result_parts();
        let (outcome, class) = (outcome.to_owned(), class.map(str::to_owned));
        out.push(Event::Request {
            at_ms: r.at_ms,
            request_id: r.request_id.clone(),
            operation: r.operation.clone(),
            outcome,
            attempts: r.attempts,
            latency_ms: r.latency_ms,
            status: r.status,
            provider: (!r.provider.is_empty()).then(|| r.provider.clone()),
            model: (!r.model.is_empty()).then(|| r.model.clone()),
            error_class: class,
        });
    }
    out
}

/// Adds the attempt's cost to its provider's spend; returns whether that put the provider out
/// of (or back in) its budget.
pub(super) fn note_spend(
    config: &Config,
    durable: &mut DurableState,
    attempt: &pb::AttemptOutcome,
    now: i64,
) -> bool {
    let Some(cost) = attempt_cost(config, attempt) else {
        return false;
    };
    let Some(provider) = config.providers.iter().find(|p| p.id == attempt.provider) else {
        return false;
    };
    let spend = durable.spend.entry(provider.id.clone()).or_default();
    let out = |s: &Spend| provider.budget.as_ref().and_then(|b| s.out_until(b, now));
    let before = out(spend);
    spend.add(now, cost);
    out(spend) != before
}
