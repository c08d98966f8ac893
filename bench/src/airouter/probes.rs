//! The sync probes: how long a revoked virtual key or a blacklisted provider key takes to
//! reach every Envoy worker, and how many bytes the sync stream carried for it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;
use serde_json::Value;

use super::{Instance, PROBE_MODEL, PROBE_TIMEOUT};
use crate::load::chat_body;
use crate::upstream::{BenchEnvoy, PROBE_RUNTIME_KEY};

impl Instance {
    /// Revokes the victim virtual key through the admin API and polls every Envoy on fresh
    /// connections until `streak` answers in a row refuse it with 401.
    pub async fn probe_revoke(&self, streak: usize) -> Result<SyncProbe> {
        let fresh = fresh_client()?;
        let secret = self.victim.1.clone();
        let check = |base: String| {
            let req = fresh
                .get(format!("{base}/v1/models"))
                .bearer_auth(&secret)
                .send();
            async move {
                Ok(match req.await?.status().as_u16() {
                    401 => Some(true),
                    200 => Some(false),
                    _ => None,
                })
            }
        };
        for (name, base) in self.gateways() {
            if check(base).await? != Some(false) {
                bail!("the revoke probe's key is not live at the {name} Envoy before the revoke");
            }
        }
        let admin = ai_router_e2e::http_client()?;
        let url = format!(
            "http://{}/admin/keys/{}/revoke",
            self.cp.http_addr(),
            self.victim.0
        );
        let token = self.secrets.admin_token.clone();
        let change = || async move {
            let resp = admin.post(&url).bearer_auth(&token).send().await?;
            if !resp.status().is_success() {
                bail!("{url} answered {}", resp.status());
            }
            Ok(())
        };
        self.measure(streak, "revoke", change, check).await
    }

