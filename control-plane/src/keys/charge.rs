//! The charge of an attempt: what one attempt's usage is charged, the one rule the usage rows (and so the
//! per-key quotas, `keys::quotas`) and the budget policies (`engine::budgets`) count by, so
//! the two never disagree on a call. An attempt is charged after it answered, for the usage
//! it reported (streamed or not); one without usage, or with none, is charged nothing.

use ai_router_proto::v1 as pb;

use crate::config::Config;

/// The cost of `usage` on `provider`'s `model`, from its cost per million tokens (a model
/// without a cost counts 0; cached prompt tokens at its `cachedInput` when it has one).
pub fn cost_of(config: &Config, provider: &str, model: &str, usage: &pb::Usage) -> f64 {
    let cost = config
        .providers
        .iter()
        .find(|p| p.id == provider)
        .and_then(|p| p.cost_of(model, config.auto_price));
    cost.map_or(0.0, |c| {
        c.price().cost(
            usage.prompt_tokens,
            usage.completion_tokens,
            usage.cached_tokens,
        )
    })
}

/// One attempt's charge: whose it is (key, profile, provider) and what it used.
#[derive(Debug, Clone, PartialEq)]
pub struct Charge<'a> {
    /// The virtual key's id; empty when the call had none.
    pub key: &'a str,
    /// The profile the call resolved to; empty for a direct model call.
    pub profile: &'a str,
    pub provider: &'a str,
    /// The model the attempt called.
    pub model: &'a str,
    /// The client protocol of the call (empty from a data plane too old to say).
    pub protocol: &'a str,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// Of the prompt tokens, those the provider served from its cache.
    pub cached_tokens: u64,
    pub cost: f64,
    /// When the attempt was reported (0: unknown).
    pub at_ms: i64,
}

impl Charge<'_> {
    pub fn tokens(&self) -> u64 {
        self.prompt_tokens.saturating_add(self.completion_tokens)
    }
}

/// The charge of `attempt`, when it used anything.
pub fn charge<'a>(config: &Config, attempt: &'a pb::AttemptOutcome) -> Option<Charge<'a>> {
    let usage = attempt.usage.as_ref()?;
    if usage.total_tokens() == 0 {
        return None;
    }
    Some(Charge {
        key: &attempt.virtual_key_id,
        profile: &attempt.profile,
        provider: &attempt.provider,
        model: &attempt.model,
        protocol: &attempt.protocol,
        prompt_tokens: usage.prompt_tokens,
        completion_tokens: usage.completion_tokens,
        cached_tokens: usage.cached_tokens,
        cost: cost_of(config, &attempt.provider, &attempt.model, usage),
        at_ms: attempt.at_ms,
    })
}

/// Every charge of a report batch, in order.
pub fn charges<'a>(
    config: &'a Config,
    batch: &'a pb::ReportBatch,
) -> impl Iterator<Item = Charge<'a>> + 'a {
    batch.attempts.iter().filter_map(|a| charge(config, a))
}
