//! The control plane's side of the sync channel's mutual TLS.
//!
//! [`load`] builds the rustls server configuration: the server certificate and key, and a
//! client-certificate verifier that requires a certificate chaining to the client CA (a
//! handshake without one, or with one from another CA, fails). [`watch`](fn@watch) re-reads the three
//! files every second and, when they changed and load, swaps the configuration for new
//! connections and ends the connections made under the old one, so every Envoy reconnects with
//! the certificate it now holds (a peer that the new CA no longer trusts is cut off, not left on
//! its old connection). Files that do not load are logged once and the old configuration stays.
//! [`incoming`] is the TLS listener tonic serves from.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::server::TlsStream;

use super::{pem_error, read, SyncTlsFiles, TlsError};

/// How often the files are compared with what was loaded.
const RELOAD_PERIOD: Duration = Duration::from_secs(1);
/// A client has this long to finish its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The three files' bytes, what [`watch`](fn@watch) compares.
fn contents(files: &SyncTlsFiles) -> Result<[Vec<u8>; 3], TlsError> {
    Ok([
        read(&files.cert)?,
        read(&files.key)?,
        read(&files.client_ca)?,
    ])
}

fn build(
    files: &SyncTlsFiles,
    bytes: &[Vec<u8>; 3],
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let [cert, key, ca] = bytes;
    let chain = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(&files.cert, e))?;
    if chain.is_empty() {
        return Err(pem_error(&files.cert, "no certificate in the file"));
    }
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| pem_error(&files.key, e))?;
    let roots = super::client::roots_from_pem(&files.client_ca, ca)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::Config(format!("{}: {e}", files.key.display())))?;
    // gRPC is HTTP/2.
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// The server configuration from `files`.
pub fn load(files: &SyncTlsFiles) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    build(files, &contents(files)?)
}

/// The configuration new connections take, and a sender that [`watch`](fn@watch) updates.
pub type Current = watch::Receiver<Arc<rustls::ServerConfig>>;

/// Loads `files` and starts re-reading them every second until `stop` flips.
pub fn watch(
    files: SyncTlsFiles,
    mut stop: watch::Receiver<bool>,
) -> Result<(Current, tokio::task::JoinHandle<()>), TlsError> {
    let mut loaded = contents(&files)?;
    let (tx, rx) = watch::channel(build(&files, &loaded)?);
    let task = tokio::spawn(async move {
        let mut refused: Option<[Vec<u8>; 3]> = None;
        let mut tick = tokio::time::interval(RELOAD_PERIOD);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.wait_for(|stopped| *stopped) => return,
            }
            let files = files.clone();
            let read = tokio::task::spawn_blocking(move || {
                let bytes = contents(&files)?;
                Ok::<_, TlsError>((files, bytes))
            })
            .await;
            let (files, bytes) = match read {
                Ok(Ok(read)) => read,
                Ok(Err(err)) => {
                    tracing::debug!(%err, "the sync TLS files are being replaced");
                    continue;
                }
                Err(_) => continue,
            };
            if bytes == loaded || refused.as_ref() == Some(&bytes) {
                continue;
            }
            match build(&files, &bytes) {
                Ok(config) => {
                    loaded = bytes;
                    refused = None;
                    tx.send_replace(config);
                    tracing::info!(
                        cert = %files.cert.display(),
                        client_ca = %files.client_ca.display(),
                        "sync TLS certificates reloaded: new connections use them, connections made under the old ones end"
                    );
                }
                Err(err) => {
                    // Logged once per set of contents: a half-written set loads on the next tick.
                    tracing::warn!(%err, "the new sync TLS files do not load; keeping the previous ones");
                    refused = Some(bytes);
                }
            }
        }
    });
    Ok((rx, task))
}

/// Accepts TCP connections on `listener` and hands tonic the ones whose TLS handshake (with the
/// configuration current at accept) succeeds. Ends when tonic drops the stream.
pub fn incoming(
    listener: TcpListener,
    current: Current,
) -> tokio_stream::wrappers::ReceiverStream<Result<SyncTlsStream, io::Error>> {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = tx.closed() => return,
            };
            let (tcp, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    tracing::debug!(%err, "accepting a gRPC connection");
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let mut rotated = current.clone();
            rotated.mark_unchanged();
            let acceptor = tokio_rustls::TlsAcceptor::from(current.borrow().clone());
            let tx = tx.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => {
                        let stream = SyncTlsStream {
                            inner: tls,
                            rotated: Some(until_rotated(rotated)),
                        };
                        let _ = tx.send(Ok(stream)).await;
                    }
                    // A client without a certificate from the CA, a plaintext client, a
                    // health check's bare connect.
                    Ok(Err(err)) => tracing::debug!(%peer, %err, "sync TLS handshake refused"),
                    Err(_) => tracing::debug!(%peer, "sync TLS handshake timed out"),
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// Resolves when the configuration changes after the connection was made.
fn until_rotated(mut rx: Current) -> BoxFuture<'static, ()> {
    async move {
        if rx.changed().await.is_err() {
            // The watcher ended (shutdown): nothing will rotate.
            futures::future::pending::<()>().await;
        }
    }
    .boxed()
}

/// A TLS connection that ends (reads fail) once the certificates are rotated.
pub struct SyncTlsStream {
    inner: TlsStream<TcpStream>,
    /// `None` once rotated.
    rotated: Option<BoxFuture<'static, ()>>,
}

impl AsyncRead for SyncTlsStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let rotated = match self.rotated.as_mut() {
            Some(future) => future.as_mut().poll(cx).is_ready(),
            None => true,
        };
        if rotated {
            self.rotated = None;
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the sync TLS certificates were rotated",
            )));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for SyncTlsStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for SyncTlsStream {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.get_ref().0.connect_info()
    }
}
