//! What tokens cost: the one price rule behind every figure of a call's cost (the answer's
//! `x-ai-router-cost`, the stats, the events, the Prometheus cost, the usage rows, the budgets
//! and the estimates a call is checked and ordered by). Prices are per million tokens.

/// A model's prices per million tokens (`cost:` of a model in the pool).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Price {
    /// `input`: a prompt token.
    pub input: f64,
    /// `output`: a completion token.
    pub output: f64,
    /// `cachedInput`: a prompt token the provider served from its cache; `None`: `input`.
    pub cached_input: Option<f64>,
}

impl Price {
    /// The cost of `prompt_tokens` and `completion_tokens`, of which `cached_tokens` of the
    /// prompt came from the provider's cache (counted at most up to the prompt).
    pub fn cost(&self, prompt_tokens: u64, completion_tokens: u64, cached_tokens: u64) -> f64 {
        let cached = cached_tokens.min(prompt_tokens);
        // Token counts fit f64 exactly far beyond any real usage.
        #[allow(clippy::cast_precision_loss)]
        let (fresh, cached, completion) = (
            (prompt_tokens - cached) as f64,
            cached as f64,
            completion_tokens as f64,
        );
        let cached_price = self.cached_input.unwrap_or(self.input);
        (fresh * self.input + cached * cached_price + completion * self.output) / 1_000_000.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_prompt_tokens_are_priced_at_cached_input() {
        let plain = Price {
            input: 10.0,
            output: 10.0,
            cached_input: None,
        };
        // 100 prompt (80 cached at the input price) + 10 completion at 10 per million.
        assert!((plain.cost(100, 10, 80) - 1_100e-6).abs() < 1e-12);
        let cached = Price {
            cached_input: Some(1.0),
            ..plain
        };
        // 20 fresh at 10, 80 cached at 1, 10 out at 10: 200 + 80 + 100.
        assert!((cached.cost(100, 10, 80) - 380e-6).abs() < 1e-12);
        // More cached than prompt counts the prompt only.
        assert!((cached.cost(50, 0, 80) - 50e-6).abs() < 1e-12);
        assert_eq!(cached.cost(0, 0, 0), 0.0);
    }

    #[test]
    fn a_prompt_cached_anthropic_call() {
        // Claude Sonnet: 3 per million in, 0.3 cached, 15 out. 10,000 prompt tokens of which
        // 9,000 read from the cache and 100 out: 3,000 + 2,700 + 1,500 = 7,200 (per million),
        // where pricing the cached tokens as input would say 31,500 (4.4 times as much).
        let sonnet = Price {
            input: 3.0,
            output: 15.0,
            cached_input: Some(0.3),
        };
        assert!((sonnet.cost(10_000, 100, 9_000) - 0.0072).abs() < 1e-12);
        let uncached = Price {
            cached_input: None,
            ..sonnet
        };
        assert!((uncached.cost(10_000, 100, 9_000) - 0.0315).abs() < 1e-12);
    }
}
