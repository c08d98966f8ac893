//! The public listener against slow and stalled clients, through a real Envoy: request headers
//! that never finish, a body that stalls and a connection that never sends anything are each
//! answered and closed within their configured bound (`gateway.requestHeadersTimeoutMs`,
//! `requestTimeoutMs`, `connectionIdleTimeoutMs`), while an answer that takes longer than the
//! request timeout is not cut.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ai_router_e2e::{script, standard_pool, Gateway};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const HEADERS_TIMEOUT_MS: u64 = 1000;
const REQUEST_TIMEOUT_MS: u64 = 2000;
const IDLE_TIMEOUT_MS: u64 = 3000;
/// How long past its bound a connection may take to be closed (timer granularity, a loaded
/// machine).
const SLACK: Duration = Duration::from_secs(3);

/// The standard pool with short listener bounds.
fn pool_with_short_bounds(p1: &str, p2: &str) -> String {
    standard_pool(p1, p2).replace(
        "  keyStore: { type: memory }\n",
        &format!(
            "  keyStore: {{ type: memory }}\n  requestHeadersTimeoutMs: {HEADERS_TIMEOUT_MS}\n  requestTimeoutMs: {REQUEST_TIMEOUT_MS}\n  connectionIdleTimeoutMs: {IDLE_TIMEOUT_MS}\n"
        ),
    )
}

/// What a stalled client saw: everything Envoy sent until it closed, and when it closed.
#[derive(Debug)]
struct Stalled {
    /// When the first byte of Envoy's answer arrived (Envoy then waits up to its delayed-close
    /// timeout, 1 s, for the client to close first).
    answered_after: Option<Duration>,
    closed_after: Duration,
    answer: String,
}

/// Connects, sends `bytes`, then reads until Envoy closes the connection (or `bound` passes:
/// an error naming what was read so far).
async fn send_and_stall(
    addr: SocketAddr,
    bytes: Vec<u8>,
    bound: Duration,
) -> Result<Stalled, String> {
    let started = Instant::now();
    let mut stream = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    stream.write_all(&bytes).await.map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    let mut answered_after = None;
    let mut buf = [0u8; 4096];
    loop {
        let left = bound.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Err(_) => {
                return Err(format!(
                    "still open after {:?}; read so far: {:?}",
                    started.elapsed(),
                    String::from_utf8_lossy(&answer)
                ))
            }
            // Closed: 0 bytes, or a reset after the answer.
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => {
                answered_after.get_or_insert(started.elapsed());
                answer.extend_from_slice(&buf[..n]);
            }
        }
    }
    Ok(Stalled {
        answered_after,
        closed_after: started.elapsed(),
        answer: String::from_utf8_lossy(&answer).into_owned(),
    })
}

