//! Reload: a new pool from the config file without a restart, on SIGHUP or when the file's
//! content changes (checked every [`WATCH_INTERVAL`]).
//!
//! The file is loaded and validated as at start; any error (a bad field, a mounted key that
//! collides with a stored one) refuses the whole reload with one log line naming the field, and
//! the pool loaded before keeps serving. A valid file replaces the providers, keys, models,
//! profiles, defaults, resilience, selection and the mounted keys (their bindings and quotas) in
//! one published version ([`crate::engine::Engine::replace_config`]); calls in flight finish on
//! the lane they hold.
//!
//! Some fields cannot change under a running process; a reload that changes them applies
//! everything else and names them in a warning ([`held_fields`]):
//! - bound by Envoy's rendered bootstrap (re-render with `ai-router render-envoy` and restart
//!   Envoy): `gateway.host`, `gateway.port`, `gateway.maxBodyBytes` (Envoy's buffer limits; the
//!   filter's own 413 moves at once), the listener limits, the largest `maxAttempts` (the
//!   router's retries). Providers never are: they are reached through dynamic forward proxy
//!   clusters, so adding one needs no new Envoy cluster;
//! - bound by the control plane at start (restart `ai-router serve`; the old value stays in
//!   force): `controlPlane.*` (listen addresses, the sync token), `gateway.adminToken`,
//!   `gateway.keyStore`, `stateStore`, `telemetry.otlp.endpoint`.
//!
//! `ai-router up` reloads the same way; it edits each file it reads as it edited the first one
//! (with no provider key, the pool moves onto its in-process mock: [`Reloader::edit`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::config::secrets::Env;
use crate::config::{self, Config, FileConfig};
use crate::engine::Engine;
use crate::keys::mounted;
use crate::keys::operations::KeyAdmin;
use crate::keys::usage::UsageRecorder;

/// How often the config file is read to see whether it changed.
pub const WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// What must restart for a changed field to take effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restart {
    /// The rendered Envoy bootstrap depends on it.
    Envoy,
    /// The control plane bound it at start; the old value stays in force.
    ControlPlane,
}

/// A changed field a reload does not (fully) apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldField {
    pub field: &'static str,
    pub restart: Restart,
}

