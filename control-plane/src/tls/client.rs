//! TLS to the databases: the roots a Redis (`rediss://`) or Postgres (`sslmode=verify-full`)
//! server's certificate must chain to (the store's `caFile`, else the system's), the rustls
//! client configuration Postgres connects with, and the reason a handshake was refused, found
//! in a driver's error so that the message names it (and nothing of the URL).

use std::error::Error;
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::RootCertStore;

use super::{pem_error, read, TlsError};

/// The CA certificates in `pem` (the file at `path`, named in errors); at least one.
pub fn roots_from_pem(path: &Path, pem: &[u8]) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| pem_error(path, e))?;
        roots.add(cert).map_err(|e| pem_error(path, e))?;
    }
    if roots.is_empty() {
        return Err(pem_error(path, "no CA certificate in the file"));
    }
    Ok(roots)
}

/// The roots a database server's certificate must chain to: the CA file's, or the system's
/// when there is none.
pub fn roots(ca_file: Option<&Path>) -> Result<RootCertStore, TlsError> {
    if let Some(path) = ca_file {
        return roots_from_pem(path, &read(path)?);
    }
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        let why = found
            .errors
            .first()
            .map_or_else(|| "none found".to_owned(), ToString::to_string);
        return Err(TlsError::Config(format!(
            "the system's CA certificates could not be read ({why}): name a caFile"
        )));
    }
    Ok(roots)
}

/// A rustls client configuration (ring, TLS 1.2 and 1.3) that verifies the server's chain
/// against `roots` and its name against the host dialled.
pub fn client_config(roots: RootCertStore) -> Result<rustls::ClientConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(config)
}

/// Why a TLS handshake in `err`'s chain failed (rustls' own words, e.g. `invalid peer
/// certificate: UnknownIssuer`), if it did. Drivers carry rustls' error inside an
/// `io::Error`, whose `source` skips it, so each link is also opened as one (and the `Arc`
/// the Redis driver shares its cause in).
pub fn handshake_failure(err: &(dyn Error + 'static)) -> Option<String> {
    find_cause::<rustls::Error>(err).map(ToString::to_string)
}

/// The first error of type `T` in `err`'s chain of causes, opening the links a driver hides
/// its cause in: an `Arc` (the Redis driver's) and the error inside an `io::Error` (whose
/// `source` skips it).
pub fn find_cause<'a, T: Error + 'static>(err: &'a (dyn Error + 'static)) -> Option<&'a T> {
    let mut link: Option<&'a (dyn Error + 'static)> = Some(err);
    while let Some(e) = link {
        if let Some(found) = e.downcast_ref::<T>() {
            return Some(found);
        }
        if let Some(shared) = e.downcast_ref::<Arc<dyn Error + Send + Sync>>() {
            link = Some(&**shared);
            continue;
        }
        if let Some(found) = e
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
            .and_then(|inner| inner.downcast_ref::<T>())
        {
            return Some(found);
        }
        link = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rustls_error_is_found_inside_an_io_error() {
        let tls = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, tls);
        let found = handshake_failure(&io);
        assert!(
            found
                .as_deref()
                .is_some_and(|m| m.contains("UnknownIssuer")),
            "{found:?}"
        );
        // The Redis driver keeps the io::Error in an Arc.
        let shared: Arc<dyn Error + Send + Sync> = Arc::new(io);
        assert_eq!(handshake_failure(&shared), found);
        let plain = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(handshake_failure(&plain), None);
    }

    #[test]
    fn a_ca_file_without_a_certificate_is_named() {
        let err = roots_from_pem(Path::new("/x/ca.pem"), b"not a pem").unwrap_err();
        assert!(err.to_string().contains("/x/ca.pem"), "{err}");
    }
}
