//! Why a lane is out right now, and until when: the spec's out reasons ("A lane is out while
//! its key is disabled, its key's or provider's breaker is open, a 429 cooldown holds it, ...")
//! as the pushed state and this VM's own holds and counts say them.

use ai_router_proto::v1::{BreakerPhase, BreakerScope, KeyOutReason, Provider, ProviderKey};

use crate::lanes::headroom::Left;
use crate::state::{scope_of, LaneHealth};
use crate::vm::view::View;
use crate::vocab::{LaneId, LocalHold, LOCAL_HOLD_GRACE_MS};
use ai_router_contract::failure::ErrorClass;

/// Why the picker passed over a lane. Its word ([`OutReason::as_str`]) is what the routing
/// trail, the reports and the admin API show.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutReason {
    /// The key has no secret (and the provider is not keyless).
    MissingSecret,
    /// The key is blacklisted: the provider refused its secret.
    BlacklistedAuth,
    /// The key is blacklisted: its quota is spent.
    BlacklistedQuota,
    /// A 429 cooldown holds the lane.
    Cooldown,
    /// The provider is out (its budget is spent).
    ProviderOut,
    /// The key's or the provider's breaker is open.
    BreakerOpen,
    /// The scope's reported credit is spent: a top-up, not time, brings it back.
    NoCredit,
    /// The reported remaining requests are 0, or the remaining tokens below the estimate.
    Headroom,
    /// The key or the provider is at its concurrency cap.
    MaxConcurrency,
    /// The key's catalog does not list the model (`discover: true`).
    NotListed,
    /// After a context-length failure: the lane takes no longer prompt.
    ContextWindow,
    /// Another call holds the lane's half-open probe lease.
    ProbeElsewhere,
}

impl OutReason {
    pub const ALL: [OutReason; 12] = [
        OutReason::MissingSecret,
        OutReason::BlacklistedAuth,
        OutReason::BlacklistedQuota,
        OutReason::Cooldown,
        OutReason::ProviderOut,
        OutReason::BreakerOpen,
        OutReason::NoCredit,
        OutReason::Headroom,
        OutReason::MaxConcurrency,
        OutReason::NotListed,
        OutReason::ContextWindow,
        OutReason::ProbeElsewhere,
    ];

    /// The routing trail's word for the reason.
    pub const fn as_str(self) -> &'static str {
        match self {
            OutReason::MissingSecret => "missing_secret",
            OutReason::BlacklistedAuth => "blacklisted:auth",
            OutReason::BlacklistedQuota => "blacklisted:quota",
            OutReason::Cooldown => "cooldown",
            OutReason::ProviderOut => "provider_out",
            OutReason::BreakerOpen => "breaker_open",
            OutReason::NoCredit => "no_credit",
            OutReason::Headroom => "headroom",
            OutReason::MaxConcurrency => "max_concurrency",
            OutReason::NotListed => "not_listed",
            OutReason::ContextWindow => "context_window",
            OutReason::ProbeElsewhere => "probe_elsewhere",
        }
    }

    /// A blacklist's reason by the class that set it.
    fn blacklisted(class: ErrorClass) -> OutReason {
        if class == ErrorClass::Quota {
            OutReason::BlacklistedQuota
        } else {
            OutReason::BlacklistedAuth
        }
    }
}

impl AsRef<str> for OutReason {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl std::fmt::Display for OutReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How often a call waiting for a concurrency slot looks again.
pub const SLOT_POLL_MS: i64 = 50;

/// Why a lane is out: the reason, its class, and until when (None: until something changes).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Out {
    pub reason: OutReason,
    pub class: ErrorClass,
    pub until: Option<i64>,
}

impl Out {
    fn new(reason: OutReason, class: ErrorClass, until: Option<i64>) -> Out {
        Out {
            reason,
            class,
            until,
        }
    }
}

/// Keeps the reason whose lane returns last (the lane is out until every reason passes).
fn later(worst: Option<Out>, next: Out) -> Option<Out> {
    Some(match worst {
        None => next,
        Some(w) => match (w.until, next.until) {
            (None, _) => w,
            (_, None) => next,
            (Some(a), Some(b)) if b > a => next,
            _ => w,
        },
    })
}

