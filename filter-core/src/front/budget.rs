//! Budget policies at the front stage, after the call is resolved and before it is planned.
//!
//! - Hour, day and month windows are counted by the control plane from reports; it pushes the
//!   budgets past their `warnAt` or their limit as [`BudgetState`]s. A hard one past its limit
//!   answers 429 `budget_exceeded` with `Retry-After` until its window ends (a provider's:
//!   that provider's candidates are cut, and only a call left with none is refused); a soft
//!   one, or one past its `warnAt`, lets the call through with a warning.
//! - A request window is a cap on each call: this call's estimate (prompt estimate plus
//!   `max_tokens`; the cost at the preferred candidate's price) against the limit, here.
//!
//! - A spent hard budget is the `budget_exceeded` trigger of the call's conditional steps
//!   ([`take_budget_steps`]): the candidates it rules out (a provider's, or every candidate
//!   for the call's key, profile or the pool) count as failed with `budget_exceeded` before the
//!   first attempt, so the call's `when: [budget_exceeded]` candidates become unconditional
//!   for it and the call goes on with them (and, for a provider's budget, with the other
//!   providers' candidates) instead of the 429. A request window's cap is no trigger: the same
//!   estimate would be past it on any model.
//!
//! A state past its `until_ms` is over even before the next push. The warnings become
//! `x-ai-router-budget-warning` (`name=warn`, `name=over`, comma-separated) and go back in
//! the call's report.

use ai_router_proto::v1::{Budget, BudgetLevel, BudgetScope, BudgetState, BudgetWindow, Budgets};

use crate::answer::errors::GatewayError;
use crate::plan::Candidate;
use ai_router_contract::error_code::ErrorCode;

/// What a budget check sees of the call.
#[derive(Debug, Clone, Copy)]
pub struct BudgetCall<'a> {
    pub key_id: &'a str,
    /// The profile the call resolved to; `None` for a direct model call.
    pub profile: Option<&'a str>,
    /// Estimated tokens: the prompt estimate plus `max_tokens`.
    pub tokens: u64,
    /// Estimated cost at the preferred candidate's price; `None` when it has none.
    pub cost: Option<f64>,
}

/// The budgets' answer for one call.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Verdict {
    /// The 429 when a hard budget refuses the call.
    pub refusal: Option<GatewayError>,
    /// `name=warn` / `name=over`, one per budget, in the pushed order.
    pub warnings: Vec<String>,
    /// The candidates a spent hard budget ruled out (trigger `budget_exceeded`).
    pub ruled_out: Vec<Candidate>,
}

impl Verdict {
    /// The value of `x-ai-router-budget-warning`, when there is any warning.
    pub fn header(&self) -> Option<String> {
        (!self.warnings.is_empty()).then(|| self.warnings.join(", "))
    }
}

fn seconds_until(now_ms: i64, until_ms: i64) -> u64 {
    let ms = until_ms.saturating_sub(now_ms).max(1);
    u64::try_from((ms + 999) / 1000).unwrap_or(1).max(1)
}

fn refusal(name: &str, message: &str, retry_after: Option<u64>) -> GatewayError {
    GatewayError::new(
        ErrorCode::BudgetExceeded,
        format!("The budget '{name}' {message}"),
    )
    .with_retry_after(retry_after)
}

fn warn(out: &mut Vec<String>, name: &str, level: BudgetLevel) {
    let item = format!("{name}={}", level.text());
    if !out.contains(&item) {
        out.push(item);
    }
}

/// The share of `policy`'s limits this call's estimate takes (the larger of the two).
fn request_share(policy: &Budget, call: &BudgetCall) -> f64 {
    let tokens = (policy.max_tokens > 0).then(|| call.tokens as f64 / policy.max_tokens as f64);
    let cost = match (policy.max_cost > 0.0, call.cost) {
        (true, Some(c)) => Some(c / policy.max_cost),
        _ => None,
    };
    tokens.into_iter().chain(cost).fold(0.0, f64::max)
}

/// Whether the pushed `state` is about this call (its key, its profile, the pool).
fn covers(policy: &Budget, state: &BudgetState, call: &BudgetCall) -> bool {
    match policy.scope() {
        BudgetScope::Key => state.subject == call.key_id,
        BudgetScope::Profile => call.profile.is_some_and(|p| p == state.subject),
        BudgetScope::Pool => true,
        BudgetScope::Provider | BudgetScope::Unspecified => false,
    }
}

/// The `when` trigger a spent hard budget fires.
pub const TRIGGER: &str = "budget_exceeded";

