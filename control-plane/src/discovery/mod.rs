//! Model discovery's background task: lists the catalog of every key of the `discover: true`
//! providers (`GET {baseUrl}/models`, per kind: `listing`) when the engine says it is due
//! (`engine::discovered`: at start, after `discoveryTtlMs`, a minute after a failure, soon after
//! a "model not found" answer), and hands the model ids back to the engine, which publishes
//! them to the data plane.
//!
//! It never blocks anything: start-up does not wait for it, calls never wait for it, and a
//! listing is bounded by [`LISTING_TIMEOUT`] and [`MAX_BODY_BYTES`]. A failed listing is one
//! log line (provider, key alias, what failed; never the secret or the provider's body) and
//! the key keeps what it had: its last good listing, else the configured models. It follows a
//! reload by itself: each round reads the engine's current pool.

pub mod listing;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use crate::engine::discovered::ListingJob;
use crate::engine::Engine;

/// How often the task asks the engine which keys are due.
pub const TICK: Duration = Duration::from_secs(1);
/// One listing (every page of it) at most.
pub const LISTING_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest catalog answer read.
pub const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;
/// Listings under way at once.
const CONCURRENT_LISTINGS: usize = 4;

/// Why a listing failed, as logged and shown by `catalog` (no secret, no provider body).
#[derive(Debug, thiserror::Error)]
pub enum ListingError {
    #[error("the catalog answered HTTP {0}")]
    Status(u16),
    #[error("the catalog could not be reached: {0}")]
    Unreachable(String),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("the catalog answer is larger than {MAX_BODY_BYTES} bytes")]
    TooLarge,
    #[error("{0}")]
    Shape(String),
}

/// The HTTP client the control plane asks providers with (listings, credit): connects within
/// `connect_timeout`, follows no redirect. `None` (logged: `what` is off) when none can be made.
pub fn provider_client(connect_timeout: Duration, what: &str) -> Option<reqwest::Client> {
    match reqwest::Client::builder()
        .connect_timeout(connect_timeout)
        .redirect(reqwest::redirect::Policy::none())
        .build()
    {
        Ok(client) => Some(client),
        Err(err) => {
            tracing::error!(%err, "{what} is off: no HTTP client");
            None
        }
    }
}

