//! The spec's defaults, each defined once: what a field of the pool file means when the file
//! leaves it out. The control plane applies them once, at load (the resolved config and the
//! snapshot carry the values: the pushed `defaults:` policy has every per-call number and
//! switch, and a profile is merged over it); the filter reads them as given, and meets one only
//! in `state::settle_unsent`, for a setting a snapshot did not send.

// Policies (`defaults:` and `profiles:`), per call.
/// `maxAttempts`.
pub const MAX_ATTEMPTS: u32 = 4;
/// `timeoutMs`: an attempt's wait for its answer to start, and the longest gap in a stream.
pub const TIMEOUT_MS: u64 = 60_000;
/// `deadlineMs`: the whole call, every attempt included.
pub const DEADLINE_MS: u64 = 120_000;
/// `allowFallback` of a policy, and of a virtual key.
pub const ALLOW_FALLBACK: bool = true;
/// `pinned`: a profile's candidates may be any model identity.
pub const PINNED: bool = false;

// The response cache (`cache:` of the pool).
/// `cache.maxEntries`: slots per Envoy process.
pub const CACHE_MAX_ENTRIES: u32 = 1_024;
/// `cache.maxBytes`: the answers' bytes per Envoy process (a slot takes maxBytes / maxEntries).
pub const CACHE_MAX_BYTES: u64 = 64 * 1024 * 1024;

// Virtual keys.
/// `enabled` of a mounted or a stored key.
pub const KEY_ENABLED: bool = true;

// Providers, keys, models, candidates.
/// `weight` of a provider, a key, a model or a candidate.
pub const WEIGHT: f64 = 1.0;
/// `providers[].defaultMaxTokens`: the `max_tokens` sent to a provider that needs one when the
/// request sets none.
pub const DEFAULT_MAX_TOKENS: u32 = 4096;

// The gateway (Envoy's public listener).
/// `gateway.host` and `controlPlane.host`.
pub const HOST: &str = "127.0.0.1";
/// `gateway.port`, when `appPort` is not given either.
pub const GATEWAY_PORT: u16 = 8080;
/// `gateway.portOffset`: the gateway listens on `appPort + portOffset`.
pub const PORT_OFFSET: u16 = 1;
/// `gateway.maxBodyBytes`: 4 MiB.
pub const MAX_BODY_BYTES: u64 = 4 * 1024 * 1024;
/// `gateway.requestHeadersTimeoutMs`: a client's request headers arrive within this.
pub const REQUEST_HEADERS_TIMEOUT_MS: u64 = 10_000;
/// `gateway.requestTimeoutMs`: a client's whole request (headers and body) arrives within this.
pub const REQUEST_TIMEOUT_MS: u64 = 60_000;
/// `gateway.connectionIdleTimeoutMs`: a client connection with no request open is closed after
/// this.
pub const CONNECTION_IDLE_TIMEOUT_MS: u64 = 300_000;
/// `gateway.maxConcurrentRequests`: calls in flight through one Envoy.
pub const MAX_CONCURRENT_REQUESTS: u32 = 10_000;
/// `gateway.forwardRateLimitHeaders`.
pub const FORWARD_RATE_LIMIT_HEADERS: bool = false;

// The control plane.
/// `controlPlane.httpPort`.
pub const CONTROL_PLANE_HTTP_PORT: u16 = 8081;
/// `controlPlane.grpcPort`.
pub const CONTROL_PLANE_GRPC_PORT: u16 = 8082;

// `resilience:`.
/// `keyBreaker.failureThreshold`, `cooldownMs`, `maxCooldownMs`.
pub const KEY_BREAKER_FAILURE_THRESHOLD: u32 = 3;
pub const KEY_BREAKER_COOLDOWN_MS: u64 = 15_000;
pub const KEY_BREAKER_MAX_COOLDOWN_MS: u64 = 300_000;
/// `providerBreaker.failureThreshold`, `cooldownMs`, `maxCooldownMs`.
pub const PROVIDER_BREAKER_FAILURE_THRESHOLD: u32 = 8;
pub const PROVIDER_BREAKER_COOLDOWN_MS: u64 = 30_000;
pub const PROVIDER_BREAKER_MAX_COOLDOWN_MS: u64 = 300_000;
/// `backoff.baseMs`, `factor`, `maxMs`.
pub const BACKOFF_BASE_MS: u64 = 100;
pub const BACKOFF_FACTOR: f64 = 2.0;
pub const BACKOFF_MAX_MS: u64 = 5_000;
/// `rateLimitCooldownMs`: how long a rate-limited lane cools down when the provider named no
/// window.
pub const RATE_LIMIT_COOLDOWN_MS: u64 = 10_000;
/// `quotaBlacklistMs`: how long a key with a spent quota is out when the provider named no
/// window (6 h).
pub const QUOTA_BLACKLIST_MS: u64 = 21_600_000;

// `selection:`.
pub const LATENCY_TOLERANCE: f64 = 1.5;
pub const LATENCY_SLACK_MS: u64 = 50;
pub const EWMA_ALPHA: f64 = 0.3;
pub const LOW_HEADROOM: u64 = 1;
/// `selection.score`: the weights of the rpm, tpm and rpd headroom terms.
pub const SCORE_ALPHA: f64 = 0.3;
pub const SCORE_BETA: f64 = 0.4;
pub const SCORE_GAMMA: f64 = 0.3;
/// `selection.unreportedWeight`: a lane without reported headroom weighs as if it had this
/// many requests left.
pub const UNREPORTED_WEIGHT: f64 = 10.0;
/// `selection.affinity.idleMs`: a session pin lapses after this long unused.
pub const AFFINITY_IDLE_MS: u64 = 30 * 60 * 1000;

/// `discoveryTtlMs`: how long a key's listed catalog (`discover: true`) is trusted before it is
/// listed again.
pub const DISCOVERY_TTL_MS: u64 = 24 * 60 * 60 * 1000;

// `telemetry:`.
/// `telemetry.includeContent`: attempt events carry no request or answer unless it is set.
pub const INCLUDE_CONTENT: bool = false;
/// With `telemetry.includeContent`, each side of an attempt's content (the request body, the
/// provider's answer) is cut to this many bytes, on a UTF-8 boundary, and marked truncated.
pub const CONTENT_MAX_BYTES: usize = 16 * 1024;
