//! `one-pass-floor`'s failover check, before it is measured: a first attempt that succeeds
//! takes one pass (the internal listener sees nothing), and one that fails (a 429, and a stream
//! whose first event is an error) is followed by Envoy's internal redirect through the internal
//! listener, the client getting the second attempt's answer whole and nothing of the first, the
//! request body replayed. Counted from the Envoys' own statistics; any miss fails the system.

use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::load::Target;
use crate::run::check;
use crate::upstream::{envoy_stat, BenchEnvoy, FAIL_HEADER};

/// How long a counter may take to reach a value the answers already imply.
const COUNTED_WITHIN: Duration = Duration::from_secs(5);

/// The counters the check reads: requests the fake upstream served, first attempts sent
/// straight to it, calls through the internal listener, internal redirects followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Counts {
    upstream: u64,
    direct: u64,
    internal: u64,
    redirects: u64,
}

async fn counts(envoy: &BenchEnvoy, upstream: &BenchEnvoy) -> Result<Counts> {
    Ok(Counts {
        upstream: envoy_stat(
            &upstream.admin,
            "http.fake_upstream.downstream_rq_completed",
        )
        .await?,
        direct: envoy_stat(&envoy.admin, "cluster.first_attempt.upstream_rq_total").await?,
        internal: envoy_stat(&envoy.admin, "cluster.second_pass.upstream_rq_total").await?,
        redirects: envoy_stat(
            &envoy.admin,
            "cluster.first_attempt.upstream_internal_redirect_succeeded_total",
        )
        .await?,
    })
}

/// Waits until the fake upstream has served `want.upstream` requests more than at `before`,
/// then checks every counter moved by `want`; else fails with `what`.
async fn counted(
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
            let now = counts(envoy, upstream).await?;
            Ok((now.upstream >= before.upstream + want.upstream).then_some(now))
        },
    )
    .await?;
    let moved = Counts {
        upstream: after.upstream - before.upstream,
        direct: after.direct - before.direct,
        internal: after.internal - before.internal,
        redirects: after.redirects - before.redirects,
    };
    if moved != want {
        bail!("{what}: {moved:?}, expected {want:?}");
    }
    Ok(after)
}

/// Runs the check against `target` (the one-pass Envoy's); what it verified, in words.
pub async fn failover_check(
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
                redirects: 0,
            },
            "a successful first attempt (unary and streamed) did not take one pass",
        ),
        (
            &failing,
            Counts {
                upstream: 4,
                direct: 2,
                internal: 2,
                redirects: 2,
            },
            "a failed first attempt (unary and streamed) did not take the redirect through the internal listener once",
        ),
    ];
    let mut before = counts(envoy, upstream).await?;
    for (call, want, what) in steps {
        let answered = check(call).await?;
        if !answered.ok {
            bail!("{what}: the answers were not the upstream's completion: {answered:?}");
        }
        before = counted(envoy, upstream, before, want, what).await?;
    }

    // The continuation read the whole body again, and the client saw nothing of the 429.
    let client = ai_router_e2e::http_client()?;
    let mut req = client
        .post(target.url.to_string())
        .header("content-type", "application/json");
    for (k, v) in &failing.headers {
        req = req.header(k.as_str(), v.as_str());
    }
    let body = target.body_for(false);
    let resp = req
        .body(body.clone())
        .send()
        .await
        .context("the replay check call")?;
    let status = resp.status().as_u16();
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let replayed = header("x-floor-replayed");
    let location = header("location");
    if status != 200 || replayed != Some(body.len().to_string()) || location.is_some() {
        bail!(
            "a failed-over call: status {status}, x-floor-replayed {replayed:?} (the body has {} bytes), location {location:?}",
            body.len()
        );
    }
    Ok(format!(
        "failover checked: a successful first attempt takes one pass (fake upstream +2, internal listener +0 for a unary and a streamed call); a 429 and a stream's error event before its first token each take one internal redirect through the internal listener, the client getting the second attempt's answer (status 200, no location) with the {}-byte body replayed",
        body.len()
    ))
}

fn with(headers: &[(String, String)], name: &str, value: &str) -> Vec<(String, String)> {
    let mut out = headers.to_vec();
    out.push((name.to_string(), value.to_string()));
    out
}
