//! What the filter (wasm) and the control plane (native) must agree on, defined once: names
//! that cross a process boundary and the small rules both sides apply. No I/O, no proxy-wasm:
//! both targets build it.
//!
//! - `failure`: the error classes and the failure -> hold rule;
//! - `error_code`: the closed set of gateway error codes (status, OpenAI type, message, gRPC);
//! - `defaults`: the spec's defaults;
//! - `calendar`: UTC (and Pacific) calendar math;
//! - `kinds`: per-kind provider facts (daily reset zone, rate-limit windows, request caps);
//! - `price`: what tokens cost at a model's prices (cached prompt tokens included);
//! - `latency`: a lane's latency average (the EWMA step);
//! - `plugin`: the plugin configuration the renderer writes and the filter reads;
//! - `headroom`: what is estimated left of a lane's reported headroom;
//! - `minute`: the blocks of a key's `requestsPerMinute` an Envoy asks for, and the most granted;
//! - here: the headers, clusters and metadata between the processes, the OpenAI error type and
//!   Google's status word of a status, the probe lease holder, SHA-256 and the secret fingerprint.

use sha2::{Digest, Sha256};

pub mod calendar;
pub mod defaults;
pub mod error_code;
pub mod failure;
pub mod kinds;
pub mod latency;
pub mod plugin;
pub mod price;

/// A virtual key's `profiles` or `models` entry that binds it to every profile or model.
pub const BINDING_WILDCARD: &str = "*";

/// The gRPC metadata entry that carries the sync token on every `airouter.v1.Sync` call.
pub const SYNC_TOKEN_METADATA: &str = "x-ai-router-sync-token";
/// The environment variable that holds the sync token (control plane and Envoy).
pub const SYNC_TOKEN_ENV: &str = "AI_ROUTER_SYNC_TOKEN";
/// The filter's gauge of the state version its workers read (the control plane's numbering),
/// set when the singleton published a snapshot or a delta; Envoy's admin `/stats` shows it as
/// `wasmcustom.` followed by this name.
pub const STATE_VERSION_STAT: &str = "ai_router.state_version";
/// While any attempt is in flight, the singleton sends the counts per provider key (a report
/// batch's `in_flight`) at least this often; the control plane forgets a node's counts older
/// than [`IN_FLIGHT_FORGET_MS`].
pub const IN_FLIGHT_REFRESH_MS: i64 = 5_000;
/// How old a node's counts in flight may be before the control plane stops counting them (an
/// Envoy that stopped says nothing more).
pub const IN_FLIGHT_FORGET_MS: i64 = 3 * IN_FLIGHT_REFRESH_MS;

/// A provider's `host[:port]` as `(host, port)`: lower-case, an IPv6 host without its
/// brackets, port 80 when none is named (the plain-HTTP providers one pass resolves at start).
pub fn host_port(authority: &str) -> (String, u16) {
    let authority = authority.to_ascii_lowercase();
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, port)) if !h.ends_with(':') => match port.parse::<u16>() {
            Ok(port) => (h.to_owned(), port),
            Err(_) => (authority.clone(), 80),
        },
        _ => (authority.clone(), 80),
    };
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    (host, port)
}

/// `host:port` as the dynamic forward proxy keys its cache (an IPv6 host in brackets).
pub fn authority_of(host: &str, port: u16) -> String {
    match host.contains(':') {
        true => format!("[{host}]:{port}"),
        false => format!("{host}:{port}"),
    }
}