/// Whether a candidate is a step for a spent budget: its `when` names `budget_exceeded`.
fn is_budget_step(c: &Candidate) -> bool {
    c.when.iter().any(|w| w == TRIGGER)
}

/// A spent hard budget rules candidates out: every one that is no budget step when the call's
/// own budget (`call_over`: its key's, its profile's, the pool's) is spent, and those of the
/// providers in `providers_out`. When it ruled any out, the budget steps left become
/// unconditional for this call. Returns the candidates ruled out; an emptied tier goes.
pub fn take_budget_steps(
    tiers: &mut Vec<Vec<Candidate>>,
    call_over: bool,
    providers_out: &[&str],
) -> Vec<Candidate> {
    let mut ruled_out = Vec::new();
    for tier in tiers.iter_mut() {
        let (out, kept): (Vec<Candidate>, Vec<Candidate>) =
            std::mem::take(tier).into_iter().partition(|c| {
                providers_out.contains(&c.provider.as_str()) || (call_over && !is_budget_step(c))
            });
        ruled_out.extend(out);
        *tier = kept;
    }
    if !ruled_out.is_empty() {
        for c in tiers.iter_mut().flatten().filter(|c| is_budget_step(c)) {
            c.when.clear();
        }
    }
    tiers.retain(|t| !t.is_empty());
    ruled_out
}

