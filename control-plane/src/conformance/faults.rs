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
    let mut cases = Vec::new();
    for kind in Kind::ALL {
        let mut family = Family {
            kind,
            cases: &mut cases,
        };
        before_headers(&mut family, settings);
        server_errors(&mut family);
        unary_bodies(&mut family);
        streams_cut_before_first_token(&mut family, settings);
        streams_cut_after_first_token(&mut family, settings);
        streamed_bodies(&mut family);
        refused_requests(&mut family);
        // Holds last.
        holds(&mut family);
    }
    cases
}

/// The cases of one provider kind, as the families add them.
struct Family<'a> {
    kind: Kind,
    cases: &'a mut Vec<Case>,
}

impl Family<'_> {
    fn push(
        &mut self,
        fault: &'static str,
        stream: bool,
        making: Making,
        failover: Expect,
        alone: Option<Expect>,
    ) {
        self.cases.push(Case {
            fault,
            kind: self.kind,
            stream,
            making,
            failover,
            alone,
        });
    }

    /// The fault unary and streamed.
    fn both(
        &mut self,
        fault: &'static str,
        making: Making,
        failover: Expect,
        alone: Option<Expect>,
    ) {
        for stream in [false, true] {
            self.push(
                fault,
                stream,
                making.clone(),
                failover.clone(),
                alone.clone(),
            );
        }
    }

    /// The fault on a call that fails over to the healthy lane, unary and streamed.
    fn failover(&mut self, fault: &'static str, making: Making, alone: Option<Expect>) {
        self.both(fault, making, Expect::Failover, alone);
    }

    fn unary(
        &mut self,
        fault: &'static str,
        reply: Value,
        failover: Expect,
        alone: Option<Expect>,
    ) {
        self.push(fault, false, Making::Reply(reply), failover, alone);
    }

    fn streamed(
        &mut self,
        fault: &'static str,
        reply: Value,
        failover: Expect,
        alone: Option<Expect>,
    ) {
        self.push(fault, true, Making::Reply(reply), failover, alone);
    }
}

/// The lane gives no answer: refused, reset or stalled before its headers.
fn before_headers(family: &mut Family, settings: Settings) {
    if family.kind == Kind::Openai {
        // The refused lane is its own provider (kind openai-compatible): once is enough.
        family.failover("connection-refused", Making::Refused, upstream_error());
    }
    family.failover(
        "reset-before-headers",
        Making::Reply(json!({"error": "network"})),
        upstream_error(),
    );
    family.failover(
        "stall-before-headers",
        Making::Reply(json!({"latencyMs": settings.stall_ms})),
        upstream_error(),
    );
}

/// The provider fails: a 5xx status, or Cloudflare's own pages in front of a failing provider,
/// as the mock's table holds them.
fn server_errors(family: &mut Family) {
    for (status, fault) in [
        (500u16, "status-500"),
        (502, "status-502"),
        (503, "status-503"),
        (529, "status-529"),
    ] {
        family.failover(
            fault,
            Making::Reply(json!({"status": status})),
            upstream_error(),
        );
    }
    for (status, fault) in CLOUDFLARE_PAGES {
        family.failover(
            fault,
            Making::Reply(json!({
                "providerError": format!("openai-compatible.cloudflare_{status}")
            })),
            upstream_error(),
        );
    }
}

/// A unary body that breaks off, or is whole but huge or slow.
fn unary_bodies(family: &mut Family) {
    family.unary(
        "reset-after-headers",
        json!({"error": "reset-after-headers", "text": FAULTED_MARKER}),
        Expect::Failover,
        upstream_error(),
    );
    family.unary(
        "body-truncated-mid-json",
        truncated_json(family.kind),
        Expect::Failover,
        upstream_error(),
    );
    family.unary(
        "huge-body",
        json!({"text": huge_text('x')}),
        Expect::WholeOrError { bytes: HUGE_BYTES },
        None,
    );
    family.unary(
        "slow-trickle",
        json!({"trickleMs": 50, "text": SLOW.concat()}),
        Expect::Served {
            text: SLOW.concat(),
        },
        None,
    );
}