/// The headers the stages use between themselves (never seen by a client or a provider).
pub mod headers {
    /// Front → attempt: the call's ticket, naming the plan kept in the VM's call table.
    pub const PLAN: &str = "x-ai-router-plan";
    /// Attempt → the attempt listener's route (`cluster_header`): the provider cluster.
    pub const CLUSTER: &str = "x-ai-router-cluster";
    /// Front → the public route (`cluster_header`, with `gateway.onePass`): the attempts'
    /// cluster, or the one-pass aggregate whose first attempt goes straight to a provider.
    pub const PASS: &str = "x-ai-router-pass";
    /// Attempt → outer router (`retriable_headers`): try another lane.
    pub const RETRY: &str = "x-ai-router-retry";
    /// Attempt → front: the gateway status of the final error this answer carries.
    pub const FINAL_STATUS: &str = "x-ai-router-final-status";
    /// Attempt → front: the attempt number.
    pub const ATTEMPT: &str = "x-ai-router-attempt";
    /// Attempt → front: the pool model that answered.
    pub const LANE_MODEL: &str = "x-ai-router-lane-model";
    /// Attempt → front: the routing trail of a call that succeeded (compact JSON), when the
    /// client asked for it.
    pub const LANE_TRAIL: &str = "x-ai-router-lane-trail";
    /// Client → front (`1`): the routing trail on a success too; front → client: that trail.
    pub const TRAIL: &str = "x-ai-router-trail";
    /// Client → front (`1`): the answer carries [`OVERHEAD_MS`], this call's overhead.
    pub const OVERHEAD: &str = "x-ai-router-overhead";
    /// Front → client, when asked for: the gateway's time to the answer's first byte less the
    /// time the providers held the call's attempts, in milliseconds (three decimals).
    pub const OVERHEAD_MS: &str = "x-ai-router-overhead-ms";
    /// Attempt → front: seconds until a lane returns.
    pub const RETRY_AFTER: &str = "x-ai-router-retry-after";
    /// Front → client: the model that answered.
    pub const MODEL: &str = "x-ai-router-model";
    /// Front → client: how many attempts the call made.
    pub const ATTEMPTS: &str = "x-ai-router-attempts";
    /// Client → front: the session a call belongs to (session affinity); read, then removed
    /// like every internal header.
    pub const SESSION: &str = "x-ai-router-session";
    /// Front → client: the budgets past their `warnAt` or their soft limit in this window,
    /// `name=warn` or `name=over`, comma-separated.
    pub const BUDGET_WARNING: &str = "x-ai-router-budget-warning";
    /// Front → client: `hit` (answered from the response cache), `miss`, or `bypass` (the
    /// client's `Cache-Control: no-cache` / `no-store`).
    pub const CACHE: &str = "x-ai-router-cache";
    /// Attempt → front: the provider that answered (what a cached copy of the answer saves
    /// is priced at its model there).
    pub const LANE_PROVIDER: &str = "x-ai-router-lane-provider";
    /// Attempt → front: the answer's estimated cost (its usage when known, else the estimate).
    pub const LANE_COST: &str = "x-ai-router-lane-cost";
    /// Front → client: this call's cost, in the unit of the pool's `cost` prices (a unary
    /// answer's usage at its price; never on a stream, whose usage comes after the headers).
    pub const COST: &str = "x-ai-router-cost";
    /// Front → client, on a stream: the request's estimated cost when its headers went out (its
    /// prompt estimate and its output bound); the real cost is the usage chunk's `usage.cost`.
    pub const COST_ESTIMATE: &str = "x-ai-router-cost-estimate";
    /// Front → client: the `routes:` rule that chose the call's profile.
    pub const ROUTE: &str = "x-ai-router-route";
    /// Client → front: request metadata the `routes:` rules match (read, then removed).
    pub const TASK_TYPE: &str = "x-ai-router-task-type";
    pub const USER_TIER: &str = "x-ai-router-user-tier";
    pub const FEATURE: &str = "x-ai-router-feature";
    /// Every internal header starts with this.
    pub const PREFIX: &str = "x-ai-router-";
}

/// The Envoy clusters the filter and the rendered bootstrap name.
pub mod clusters {
    pub const CONTROL_PLANE: &str = "ai_router_control_plane";
    pub const TIMER: &str = "ai_router_timer";
    pub const ATTEMPTS: &str = "ai_router_attempts";
    pub const PROVIDERS_TLS: &str = "providers_tls";
    pub const PROVIDERS_PLAIN: &str = "providers_plain";
    /// With `gateway.onePass`: the aggregate of `providers_plain` (the first attempt) and one
    /// attempts cluster per retry ([`attempts_retry`]), in that priority order.
    pub const ONE_PASS: &str = "ai_router_one_pass";

    /// The attempts cluster the aggregate's priority `n` (2 and on) sends to: the same internal
    /// listener as [`ATTEMPTS`] (priority 1) under another name, since a retry goes to the next
    /// priority and back to the first once all were tried.
    pub fn attempts_retry(n: u32) -> String {
        format!("{ATTEMPTS}_{n}")
    }
}

/// Inside one Envoy process: the wasm VM the three roles share, the queue of reports, and the
/// shared-data records. The singleton writes the pushed state as records a worker looks up by
/// key (the pool, one virtual key, one provider's lane health), so a request reads only what it
/// needs; workers write their own holds and counters.
pub mod shared {
    /// The `vm_id` of the rendered plugin configuration.
    pub const VM_ID: &str = "ai_router";
    pub const REPORT_QUEUE: &str = "ai-router/reports";
    /// 24 bytes, big endian: the pool record's version (u64), when the control plane generated
    /// the newest update (i64 ms), and how many updates this process applied (u64: it moves
    /// whenever any record changed). Written last, after the records.
    pub const SYNC: &str = "ai-router/sync";
    /// The pool: settings and providers (a `Snapshot` without virtual keys or lane health).
    pub const POOL: &str = "ai-router/pool";

    /// A virtual key (a `VirtualKey`), by the SHA-256 (hex) of its secret; empty when gone.
    pub fn virtual_key(sha256_hex: &str) -> String {
        format!("ai-router/vk/{sha256_hex}")
    }