/// Checks the call against every budget; rules out of `tiers` what a spent hard budget rules
/// out ([`take_budget_steps`]; an emptied tier goes).
pub fn check(
    budgets: Option<&Budgets>,
    call: &BudgetCall,
    tiers: &mut Vec<Vec<Candidate>>,
    now_ms: i64,
) -> Verdict {
    let mut verdict = Verdict::default();
    let Some(budgets) = budgets else {
        return verdict;
    };
    let policy_of = |name: &str| budgets.policies.iter().find(|p| p.name == name);
    for policy in &budgets.policies {
        if policy.window() != BudgetWindow::Request {
            continue;
        }
        let share = request_share(policy, call);
        if share > 1.0 {
            if policy.hard {
                verdict.refusal.get_or_insert_with(|| {
                    refusal(
                        &policy.name,
                        "caps each call, and this one's estimate (prompt and max_tokens) is past it; ask for fewer tokens.",
                        None,
                    )
                });
            } else {
                warn(&mut verdict.warnings, &policy.name, BudgetLevel::Over);
            }
        } else if policy.warn_at > 0.0 && share >= policy.warn_at {
            warn(&mut verdict.warnings, &policy.name, BudgetLevel::Warn);
        }
    }
    // The call's own spent hard budget (its key's, its profile's, the pool's): the 429 unless
    // a budget step takes the call.
    let mut call_over: Option<GatewayError> = None;
    // A provider's spent hard budget: until when its candidates are out.
    let mut provider_out: Vec<(&str, &str, i64)> = Vec::new();
    for state in budgets.states.iter().filter(|s| s.until_ms > now_ms) {
        let Some(policy) = policy_of(&state.name) else {
            continue;
        };
        let level = state.level();
        if policy.scope() == BudgetScope::Provider {
            let serves = tiers.iter().flatten().any(|c| c.provider == state.subject);
            if !serves {
                continue;
            }
            if policy.hard && level == BudgetLevel::Over {
                provider_out.push((&state.subject, &state.name, state.until_ms));
            } else {
                warn(&mut verdict.warnings, &state.name, level);
            }
            continue;
        }
        if !covers(policy, state, call) {
            continue;
        }
        if policy.hard && level == BudgetLevel::Over {
            call_over.get_or_insert_with(|| {
                refusal(
                    &state.name,
                    "is spent for this window; it resets when the window ends.",
                    Some(seconds_until(now_ms, state.until_ms)),
                )
            });
        } else if level != BudgetLevel::Unspecified {
            warn(&mut verdict.warnings, &state.name, level);
        }
    }
    if (call_over.is_some() || !provider_out.is_empty()) && verdict.refusal.is_none() {
        let out: Vec<&str> = provider_out.iter().map(|(p, _, _)| *p).collect();
        verdict.ruled_out = take_budget_steps(tiers, call_over.is_some(), &out);
        if tiers.is_empty() && call_over.is_some() {
            verdict.refusal = call_over;
        } else if tiers.is_empty() {
            // Every candidate's provider is out: back when the first of them returns.
            let (_, name, until) = provider_out
                .iter()
                .min_by_key(|(_, _, until)| *until)
                .copied()
                .unwrap_or(("", "", now_ms));
            verdict.refusal = Some(refusal(
                name,
                "is spent for this window on every provider that could serve this call; it resets when the window ends.",
                Some(seconds_until(now_ms, until)),
            ));
        }
    }
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;

    // 2026-03-15T12:30:00Z
    const AT: i64 = 1_773_577_800_000;

    fn policy(name: &str, scope: BudgetScope, window: BudgetWindow, hard: bool) -> Budget {
        Budget {
            name: name.into(),
            scope: scope.into(),
            window: window.into(),
            max_tokens: 1_000,
            max_cost: 0.0,
            hard,
            warn_at: 0.5,
        }
    }

    fn state(name: &str, subject: &str, level: BudgetLevel, until_ms: i64) -> BudgetState {
        BudgetState {
            name: name.into(),
            subject: subject.into(),
            level: level.into(),
            until_ms,
        }
    }

    fn cand(provider: &str) -> Candidate {
        Candidate {
            when: Vec::new(),
            provider: provider.into(),
            model: "m".into(),
            weight: 1.0,
        }
    }

    fn call(tokens: u64) -> BudgetCall<'static> {
        BudgetCall {
            key_id: "key_a",
            profile: Some("fast"),
            tokens,
            cost: Some(0.01),
        }
    }

    #[test]
    fn no_budgets_no_verdict() {
        let mut tiers = vec![vec![cand("p")]];
        assert_eq!(check(None, &call(10), &mut tiers, AT), Verdict::default());
        assert_eq!(Verdict::default().header(), None);
    }

    #[test]
    fn a_spent_hard_budget_refuses_until_its_window_ends() {
        let budgets = Budgets {
            policies: vec![
                policy("team", BudgetScope::Key, BudgetWindow::Day, true),
                policy("fast-daily", BudgetScope::Profile, BudgetWindow::Day, false),
            ],
            states: vec![
                state("team", "key_a", BudgetLevel::Over, AT + 90_500),
                state("fast-daily", "fast", BudgetLevel::Warn, AT + 90_500),
            ],
        };
        let mut tiers = vec![vec![cand("p")]];
        let v = check(Some(&budgets), &call(10), &mut tiers, AT);
        let e = v.refusal.expect("refused");
        assert_eq!((e.status, e.code), (429, ErrorCode::BudgetExceeded));
        assert_eq!(e.retry_after_s, Some(91));
        assert!(e.message.contains("team"));
        assert_eq!(v.warnings, ["fast-daily=warn"]);
        // Another key, another profile: not this call's.
        let other = BudgetCall {
            key_id: "key_b",
            profile: None,
            ..call(10)
        };
        assert_eq!(
            check(Some(&budgets), &other, &mut tiers, AT),
            Verdict::default()
        );
        // Past its end the state is over before the next push.
        assert_eq!(
            check(Some(&budgets), &call(10), &mut tiers, AT + 90_500).refusal,
            None
        );
    }

    #[test]
    fn a_soft_budget_warns_and_lets_the_call_through() {
        let budgets = Budgets {
            policies: vec![policy(
                "pool-hour",
                BudgetScope::Pool,
                BudgetWindow::Hour,
                false,
            )],
            states: vec![state("pool-hour", "", BudgetLevel::Over, AT + 1_000)],
        };
        let mut tiers = vec![vec![cand("p")]];
        let v = check(Some(&budgets), &call(10), &mut tiers, AT);
        assert_eq!(v.refusal, None);
        assert_eq!(v.header().as_deref(), Some("pool-hour=over"));
    }

    #[test]
    fn a_request_window_caps_each_call_by_its_estimate() {
        let budgets = Budgets {
            policies: vec![
                policy("cap", BudgetScope::Pool, BudgetWindow::Request, true),
                Budget {
                    max_tokens: 0,
                    max_cost: 0.02,
                    warn_at: 0.4,
                    ..policy("cap-cost", BudgetScope::Key, BudgetWindow::Request, false)
                },
            ],
            states: vec![],
        };
        let mut tiers = vec![vec![cand("p")]];
        let v = check(Some(&budgets), &call(400), &mut tiers, AT);
        assert_eq!(v.refusal, None);
        // 0.01 of 0.02 is past the cost cap's warnAt of 0.4.
        assert_eq!(v.warnings, ["cap-cost=warn"]);
        let v = check(Some(&budgets), &call(600), &mut tiers, AT);
        assert_eq!(v.warnings, ["cap=warn", "cap-cost=warn"]);
        let v = check(Some(&budgets), &call(1_001), &mut tiers, AT);
        let e = v.refusal.expect("refused");
        assert_eq!((e.code, e.retry_after_s), (ErrorCode::BudgetExceeded, None));
        let pricey = BudgetCall {
            cost: Some(0.05),
            ..call(10)
        };
        let v = check(Some(&budgets), &pricey, &mut tiers, AT);
        assert_eq!(
            (v.refusal, v.warnings),
            (None, vec!["cap-cost=over".to_owned()])
        );
    }

    #[test]
    fn a_spent_provider_budget_cuts_its_candidates() {
        let budgets = Budgets {
            policies: vec![
                policy("openai-day", BudgetScope::Provider, BudgetWindow::Day, true),
                policy("groq-day", BudgetScope::Provider, BudgetWindow::Day, false),
            ],
            states: vec![
                state("openai-day", "openai", BudgetLevel::Over, AT + 5_000),
                state("groq-day", "groq", BudgetLevel::Warn, AT + 5_000),
                state("groq-day", "mistral", BudgetLevel::Warn, AT + 5_000),
            ],
        };
        let mut tiers = vec![vec![cand("openai")], vec![cand("groq"), cand("openai")]];
        let v = check(Some(&budgets), &call(10), &mut tiers, AT);
        assert_eq!(v.refusal, None);
        // Only the providers this call could use warn.
        assert_eq!(v.warnings, ["groq-day=warn"]);
        assert_eq!(tiers, vec![vec![cand("groq")]]);
        let mut only_openai = vec![vec![cand("openai")]];
        let v = check(Some(&budgets), &call(10), &mut only_openai, AT);
        let e = v.refusal.expect("refused");
        assert_eq!(
            (e.code, e.retry_after_s),
            (ErrorCode::BudgetExceeded, Some(5))
        );
    }

    fn step(provider: &str, model: &str, when: &[&str]) -> Candidate {
        Candidate {
            when: when.iter().map(|w| (*w).to_owned()).collect(),
            model: model.into(),
            ..cand(provider)
        }
    }

    #[test]
    fn a_spent_call_budget_takes_the_budget_step_instead_of_the_429() {
        let budgets = Budgets {
            policies: vec![policy("team", BudgetScope::Key, BudgetWindow::Day, true)],
            states: vec![state("team", "key_a", BudgetLevel::Over, AT + 5_000)],
        };
        let mut tiers = vec![
            vec![cand("openai")],
            vec![step("groq", "big", &["rate_limit"])],
            vec![step("groq", "mini", &["budget_exceeded", "timeout"])],
        ];
        let v = check(Some(&budgets), &call(10), &mut tiers, AT);
        assert_eq!(v.refusal, None);
        // Only the step is left, unconditional now: its trigger fired before the first attempt.
        assert_eq!(tiers, vec![vec![step("groq", "mini", &[])]]);
        assert_eq!(
            v.ruled_out,
            vec![cand("openai"), step("groq", "big", &["rate_limit"])]
        );
        // Without a step the 429 stays.
        let mut plain = vec![
            vec![cand("openai")],
            vec![step("groq", "big", &["timeout"])],
        ];
        let v = check(Some(&budgets), &call(10), &mut plain, AT);
        let e = v.refusal.expect("refused");
        assert_eq!(
            (e.code, e.retry_after_s),
            (ErrorCode::BudgetExceeded, Some(5))
        );
    }

    #[test]
    fn a_spent_provider_budget_enables_the_steps_of_other_providers() {
        let budgets = Budgets {
            policies: vec![policy(
                "openai-day",
                BudgetScope::Provider,
                BudgetWindow::Day,
                true,
            )],
            states: vec![state("openai-day", "openai", BudgetLevel::Over, AT + 5_000)],
        };
        let mut tiers = vec![
            vec![cand("openai")],
            vec![step("openai", "mini", &["budget_exceeded"])],
            vec![step("groq", "mini", &["budget_exceeded"])],
        ];
        let v = check(Some(&budgets), &call(10), &mut tiers, AT);
        assert_eq!(v.refusal, None);
        // The step on the spent provider is out too.
        assert_eq!(tiers, vec![vec![step("groq", "mini", &[])]]);
        assert_eq!(v.ruled_out.len(), 2);
        // A step no budget fired stays conditional.
        let mut calm = vec![
            vec![cand("groq")],
            vec![step("groq", "mini", &["budget_exceeded"])],
        ];
        let v = check(Some(&budgets), &call(10), &mut calm, AT);
        assert_eq!((v.refusal, v.ruled_out), (None, vec![]));
        assert_eq!(calm[1][0].when, ["budget_exceeded"]);
        // Only steps on spent providers: refused.
        let mut spent = vec![
            vec![cand("openai")],
            vec![step("openai", "mini", &["budget_exceeded"])],
        ];
        let e = check(Some(&budgets), &call(10), &mut spent, AT)
            .refusal
            .expect("refused");
        assert_eq!(e.code, ErrorCode::BudgetExceeded);
    }
}