    /// Has the probe provider's only key refused with 401 once at this Envoy (the fake
    /// upstream's `/probe/` route, switched on and off again through its runtime), then polls
    /// every Envoy on fresh connections until `streak` calls in a row are refused by the
    /// gateway itself (503: no usable key) instead of reaching the key, which works again.
    pub async fn probe_blacklist(&self, upstream: &BenchEnvoy, streak: usize) -> Result<SyncProbe> {
        let fresh = fresh_client()?;
        let body = chat_body(PROBE_MODEL, false);
        let key = self.load_key.clone();
        let call = |base: String| {
            let req = fresh
                .post(format!("{base}/v1/chat/completions"))
                .bearer_auth(&key)
                .header("content-type", "application/json")
                .body(body.clone())
                .send();
            async move {
                let resp = req.await?;
                let status = resp.status().as_u16();
                let v: Value = resp.json().await.unwrap_or(Value::Null);
                let code = v
                    .pointer("/error/code")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                Ok::<(u16, String), anyhow::Error>((status, code))
            }
        };
        // The gateway's own refusal once the key is out: 503 pool_auth_failed.
        let check = |base: String| {
            let answer = call(base);
            async move {
                Ok(match answer.await? {
                    (503, code) if code == "pool_auth_failed" => Some(true),
                    (200, _) => Some(false),
                    _ => None,
                })
            }
        };
        upstream.set_runtime(PROBE_RUNTIME_KEY, "0").await?;
        for (name, base) in self.gateways() {
            let (first, code) = call(base).await?;
            if first != 200 {
                bail!("the probe model does not answer at the {name} Envoy before the blacklist: {first} {code}");
            }
        }
        let here = self.envoy.base_url();
        let change = || async move {
            upstream.set_runtime(PROBE_RUNTIME_KEY, "100").await?;
            let refused = call(here).await;
            upstream.set_runtime(PROBE_RUNTIME_KEY, "0").await?;
            let (refused, _) = refused?;
            if refused == 200 {
                bail!("the probe key was not refused (the fake upstream answered 200)");
            }
            Ok(())
        };
        let cp_http = self.cp.http_addr().to_string();
        let token = self.secrets.admin_token.clone();
        // When the control plane's /health first lists the key out (the probe's change starts
        // after the sync stream is quiet, which may take seconds).
        let cp_seen = tokio::spawn(async move {
            let client = ai_router_e2e::http_client().ok()?;
            let until = Instant::now() + PROBE_TIMEOUT * 2;
            while Instant::now() < until {
                let health: Value = client
                    .get(format!("http://{cp_http}/health"))
                    .bearer_auth(&token)
                    .send()
                    .await
                    .ok()?
                    .json()
                    .await
                    .ok()?;
                if probe_key_out(&health) == Some(true) {
                    return Some(Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            None
        });
        let mut probe = self.measure(streak, "blacklist", change, check).await?;
        probe.control_plane_ms = cp_seen
            .await
            .ok()
            .flatten()
            .map(|at| at.saturating_duration_since(probe.started).as_secs_f64() * 1000.0);
        Ok(probe)
    }

    /// Waits for the sync stream to go quiet (at most a few seconds) and returns its rate then
    /// (bytes per second).
    pub(super) async fn quiet_sync(&self) -> Result<f64> {
        let window = Duration::from_millis(250);
        let mut best = f64::MAX;
        for _ in 0..20 {
            let a = self.sync_rx_bytes().await?;
            tokio::time::sleep(window).await;
            let b = self.sync_rx_bytes().await?;
            let rate = b.saturating_sub(a) as f64 / window.as_secs_f64();
            best = best.min(rate);
            if b == a {
                break;
            }
        }
        Ok(best)
    }

    /// Runs `change`, then polls every Envoy with `check` (Some(true): the worker that answered
    /// has the change, Some(false): not yet, None: another answer) until `streak` polls in a
    /// row at each say it has; counts the sync stream's bytes around it, less its quiet rate.
    pub(super) async fn measure<C, CF, K, KF>(
        &self,
        streak: usize,
        what: &str,
        change: C,
        check: K,
    ) -> Result<SyncProbe>
    where
        C: FnOnce() -> CF,
        CF: std::future::Future<Output = Result<()>>,
        K: Fn(String) -> KF,
        KF: std::future::Future<Output = Result<Option<bool>>>,
    {
        let idle_rate = self.quiet_sync().await?;
        let rx0 = self.sync_rx_bytes().await?;
        let metrics0 = self.sync_metrics().await;
        let t0 = Instant::now();
        change()
            .await
            .with_context(|| format!("the {what} probe's change"))?;
        let change_ms = t0.elapsed().as_secs_f64() * 1000.0;
        let mut reach: Vec<Reach> = self
            .gateways()
            .into_iter()
            .map(|(envoy, _)| Reach {
                envoy: envoy.to_string(),
                ..Default::default()
            })
            .collect();
        let bases: Vec<String> = self.gateways().into_iter().map(|(_, b)| b).collect();
        let mut runs = vec![0usize; bases.len()];
        let mut others = 0u64;
        while runs.iter().any(|r| *r < streak) {
            if t0.elapsed() > PROBE_TIMEOUT {
                bail!("the {what} did not reach every worker within {PROBE_TIMEOUT:?}: {reach:?}");
            }
            for (i, base) in bases.iter().enumerate() {
                if runs[i] >= streak {
                    continue;
                }
                let at = t0.elapsed().as_secs_f64() * 1000.0;
                reach[i].polls += 1;
                match check(base.clone()).await? {
                    Some(true) => {
                        if runs[i] == 0 {
                            reach[i].every_worker_ms = at;
                        }
                        reach[i].first_seen_ms.get_or_insert(at);
                        runs[i] += 1;
                    }
                    Some(false) => runs[i] = 0,
                    None => {
                        others += 1;
                        if others > 50 {
                            bail!("the {what} probe got unexpected answers ({others}): {reach:?}");
                        }
                    }
                }
            }
        }
        // Let the rest of the push land before counting its bytes.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let elapsed = t0.elapsed().as_secs_f64();
        let rx1 = self.sync_rx_bytes().await?;
        let metrics1 = self.sync_metrics().await;
        let raw = rx1.saturating_sub(rx0);
        let bytes = (raw as f64 - idle_rate * elapsed).max(0.0);
        let control_plane_metrics = metrics1
            .iter()
            .map(|(k, v)| (k.clone(), v - metrics0.get(k).copied().unwrap_or(0.0)))
            .collect();
        Ok(SyncProbe {
            started: t0,
            change_call_ms: change_ms,
            every_worker_ms: reach.iter().map(|r| r.every_worker_ms).fold(0.0, f64::max),
            reach,
            streak,
            sync_rx_bytes: bytes.round() as u64,
            sync_rx_bytes_raw: raw,
            idle_rx_bytes_per_s: idle_rate,
            control_plane_ms: None,
            control_plane_metrics,
        })
    }
}

/// `/health` (admin view): is the probe provider's key out? None when the shape is unknown.
fn probe_key_out(health: &Value) -> Option<bool> {
    let providers = health.get("providers")?.as_array()?;
    let probe = providers
        .iter()
        .find(|p| p.get("id").and_then(Value::as_str) == Some("probe"))?;
    let keys = probe.get("keys")?.as_array()?;
    Some(keys.iter().any(|k| {
        k.get("state")
            .and_then(Value::as_str)
            .is_some_and(|s| s != "ok")
    }))
}

/// A client that opens a new connection for every request (so the kernel spreads the probes
/// over Envoy's workers).
fn fresh_client() -> Result<reqwest::Client> {
    reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| anyhow!("building the probe client: {e}"))
}

/// How a change reached one Envoy's workers (ms from the change).
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Reach {
    /// `same`: the Envoy where the change was made (the blacklist's refused call) or the
    /// first one; `other`: a second Envoy on the same control plane.
    pub envoy: String,
    /// The first poll that saw the change.
    pub first_seen_ms: Option<f64>,
    /// The start of the final run of `streak` polls in a row that saw it, each on a new
    /// connection: the change had reached every worker by then.
    pub every_worker_ms: f64,
    pub polls: u64,
}

/// How a change reached the workers.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SyncProbe {
    /// When the change was made.
    #[serde(skip)]
    pub started: Instant,
    /// The admin call (revoke) or the refused call (blacklist) that made the change.
    pub change_call_ms: f64,
    /// The latest of `reach`: the change had reached every worker of every Envoy polled.
    pub every_worker_ms: f64,
    pub reach: Vec<Reach>,
    pub streak: usize,
    /// Bytes Envoy received on the sync stream for the change (the idle rate taken off).
    pub sync_rx_bytes: u64,
    pub sync_rx_bytes_raw: u64,
    pub idle_rx_bytes_per_s: f64,
    /// Blacklist: when the control plane's `/health` first listed the key out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub control_plane_ms: Option<f64>,
    /// Changes of the control plane's `ai_router_sync*` metrics, if it has any.
    pub control_plane_metrics: BTreeMap<String, f64>,
}