/// The fields `new` changes that a reload cannot apply (see the module docs).
pub fn held_fields(old: &Config, new: &Config) -> Vec<HeldField> {
    let (og, ng) = (&old.gateway, &new.gateway);
    let (oc, nc) = (&old.control_plane, &new.control_plane);
    let held = |restart: Restart| {
        move |field: &'static str, changed: bool| changed.then_some(HeldField { field, restart })
    };
    let (envoy, cp) = (held(Restart::Envoy), held(Restart::ControlPlane));
    [
        envoy("gateway.host", og.host != ng.host),
        envoy("gateway.port", og.port != ng.port),
        envoy("gateway.maxBodyBytes", og.max_body_bytes != ng.max_body_bytes),
        envoy(
            "gateway listener limits (requestHeadersTimeoutMs, requestTimeoutMs, connectionIdleTimeoutMs, maxConcurrentRequests)",
            og.limits != ng.limits,
        ),
        envoy(
            "the largest maxAttempts (the router's retries)",
            old.max_attempts() != new.max_attempts(),
        ),
        envoy(
            "gateway.onePass, or a plain-HTTP provider's host with it (resolved at Envoy's start)",
            og.one_pass != ng.one_pass,
        ),
        cp("controlPlane.host", oc.host != nc.host),
        cp("controlPlane.httpPort", oc.http_port != nc.http_port),
        cp("controlPlane.grpcPort", oc.grpc_port != nc.grpc_port),
        cp("controlPlane.syncToken", oc.sync_token != nc.sync_token),
        cp("gateway.adminToken", og.admin_token != ng.admin_token),
        cp("gateway.keyStore", og.key_store != ng.key_store),
        cp("stateStore", old.state_store != new.state_store),
        cp("telemetry.otlp.endpoint", old.otlp_endpoint != new.otlp_endpoint),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// `new` with what only a control plane restart changes put back to `old`'s values, so the
/// engine's copy says what is in force.
fn keep_start_bound(old: &Config, mut new: Config) -> Config {
    new.control_plane = old.control_plane.clone();
    new.gateway.admin_token = old.gateway.admin_token.clone();
    new.gateway.key_store = old.gateway.key_store.clone();
    new.state_store = old.state_store.clone();
    new.otlp_endpoint = old.otlp_endpoint.clone();
    new
}

/// What one reload did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The new pool serves, from this version on.
    Applied { version: u64 },
    /// The file was refused (the message names the field); the old pool keeps serving.
    Refused(String),
}

/// An edit of the file as read, before it is resolved (`up`'s move onto its mock).
pub type EditFile = Arc<dyn Fn(&mut FileConfig) + Send + Sync>;

/// Everything a reload replaces, and where the file is.
#[derive(Clone)]
pub struct Reloader {
    pub path: PathBuf,
    /// Applied to every file read, as to the one the process started with.
    pub edit: Option<EditFile>,
    pub env: Arc<dyn Env>,
    pub engine: Arc<Engine>,
    pub keys: Arc<KeyAdmin>,
    pub usage: Arc<UsageRecorder>,
    /// The quota ledger: its providers, scopes and limits follow the pool.
    pub ledger: Arc<crate::ledger::Ledger>,
    /// Serving under `ai-router up` (which starts Envoy itself): what a restart means changes.
    pub under_up: bool,
}

impl std::fmt::Debug for Reloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloader")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl Reloader {
    /// Loads the file and, when it is valid, serves it (see the module docs). Logs the outcome.
    pub async fn reload(&self, why: &str) -> Outcome {
        let this = self.clone();
        let trigger = why.to_owned();
        let outcome = tokio::task::spawn_blocking(move || this.reload_blocking(&trigger))
            .await
            .unwrap_or_else(|err| Outcome::Refused(format!("the reload task failed: {err}")));
        if let Outcome::Refused(reason) = &outcome {
            tracing::error!(
                config = %self.path.display(),
                trigger = why,
                "config reload refused, the pool loaded before keeps serving: {reason}"
            );
        }
        outcome
    }

    fn reload_blocking(&self, trigger: &str) -> Outcome {
        let loaded = match &self.edit {
            None => config::load(&self.path, self.env.as_ref()),
            Some(edit) => config::read(&self.path).and_then(|mut file| {
                edit(&mut file);
                config::resolve_at(&file, self.env.as_ref(), &self.path)
            }),
        };
        let new = match loaded {
            Ok(new) => new,
            Err(err) => return Outcome::Refused(format!("{err:#}")),
        };
        let mounted = match mounted::mounted_keys(&new, self.env.as_ref()) {
            Ok(mounted) => mounted,
            Err(err) => return Outcome::Refused(format!("mountedKeys: {err}")),
        };
        if let Err(err) = self.keys.replace_pool(mounted, new.names.clone()) {
            return Outcome::Refused(format!("mountedKeys: {err}"));
        }
        let old = self.engine.config();
        for held in held_fields(&old, &new) {
            match held.restart {
                Restart::Envoy if self.under_up => tracing::warn!(
                    field = held.field,
                    "config reload: this field is part of Envoy's bootstrap; restart ai-router up (it renders and starts Envoy) for the change to take effect"
                ),
                Restart::ControlPlane if self.under_up => tracing::warn!(
                    field = held.field,
                    "config reload: this field is bound at start; the old value stays in force until ai-router up restarts"
                ),
                Restart::Envoy => tracing::warn!(
                    field = held.field,
                    "config reload: this field is part of Envoy's bootstrap; re-render it (ai-router render-envoy) and restart Envoy for the change to take effect"
                ),
                Restart::ControlPlane => tracing::warn!(
                    field = held.field,
                    "config reload: this field is bound at start; the old value stays in force until ai-router serve restarts"
                ),
            }
        }
        for warning in &new.warnings {
            tracing::warn!("{warning}");
        }
        let new = Arc::new(keep_start_bound(&old, new));
        let change = self.engine.replace_config(new.clone());
        self.ledger.reconfigure(&new);
        self.usage.set_config(new);
        if let Err(err) = crate::api::admin::push_keys(&self.engine, &self.keys) {
            // The pool is in; the virtual keys follow at the next key sync.
            tracing::error!(%err, "config reload: cannot read the key store");
        }
        let version = self.engine.version();
        tracing::info!(
            config = %self.path.display(),
            trigger,
            version,
            providers_added = ?change.providers_added,
            providers_removed = ?change.providers_removed,
            keys_added = ?change.keys_added,
            keys_removed = ?change.keys_removed,
            "config reloaded"
        );
        Outcome::Applied { version }
    }

    /// Reloads on SIGHUP and whenever the file's content changes, until `shutdown` flips.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let mut seen = std::fs::read(&self.path).ok();
        let mut tick = tokio::time::interval(WATCH_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut hangup = hangup_signal();
        loop {
            let hup = tokio::select! {
                _ = tick.tick() => false,
                _ = next_hangup(&mut hangup) => true,
                _ = shutdown.changed() => break,
            };
            if *shutdown.borrow() {
                break;
            }
            let now = tokio::fs::read(&self.path).await.ok();
            // A file that cannot be read (mid-rename) is looked at again next tick.
            let changed = now.is_some() && now != seen;
            if !hup && !changed {
                continue;
            }
            if now.is_some() {
                seen = now;
            }
            self.reload(if hup { "SIGHUP" } else { "file changed" })
                .await;
        }
    }
}