/// A stream that breaks before its first token: nothing sent yet, so it fails over.
fn streams_cut_before_first_token(family: &mut Family, settings: Settings) {
    family.streamed(
        "reset-after-headers-before-first-token",
        before_first_token("network"),
        Expect::Failover,
        upstream_error(),
    );
    family.streamed(
        "stall-before-first-token",
        json!({"stream": {"chunks": faulted_chunks(), "stallAfter": 0, "stallMs": settings.stall_ms}}),
        Expect::Failover,
        upstream_error(),
    );
    family.streamed(
        "malformed-sse-before-first-token",
        before_first_token("malformed"),
        Expect::Failover,
        upstream_error(),
    );
    family.streamed(
        "error-event-before-first-token",
        before_first_token("error-event"),
        Expect::Failover,
        upstream_error(),
    );
}

/// A stream that breaks after its first token: the client is owed an interrupted stream.
fn streams_cut_after_first_token(family: &mut Family, settings: Settings) {
    let interrupted = || Expect::Interrupted {
        sent: FIRST.to_owned(),
    };
    family.streamed(
        "reset-after-first-token",
        after_first_token("network"),
        interrupted(),
        None,
    );
    family.streamed(
        "stall-between-chunks",
        json!({"stream": {"chunks": [FIRST, " second"], "stallAfter": 1, "stallMs": settings.stall_ms}}),
        interrupted(),
        None,
    );
    family.streamed(
        "malformed-sse-after-first-token",
        after_first_token("malformed"),
        interrupted(),
        None,
    );
    family.streamed(
        "error-event-after-first-token",
        after_first_token("error-event"),
        interrupted(),
        None,
    );
    family.streamed(
        "ended-without-finish-after-first-token",
        after_first_token("truncate"),
        interrupted(),
        None,
    );
}

/// A stream that is whole but huge or slow.
fn streamed_bodies(family: &mut Family) {
    let text = huge_text('y');
    let huge: Vec<&str> = text
        .as_bytes()
        .chunks(HUGE_CHUNK)
        .filter_map(|chunk| std::str::from_utf8(chunk).ok())
        .collect();
    family.streamed(
        "huge-body",
        json!({"stream": {"chunks": huge}}),
        Expect::WholeOrError { bytes: HUGE_BYTES },
        None,
    );
    family.streamed(
        "slow-trickle",
        json!({"stream": {"chunks": SLOW, "delayMs": 300}}),
        Expect::Served {
            text: SLOW.concat(),
        },
        None,
    );
}

/// What a provider refuses the request itself for is the client's to see, once.
fn refused_requests(family: &mut Family) {
    let k = family.kind.name();
    let bad_request = error(400, "upstream_invalid_request");
    family.both(
        "status-400-bad-request",
        Making::Reply(json!({"providerError": format!("{k}.bad_request")})),
        bad_request.clone().unwrap_or(Expect::Failover),
        bad_request,
    );
}

/// The faults that put a hold on the lane: rate limits, quota, auth.
fn holds(family: &mut Family) {
    let k = family.kind.name();
    let rate_limited = error(503, "pool_rate_limited");
    for (fault, reply) in [
        (
            "429-retry-after",
            json!({"status": 429, "headers": {"retry-after": "1"}}),
        ),
        (
            "429-retry-after-ms",
            json!({"status": 429, "headers": {"retry-after-ms": "300"}}),
        ),
        ("429-no-header", json!({"status": 429})),
    ] {
        family.failover(fault, Making::Reply(reply), rate_limited.clone());
    }
    let quota = error(503, "pool_quota_exhausted");
    family.failover(
        "status-402",
        Making::Reply(json!({"status": 402})),
        quota.clone(),
    );
    family.failover(
        "quota-body",
        Making::Reply(json!({"providerError": format!("{k}.quota_exhausted")})),
        quota,
    );
    let auth = error(503, "pool_auth_failed");
    family.failover(
        "status-401",
        Making::Reply(json!({"providerError": format!("{k}.invalid_key")})),
        auth.clone(),
    );
    family.failover("status-403", Making::Reply(json!({"status": 403})), auth);
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
