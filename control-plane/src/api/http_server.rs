//! The admin and metrics HTTP server: axum's router behind hyper's connection builder, so that
//! a client has a bounded time to send its request headers. `axum::serve` has no such bound: a
//! client that opens connections and trickles header bytes would hold a task and a socket each
//! for as long as it likes.

use std::future::Future;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

/// How long a client may take to send a request's headers.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `router` on `listener` until `stop` completes, then waits for the connections in
/// progress to finish (as `axum::serve`'s graceful shutdown does).
pub async fn serve(listener: TcpListener, router: Router, stop: impl Future<Output = ()>) {
    serve_with(listener, router, stop, HEADER_READ_TIMEOUT).await;
}

/// [`serve`] with another header bound (tests).
pub async fn serve_with(
    listener: TcpListener,
    router: Router,
    stop: impl Future<Output = ()>,
    header_read_timeout: Duration,
) {
    let graceful = GracefulShutdown::new();
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(err) => {
                        // Out of file descriptors, say: give the process a moment.
                        tracing::warn!(%err, "the HTTP server could not accept a connection");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let service = TowerToHyperService::new(router.clone());
                let connection = builder
                    .serve_connection_with_upgrades(TokioIo::new(stream), service)
                    .into_owned();
                let connection = graceful.watch(connection);
                tokio::spawn(async move {
                    // A client that goes away or is too slow ends its own connection only.
                    let _ = connection.await;
                });
            }
            () = &mut stop => break,
        }
    }
    drop(listener);
    graceful.shutdown().await;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn a_client_too_slow_with_its_headers_is_cut_and_a_prompt_one_is_served() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let router = Router::new().route("/health", get(|| async { "ok" }));
        let server = tokio::spawn(serve_with(
            listener,
            router,
            async {
                let _ = stop_rx.await;
            },
            Duration::from_millis(300),
        ));

        let mut prompt = tokio::net::TcpStream::connect(addr).await.unwrap();
        prompt
            .write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        prompt.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("ok"), "{answer}");

        // Half a request line, then nothing: the server closes the connection.
        let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET /health HTTP/1.1\r\nhost:")
            .await
            .unwrap();
        let mut rest = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), slow.read_to_end(&mut rest))
            .await
            .expect("the server cut the slow client");
        assert!(read.is_ok() || rest.is_empty(), "{read:?}");
        assert!(
            !String::from_utf8_lossy(&rest).contains(" 200 "),
            "{rest:?}"
        );

        stop_tx.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), server)
            .await
            .expect("the server stops")
            .unwrap();
    }
}