/// Lists every due key until `shutdown` flips.
pub async fn run(engine: Arc<Engine>, mut shutdown: watch::Receiver<bool>) {
    let Some(client) = provider_client(LISTING_TIMEOUT, "model discovery") else {
        return;
    };
    let slots = Arc::new(Semaphore::new(CONCURRENT_LISTINGS));
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut running = JoinSet::new();
    loop {
        tokio::select! {
            _ = tick.tick() => {
                for job in engine.listings_due() {
                    let (client, engine, slots) = (client.clone(), engine.clone(), slots.clone());
                    running.spawn(async move {
                        let _slot = slots.acquire_owned().await;
                        let result = list(&client, &job).await;
                        report(&job, &result);
                        engine.finish_listing(&job, result.map_err(|e| e.to_string()));
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

fn report(job: &ListingJob, result: &Result<Vec<String>, ListingError>) {
    match result {
        Ok(models) => tracing::info!(
            provider = %job.provider,
            key = %job.key,
            models = models.len(),
            "listed the key's models"
        ),
        Err(err) => tracing::warn!(
            provider = %job.provider,
            key = %job.key,
            error = %err,
            "listing the key's models failed; it keeps routing what it had (its last listing, else the configured models)"
        ),
    }
}

/// Every page of one key's catalog, within [`LISTING_TIMEOUT`].
pub async fn list(client: &reqwest::Client, job: &ListingJob) -> Result<Vec<String>, ListingError> {
    match tokio::time::timeout(LISTING_TIMEOUT, pages(client, job)).await {
        Ok(result) => result,
        Err(_) => Err(ListingError::Timeout(LISTING_TIMEOUT)),
    }
}

async fn pages(client: &reqwest::Client, job: &ListingJob) -> Result<Vec<String>, ListingError> {
    let mut ids = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..listing::MAX_PAGES {
        let mut request = client.get(listing::url(job, after.as_deref()));
        for (name, value) in listing::headers(job) {
            request = request.header(name, value);
        }
        // The URL holds no secret (the key is in a header), but say less anyway.
        let mut response = request
            .send()
            .await
            .map_err(|e| ListingError::Unreachable(e.without_url().to_string()))?;
        let status = response.status();
        if !status.is_success() {
            return Err(ListingError::Status(status.as_u16()));
        }
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| ListingError::Unreachable(e.without_url().to_string()))?
        {
            if body.len() + chunk.len() > MAX_BODY_BYTES {
                return Err(ListingError::TooLarge);
            }
            body.extend_from_slice(&chunk);
        }
        let page = listing::parse(job.kind, &body).map_err(ListingError::Shape)?;
        ids.extend(page.ids);
        ids.truncate(listing::MAX_MODELS);
        match page.next_after {
            Some(next) if ids.len() < listing::MAX_MODELS && after.as_ref() != Some(&next) => {
                after = Some(next);
            }
            _ => break,
        }
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::secrets::Secret;
    use crate::config::{Endpoint, ProviderKind};
    use crate::mock::{MockOptions, Script};

    fn job(kind: ProviderKind, mock: &crate::mock::MockHandle, secret: &str) -> ListingJob {
        ListingJob {
            provider: "p".into(),
            key: "a".into(),
            kind,
            endpoint: Endpoint {
                scheme: "http".into(),
                authority: mock.addr().to_string(),
                base_path: "/v1".into(),
            },
            headers: Vec::new(),
            secret: Secret::new(secret),
            fingerprint: Secret::new(secret).fingerprint(),
        }
    }

    #[tokio::test]
    async fn a_paged_anthropic_catalog_is_read_whole_and_a_failure_is_its_status(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let mock = crate::mock::start(MockOptions::default()).await?;
        let ids: Vec<String> = (0..2_500).map(|i| format!("claude-{i:04}")).collect();
        let script = serde_json::json!({
            "catalog": { "shape": "anthropic", "keys": { "sk-big": ids } },
            "rules": [{ "match": { "path": "/models", "key": "sk-down" }, "replies": [{ "status": 503 }] }],
        });
        mock.set_script(Script::from_json(&script.to_string())?)?;
        let client = reqwest::Client::new();
        let listed = list(&client, &job(ProviderKind::Anthropic, &mock, "sk-big")).await?;
        assert_eq!(listed, ids);
        // Three pages of at most 1000, each with the key and the version.
        let calls = mock.calls();
        assert_eq!(calls.len(), 3);
        assert!(calls.iter().all(|c| c.key.as_deref() == Some("sk-big")
            && c.headers.get("anthropic-version").map(String::as_str)
                == Some(listing::ANTHROPIC_VERSION)));
        let down = list(
            &client,
            &job(ProviderKind::OpenaiCompatible, &mock, "sk-down"),
        )
        .await;
        assert!(matches!(down, Err(ListingError::Status(503))), "{down:?}");
        // The error says what failed and nothing of the key.
        let text = down.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(text.contains("503") && !text.contains("sk-down"), "{text}");
        Ok(())
    }

    #[tokio::test]
    async fn an_unreachable_catalog_fails_fast() {
        // A port nothing listens on.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").ok();
        let port = listener
            .as_ref()
            .and_then(|l| l.local_addr().ok())
            .map_or(9, |a| a.port());
        drop(listener);
        let job = ListingJob {
            provider: "p".into(),
            key: "a".into(),
            kind: ProviderKind::Openai,
            endpoint: Endpoint {
                scheme: "http".into(),
                authority: format!("127.0.0.1:{port}"),
                base_path: "/v1".into(),
            },
            headers: Vec::new(),
            secret: Secret::new("sk-x"),
            fingerprint: 1,
        };
        let result = list(&reqwest::Client::new(), &job).await;
        assert!(
            matches!(result, Err(ListingError::Unreachable(_))),
            "{result:?}"
        );
    }
}
