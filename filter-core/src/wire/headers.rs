//! Which headers cross the gateway. Both directions are allowlists: a header reaches a provider
//! or a client only when it is named here, so a new header a client or a provider invents
//! (credentials, billing selectors, cookies, the stages' own signals) never crosses by default.

/// The prefix of every header the stages use between themselves. A client's or a provider's
/// header with this prefix is removed before anything reads it.
pub const INTERNAL_PREFIX: &str = ai_router_contract::headers::PREFIX;

/// Headers a client sends that reach the provider unchanged. Everything else is dropped:
/// the gateway sets the provider's credentials, `:authority`, `:path`, `content-length`,
/// `accept` on streams, `x-request-id` and `idempotency-key` itself (the latter derived by
/// [`upstream_idempotency_key`]), and the provider's configured `headers` are added after. `accept-encoding` is not forwarded so that answers
/// come back as plain bytes the attempt stage can read.
pub const FORWARDED_TO_PROVIDER: &[&str] = &[
    "content-type",
    // Set by Envoy on every request; its route lookup finds no route without it.
    "x-forwarded-proto",
    "accept",
    "user-agent",
    "traceparent",
    "tracestate",
];

/// Headers of a provider's answer that reach the client. The provider's rate-limit, cookie,
/// organisation and tracing headers stay inside; the gateway adds its own (`x-request-id`,
/// `x-ai-router-model`, `x-ai-router-attempts`, `retry-after` on a final error).
pub const FORWARDED_TO_CLIENT: &[&str] = &[
    "content-type",
    "content-length",
    "content-encoding",
    "cache-control",
];

/// Whether a request header the attempt stage received from the front stage goes on to the
/// provider. Pseudo-headers (`:method`, `:path`...) always stay: Envoy needs them.
pub fn forwarded_to_provider(name: &str) -> bool {
    name.starts_with(':') || FORWARDED_TO_PROVIDER.contains(&name)
}

/// Whether a provider's response header goes on to the client; its rate-limit headers only
/// when the operator opted in (`gateway.forwardRateLimitHeaders`).
pub fn forwarded_to_client(name: &str, rate_limits: bool) -> bool {
    name.starts_with(':')
        || FORWARDED_TO_CLIENT.contains(&name)
        || rate_limits && is_rate_limit(name)
}

/// A provider's rate-limit header: `x-ratelimit-*`, `anthropic-ratelimit-*`, `retry-after`.
pub fn is_rate_limit(name: &str) -> bool {
    name.starts_with("x-ratelimit-")
        || name.starts_with("anthropic-ratelimit-")
        || name == "retry-after"
        || name == "retry-after-ms"
}

/// The `idempotency-key` a provider receives for a call: a digest of the virtual key's id and
/// the client's value (its `Idempotency-Key`, else its `x-request-id`). Every tenant shares
/// the pool's provider keys, so a value a client chooses never reaches a provider as is: two
/// tenants sending the same value get different keys upstream (neither can replay the other's
/// answer), while every attempt of a call, and a client's retry with the same value, get the
/// same one. `None` when the client's value is empty.
pub fn upstream_idempotency_key(virtual_key_id: &str, client_value: &str) -> Option<String> {
    let value = client_value.trim();
    if value.is_empty() {
        return None;
    }
    // Length-prefixed, so no (id, value) pair spells another's input.
    let input = format!(
        "ai-router idempotency v1\n{}:{virtual_key_id}\n{value}",
        virtual_key_id.len()
    );
    Some(ai_router_contract::sha256_hex(input.as_bytes()))
}

/// The names of a listed map's internal headers ([`is_internal`]), to take out once the
/// listing is dropped (usually none: nothing allocated).
pub fn internal_names(map: &[(String, Vec<u8>)]) -> Vec<String> {
    map.iter()
        .filter(|(name, _)| is_internal(name))
        .map(|(name, _)| name.clone())
        .collect()
}

/// Whether a header is one the stages use between themselves, or one that steers Envoy.
pub fn is_internal(name: &str) -> bool {
    name.starts_with(INTERNAL_PREFIX) || name.starts_with("x-envoy-")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_upstream_idempotency_key_is_per_tenant_and_stable() {
        let a = upstream_idempotency_key("vk-a", "order-42").unwrap();
        assert_eq!(
            upstream_idempotency_key("vk-a", "order-42").as_deref(),
            Some(a.as_str())
        );
        assert_ne!(
            upstream_idempotency_key("vk-b", "order-42").as_deref(),
            Some(a.as_str())
        );
        assert_ne!(
            upstream_idempotency_key("vk-a", "order-43").as_deref(),
            Some(a.as_str())
        );
        assert!(!a.contains("order-42"));
        // The split between id and value is part of the input.
        assert_ne!(
            upstream_idempotency_key("vk-a\n1", "x"),
            upstream_idempotency_key("vk-a", "1\nx")
        );
        assert_eq!(upstream_idempotency_key("vk-a", "  "), None);
    }

    #[test]
    fn credentials_and_billing_selectors_never_reach_a_provider() {
        for name in [
            "authorization",
            "api-key",
            "x-api-key",
            "proxy-authorization",
            "cookie",
            "openai-organization",
            "openai-project",
            "x-goog-api-key",
            "x-forwarded-for",
            "x-envoy-attempt-count",
            "x-ai-router-plan",
            "accept-encoding",
            "anthropic-version",
        ] {
            assert!(!forwarded_to_provider(name), "{name} must not be forwarded");
        }
        for name in [":method", ":path", "content-type", "accept", "traceparent"] {
            assert!(forwarded_to_provider(name), "{name} must be forwarded");
        }
    }

    #[test]
    fn provider_internals_never_reach_a_client() {
        for name in [
            "set-cookie",
            "openai-organization",
            "openai-project",
            "x-ratelimit-remaining-requests",
            "anthropic-ratelimit-requests-remaining",
            "x-ai-router-final-status",
            "x-ai-router-retry",
            "x-envoy-upstream-service-time",
            "server",
            "x-request-id",
        ] {
            assert!(
                !forwarded_to_client(name, false),
                "{name} must not be forwarded"
            );
        }
        for name in [":status", "content-type", "content-length"] {
            assert!(forwarded_to_client(name, false), "{name} must be forwarded");
        }
        // Rate-limit headers only when the operator opts in; never the others.
        assert!(forwarded_to_client("x-ratelimit-remaining-requests", true));
        assert!(forwarded_to_client(
            "anthropic-ratelimit-tokens-remaining",
            true
        ));
        assert!(!forwarded_to_client("set-cookie", true));
        assert!(!forwarded_to_client("x-ai-router-retry", true));
    }

    #[test]
    fn internal_names() {
        assert!(is_internal("x-ai-router-retry"));
        assert!(is_internal("x-envoy-max-retries"));
        assert!(!is_internal("x-request-id"));
    }
}