    /// A provider's lane health: the whole of it, or with many keys what concerns the
    /// provider as a whole and how many buckets of keys hold the rest
    /// (`filter-core/src/vm/lane_records.rs`).
    pub fn lanes(provider: &str) -> String {
        format!("ai-router/lanes/{provider}")
    }

    /// One bucket of a provider's keys' lane health.
    pub fn lane_bucket(provider: &str, bucket: u32) -> String {
        format!("ai-router/lane-bucket/{provider}/{bucket}")
    }

    /// The holds the workers put on a provider's keys and lanes.
    pub fn holds(provider: &str) -> String {
        format!("ai-router/holds/{provider}")
    }

    /// A provider's lanes parked after a failover (snap-back, `filter-core/src/lanes/park.rs`),
    /// across the workers.
    pub fn parked(provider: &str) -> String {
        format!("ai-router/parked/{provider}")
    }

    /// Attempts in flight on a provider's keys, across the workers.
    pub fn in_flight(provider: &str) -> String {
        format!("ai-router/inflight/{provider}")
    }

    /// The attempts sent on one billing scope of a provider lately: the reservations against
    /// its pushed headroom, across the workers. One record per scope, so a reservation reads
    /// and writes its own scope's sends, however many scopes (keys) the provider has.
    pub fn sends(provider: &str, scope: &str) -> String {
        format!("ai-router/sends/{provider}/{scope}")
    }

    /// One slot of the affinity tables (`filter-core/src/lanes/affinity.rs`): which lane a session
    /// is pinned to (the first slots), or which key stored a response (the next ones).
    pub fn affinity(slot: u64) -> String {
        format!("ai-router/affinity/{slot}")
    }

    /// One response-cache slot (`filter-core/src/cache/store.rs`): a stored answer, or nothing.
    pub fn cache(slot: u32) -> String {
        format!("ai-router/cache/{slot}")
    }

    /// One virtual key's requests in the current UTC minute, across the workers.
    pub fn minute_requests(key_id: &str) -> String {
        format!("ai-router/rpm/{key_id}")
    }
}

/// A virtual key's `requestsPerMinute` across Envoys: the blocks of a minute's budget an Envoy
/// asks its control plane for (`Sync.TakeMinuteCalls`; the filter's side is
/// `filter-core/src/vm/minute_lease.rs`, the control plane's `store::minute_calls`).
pub mod minute {
    /// How many calls an Envoy asks for at a time under `limit`: a tenth of the limit, but at
    /// least 5 (or the whole limit when it is smaller), so that a burst at one Envoy rarely
    /// outruns the answer; and at most 1,000, or a hundredth of the limit when that is more.
    /// One ask is in flight at a time, so an Envoy admits at most about a block and a half per
    /// round trip to its control plane: a fixed 1,000 refused calls (429) under a large limit at
    /// a few thousand calls a second when a starved control plane took half a second to answer;
    /// a hundredth of the limit keeps the overshoot bound (`limit + E × block`) a few percent of
    /// the limit.
    pub fn block(limit: u64) -> u64 {
        let most = (limit / 100).max(1_000);
        limit.div_ceil(10).max(limit.min(5)).clamp(1, most)
    }

    /// The most one ask is granted under `limit`: the block, or 10,000 when that is more. An
    /// Envoy takes a grant smaller than its ask for a spent minute, so every block it can ask
    /// for must be granted whole while the minute lasts.
    pub fn most_granted(limit: u64) -> u64 {
        block(limit).max(10_000)
    }
}

/// How the filter's record of its sends and the quota ledger's pushed estimate split a scope's
/// count between them, so that each attempt is counted once: the ledger's figure is as of an
/// instant on a [`SEND_BUCKET_MS`](ledger::SEND_BUCKET_MS) boundary and counts the attempts sent
/// before it; the filter counts its own sends from it on. An attempt is sent at its
/// reservation, which its report names as `at_ms - latency_ms`.
pub mod ledger {
    /// The filter counts its sends in stretches of this width (a count since an instant takes
    /// the whole stretch that instant falls in).
    pub const SEND_BUCKET_MS: i64 = 100;
    /// The ledger's figure leaves the attempts sent in this last stretch to the filters' own
    /// records, since their reports may still be on their way (the attempt's own length, the
    /// singleton's batching). An attempt whose report comes later than this after it was sent
    /// is counted by neither until it arrives: the only overshoot within one Envoy.
    pub const ESTIMATE_LAG_MS: i64 = 5_000;

    /// The instant the ledger's figure is as of, computed at `now_ms`.
    pub fn estimate_as_of(now_ms: i64) -> i64 {
        (now_ms - ESTIMATE_LAG_MS).div_euclid(SEND_BUCKET_MS) * SEND_BUCKET_MS
    }
}

