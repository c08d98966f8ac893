//! The one-pass systems' failover check, before they are measured: a first attempt that
//! succeeds takes one pass (the internal listener sees nothing), and one that fails (a 429, and
//! a stream whose first event is an error) goes through the internal listener once, the client
//! getting the second attempt's answer whole and nothing of the first, the request body
//! replayed: by Envoy's internal redirect (`one-pass-floor`) or by the router's own retry to the
//! aggregate cluster's next priority (`one-pass-retry`). For `one-pass-retry` also the failures
//! without an answer, from scripted first hosts ([`Scripted`]): a host that refuses the
//! connection, one that closes it before answering, one that never answers (the route's per-try
//! timeout); and a stream slower than the per-try timeout after its first event, which must
//! reach the client whole. Counted from the Envoys' own statistics; any miss fails the system.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::load::Target;
use crate::run::check;
use crate::upstream::{envoy_stat, BenchEnvoy, FAIL_HEADER, ONE_PASS_RETRY_PER_TRY};

/// The request header naming `one-pass-retry`'s first host (bench/wasm-floor's `oneretry`).
const FIRST_HOST_HEADER: &str = "x-bench-first-host";

/// How the one-pass system fails a first attempt over.
#[derive(Clone, Copy)]
pub enum Failover<'a> {
    /// `one-pass-floor`: the upstream filter's `307`, followed by the route's internal redirect.
    Redirect,
    /// `one-pass-retry`: the router's retry, to the aggregate cluster's next priority; the
    /// scripted first hosts its Envoy knows.
    Retry(&'a Scripted),
}

/// How long a counter may take to reach a value the answers already imply.
const COUNTED_WITHIN: Duration = Duration::from_secs(5);

/// The counters the check reads: requests the fake upstream served, first attempts sent
/// straight to it, calls through the internal listener, failovers (internal redirects followed,
/// or the route's retries).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Counts {
    upstream: u64,
    direct: u64,
    internal: u64,
    failovers: u64,
}

async fn counts(design: Failover<'_>, envoy: &BenchEnvoy, upstream: &BenchEnvoy) -> Result<Counts> {
    let stat = |name: &'static str| envoy_stat(&envoy.admin, name);
    let (internal, failovers) = match design {
        Failover::Redirect => (
            stat("cluster.second_pass.upstream_rq_total").await?,
            stat("cluster.first_attempt.upstream_internal_redirect_succeeded_total").await?,
        ),
        Failover::Retry(_) => (
            stat("cluster.second_pass.upstream_rq_total").await?
                + stat("cluster.second_pass_2.upstream_rq_total").await?,
            stat("cluster.one_pass.upstream_rq_retry").await?,
        ),
    };
    Ok(Counts {
        upstream: envoy_stat(
            &upstream.admin,
            "http.fake_upstream.downstream_rq_completed",
        )
        .await?,
        direct: stat("cluster.first_attempt.upstream_rq_total").await?,
        internal,
        failovers,
    })
}

/// Waits until the fake upstream has served `want.upstream` requests more than at `before`,
/// then checks every counter moved by `want`; else fails with `what`.
async fn counted(
    design: Failover<'_>,
    envoy: &BenchEnvoy,
    upstream: &BenchEnvoy,
    before: Counts,
    want: Counts,
    what: &str,
) -> Result<Counts> {
    let after = ai_router_e2e::poll(
        &format!("{} more requests at the fake upstream", want.upstream),
        COUNTED_WITHIN,
        || async move {
            let now = counts(design, envoy, upstream).await?;
            Ok((now.upstream >= before.upstream + want.upstream).then_some(now))
        },
    )
    .await?;
    let moved = Counts {
        upstream: after.upstream - before.upstream,
        direct: after.direct - before.direct,
        internal: after.internal - before.internal,
        failovers: after.failovers - before.failovers,
    };
    if moved != want {
        bail!("{what}: {moved:?}, expected {want:?}");
    }
    Ok(after)
}

