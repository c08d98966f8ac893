//! The failover conformance runner: `ai-router conformance`.
//!
//! Drives a running gateway through every fault of [`faults::catalogue`], unary and streamed,
//! with OpenAI and Anthropic provider lanes, and judges what the client saw
//! ([`judge::judge`]): before the first token a fault fails over invisibly; after it the
//! client gets an error event or a broken transfer, never a clean end; without another lane
//! the client gets the right error object.
//!
//! The gateway under test serves a pool shaped like `examples/conformance.yaml`: the models
//! `conformance-openai` and `conformance-anthropic` (a lane of that kind on the fault mock,
//! `defaults.fallbacks` a healthy lane), `conformance-refused` (a lane whose provider does not
//! listen) and, for each, a `-alone` profile with no fallback and one attempt. The runner
//! scripts the fault mock (`ai-router mock`, its control API) for each case, then checks in
//! the mock's call log that the faulted lane was really tried: a lane still held by an earlier
//! case (a cooldown, a blacklist) is waited for, so each verdict is about the fault itself.

pub mod faults;
pub mod judge;

use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use futures::StreamExt as _;
use serde::Serialize;
use serde_json::{json, Value};

pub use faults::{Case, Kind, Making, Settings};
pub use judge::{judge, Expect, Seen};

/// Which pool shape a case runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// A healthy lane behind the faulted one.
    Failover,
    /// The faulted lane alone: no fallback, one attempt.
    Alone,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Failover => "failover",
            Mode::Alone => "alone",
        }
    }
}

/// The pool's model names the runner calls.
#[derive(Debug, Clone)]
pub struct Models {
    pub openai: String,
    pub anthropic: String,
    pub refused: String,
    /// Appended to a model for its no-fallback profile.
    pub alone_suffix: String,
}

impl Default for Models {
    fn default() -> Self {
        Self {
            openai: "conformance-openai".into(),
            anthropic: "conformance-anthropic".into(),
            refused: "conformance-refused".into(),
            alone_suffix: "-alone".into(),
        }
    }
}

/// How to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// The gateway's base URL (`http://127.0.0.1:8080`).
    pub url: String,
    /// The virtual key the calls carry.
    pub key: String,
    /// The fault mock's base URL (its `/_mock/` control API).
    pub mock: String,
    pub models: Models,
    pub settings: Settings,
    /// Only faults whose name contains one of these (all when empty).
    pub only: Vec<String>,
    pub kinds: Vec<Kind>,
    pub modes: Vec<Mode>,
    /// How long to wait for a lane an earlier case put on hold.
    pub hold_wait: Duration,
}

/// The verdict on one case.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub fault: &'static str,
    pub kind: Kind,
    pub stream: bool,
    pub mode: Mode,
    #[serde(flatten)]
    pub expect: Expect,
    pub saw: String,
    pub ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    pub ms: u64,
}

impl Outcome {
    /// One line for people.
    pub fn line(&self) -> String {
        let verdict = if self.ok { "ok  " } else { "FAIL" };
        let shape = if self.stream { "stream" } else { "unary" };
        let mut line = format!(
            "{verdict} {:<9} {:<6} {:<8} {:<40} {}",
            self.kind.name(),
            shape,
            self.mode.name(),
            self.fault,
            self.saw
        );
        if let Some(problem) = &self.problem {
            line.push_str(&format!("  <- {problem}"));
        }
        line
    }
}

/// Pause between two looks at a held lane.
const HOLD_POLL: Duration = Duration::from_millis(250);
/// The bound on one call, stalls included.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs every selected case in order, handing each verdict to `report` as it comes.
pub async fn run(opts: &Options, mut report: impl FnMut(&Outcome)) -> anyhow::Result<Vec<Outcome>> {
    let http = reqwest::Client::builder()
        .timeout(CALL_TIMEOUT)
        .connect_timeout(Duration::from_secs(5))
        .build()
        .context("building the HTTP client")?;
    let mock = opts.mock.trim_end_matches('/').to_owned();
    http.get(format!("{mock}/_mock/health"))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .with_context(|| format!("the fault mock at {mock} does not answer /_mock/health"))?;
    let mut outcomes = Vec::new();
    for case in faults::catalogue(opts.settings) {
        if !opts.kinds.contains(&case.kind) {
            continue;
        }
        if !opts.only.is_empty()
            && !opts
                .only
                .iter()
                .any(|name| case.fault.contains(name.as_str()))
        {
            continue;
        }
        for mode in &opts.modes {
            let expect = match mode {
                Mode::Failover => case.failover.clone(),
                Mode::Alone => match &case.alone {
                    Some(expect) => expect.clone(),
                    None => continue,
                },
            };
            let outcome = run_case(&http, opts, &mock, &case, *mode, expect).await?;
            report(&outcome);
            outcomes.push(outcome);
        }
    }
    Ok(outcomes)
}

