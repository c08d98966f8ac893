//! The background task that asks OpenRouter for each key's credit (`GET {baseUrl}/key`, the
//! key's bearer token) when the ledger says it is due ([`super::credit::KeyPoll`]: at start,
//! every [`super::credit::POLL_INTERVAL_MS`], and soon after a 402 or 429 through the key),
//! and hands the answer to the ledger.
//!
//! Nothing waits for it. An ask is bounded by [`POLL_TIMEOUT`] and [`MAX_BODY_BYTES`]; a
//! failed one is one log line (provider, key alias, what failed; never the secret or the
//! body), and the key's last figure ages out as any reported figure does. It follows a reload:
//! each round reads the ledger's current keys and the engine's current secrets.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;

use super::credit::{self, KeyCredit};
use super::Ledger;
use crate::discovery::listing;
use crate::engine::discovered::ListingJob;
use crate::engine::Engine;

/// How often the task looks for due keys.
pub const TICK: Duration = Duration::from_secs(1);
/// One ask at most.
pub const POLL_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest answer read (OpenRouter's is a few hundred bytes).
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// Asks every due key until `shutdown` flips.
pub async fn run(engine: Arc<Engine>, ledger: Arc<Ledger>, mut shutdown: watch::Receiver<bool>) {
    let Some(client) = crate::discovery::provider_client(POLL_TIMEOUT, "asking OpenRouter credit")
    else {
        return;
    };
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut running = JoinSet::new();
    loop {
        tokio::select! {
            _ = tick.tick() => {
                for (provider, alias) in ledger.key_polls_due() {
                    let Some(job) = engine.key_access(&provider, &alias) else {
                        // No secret (yet): nothing to ask with.
                        ledger.key_polled(&provider, &alias, None);
                        continue;
                    };
                    let (client, ledger) = (client.clone(), ledger.clone());
                    running.spawn(async move {
                        let result = ask(&client, &job).await;
                        if let Err(err) = &result {
                            tracing::warn!(
                                provider = %job.provider,
                                key = %job.key,
                                error = %err,
                                "asking the key's credit failed; its last figure ages out"
                            );
                        }
                        ledger.key_polled(&job.provider, &job.key, result.ok());
                    });
                }
            }
            Some(_) = running.join_next(), if !running.is_empty() => {}
            _ = shutdown.changed() => break,
        }
        if *shutdown.borrow() {
            break;
        }
    }
    running.abort_all();
}

/// One key's credit, within [`POLL_TIMEOUT`]. The error names what failed, never the secret.
pub async fn ask(client: &reqwest::Client, job: &ListingJob) -> Result<KeyCredit, String> {
    match tokio::time::timeout(POLL_TIMEOUT, fetch(client, job)).await {
        Ok(result) => result,
        Err(_) => Err(format!("no answer within {POLL_TIMEOUT:?}")),
    }
}

async fn fetch(client: &reqwest::Client, job: &ListingJob) -> Result<KeyCredit, String> {
    let url = format!(
        "{}://{}{}/key",
        job.endpoint.scheme, job.endpoint.authority, job.endpoint.base_path
    );
    let mut request = client.get(url);
    for (name, value) in listing::headers(job) {
        request = request.header(name, value);
    }
    let unreachable = |e: reqwest::Error| format!("unreachable: {}", e.without_url());
    let mut response = request.send().await.map_err(unreachable)?;
    let status = response.status();
    if !status.is_success() {
        return Err(format!("answered HTTP {}", status.as_u16()));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(unreachable)? {
        if body.len() + chunk.len() > MAX_BODY_BYTES {
            return Err(format!("answer larger than {MAX_BODY_BYTES} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    credit::parse(&body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::secrets::Secret;
    use crate::config::{Endpoint, ProviderKind};
    use crate::mock::{MockOptions, Script};

    #[tokio::test]
    async fn the_key_s_credit_is_read_from_its_own_answer_and_a_refusal_is_its_status(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let mock = crate::mock::start(MockOptions::default()).await?;
        let script = serde_json::json!({
            "keyInfo": { "default": { "limit": 10, "usage": 4 }, "keys": { "sk-out": { "limit": 5, "usage": 5 } } },
            "rules": [{ "match": { "path": "/key", "key": "sk-bad" }, "replies": [{ "status": 401 }] }],
        });
        mock.set_script(Script::from_json(&script.to_string())?)?;
        let job = |secret: &str| ListingJob {
            provider: "or".into(),
            key: "a".into(),
            kind: ProviderKind::Openrouter,
            endpoint: Endpoint {
                scheme: "http".into(),
                authority: mock.addr().to_string(),
                base_path: "/api/v1".into(),
            },
            headers: Vec::new(),
            secret: Secret::new(secret),
            fingerprint: 1,
        };
        let client = reqwest::Client::new();
        let out = ask(&client, &job("sk-out")).await?;
        assert!(out.spent(), "{out:?}");
        let ok = ask(&client, &job("sk-ok")).await?;
        assert_eq!(ok.remaining, Some(6.0));
        let bad = ask(&client, &job("sk-bad")).await;
        assert!(
            bad.as_ref()
                .is_err_and(|e| e.contains("401") && !e.contains("sk-bad")),
            "{bad:?}"
        );
        let calls = mock.calls();
        assert_eq!(calls.len(), 3);
        assert!(calls.iter().all(|c| c.path == "/api/v1/key"));
        assert_eq!(calls[0].key.as_deref(), Some("sk-out"));
        Ok(())
    }
}
