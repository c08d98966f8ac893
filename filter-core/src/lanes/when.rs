//! Conditional candidates (`when: [timeout, rate_limit, ...]`): a candidate with a `when` list
//! is tried only after an attempt of the call failed with one of its triggers; one without is
//! unconditional. The first attempt of a call has no failure before it, so a conditional
//! candidate is never the first.

use ai_router_proto::v1::FallbackTrigger;

use ai_router_contract::failure::ErrorClass;

/// Whether a candidate with this `when` list may take the next attempt, after the call's last
/// failure (`None`: no attempt failed yet).
pub fn allows(when: &[String], last_failure: Option<ErrorClass>) -> bool {
    if when.is_empty() {
        return true;
    }
    last_failure
        .and_then(FallbackTrigger::of_class)
        .is_some_and(|trigger| when.iter().any(|w| w == trigger.text()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn when(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn an_empty_list_is_unconditional() {
        assert!(allows(&[], None));
        assert!(allows(&[], Some(ErrorClass::Auth)));
    }

    #[test]
    fn a_list_takes_only_its_triggers_and_never_the_first_attempt() {
        let w = when(&["timeout", "rate_limit"]);
        assert!(!allows(&w, None));
        assert!(allows(&w, Some(ErrorClass::Timeout)));
        assert!(allows(&w, Some(ErrorClass::RateLimit)));
        assert!(!allows(&w, Some(ErrorClass::Transient)));
        assert!(!allows(&w, Some(ErrorClass::Auth)));
    }

    #[test]
    fn transient_network_and_stream_failures_are_provider_errors() {
        let w = when(&["provider_error"]);
        for class in [
            ErrorClass::Transient,
            ErrorClass::Network,
            ErrorClass::Stream,
        ] {
            assert!(allows(&w, Some(class)), "{class:?}");
        }
        for class in [
            ErrorClass::Timeout,
            ErrorClass::RateLimit,
            ErrorClass::Quota,
            ErrorClass::Auth,
        ] {
            assert!(!allows(&w, Some(class)), "{class:?}");
        }
        // The caller's own failures trigger nothing.
        let all = when(&[
            "timeout",
            "rate_limit",
            "provider_error",
            "budget_exceeded",
            "quota",
            "auth",
        ]);
        for class in [
            ErrorClass::InvalidRequest,
            ErrorClass::Cancelled,
            ErrorClass::Deadline,
            ErrorClass::Mismatch,
        ] {
            assert!(!allows(&all, Some(class)), "{class:?}");
        }
        assert!(allows(&all, Some(ErrorClass::Quota)));
        assert!(allows(&all, Some(ErrorClass::Auth)));
    }
}
