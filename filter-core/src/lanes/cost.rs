//! What a call costs: the estimate a candidate is ordered by (`autoSort`), the cost an answer
//! reports (`x-ai-router-cost`) and the first choice a saving is counted against.
//!
//! Prices are the pool's `cost` per million tokens (explicit, or filled from the price table
//! with `autoPrice`); a model without one is unpriced: it sorts after every priced one and its
//! answers cost 0, as in the usage rows.

use ai_router_contract::price::Price;
use ai_router_proto::v1::Cost;

use crate::plan::Candidate;
use crate::state::State;
use crate::vocab::Needs;

/// The price of a candidate's model, if it has one.
pub fn price_of(state: &State, provider: &str, model: &str) -> Option<Cost> {
    let (_, p) = state.provider(provider)?;
    p.models.iter().find(|m| m.id == model)?.cost
}

/// The cost of a number of tokens at a pushed price, `cached_tokens` of the prompt served from
/// the provider's cache: the one price rule ([`ai_router_contract::price::Price::cost`]) the
/// control plane prices the same usage by.
pub fn cost_at(
    price: &Cost,
    prompt_tokens: u64,
    completion_tokens: u64,
    cached_tokens: u64,
) -> f64 {
    Price {
        input: price.input,
        output: price.output,
        cached_input: price.cached_input,
    }
    .cost(prompt_tokens, completion_tokens, cached_tokens)
}

/// What an answer's usage costs at a price: the one figure `x-ai-router-cost` and a stream's
/// `usage.cost` state.
pub fn of_usage(price: &Cost, usage: &crate::vocab::Usage) -> f64 {
    cost_at(
        price,
        usage.prompt_tokens,
        usage.completion_tokens,
        usage.cached_tokens,
    )
}

/// The output a request may produce: its `max_tokens`, else the provider's `defaultMaxTokens`.
fn output_estimate(state: &State, provider: &str, needs: &Needs) -> u64 {
    if needs.max_tokens > 0 {
        return needs.max_tokens;
    }
    state
        .provider(provider)
        .map_or(0, |(_, p)| u64::from(p.default_max_tokens))
}

/// This request's estimated cost on a candidate: the prompt estimate at the input price plus
/// its output estimate at the output price; `None` when the model is unpriced.
pub fn estimate(state: &State, c: &Candidate, needs: &Needs) -> Option<f64> {
    let price = price_of(state, &c.provider, &c.model)?;
    Some(cost_at(
        &price,
        needs.prompt_tokens,
        output_estimate(state, &c.provider, needs),
        0,
    ))
}

/// `autoSort`: every candidate of every tier, cheapest first by this request's estimate, each
/// its own tier. Unpriced candidates come last; ties keep the configured order (the sort is
/// stable), so an unpriced pool keeps its order.
pub fn cheapest_first(
    state: &State,
    tiers: Vec<Vec<Candidate>>,
    needs: &Needs,
) -> Vec<Vec<Candidate>> {
    let mut all: Vec<(Option<f64>, Candidate)> = tiers
        .into_iter()
        .flatten()
        .map(|c| (estimate(state, &c, needs), c))
        .collect();
    all.sort_by(|(a, _), (b, _)| match (a, b) {
        (Some(a), Some(b)) => a.total_cmp(b),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => std::cmp::Ordering::Equal,
    });
    all.into_iter().map(|(_, c)| vec![c]).collect()
}

/// The header value of a cost: plain decimal, at most ten places, no exponent.
pub fn header_value(cost: f64) -> String {
    let text = format!("{:.10}", cost.max(0.0));
    let text = text.trim_end_matches('0').trim_end_matches('.');
    if text.is_empty() {
        "0".into()
    } else {
        text.into()
    }
}