#[cfg(unix)]
type Hangup = Option<tokio::signal::unix::Signal>;
#[cfg(not(unix))]
type Hangup = Option<()>;

fn hangup_signal() -> Hangup {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::hangup()) {
            Ok(s) => Some(s),
            Err(err) => {
                tracing::warn!(%err, "cannot listen for SIGHUP: reload by changing the file");
                None
            }
        }
    }
    #[cfg(not(unix))]
    None
}

/// The next SIGHUP; never, without the handler.
async fn next_hangup(hangup: &mut Hangup) {
    #[cfg(unix)]
    if let Some(signal) = hangup {
        if signal.recv().await.is_some() {
            return;
        }
    }
    #[cfg(not(unix))]
    let _ = hangup;
    std::future::pending::<()>().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse;
    use crate::config::secrets::MapEnv;
    use std::path::Path;

    fn config(text: &str) -> Result<Config, String> {
        let env = MapEnv::new([("K", "sk-k")]);
        parse(text)
            .and_then(|f| f.resolve(&env, Path::new(".")))
            .map_err(|e| e.to_string())
    }

    const PROVIDERS: &str = "providers:\n  - { id: p, baseUrl: 'http://h/v1', keys: [{ alias: a, env: K }], models: [{ id: m }] }\n";

    #[test]
    fn fields_bound_at_start_are_named_and_kept() -> Result<(), String> {
        let old = config(&format!(
            "gateway: {{ port: 8080 }}\ncontrolPlane: {{ grpcPort: 1 }}\n{PROVIDERS}"
        ))?;
        let same = config(&format!(
            "gateway: {{ port: 8080 }}\ncontrolPlane: {{ grpcPort: 1 }}\n{PROVIDERS}profiles: {{ x: {{ model: m }} }}\n"
        ))?;
        assert_eq!(
            held_fields(&old, &same),
            vec![],
            "a pool change needs no restart"
        );
        let moved = config(&format!(
            "gateway: {{ port: 9090 }}\ncontrolPlane: {{ grpcPort: 2 }}\n{PROVIDERS}"
        ))?;
        assert_eq!(
            held_fields(&old, &moved),
            vec![
                HeldField {
                    field: "gateway.port",
                    restart: Restart::Envoy
                },
                HeldField {
                    field: "controlPlane.grpcPort",
                    restart: Restart::ControlPlane
                },
            ]
        );
        let kept = keep_start_bound(&old, moved);
        assert_eq!(kept.control_plane.grpc_port, 1, "the bound port stays");
        assert_eq!(kept.gateway.port, 9090, "Envoy's fields are the file's");
        Ok(())
    }
}
