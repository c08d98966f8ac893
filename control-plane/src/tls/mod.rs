//! Mutual TLS on the sync channel: the certificates `ai-router certs` issues ([`issue`]) and the
//! control plane's side of the handshake ([`server`]), reloaded when its files change.
//!
//! The files `certs --out DIR` writes (keys 0600):
//! - `DIR/ca.pem`, `DIR/ca.key`: the CA (its key signs later leaves: run `certs` again to
//!   rotate them under the same CA, `--new-ca` to replace the CA too);
//! - `DIR/control-plane/{cert.pem,key.pem,ca.pem}`: the control plane's server certificate
//!   (`serve --tls-cert --tls-key --client-ca`);
//! - `DIR/envoy/` (or `envoy-1` ... `envoy-N` with `--envoys N`): an Envoy's client certificate
//!   and the CA, plus the two SDS files the rendered bootstrap reads them through
//!   ([`SDS_CERTIFICATE_FILE`], [`SDS_CA_FILE`]); mount the folder where `render-envoy
//!   --sync-tls-dir` says.

pub mod client;
pub mod issue;
pub mod server;
#[cfg(test)]
pub mod testing;

use std::path::PathBuf;

/// A leaf's certificate chain, its key, and the CA that signs its peers, in each folder.
pub const CERT_FILE: &str = "cert.pem";
pub const KEY_FILE: &str = "key.pem";
pub const CA_FILE: &str = "ca.pem";
/// The SDS resource files in an Envoy's folder, and the names of the secrets they hold.
pub const SDS_CERTIFICATE_FILE: &str = "sds-certificate.yaml";
pub const SDS_CA_FILE: &str = "sds-ca.yaml";
pub const SDS_CERTIFICATE_SECRET: &str = "ai_router_sync_client";
pub const SDS_CA_SECRET: &str = "ai_router_sync_ca";

/// The env twins of `serve --tls-cert`, `--tls-key`, `--client-ca` and
/// `--insecure-plaintext-sync`.
pub const TLS_CERT_ENV: &str = "AI_ROUTER_TLS_CERT";
pub const TLS_KEY_ENV: &str = "AI_ROUTER_TLS_KEY";
pub const CLIENT_CA_ENV: &str = "AI_ROUTER_CLIENT_CA";
pub const INSECURE_PLAINTEXT_SYNC_ENV: &str = "AI_ROUTER_INSECURE_PLAINTEXT_SYNC";

/// The control plane's server certificate, its key and the CA its clients' certificates must
/// chain to (`controlPlane.syncTls` or the `serve` flags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncTlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("writing {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Pem { path: String, reason: String },
    #[error("the sync TLS configuration is not valid: {0}")]
    Config(String),
    #[error("issuing a certificate: {0}")]
    Issue(String),
}

pub(crate) fn pem_error(path: &std::path::Path, reason: impl std::fmt::Display) -> TlsError {
    TlsError::Pem {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

pub(crate) fn read(path: &std::path::Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.display().to_string(),
        source,
    })
}
