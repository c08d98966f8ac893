//! Stopping an Envoy without losing a call or its usage: stop its public listener, wait until no
//! request is active on it, then until the filter's outcome reports are acknowledged by a
//! control plane (the gauge `wasmcustom.ai_router.reports_pending`), at most a grace. Only then
//! may Envoy be stopped: the reports live in its VMs (a worker holds them up to 50 ms, the
//! singleton's outbox until a control plane answers), and Envoy runs no wasm code on its way
//! out that could still send them.
//!
//! `ai-router up` drains its own Envoy this way when stopped; `ai-router drain` does it for any
//! Envoy whose admin interface it can reach (a pre-stop hook).

use std::time::{Duration, Instant};

use serde::Serialize;

/// Envoy's stat of the requests active on the gateway's public listener.
pub const ACTIVE_REQUESTS_STAT: &str = "http.ai_router_public.downstream_rq_active";
/// The filter's gauge of outcome reports no control plane acknowledged yet.
pub const PENDING_REPORTS_STAT: &str = "wasmcustom.ai_router.reports_pending";

/// How a drain ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Drained {
    /// Nothing in flight and nothing unreported: Envoy may stop.
    pub drained: bool,
    /// Requests still active on the public listener when the drain ended (`null`: unknown).
    pub in_flight: Option<u64>,
    /// Outcome reports not acknowledged when the drain ended (`null`: unknown).
    pub reports_pending: Option<u64>,
    pub waited_ms: u64,
}

/// What the drain waits on, read from Envoy's `/stats`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Figures {
    in_flight: Option<u64>,
    reports_pending: Option<u64>,
}

impl Figures {
    /// Parses the lines of Envoy's text `/stats`. The reports gauge exists once a VM reported
    /// an outcome: absent, nothing was ever held.
    fn parse(stats: &str) -> Self {
        let value = |name: &str| {
            stats.lines().find_map(|line| {
                let (stat, value) = line.split_once(": ")?;
                (stat == name).then(|| value.trim().parse::<u64>().ok())?
            })
        };
        Self {
            in_flight: value(ACTIVE_REQUESTS_STAT),
            reports_pending: Some(value(PENDING_REPORTS_STAT).unwrap_or(0)),
        }
    }

    fn done(self) -> bool {
        self.in_flight == Some(0) && self.reports_pending == Some(0)
    }
}

/// Drains the Envoy whose admin interface is at `admin` (`host:port`), waiting at most `grace`.
/// Errors only when the listener cannot be drained at all (the admin interface unreachable).
pub async fn drain_envoy(admin: &str, grace: Duration) -> anyhow::Result<Drained> {
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(2))
        .build()?;
    let base = format!("http://{admin}");
    let began = Instant::now();
    // Inbound only: the internal hops (the attempts of the calls in flight) keep working.
    let answer = http
        .post(format!("{base}/drain_listeners?inboundonly"))
        .send()
        .await
        .map_err(|err| anyhow::anyhow!("cannot reach Envoy's admin at {admin}: {err}"))?;
    if !answer.status().is_success() {
        anyhow::bail!(
            "Envoy's admin at {admin} refused to drain its listeners: {}",
            answer.status()
        );
    }
    let deadline = began + grace;
    let mut last = Figures {
        in_flight: None,
        reports_pending: None,
    };
    let mut logged = None;
    loop {
        if let Some(figures) = read_figures(&http, &base).await {
            last = figures;
            if figures.done() {
                tracing::info!("drained: no call in flight, every outcome reported");
                break;
            }
            let waiting = if figures.in_flight != Some(0) {
                "the calls in flight"
            } else {
                "the outcome reports to be acknowledged by a control plane"
            };
            if logged != Some(waiting) {
                tracing::info!(
                    in_flight = ?figures.in_flight,
                    reports_pending = ?figures.reports_pending,
                    grace_s = grace.as_secs(),
                    "draining: waiting for {waiting}"
                );
                logged = Some(waiting);
            }
        }
        if Instant::now() >= deadline {
            tracing::warn!(
                in_flight = ?last.in_flight,
                reports_pending = ?last.reports_pending,
                "the drain's grace ended first: stopping Envoy now loses what is still pending"
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(Drained {
        drained: last.done(),
        in_flight: last.in_flight,
        reports_pending: last.reports_pending,
        waited_ms: u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX),
    })
}

async fn read_figures(http: &reqwest::Client, base: &str) -> Option<Figures> {
    let text = http
        .get(format!("{base}/stats?filter=ai_router"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    Some(Figures::parse(&text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drain_is_done_with_nothing_in_flight_and_nothing_unreported() {
        let stats = "http.ai_router_public.downstream_rq_active: 0\n\
                     wasmcustom.ai_router.reports_pending: 0\n\
                     wasmcustom.ai_router.calls_in_progress: 0\n";
        assert!(Figures::parse(stats).done());
    }

    #[test]
    fn pending_reports_keep_the_drain_waiting_after_the_calls_end() {
        let f = Figures::parse(
            "http.ai_router_public.downstream_rq_active: 0\n\
             wasmcustom.ai_router.reports_pending: 3\n",
        );
        assert_eq!(f.reports_pending, Some(3));
        assert!(!f.done());
        let f = Figures::parse(
            "http.ai_router_public.downstream_rq_active: 2\n\
             wasmcustom.ai_router.reports_pending: 0\n",
        );
        assert!(!f.done());
    }

    #[test]
    fn a_filter_that_never_reported_has_nothing_pending_but_the_listener_must_be_seen() {
        let f = Figures::parse("http.ai_router_public.downstream_rq_active: 0\n");
        assert_eq!(f.reports_pending, Some(0));
        assert!(f.done());
        // A stats page without the listener (another bootstrap): never called drained.
        let f = Figures::parse("wasmcustom.ai_router.reports_pending: 0\n");
        assert_eq!(f.in_flight, None);
        assert!(!f.done());
        // A prefix of the name is another stat.
        let f = Figures::parse("http.ai_router_public.downstream_rq_active_x: 0\n");
        assert_eq!(f.in_flight, None);
    }
}