/// Runs the check against `target` (the one-pass Envoy's); what it verified, in words.
pub async fn failover_check(
    design: Failover<'_>,
    envoy: &BenchEnvoy,
    upstream: &BenchEnvoy,
    target: &Target,
) -> Result<String> {
    // A success takes one pass, straight to the upstream; a failed first attempt (unary and
    // streamed) one redirect through the internal listener, the client getting the second
    // attempt's answer whole.
    let failing = Target {
        headers: with(&target.headers, FAIL_HEADER, "unary"),
        stream_headers: with(&target.stream_headers, FAIL_HEADER, "stream"),
        ..target.clone()
    };
    let steps = [
        (
            target,
            Counts {
                upstream: 2,
                direct: 2,
                internal: 0,
                failovers: 0,
            },
            "a successful first attempt (unary and streamed) did not take one pass",
        ),
        (
            &failing,
            Counts {
                upstream: 4,
                direct: 2,
                internal: 2,
                failovers: 2,
            },
            "a failed first attempt (unary and streamed) did not go through the internal listener once",
        ),
    ];
    let body_len = target.body_for(false).len();
    if let Failover::Retry(scripted) = design {
        return retry_check(scripted, envoy, upstream, target, &failing, steps).await;
    }
    let mut before = counts(design, envoy, upstream).await?;
    for (call, want, what) in steps {
        let answered = check(call).await?;
        if !answered.ok {
            bail!("{what}: the answers were not the upstream's completion: {answered:?}");
        }
        before = counted(design, envoy, upstream, before, want, what).await?;
    }

    // The continuation read the whole body again, and the client saw nothing of the 429.
    replayed(&failing, "a failed-over call", false).await?;
    Ok(format!(
        "failover checked: a successful first attempt takes one pass (fake upstream +2, internal listener +0 for a unary and a streamed call); a 429 and a stream's error event before its first token each take one internal redirect through the internal listener, the client getting the second attempt's answer (status 200, no location) with the {body_len}-byte body replayed"
    ))
}

/// The header `one-pass-retry`'s upstream filter writes on the first attempt's request, and on
/// its answer (bench/wasm-floor).
const FIRST_WRITE_HEADER: &str = "x-floor-first-attempt";

/// One unary call of `call`: answered 200 by the second attempt, which read the whole body
/// again (`x-floor-replayed`), with nothing of the first attempt's answer (no `location`, no
/// retry header); by the router's retry (`retried`), with none of the first attempt's rewrite
/// either (`x-floor-first-seen: no`).
async fn replayed(call: &Target, what: &str, retried: bool) -> Result<()> {
    let body = call.body_for(false);
    let resp = send(call, false)
        .await
        .with_context(|| format!("the replay check call ({what})"))?;
    let status = resp.status().as_u16();
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let replayed = header("x-floor-replayed");
    let location = header("location");
    let retry = header("x-floor-retry");
    // The router's retry carries the client's request, not the first attempt's rewrite.
    let first_seen = header("x-floor-first-seen");
    let first_kept = if retried {
        first_seen.as_deref() == Some("no")
    } else {
        first_seen.is_none()
    };
    if status != 200
        || replayed != Some(body.len().to_string())
        || location.is_some()
        || retry.is_some()
        || !first_kept
    {
        bail!(
            "{what}: status {status}, x-floor-replayed {replayed:?} (the body has {} bytes), location {location:?}, x-floor-retry {retry:?}, x-floor-first-seen {first_seen:?}",
            body.len()
        );
    }
    Ok(())
}