async fn run_case(
    http: &reqwest::Client,
    opts: &Options,
    mock: &str,
    case: &Case,
    mode: Mode,
    expect: Expect,
) -> anyhow::Result<Outcome> {
    let reply = match &case.making {
        Making::Reply(reply) => reply.clone(),
        Making::Refused => json!({}),
    };
    mock_call(
        http.put(format!("{mock}/_mock/script"))
            .json(&json!({"rules": [{"replies": [reply]}]})),
        "PUT /_mock/script",
    )
    .await?;
    let model = model_for(&opts.models, case, mode);
    let started = Instant::now();
    let deadline = started + opts.hold_wait;
    let (seen, exercised) = loop {
        mock_call(
            http.delete(format!("{mock}/_mock/calls")),
            "DELETE /_mock/calls",
        )
        .await?;
        let seen = call_gateway(http, opts, &model, case.stream).await;
        let exercised = case.making == Making::Refused || mock_calls(http, mock).await? > 0;
        if exercised || Instant::now() >= deadline {
            break (seen, exercised);
        }
        tokio::time::sleep(HOLD_POLL).await;
    };
    let verdict = if exercised {
        judge(&expect, &seen)
    } else {
        Err(format!(
            "the faulted lane was never tried within {} ms (held by an earlier case?)",
            opts.hold_wait.as_millis()
        ))
    };
    Ok(Outcome {
        fault: case.fault,
        kind: case.kind,
        stream: case.stream,
        mode,
        expect,
        saw: seen.summary(),
        ok: verdict.is_ok(),
        problem: verdict.err(),
        ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
    })
}

fn model_for(models: &Models, case: &Case, mode: Mode) -> String {
    let base = match (&case.making, case.kind) {
        (Making::Refused, _) => &models.refused,
        (_, Kind::Openai) => &models.openai,
        (_, Kind::Anthropic) => &models.anthropic,
    };
    match mode {
        Mode::Failover => base.clone(),
        Mode::Alone => format!("{base}{}", models.alone_suffix),
    }
}

async fn mock_call(request: reqwest::RequestBuilder, what: &str) -> anyhow::Result<Value> {
    let response = request
        .send()
        .await
        .with_context(|| format!("the fault mock: {what}"))?;
    let status = response.status();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    if !status.is_success() {
        bail!("the fault mock: {what} answered {status}: {body}");
    }
    Ok(body)
}

async fn mock_calls(http: &reqwest::Client, mock: &str) -> anyhow::Result<usize> {
    let calls = mock_call(http.get(format!("{mock}/_mock/calls")), "GET /_mock/calls").await?;
    Ok(calls
        .get("calls")
        .and_then(Value::as_array)
        .map_or(0, Vec::len))
}

/// One chat completion through the gateway, as a client sees it; never an error: a failed
/// connection is part of what the client saw.
async fn call_gateway(http: &reqwest::Client, opts: &Options, model: &str, stream: bool) -> Seen {
    let body = json!({
        "model": model,
        "messages": [{"role": "user", "content": "conformance"}],
        "max_tokens": 64,
        "stream": stream,
    });
    let url = format!("{}/v1/chat/completions", opts.url.trim_end_matches('/'));
    let response = match http
        .post(url)
        .bearer_auth(&opts.key)
        .json(&body)
        .send()
        .await
    {
        Ok(response) => response,
        Err(error) => {
            return Seen {
                transport_error: Some(error_chain(&error)),
                streamed: stream,
                ..Seen::default()
            }
        }
    };
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let mut bytes = Vec::new();
    let mut transport_error = None;
    let mut chunks = response.bytes_stream();
    while let Some(chunk) = chunks.next().await {
        match chunk {
            Ok(chunk) => bytes.extend_from_slice(&chunk),
            Err(error) => {
                transport_error = Some(error_chain(&error));
                break;
            }
        }
    }
    let is_sse = content_type.starts_with("text/event-stream");
    Seen {
        status,
        transport_error,
        json: if is_sse {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or(Value::Null)
        },
        events: if is_sse { sse_data(&bytes) } else { Vec::new() },
        streamed: stream && is_sse,
        content_type,
    }
}

/// The `data:` payloads of a server-sent event body, in order (multi-line data joined).
pub fn sse_data(bytes: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(bytes).replace("\r\n", "\n");
    text.split("\n\n")
        .filter_map(|event| {
            let lines: Vec<&str> = event
                .lines()
                .filter_map(|line| line.strip_prefix("data:"))
                .map(|data| data.strip_prefix(' ').unwrap_or(data))
                .collect();
            (!lines.is_empty()).then(|| lines.join("\n"))
        })
        .collect()
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn sse_data_reads_events_across_line_endings() {
        let body = b"data: {\"a\":1}\n\nevent: x\r\ndata: two\r\ndata: lines\r\n\r\n: comment\n\ndata:[DONE]\n\n";
        assert_eq!(sse_data(body), ["{\"a\":1}", "two\nlines", "[DONE]"]);
    }

    #[test]
    fn each_case_calls_its_kinds_model_or_its_alone_profile() {
        let models = Models::default();
        let cases = faults::catalogue(Settings { stall_ms: 10 });
        let refused = cases.iter().find(|c| c.making == Making::Refused).unwrap();
        assert_eq!(
            model_for(&models, refused, Mode::Failover),
            "conformance-refused"
        );
        let anthropic = cases.iter().find(|c| c.kind == Kind::Anthropic).unwrap();
        assert_eq!(
            model_for(&models, anthropic, Mode::Alone),
            "conformance-anthropic-alone"
        );
    }
}
