//! The faults the runner drives a gateway through, each as the mock reply that makes it and
//! what the client is owed for it, unary and streamed, with a healthy lane behind the faulted
//! one (`failover`) and without one (`alone`).

use serde_json::{json, Value};

use super::judge::{Expect, FAULTED_MARKER};

/// The provider kind a faulted lane speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    Openai,
    Anthropic,
}

impl Kind {
    pub const ALL: [Kind; 2] = [Kind::Openai, Kind::Anthropic];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Openai => "openai",
            Kind::Anthropic => "anthropic",
        }
    }
}

/// How a fault is made at the provider.
#[derive(Debug, Clone, PartialEq)]
pub enum Making {
    /// The faulted lane's mock answers with this reply (a mock script reply).
    Reply(Value),
    /// The lane's provider does not listen at all: the runner calls the `refused` model.
    Refused,
}

/// One case: a fault, a call shape and a provider kind, with what the client is owed.
#[derive(Debug, Clone)]
pub struct Case {
    pub fault: &'static str,
    pub kind: Kind,
    pub stream: bool,
    pub making: Making,
    /// With a healthy lane behind the faulted one.
    pub failover: Expect,
    /// With the faulted lane alone (no fallback, one attempt); `None`: not a final error.
    pub alone: Option<Expect>,
}

/// Knobs of the catalogue.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// How long a stall lasts: past the pool's `timeoutMs`.
    pub stall_ms: u64,
}

/// The text the faulted lane streams before a cut after the first token.
const FIRST: &str = "faulted-lane first";
const SLOW: [&str; 6] = ["slow", " but", " whole", " and", " in", " order"];
/// Bytes of the huge answer (past the 1 MiB buffers Envoy is usually given).
const HUGE_BYTES: usize = 3 * 1024 * 1024;
const HUGE_CHUNK: usize = 32 * 1024;

/// [`HUGE_BYTES`] of text starting with the faulted lane's marker.
fn huge_text(fill: char) -> String {
    let mut text = String::with_capacity(HUGE_BYTES);
    text.push_str(FAULTED_MARKER);
    text.extend(std::iter::repeat_n(fill, HUGE_BYTES - FAULTED_MARKER.len()));
    text
}

fn error(status: u16, code: &str) -> Option<Expect> {
    Some(Expect::Error {
        status,
        code: code.to_owned(),
    })
}

fn upstream_error() -> Option<Expect> {
    error(502, "upstream_error")
}

fn faulted_chunks() -> Value {
    json!([FAULTED_MARKER, " never", " shown"])
}

fn after_first_token(fail_with: &str) -> Value {
    json!({"stream": {"chunks": [FIRST, " second", " third"], "failAfter": 1, "failWith": fail_with}})
}

fn before_first_token(fail_with: &str) -> Value {
    json!({"stream": {"chunks": faulted_chunks(), "failAfter": 0, "failWith": fail_with}})
}

/// Cloudflare's 52x pages (HTML): `openai-compatible.cloudflare_<status>` in the mock's table.
const CLOUDFLARE_PAGES: [(u16, &str); 8] = [
    (520, "cloudflare-520-html"),
    (521, "cloudflare-521-html"),
    (522, "cloudflare-522-html"),
    (523, "cloudflare-523-html"),
    (524, "cloudflare-524-html"),
    (525, "cloudflare-525-html"),
    (526, "cloudflare-526-html"),
    (527, "cloudflare-527-html"),
];

/// A unary body cut in the middle of its JSON.
fn truncated_json(kind: Kind) -> Value {
    let body = match kind {
        Kind::Openai => format!(
            r#"{{"id":"chatcmpl-cut","object":"chat.completion","choices":[{{"index":0,"message":{{"role":"assistant","content":"{FAULTED_MARKER} cu"#
        ),
        Kind::Anthropic => format!(
            r#"{{"id":"msg_cut","type":"message","role":"assistant","content":[{{"type":"text","text":"{FAULTED_MARKER} cu"#
        ),
    };
    json!({"headers": {"content-type": "application/json"}, "body": body})
}