/// What an answer on `answered` saved against the call's first choice for the same usage
/// (0 when the first choice answered, or either is unpriced, or it cost more).
pub fn saving(
    state: &State,
    first_choice: &Candidate,
    answered_provider: &str,
    answered_model: &str,
    prompt_tokens: u64,
    completion_tokens: u64,
) -> f64 {
    let (Some(first), Some(answered)) = (
        price_of(state, &first_choice.provider, &first_choice.model),
        price_of(state, answered_provider, answered_model),
    ) else {
        return 0.0;
    };
    let saved = cost_at(&first, prompt_tokens, completion_tokens, 0)
        - cost_at(&answered, prompt_tokens, completion_tokens, 0);
    saved.max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ai_router_proto::v1::{Model, Provider, Snapshot};

    fn model(id: &str, cost: Option<(f64, f64)>) -> Model {
        Model {
            id: id.into(),
            cost: cost.map(|(input, output)| Cost {
                input,
                output,
                cached_input: None,
            }),
            ..Default::default()
        }
    }

    fn state() -> State {
        let mut snap = Snapshot::default();
        snap.providers.push(Provider {
            id: "dear".into(),
            default_max_tokens: 1000,
            models: vec![model("m", Some((10.0, 30.0))), model("free", None)],
            ..Default::default()
        });
        snap.providers.push(Provider {
            id: "cheap".into(),
            default_max_tokens: 1000,
            // Dear on input, cheap on output: which wins depends on the request.
            models: vec![model("m", Some((20.0, 1.0)))],
            ..Default::default()
        });
        State::new(1, snap)
    }

    fn cand(p: &str, m: &str) -> Candidate {
        Candidate {
            provider: p.into(),
            model: m.into(),
            weight: 1.0,
            when: Vec::new(),
        }
    }

    fn needs(prompt_tokens: u64, max_tokens: u64) -> Needs {
        Needs {
            prompt_tokens,
            max_tokens,
            context_tokens: prompt_tokens + max_tokens,
            ..Needs::default()
        }
    }

    fn order(tiers: &[Vec<Candidate>]) -> Vec<String> {
        tiers
            .iter()
            .map(|t| {
                assert_eq!(t.len(), 1, "each candidate its own tier");
                format!("{}/{}", t[0].provider, t[0].model)
            })
            .collect()
    }

    #[test]
    fn the_order_follows_this_requests_estimate() {
        let s = state();
        let tiers = vec![
            vec![cand("dear", "m"), cand("dear", "free")],
            vec![cand("cheap", "m")],
        ];
        // A long answer: output dominates, "cheap" (1/M out) wins; the unpriced model is last.
        let long = cheapest_first(&s, tiers.clone(), &needs(10, 10_000));
        assert_eq!(order(&long), ["cheap/m", "dear/m", "dear/free"]);
        // A long prompt and a short answer: input dominates, "dear" (10/M in) wins.
        let short = cheapest_first(&s, tiers, &needs(10_000, 1));
        assert_eq!(order(&short), ["dear/m", "cheap/m", "dear/free"]);
    }

    #[test]
    fn without_max_tokens_the_providers_default_is_the_output_estimate() {
        let s = state();
        // 0 prompt tokens, 1000 output tokens by default: 30/M*1000 vs 1/M*1000.
        let e = estimate(&s, &cand("dear", "m"), &needs(0, 0)).unwrap();
        assert!((e - 0.03).abs() < 1e-12, "{e}");
        assert_eq!(estimate(&s, &cand("dear", "free"), &needs(0, 0)), None);
    }

    #[test]
    fn unpriced_candidates_keep_their_configured_order() {
        let s = state();
        let tiers = vec![vec![cand("dear", "free")], vec![cand("dear", "free2")]];
        assert_eq!(
            order(&cheapest_first(&s, tiers, &needs(1, 1))),
            ["dear/free", "dear/free2"]
        );
    }

    #[test]
    fn savings_and_header_values() {
        let s = state();
        // 1000 out: first choice dear (0.03) answered by cheap (0.001).
        let saved = saving(&s, &cand("dear", "m"), "cheap", "m", 0, 1000);
        assert!((saved - 0.029).abs() < 1e-12, "{saved}");
        assert_eq!(saving(&s, &cand("cheap", "m"), "dear", "m", 0, 1000), 0.0);
        assert_eq!(saving(&s, &cand("dear", "m"), "dear", "free", 0, 1000), 0.0);
        assert_eq!(header_value(0.029), "0.029");
        assert_eq!(header_value(0.0), "0");
        assert_eq!(header_value(1.5e-7), "0.00000015");
        assert_eq!(header_value(12.0), "12");
    }
}
