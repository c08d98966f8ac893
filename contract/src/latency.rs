//! A lane's latency average: the filter ranks lanes by it (`selection.latencyTolerance`) and
//! the control plane shows it (`GET /admin/stats`, `GET /admin/health`). An exponentially
//! weighted moving average that starts at the lane's first sample, the newest sample weighing
//! `selection.ewmaAlpha` ([`crate::defaults::EWMA_ALPHA`] unless the pool sets it).

/// The average after `sample`: `alpha · sample + (1 − alpha) · average`.
pub fn ewma_step(average: f64, sample: f64, alpha: f64) -> f64 {
    alpha * sample + (1.0 - alpha) * average
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_sample_weighs_alpha() {
        assert!((ewma_step(100.0, 200.0, 0.3) - 130.0).abs() < 1e-9);
        assert!((ewma_step(100.0, 200.0, 0.5) - 150.0).abs() < 1e-9);
        // Alpha 1: only the newest counts; a first sample folded into itself stays.
        assert_eq!(ewma_step(100.0, 200.0, 1.0), 200.0);
        assert_eq!(ewma_step(42.0, 42.0, 0.3), 42.0);
    }
}