/// Every case of the catalogue, in the order they run: the faults that put a hold on the lane
/// (rate limits, quota, auth) last, so the others find it free.
pub fn catalogue(settings: Settings) -> Vec<Case> {
    let stall = settings.stall_ms;
    let mut cases = Vec::new();
    for kind in Kind::ALL {
        let k = kind.name();
        let mut both = |fault: &'static str, making: Making, alone: Option<Expect>| {
            for stream in [false, true] {
                cases.push(Case {
                    fault,
                    kind,
                    stream,
                    making: making.clone(),
                    failover: Expect::Failover,
                    alone: alone.clone(),
                });
            }
        };
        if kind == Kind::Openai {
            // The refused lane is its own provider (kind openai-compatible): once is enough.
            both("connection-refused", Making::Refused, upstream_error());
        }
        both(
            "reset-before-headers",
            Making::Reply(json!({"error": "network"})),
            upstream_error(),
        );
        both(
            "stall-before-headers",
            Making::Reply(json!({"latencyMs": stall})),
            upstream_error(),
        );
        for status in [500u16, 502, 503, 529] {
            let fault = match status {
                500 => "status-500",
                502 => "status-502",
                503 => "status-503",
                _ => "status-529",
            };
            both(
                fault,
                Making::Reply(json!({"status": status})),
                upstream_error(),
            );
        }
        // Cloudflare's own pages in front of a failing provider, as the mock's table holds them.
        for (status, fault) in CLOUDFLARE_PAGES {
            both(
                fault,
                Making::Reply(json!({
                    "providerError": format!("openai-compatible.cloudflare_{status}")
                })),
                upstream_error(),
            );
        }

        let mut unary = |fault: &'static str, making: Value, failover: Expect, alone| {
            cases.push(Case {
                fault,
                kind,
                stream: false,
                making: Making::Reply(making),
                failover,
                alone,
            });
        };
        unary(
            "reset-after-headers",
            json!({"error": "reset-after-headers", "text": FAULTED_MARKER}),
            Expect::Failover,
            upstream_error(),
        );
        unary(
            "body-truncated-mid-json",
            truncated_json(kind),
            Expect::Failover,
            upstream_error(),
        );
        unary(
            "huge-body",
            json!({"text": huge_text('x')}),
            Expect::WholeOrError { bytes: HUGE_BYTES },
            None,
        );
        unary(
            "slow-trickle",
            json!({"trickleMs": 50, "text": SLOW.concat()}),
            Expect::Served {
                text: SLOW.concat(),
            },
            None,
        );

        let mut streamed = |fault: &'static str, making: Value, failover: Expect, alone| {
            cases.push(Case {
                fault,
                kind,
                stream: true,
                making: Making::Reply(making),
                failover,
                alone,
            });
        };
        streamed(
            "reset-after-headers-before-first-token",
            before_first_token("network"),
            Expect::Failover,
            upstream_error(),
        );
        streamed(
            "stall-before-first-token",
            json!({"stream": {"chunks": faulted_chunks(), "stallAfter": 0, "stallMs": stall}}),
            Expect::Failover,
            upstream_error(),
        );
        streamed(
            "malformed-sse-before-first-token",
            before_first_token("malformed"),
            Expect::Failover,
            upstream_error(),
        );
        streamed(
            "error-event-before-first-token",
            before_first_token("error-event"),
            Expect::Failover,
            upstream_error(),
        );
        let interrupted = || Expect::Interrupted {
            sent: FIRST.to_owned(),
        };
        streamed(
            "reset-after-first-token",
            after_first_token("network"),
            interrupted(),
            None,
        );
        streamed(
            "stall-between-chunks",
            json!({"stream": {"chunks": [FIRST, " second"], "stallAfter": 1, "stallMs": stall}}),
            interrupted(),
            None,
        );
        streamed(
            "malformed-sse-after-first-token",
            after_first_token("malformed"),
            interrupted(),
            None,
        );
        streamed(
            "error-event-after-first-token",
            after_first_token("error-event"),
            interrupted(),
            None,
        );
        streamed(
            "ended-without-finish-after-first-token",
            after_first_token("truncate"),
            interrupted(),
            None,
        );
        let text = huge_text('y');
        let huge: Vec<&str> = text
            .as_bytes()
            .chunks(HUGE_CHUNK)
            .filter_map(|chunk| std::str::from_utf8(chunk).ok())
            .collect();
        streamed(
            "huge-body",
            json!({"stream": {"chunks": huge}}),
            Expect::WholeOrError { bytes: HUGE_BYTES },
            None,
        );
        streamed(
            "slow-trickle",
            json!({"stream": {"chunks": SLOW, "delayMs": 300}}),
            Expect::Served {
                text: SLOW.concat(),
            },
            None,
        );

        // What a provider refuses the request itself for is the client's to see, once.
        let mut both = |fault: &'static str, making: Value, failover: Expect, alone| {
            for stream in [false, true] {
                cases.push(Case {
                    fault,
                    kind,
                    stream,
                    making: Making::Reply(making.clone()),
                    failover: failover.clone(),
                    alone: Option::clone(&alone),
                });
            }
        };
        let bad_request = error(400, "upstream_invalid_request");
        both(
            "status-400-bad-request",
            json!({"providerError": format!("{k}.bad_request")}),
            bad_request.clone().unwrap_or(Expect::Failover),
            bad_request,
        );
        // Holds last.
        let rate_limited = error(503, "pool_rate_limited");
        both(
            "429-retry-after",
            json!({"status": 429, "headers": {"retry-after": "1"}}),
            Expect::Failover,
            rate_limited.clone(),
        );
        both(
            "429-retry-after-ms",
            json!({"status": 429, "headers": {"retry-after-ms": "300"}}),
            Expect::Failover,
            rate_limited.clone(),
        );
        both(
            "429-no-header",
            json!({"status": 429}),
            Expect::Failover,
            rate_limited,
        );
        let quota = error(503, "pool_quota_exhausted");
        both(
            "status-402",
            json!({"status": 402}),
            Expect::Failover,
            quota.clone(),
        );
        both(
            "quota-body",
            json!({"providerError": format!("{k}.quota_exhausted")}),
            Expect::Failover,
            quota,
        );
        let auth = error(503, "pool_auth_failed");
        both(
            "status-401",
            json!({"providerError": format!("{k}.invalid_key")}),
            Expect::Failover,
            auth.clone(),
        );
        both("status-403", json!({"status": 403}), Expect::Failover, auth);
    }
    cases
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use std::collections::BTreeSet;

    use super::*;
    use crate::mock::Rule;

    fn cases() -> Vec<Case> {
        catalogue(Settings { stall_ms: 2500 })
    }

    #[test]
    fn every_reply_is_a_valid_mock_reply() {
        for case in cases() {
            if let Making::Reply(reply) = &case.making {
                let rule = json!({"replies": [reply]}).to_string();
                Rule::from_json(&rule)
                    .unwrap_or_else(|e| panic!("{} {:?}: {e}", case.fault, case.kind));
            }
        }
    }

    #[test]
    fn the_issues_fault_list_is_covered_for_both_kinds_unary_and_streamed() {
        let all = cases();
        let names: BTreeSet<&str> = all.iter().map(|case| case.fault).collect();
        for fault in [
            "connection-refused",
            "reset-before-headers",
            "reset-after-headers-before-first-token",
            "reset-after-first-token",
            "stall-before-headers",
            "stall-before-first-token",
            "stall-between-chunks",
            "malformed-sse-before-first-token",
            "malformed-sse-after-first-token",
            "error-event-before-first-token",
            "error-event-after-first-token",
            "429-retry-after",
            "429-retry-after-ms",
            "429-no-header",
            "status-402",
            "quota-body",
            "status-401",
            "status-403",
            "status-500",
            "status-502",
            "status-503",
            "status-529",
            "cloudflare-520-html",
            "cloudflare-521-html",
            "cloudflare-522-html",
            "cloudflare-523-html",
            "cloudflare-524-html",
            "cloudflare-525-html",
            "cloudflare-526-html",
            "cloudflare-527-html",
            "body-truncated-mid-json",
            "huge-body",
            "slow-trickle",
        ] {
            assert!(names.contains(fault), "{fault} missing");
        }
        for kind in Kind::ALL {
            for stream in [false, true] {
                assert!(all
                    .iter()
                    .any(|c| c.kind == kind && c.stream == stream && c.fault == "status-503"));
            }
        }
        // Faults that hold the lane come after every other case of their kind.
        for kind in Kind::ALL {
            let of_kind: Vec<&Case> = all.iter().filter(|c| c.kind == kind).collect();
            let first_hold = of_kind
                .iter()
                .position(|c| c.fault.starts_with("429"))
                .unwrap();
            assert!(of_kind[first_hold..].iter().all(|c| {
                c.fault.starts_with("429")
                    || c.fault.starts_with("status-40")
                    || c.fault == "quota-body"
            }));
        }
    }
}