/// Checks that a raw HTTP/1.1 answer has `status` and an OpenAI error object with `code`
/// (content-type application/json, `message`, `type`, `param: null`); returns the object.
fn assert_openai_error(answer: &str, status: u16, code: &str) -> serde_json::Value {
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no complete answer: {answer:?}"));
    assert!(
        head.starts_with(&format!("HTTP/1.1 {status} ")),
        "want {status}: {answer:?}"
    );
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/json"),
        "{answer:?}"
    );
    let value: serde_json::Value = serde_json::from_str(body.trim())
        .unwrap_or_else(|e| panic!("the body is not JSON ({e}): {answer:?}"));
    let error = &value["error"];
    assert_eq!(error["code"], code, "{answer:?}");
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{answer:?}"
    );
    assert!(
        error["type"]
            .as_str()
            .is_some_and(|t| t.ends_with("_error")),
        "{answer:?}"
    );
    assert!(
        error.get("param").is_some_and(|p| p.is_null()),
        "{answer:?}"
    );
    value
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoys_own_answers_are_openai_errors_and_the_filters_are_left_alone() {
    let gw = Gateway::start_with("listener_local_replies", pool_with_short_bounds)
        .await
        .expect("fixture");
    let addr = gw.envoy.listen_addr();
    let bound = Duration::from_secs(10);
    let key = &gw.virtual_key;
    let huge = "x".repeat(100 * 1024);
    let cases: Vec<(&str, String, u16, &str)> = vec![
        (
            "a malformed header line",
            "GET /v1/models HTTP/1.1\r\nhost: gw\r\nno colon here\r\n\r\n".into(),
            400,
            "invalid_request",
        ),
        (
            "headers past 60 KiB",
            format!("GET /v1/models HTTP/1.1\r\nhost: gw\r\nx-big: {huge}\r\n\r\n"),
            431,
            "header_too_large",
        ),
        (
            "HTTP/1.0",
            "GET /v1/models HTTP/1.0\r\nhost: gw\r\n\r\n".into(),
            426,
            "upgrade_required",
        ),
        (
            "headers that never end",
            format!("GET /v1/models HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer {key}\r\n"),
            408,
            "request_timeout",
        ),
        // The front stage's own answers keep their codes (a rewrite would say gateway_error).
        (
            "no key (the filter's 401)",
            "GET /v1/models HTTP/1.1\r\nhost: gw\r\nconnection: close\r\n\r\n".into(),
            401,
            "missing_api_key",
        ),
        (
            "an unknown route (the filter's 404)",
            format!("GET /v2/nope HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer {key}\r\nconnection: close\r\n\r\n"),
            404,
            "not_found",
        ),
    ];
    for (what, request, status, code) in cases {
        let answer = send_and_stall(addr, request.into_bytes(), bound)
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}\n{}", gw.tails()))
            .answer;
        let error = assert_openai_error(&answer, status, code);
        eprintln!("{what}: {status} {error}");
    }
    // A body over gateway.maxBodyBytes: the filter's 413, unchanged.
    let body = format!(
        "{{\"model\":\"chat\",\"messages\":[{{\"role\":\"user\",\"content\":\"{}\"}}]}}",
        "y".repeat(5 * 1024 * 1024)
    );
    let r = gw
        .client
        .request(
            reqwest::Method::POST,
            "/v1/chat/completions",
            Some(key),
            Some(body),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 413, "{r}");
    assert_eq!(r.error_code(), Some("request_too_large"), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_headers_and_silent_connections_are_closed_within_their_bounds() {
    let gw = Gateway::start_with("listener_slowloris", pool_with_short_bounds)
        .await
        .expect("fixture");
    let addr = gw.envoy.listen_addr();
    let headers_bound = Duration::from_millis(HEADERS_TIMEOUT_MS) + SLACK;
    let idle_bound = Duration::from_millis(IDLE_TIMEOUT_MS) + SLACK;

    // 20 slowloris connections: half stop inside the request line, half inside the headers
    // (with a valid key, so the stall is the only thing wrong), plus two that send nothing.
    let mut tasks = Vec::new();
    for i in 0..20 {
        let bytes = if i % 2 == 0 {
            b"POST /v1/chat/compl".to_vec()
        } else {
            format!(
                "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer {}\r\nx-slow",
                gw.virtual_key
            )
            .into_bytes()
        };
        tasks.push((
            "slow headers",
            tokio::spawn(send_and_stall(addr, bytes, headers_bound)),
        ));
    }
    for _ in 0..2 {
        tasks.push((
            "silent",
            tokio::spawn(send_and_stall(addr, Vec::new(), idle_bound)),
        ));
    }
    let mut closed = Vec::new();
    for (i, (kind, task)) in tasks.into_iter().enumerate() {
        let stalled = task.await.unwrap().unwrap_or_else(|e| {
            panic!(
                "connection {i} ({kind}) was not closed: {e}\n{}",
                gw.tails()
            )
        });
        closed.push((kind, stalled));
    }
    for (i, (kind, stalled)) in closed.iter().enumerate() {
        match *kind {
            "slow headers" => {
                // Answered (a 408 when Envoy says anything at all), never passed on.
                assert!(
                    stalled.answer.is_empty() || stalled.answer.starts_with("HTTP/1.1 408"),
                    "connection {i}: {stalled:?}"
                );
                assert!(
                    stalled.closed_after >= Duration::from_millis(HEADERS_TIMEOUT_MS / 2),
                    "connection {i} closed before its header timeout: {stalled:?}"
                );
            }
            _ => {
                assert!(stalled.answer.is_empty(), "connection {i}: {stalled:?}");
                assert!(
                    stalled.closed_after >= Duration::from_millis(IDLE_TIMEOUT_MS / 2),
                    "connection {i} closed before its idle timeout: {stalled:?}"
                );
            }
        }
    }
    // None of them reached a provider.
    assert!(gw.provider_calls().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_body_is_answered_408_within_the_request_timeout_but_a_slow_answer_is_not_cut() {
    let gw = Gateway::start_with("listener_stalled_body", pool_with_short_bounds)
        .await
        .expect("fixture");
    let addr = gw.envoy.listen_addr();

    // A valid key, a body announced as 1000 bytes of which 10 arrive.
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer {}\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{{\"model\":",
        gw.virtual_key
    );
    let bound = Duration::from_millis(REQUEST_TIMEOUT_MS) + SLACK;
    let mut tasks = Vec::new();
    for _ in 0..5 {
        tasks.push(tokio::spawn(send_and_stall(
            addr,
            request.clone().into_bytes(),
            bound,
        )));
    }
    for (i, task) in tasks.into_iter().enumerate() {
        let stalled = task
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("stalled body {i} was not answered: {e}\n{}", gw.tails()));
        assert!(
            stalled.answer.starts_with("HTTP/1.1 408"),
            "stalled body {i}: {stalled:?}"
        );
        assert_openai_error(&stalled.answer, 408, "request_timeout");
        let answered = stalled.answered_after.unwrap_or_default();
        assert!(
            answered >= Duration::from_millis(REQUEST_TIMEOUT_MS / 2)
                && answered <= Duration::from_millis(REQUEST_TIMEOUT_MS) + SLACK / 2,
            "stalled body {i} not answered at its request timeout: {stalled:?}"
        );
    }
    assert!(gw.provider_calls().await.unwrap().is_empty());

    // The request timeout ends with the request: an answer that starts later than it, and a
    // stream that runs longer than it, are not cut.
    let slow = Duration::from_millis(REQUEST_TIMEOUT_MS + 500);
    gw.mock1
        .script(json!([script::always(vec![json!({
            "latencyMs": slow.as_millis() as u64,
            "text": "late but whole",
            "stream": { "chunks": ["late", " but", " whole"], "delayMs": 600 },
        })])]))
        .await
        .unwrap();
    let started = Instant::now();
    let r = gw.chat("chat").await.unwrap();
    assert_eq!(r.status, 200, "{r}");
    assert_eq!(r.content(), Some("late but whole"), "{r}");
    assert!(started.elapsed() >= slow, "{:?}", started.elapsed());
    let started = Instant::now();
    let s = gw.stream("chat").await.unwrap();
    assert_eq!(s.status, 200, "{s}");
    assert_eq!(s.contents(), ["late", " but", " whole"], "{s}");
    assert!(started.elapsed() >= slow, "{:?}", started.elapsed());
}
