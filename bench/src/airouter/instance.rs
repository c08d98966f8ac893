//! A running ai-router under test: control plane + Envoy, and a second Envoy for the probes.

use std::collections::BTreeMap;
use std::time::Instant;

use ai_router_e2e::{ControlPlane, Envoy, TestDir};
use anyhow::{Context, Result};

use super::provision::{create_key, pool};
use super::{KeyBundle, Secrets, Shape, MODEL, SYNC_CLUSTER_RX};
use crate::load::{chat_body, Target};
use crate::procs::ProcSet;
use crate::upstream::{envoy_stat, BenchEnvoy};

/// A running ai-router: control plane + Envoy (rendered by `ai-router render-envoy`).
#[derive(Debug)]
pub struct Instance {
    pub(super) name: String,
    pub cp: ControlPlane,
    pub envoy: Envoy,
    /// A second Envoy on the same control plane, for the probes.
    pub(super) second: Option<Envoy>,
    pub(super) secrets: Secrets,
    pub(super) load_key: String,
    /// A virtual key created for the revoke probe: (id, secret).
    pub(super) victim: (String, String),
    /// How long its `POST /admin/keys` took (every other key already in the store).
    pub create_key_ms: f64,
}

impl Instance {
    pub async fn start(
        name: &str,
        shape: Shape,
        bundle: &KeyBundle,
        upstream: &BenchEnvoy,
        variants: &[&'static str],
        one_pass: bool,
    ) -> Result<Self> {
        let dir = TestDir::new(name)?;
        for f in &bundle.files {
            let to = dir.join(
                &f.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            );
            std::fs::copy(f, &to).with_context(|| format!("copying {}", f.display()))?;
        }
        let secrets = Secrets::new();
        let (yaml, env) = pool(
            &shape,
            upstream.port,
            &dir.join("keys.db"),
            &secrets,
            one_pass,
        );
        let cp = ControlPlane::start(&dir, &yaml, &env)
            .await
            .context("starting the control plane")?;
        let client = ai_router_e2e::http_client()?;
        let t0 = Instant::now();
        let victim = create_key(
            &client,
            &cp.http_addr().to_string(),
            &secrets.admin_token,
            "bench_victim",
        )
        .await
        .with_context(|| cp.tail())?;
        let create_key_ms = t0.elapsed().as_secs_f64() * 1000.0;
        let envoy_env = vec![
            (
                "AI_ROUTER_SYNC_TOKEN".to_string(),
                secrets.sync_token.clone(),
            ),
            ("RUST_LOG".to_string(), "warn".to_string()),
        ];
        let envoy = if variants.is_empty() {
            Envoy::start(
                &dir,
                cp.config_path(),
                cp.grpc_addr(),
                &envoy_env,
                &bundle.load_key,
            )
            .await
        } else {
            let (variants, port) = (variants.to_vec(), upstream.port);
            let edit = move |yaml: String| super::variant::apply(&yaml, &variants, port);
            Envoy::start_edited(
                &dir,
                cp.config_path(),
                cp.grpc_addr(),
                &envoy_env,
                &bundle.load_key,
                &edit,
            )
            .await
        }
        .with_context(|| cp.tail())
        .context("starting Envoy")?;
        Ok(Self {
            name: name.to_string(),
            cp,
            envoy,
            second: None,
            secrets,
            load_key: bundle.load_key.clone(),
            victim,
            create_key_ms,
        })
    }

    pub fn target(&self) -> Result<Target> {
        let url = format!("{}/v1/chat/completions", self.envoy.base_url());
        // Each answer states the gateway's own overhead (`x-ai-router-overhead-ms`): the
        // report puts it beside the added latency the load generator measures.
        let headers = vec![
            (
                "authorization".to_string(),
                format!("Bearer {}", self.load_key),
            ),
            (
                ai_router_contract::headers::OVERHEAD.to_string(),
                "1".to_string(),
            ),
        ];
        let mut stream_headers = headers.clone();
        stream_headers.push(("accept".to_string(), "text/event-stream".to_string()));
        Ok(Target {
            url: url.parse()?,
            headers,
            unary_body: chat_body(MODEL, false),
            stream_body: chat_body(MODEL, true),
            stream_headers,
        })
    }

    pub fn procs(&self) -> ProcSet {
        let mut p = ProcSet::new();
        p.add("envoy", self.envoy.process().pid());
        p.add("control-plane", self.cp.pid());
        p
    }

    /// Bytes Envoy has received on the sync stream so far.
    pub async fn sync_rx_bytes(&self) -> Result<u64> {
        envoy_stat(self.envoy.admin_addr(), SYNC_CLUSTER_RX).await
    }

    /// The control plane's `ai_router_sync*` metrics, if it has any (a hook for a control
    /// plane that counts what it sends).
    pub(super) async fn sync_metrics(&self) -> BTreeMap<String, f64> {
        let Ok(client) = ai_router_e2e::http_client() else {
            return BTreeMap::new();
        };
        let url = format!("http://{}/metrics", self.cp.http_addr());
        let text = match client.get(&url).send().await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        text.lines()
            .filter(|l| l.starts_with("ai_router_sync"))
            .filter_map(|l| {
                let (name, value) = l.rsplit_once(' ')?;
                Some((name.to_string(), value.parse::<f64>().ok()?))
            })
            .collect()
    }

    /// Starts a second Envoy on the same control plane (its own directory): the probes poll
    /// both, so a change is timed to every worker of the Envoy that saw it happen and of one
    /// that only hears of it through the control plane.
    pub async fn start_second_envoy(&mut self) -> Result<()> {
        if self.second.is_some() {
            return Ok(());
        }
        let dir = TestDir::new(&format!("{}-second-envoy", self.name))?;
        let envoy_env = vec![
            (
                "AI_ROUTER_SYNC_TOKEN".to_string(),
                self.secrets.sync_token.clone(),
            ),
            ("RUST_LOG".to_string(), "warn".to_string()),
        ];
        let envoy = Envoy::start(
            &dir,
            self.cp.config_path(),
            self.cp.grpc_addr(),
            &envoy_env,
            &self.load_key,
        )
        .await
        .context("starting the second Envoy")?;
        self.second = Some(envoy);
        Ok(())
    }

    /// The Envoys the probes poll: this one, then the second if it runs.
    pub(super) fn gateways(&self) -> Vec<(&'static str, String)> {
        let mut g = vec![("same", self.envoy.base_url())];
        if let Some(second) = &self.second {
            g.push(("other", second.base_url()));
        }
        g
    }
}