/// A breaker's effect on a lane right now.
pub enum BreakerGate {
    Closed,
    Open(i64),
    HalfOpen,
}

pub fn breaker_gate(
    health: &LaneHealth,
    scope: BreakerScope,
    key: &str,
    now_ms: i64,
) -> BreakerGate {
    match health.breaker(scope, key) {
        Some(b) if b.state() == BreakerPhase::Open && b.open_until_ms > now_ms => {
            BreakerGate::Open(b.open_until_ms)
        }
        // Open past its cooldown is half-open, whether or not the push said so yet.
        Some(b) if matches!(b.state(), BreakerPhase::Open | BreakerPhase::HalfOpen) => {
            BreakerGate::HalfOpen
        }
        _ => BreakerGate::Closed,
    }
}

/// The lane being judged: its provider, key and id, its provider's health and its scope's
/// headroom (`left`, read once per lane by the picker).
pub struct Lane<'a> {
    pub provider: &'a Provider,
    pub key: &'a ProviderKey,
    pub id: &'a LaneId,
    pub health: &'a LaneHealth,
    pub left: Option<Left>,
}

/// Why `lane` is out right now, and until when; the reason whose lane returns last when
/// several hold. `synced_at_ms` is when the control plane last spoke, `tokens` the call's
/// estimate.
pub fn out_reason(
    lane: &Lane<'_>,
    view: &dyn View,
    synced_at_ms: i64,
    tokens: u64,
    now_ms: i64,
) -> Option<Out> {
    let Lane {
        provider,
        key,
        health,
        ..
    } = *lane;
    let keyless = provider.terms.as_ref().is_some_and(|t| t.keyless);
    if key.secret.is_empty() && !keyless {
        return Some(Out::new(OutReason::MissingSecret, ErrorClass::Auth, None));
    }
    let mut worst: Option<Out> = None;
    if let Some(h) = health.key_health(&key.alias) {
        let same_secret = h.refused_fingerprint == 0 || h.refused_fingerprint == key.fingerprint;
        let active = h.until_ms == 0 || h.until_ms > now_ms;
        if same_secret && active {
            let class = if h.reason() == KeyOutReason::Quota {
                ErrorClass::Quota
            } else {
                ErrorClass::Auth
            };
            let until = (h.until_ms > 0).then_some(h.until_ms);
            worst = later(worst, Out::new(OutReason::blacklisted(class), class, until));
        }
    }
    let pushed = health.cooldown_until(&lane.id.key, &lane.id.model);
    if pushed > now_ms {
        worst = later(
            worst,
            Out::new(OutReason::Cooldown, ErrorClass::RateLimit, Some(pushed)),
        );
    }
    for out in local_holds(lane, view, synced_at_ms, now_ms) {
        worst = later(worst, out);
    }
    let provider_out = health.out_until_ms();
    if provider_out > now_ms {
        worst = later(
            worst,
            Out::new(
                OutReason::ProviderOut,
                ErrorClass::Quota,
                Some(provider_out),
            ),
        );
    }
    for (scope, key_alias) in [
        (BreakerScope::Provider, ""),
        (BreakerScope::Key, key.alias.as_str()),
    ] {
        if let BreakerGate::Open(until) = breaker_gate(health, scope, key_alias, now_ms) {
            worst = later(
                worst,
                Out::new(OutReason::BreakerOpen, ErrorClass::Transient, Some(until)),
            );
        }
    }
    if let Some(out) = headroom_out(lane, tokens, now_ms) {
        worst = later(worst, out);
    }
    let key_full =
        key.max_concurrency > 0 && view.in_flight(&provider.id, &key.alias) >= key.max_concurrency;
    let provider_full = provider.max_concurrency > 0
        && view.provider_in_flight(&provider.id) >= provider.max_concurrency;
    if key_full || provider_full {
        let until = Some(now_ms + SLOT_POLL_MS);
        worst = later(
            worst,
            Out::new(OutReason::MaxConcurrency, ErrorClass::RateLimit, until),
        );
    }
    worst
}