/// A lane's headroom as both sides estimate it: the filter, to skip a lane with nothing left;
/// the control plane, to pass over a reported figure that only says what was estimated.
pub mod headroom {
    /// What is estimated left of a reported `figure` (requests or tokens; negative: not
    /// reported, which stays -1) once `used` more were sent since it: never below 0.
    pub fn left(figure: i64, used: u64) -> i64 {
        if figure < 0 {
            -1
        } else {
            figure
                .saturating_sub(i64::try_from(used).unwrap_or(i64::MAX))
                .max(0)
        }
    }
}

/// The OpenAI error `type` of a gateway answer, by its HTTP status: one mapping for the filter,
/// the control plane's APIs and Envoy's own replies.
pub fn openai_error_type(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        403 => "permission_error",
        429 => "rate_limit_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    }
}

/// Google's status word (the `google.rpc.Code` name) of an HTTP status, as its APIs pair them
/// in `{"error":{"code","status"}}`: one mapping for the filter's Gemini answers and the mock
/// provider's.
pub fn google_status(status: u16) -> &'static str {
    match status {
        400 | 413 | 422 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        402 | 403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        405 | 501 => "UNIMPLEMENTED",
        408 | 504 => "DEADLINE_EXCEEDED",
        409 => "ABORTED",
        412 | 426 => "FAILED_PRECONDITION",
        429 => "RESOURCE_EXHAUSTED",
        499 => "CANCELLED",
        502 | 503 | 529 => "UNAVAILABLE",
        s if (400..500).contains(&s) => "INVALID_ARGUMENT",
        _ => "INTERNAL",
    }
}

/// Who holds a half-open breaker's probe lease: one attempt of one request. A probe's outcome
/// releases the lease only when it names the same holder, whole.
pub fn probe_holder(request_id: &str, attempt: u32) -> String {
    format!("{request_id}#{attempt}")
}

/// Lowercase hex SHA-256: how virtual keys (and the admin token) are stored and pushed, and
/// how the filter looks them up.
pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// The 64-bit fingerprint of a secret: the first 8 bytes of its SHA-256, big endian. A
/// blacklist remembers the fingerprint of the secret that was refused, so a new secret lifts it.
pub fn fingerprint(secret: &str) -> u64 {
    let digest = Sha256::digest(secret.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headroom_left_is_the_figure_less_what_was_sent_never_below_zero_and_absent_stays_absent() {
        assert_eq!(headroom::left(100, 30), 70);
        assert_eq!(headroom::left(100, 100), 0);
        assert_eq!(headroom::left(100, 101), 0);
        assert_eq!(headroom::left(100, u64::MAX), 0);
        assert_eq!(headroom::left(0, 0), 0);
        assert_eq!(headroom::left(-1, 0), -1);
        assert_eq!(headroom::left(-1, 5), -1);
        assert_eq!(headroom::left(i64::MAX, 1), i64::MAX - 1);
    }

    #[test]
    fn google_status_words_pair_with_http_statuses() {
        for (status, word) in [
            (400, "INVALID_ARGUMENT"),
            (401, "UNAUTHENTICATED"),
            (403, "PERMISSION_DENIED"),
            (404, "NOT_FOUND"),
            (405, "UNIMPLEMENTED"),
            (418, "INVALID_ARGUMENT"),
            (429, "RESOURCE_EXHAUSTED"),
            (499, "CANCELLED"),
            (500, "INTERNAL"),
            (502, "UNAVAILABLE"),
            (503, "UNAVAILABLE"),
            (504, "DEADLINE_EXCEEDED"),
        ] {
            assert_eq!(google_status(status), word, "{status}");
        }
    }

    #[test]
    fn holders_are_whole_strings() {
        assert_eq!(probe_holder("req-1", 2), "req-1#2");
        assert_ne!(probe_holder("1", 2), probe_holder("12", 2));
        assert!(!probe_holder("12", 1).starts_with(&probe_holder("1", 1)));
    }

    #[test]
    fn fingerprint_is_the_first_eight_bytes_big_endian() {
        let digest = Sha256::digest(b"abc");
        assert_eq!(fingerprint("abc").to_be_bytes(), digest[..8]);
        assert_ne!(fingerprint("sk-a"), fingerprint("sk-b"));
    }

    #[test]
    fn fingerprint_is_stable_and_distinct() {
        assert_eq!(fingerprint("sk-a"), fingerprint("sk-a"));
        assert_ne!(fingerprint("sk-a"), fingerprint("sk-b"));
        // Matches the control plane's definition: first 8 bytes of SHA-256.
        let d = Sha256::digest(b"abc");
        assert_eq!(fingerprint("abc").to_be_bytes(), d[..8]);
    }

    #[test]
    fn sha256_hex_is_64_hex_digits() {
        assert_eq!(sha256_hex(b"").len(), 64);
    }
}
