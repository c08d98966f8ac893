//! Callbacks the host delivered while their stage was already running: the attempt root's
//! tick acts on an attempt (a local answer, a reset) and Envoy may call back into that
//! attempt's context before the tick returns. The stage cannot be entered twice, and the
//! callback cannot be put off (Envoy wants its answer now), so it is skipped: Envoy goes on
//! with the stream as if the stage said "continue", and an attempt whose log callback was
//! skipped is settled when its context is dropped. Each skip is counted (the filter's
//! `ai_router.callbacks_skipped` counter) and the first one of a VM is logged.

/// The skips of one VM.
#[derive(Debug, Default)]
pub struct Skipped {
    pub count: u64,
}

impl Skipped {
    /// Counts a skipped `callback`; the line to log when it is this VM's first.
    pub fn skip(&mut self, callback: &str) -> Option<String> {
        self.count += 1;
        (self.count == 1).then(|| {
            format!(
                "ai-router: the {callback} callback arrived while its stage was running and was skipped (counted in ai_router.callbacks_skipped; logged once per worker)"
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_skip_counts_and_the_first_is_logged() {
        let mut s = Skipped::default();
        assert!(s.skip("on_log").is_some_and(|l| l.contains("on_log")));
        assert!(s.skip("on_log").is_none());
        assert_eq!(s.count, 2);
    }
}