/// `one-pass-retry`'s check: `steps` (a success, a 429 and a stream's error event), then the
/// failures without an answer from scripted first hosts, an upstream filter's own retry answer,
/// and a stream slower than the per-try timeout after its first event.
async fn retry_check(
    scripted: &Scripted,
    envoy: &BenchEnvoy,
    upstream: &BenchEnvoy,
    target: &Target,
    failing: &Target,
    steps: [(&Target, Counts, &str); 2],
) -> Result<String> {
    let design = Failover::Retry(scripted);
    // The upstream filter rewrote the first attempt's request (its answer says so), so that
    // the retries below show the rewrite stayed with that attempt.
    let answer = send(target, false)
        .await
        .context("a first attempt's rewrite")?;
    let rewritten = answer
        .headers()
        .get(FIRST_WRITE_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    if answer.status() != 200 || rewritten.as_deref() != Some("rewritten") {
        bail!(
            "a successful first attempt: status {}, {FIRST_WRITE_HEADER} {rewritten:?} (expected the upstream filter's rewrite)",
            answer.status()
        );
    }
    let first_host = |port: u16| Target {
        headers: with(
            &target.headers,
            FIRST_HOST_HEADER,
            &format!("127.0.0.1:{port}"),
        ),
        stream_headers: with(
            &target.stream_headers,
            FIRST_HOST_HEADER,
            &format!("127.0.0.1:{port}"),
        ),
        ..target.clone()
    };
    let refused = first_host(scripted.refused);
    let reset = first_host(scripted.reset);
    let stalled = first_host(scripted.stalled);
    let local = Target {
        headers: with(&target.headers, FAIL_HEADER, "local"),
        stream_headers: with(&target.stream_headers, FAIL_HEADER, "local"),
        ..target.clone()
    };
    // A failure without an answer: the fake upstream serves the retries only, and Envoy's
    // counter of that failure on the direct cluster (or the route's) moved by 2.
    let without_answer = |direct, cause, what| {
        (
            Counts {
                upstream: 2,
                direct,
                internal: 2,
                failovers: 2,
            },
            Some(cause),
            what,
        )
    };
    let mut all: Vec<(&Target, Counts, Option<&str>, &str)> = steps
        .iter()
        .map(|(call, want, what)| (*call, *want, None, *what))
        .collect();
    for (call, (want, cause, what)) in [
        (&refused, without_answer(0, "cluster.first_attempt.upstream_cx_connect_fail", "a first host refusing the connection (unary and streamed) was not retried through the internal listener once")),
        (&reset, without_answer(2, "cluster.first_attempt.upstream_cx_destroy_remote_with_active_rq", "a first host closing the connection before answering (unary and streamed) was not retried through the internal listener once")),
        (&stalled, without_answer(2, "cluster.one_pass.upstream_rq_per_try_timeout", "a first host never answering (unary and streamed) was not retried through the internal listener once at the per-try timeout")),
    ] {
        all.push((call, want, cause, what));
    }
    // A retry that fails too goes to the next priority (the internal listener again, through
    // `second_pass_2`), never back to the direct cluster.
    let twice = Target {
        headers: with(&failing.headers, "x-bench-fail-through", "2"),
        stream_headers: with(&failing.stream_headers, "x-bench-fail-through", "2"),
        ..target.clone()
    };
    all.push((
        &twice,
        Counts {
            upstream: 6,
            direct: 2,
            internal: 4,
            failovers: 4,
        },
        None,
        "a first attempt and its retry failing (unary and streamed): the third attempt did not go through the internal listener",
    ));
    let mut before = counts(design, envoy, upstream).await?;
    for (call, want, cause, what) in all {
        let cause_before = match cause {
            Some(name) => envoy_stat(&envoy.admin, name).await?,
            None => 0,
        };
        let answered = check(call).await?;
        if !answered.ok {
            bail!("{what}: the answers were not the upstream's completion: {answered:?}");
        }
        before = counted(design, envoy, upstream, before, want, what).await?;
        if let Some(name) = cause {
            let moved = envoy_stat(&envoy.admin, name).await? - cause_before;
            if moved != 2 {
                bail!("{what}: {name} +{moved}, expected +2");
            }
        }
    }
    // An upstream filter's own answer (`send_http_response`) goes to the client as it is: the
    // router does not see it, so does not retry it, whatever it carries.
    let resp = send(&local, false).await.context("the local answer call")?;
    let status = resp.status().as_u16();
    let signal = resp.headers().get("x-floor-retry").is_some();
    let after = counts(design, envoy, upstream).await?;
    if status != 503
        || !signal
        || after.internal != before.internal
        || after.failovers != before.failovers
    {
        bail!(
            "the upstream filter's own retry answer: status {status}, x-floor-retry {signal}, internal listener +{}, retries +{} (expected the filter's 503 with its retry header, not retried)",
            after.internal - before.internal,
            after.failovers - before.failovers
        );
    }
    for (call, what) in [
        (failing, "a 429 failed over"),
        (&refused, "a refused connection failed over"),
        (&reset, "a connection closed before the answer failed over"),
        (
            &stalled,
            "a first attempt past the per-try timeout failed over",
        ),
    ] {
        replayed(call, what, true).await?;
    }
    // A stream whose first event comes at once and the rest after the per-try timeout: not
    // cut, not retried.
    let slow = first_host(scripted.slow);
    let before = counts(design, envoy, upstream).await?;
    let text = slow_stream(&slow).await?;
    let after = counts(design, envoy, upstream).await?;
    if text != SLOW_STREAM_TEXT || after.internal != before.internal {
        bail!(
            "a stream slower than the per-try timeout after its first event: the client read {text:?} (the upstream sent {SLOW_STREAM_TEXT:?}), internal listener +{}",
            after.internal - before.internal
        );
    }
    Ok(format!(
        "failover checked: a successful first attempt takes one pass (fake upstream +2, internal listener +0 for a unary and a streamed call); each of a 429, a stream's error event before its first token, a first host refusing the connection, one closing it before answering, and one not answering within the per-try timeout ({ONE_PASS_RETRY_PER_TRY}) is retried once through the internal listener (a retry failing too: the third attempt through it again, not back to the direct cluster), the client getting the second attempt's answer (status 200, no retry header) with the {}-byte body replayed and none of the first attempt's rewrite (its header and its body, written by the upstream filter for that attempt alone); a stream slower than the per-try timeout after its first event reaches the client whole, not retried; an answer the upstream filter sends itself reaches the client as it is, not retried",
        target.body_for(false).len()
    ))
}

/// The scripted first hosts of `one-pass-retry`'s check (ports on 127.0.0.1).
pub struct Scripted {
    /// Nothing listens: the connection is refused.
    refused: u16,
    /// Reads the request's head, then closes the connection.
    reset: u16,
    /// Reads the request and never answers (until the peer closes).
    stalled: u16,
    /// Answers an event stream: headers and the first event at once, the rest after the
    /// per-try timeout.
    slow: u16,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Scripted {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// The text of [`Scripted::slow`]'s stream (its two events' content).
const SLOW_STREAM_TEXT: &str = "first, then late";
/// How long [`Scripted::slow`] waits after its first event: past the per-try timeout.
const SLOW_STREAM_GAP: Duration = Duration::from_millis(1_500);

impl Scripted {
    /// Every port, for the Envoy's DNS cache.
    pub fn ports(&self) -> [u16; 4] {
        [self.refused, self.reset, self.stalled, self.slow]
    }

    pub async fn start() -> Result<Self> {
        let refused = {
            let l = TcpListener::bind("127.0.0.1:0").await?;
            l.local_addr()?.port()
        };
        let mut tasks = Vec::new();
        let mut serve = |behave: Behave| -> Result<u16> {
            let std = std::net::TcpListener::bind("127.0.0.1:0")?;
            std.set_nonblocking(true)?;
            let port = std.local_addr()?.port();
            let listener = TcpListener::from_std(std)?;
            tasks.push(tokio::spawn(async move {
                while let Ok((conn, _)) = listener.accept().await {
                    tokio::spawn(behave.serve(conn));
                }
            }));
            Ok(port)
        };
        let reset = serve(Behave::Close)?;
        let stalled = serve(Behave::Stall)?;
        let slow = serve(Behave::Slow)?;
        Ok(Self {
            refused,
            reset,
            stalled,
            slow,
            tasks,
        })
    }
}

#[derive(Clone, Copy)]
enum Behave {
    Close,
    Stall,
    Slow,
}

impl Behave {
    async fn serve(self, mut conn: TcpStream) {
        // The request's head (the body, if any, follows; these hosts do not need it).
        let mut buf = vec![0u8; 64 * 1024];
        let mut seen = Vec::new();
        while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
        match self {
            Behave::Close => drop(conn),
            Behave::Stall => {
                // Until Envoy gives up on it (the per-try timeout) and closes.
                while let Ok(n) = conn.read(&mut buf).await {
                    if n == 0 {
                        return;
                    }
                }
            }
            Behave::Slow => {
                let event = |text: &str| {
                    let data = format!(
                        "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n"
                    );
                    format!("{:x}\r\n{data}\r\n", data.len())
                };
                let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
                let first = format!("{head}{}", event("first, "));
                if conn.write_all(first.as_bytes()).await.is_err() {
                    return;
                }
                tokio::time::sleep(SLOW_STREAM_GAP).await;
                let done = "data: [DONE]\n\n";
                let rest = format!(
                    "{}{:x}\r\n{done}\r\n0\r\n\r\n",
                    event("then late"),
                    done.len()
                );
                let _ = conn.write_all(rest.as_bytes()).await;
                // Until Envoy closes.
                while let Ok(n) = conn.read(&mut buf).await {
                    if n == 0 {
                        return;
                    }
                }
            }
        }
    }
}

/// A streamed call of `call`: the concatenated content of its events.
async fn slow_stream(call: &Target) -> Result<String> {
    let resp = send(call, true).await.context("the slow stream call")?;
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap_or_default();
    if status != 200 {
        bail!("the slow stream call: status {status}: {text}");
    }
    let mut content = String::new();
    for line in text.lines() {
        let Some(data) = line.strip_prefix("data:").map(str::trim) else {
            continue;
        };
        let v: serde_json::Value = serde_json::from_str(data).unwrap_or_default();
        if let Some(piece) = v
            .pointer("/choices/0/delta/content")
            .and_then(serde_json::Value::as_str)
        {
            content.push_str(piece);
        }
    }
    Ok(content)
}

/// One unary or streamed call of `call`.
async fn send(call: &Target, stream: bool) -> Result<reqwest::Response> {
    let client = ai_router_e2e::http_client()?;
    let mut req = client
        .post(call.url.to_string())
        .header("content-type", "application/json");
    for (k, v) in call.headers_for(stream) {
        req = req.header(k.as_str(), v.as_str());
    }
    Ok(req.body(call.body_for(stream)).send().await?)
}

fn with(headers: &[(String, String)], name: &str, value: &str) -> Vec<(String, String)> {
    let mut out = headers.to_vec();
    out.push((name.to_string(), value.to_string()));
    out
}