/// What this VM's own holds on the lane (a 429 cooldown, a blacklist) say, in the view's
/// order, past those the control plane has answered since.
fn local_holds(lane: &Lane<'_>, view: &dyn View, synced_at_ms: i64, now_ms: i64) -> Vec<Out> {
    let reset_at = lane.health.reset_at_ms(&lane.key.alias);
    let mut outs = Vec::new();
    for hold in view.holds(lane.id) {
        if hold.set_at_ms() + LOCAL_HOLD_GRACE_MS <= synced_at_ms
            || (reset_at > 0 && hold.set_at_ms() <= reset_at)
        {
            // The control plane has spoken since, or an operator reset the key: its state is
            // the truth.
            continue;
        }
        match hold {
            LocalHold::Cooldown { until_ms, .. } if until_ms > now_ms => {
                outs.push(Out::new(
                    OutReason::Cooldown,
                    ErrorClass::RateLimit,
                    Some(until_ms),
                ));
            }
            LocalHold::Blacklist {
                class,
                until_ms,
                fingerprint,
                ..
            } if (fingerprint == 0 || fingerprint == lane.key.fingerprint)
                && (until_ms == 0 || until_ms > now_ms) =>
            {
                let until = (until_ms > 0).then_some(until_ms);
                outs.push(Out::new(OutReason::blacklisted(class), class, until));
            }
            _ => {}
        }
    }
    outs
}

/// What the scope's headroom says: no credit (a quota with no known end), or too few requests
/// or tokens left until the window resets.
fn headroom_out(lane: &Lane<'_>, tokens: u64, now_ms: i64) -> Option<Out> {
    let (requests, tokens_left, reset_at_ms) = lane.left?;
    let too_few_tokens = tokens_left >= 0 && (tokens_left as u64) < tokens;
    // A figure the control plane marks spent (a credit, not a rate window) is a quota
    // with no known end: a top-up, not time, brings it back, so a call does not wait for it.
    // Looked up only for a lane with no request left, not on every pick.
    let spent = || {
        [lane.id.model.as_str(), ""].into_iter().any(|m| {
            lane.health
                .headroom(scope_of(lane.key), m)
                .is_some_and(|h| h.spent && h.remaining_requests == 0 && h.reset_at_ms > now_ms)
        })
    };
    if requests == 0 && spent() {
        Some(Out::new(OutReason::NoCredit, ErrorClass::Quota, None))
    } else if requests == 0 || too_few_tokens {
        Some(Out::new(
            OutReason::Headroom,
            ErrorClass::RateLimit,
            Some(reset_at_ms),
        ))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_keeps_its_word() {
        let words: Vec<&str> = OutReason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(
            words,
            [
                "missing_secret",
                "blacklisted:auth",
                "blacklisted:quota",
                "cooldown",
                "provider_out",
                "breaker_open",
                "no_credit",
                "headroom",
                "max_concurrency",
                "not_listed",
                "context_window",
                "probe_elsewhere",
            ]
        );
    }

    #[test]
    fn the_reason_that_lasts_longest_wins_and_no_end_outlasts_all() {
        let out = |reason, until| Out::new(reason, ErrorClass::RateLimit, until);
        let cooldown = out(OutReason::Cooldown, Some(10));
        let breaker = out(OutReason::BreakerOpen, Some(20));
        let credit = out(OutReason::NoCredit, None);
        assert_eq!(later(later(None, cooldown), breaker), Some(breaker));
        assert_eq!(later(later(None, breaker), cooldown), Some(breaker));
        assert_eq!(later(later(None, credit), breaker), Some(credit));
        assert_eq!(later(later(None, breaker), credit), Some(credit));
        // A tie keeps the first.
        let headroom = out(OutReason::Headroom, Some(20));
        assert_eq!(later(later(None, breaker), headroom), Some(breaker));
    }
}
