//! Envoy's own replies on `/v1/messages` (a body past the buffer limit, a broken chunk framing,
//! a body not received in time) come in the Anthropic error shape,
//! `{"type":"error","error":{"type","message","code"}}`, with the right status and the gateway's
//! code; the same replies on `/v1/chat/completions` keep the OpenAI shape. (Envoy writes them
//! as OpenAI error objects; the front stage re-dresses them for a Messages caller.)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::time::Duration;

use ai_router_e2e::{standard_pool, Gateway};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The JSON body of an HTTP/1.1 answer read so far, once it is whole (a chunked body starts
/// with its chunk size line, so the JSON is taken from its first brace).
fn json_of(text: &str) -> Option<Value> {
    let body = &text[text.find("\r\n\r\n")? + 4..];
    let start = body.find('{')?;
    serde_json::Deserializer::from_str(&body[start..])
        .into_iter::<Value>()
        .next()?
        .ok()
}

/// Status and JSON body of Envoy's answer to one raw HTTP/1.1 request (`head` then as much of
/// `body` as Envoy reads before it answers), read until the JSON body is whole.
async fn answer(addr: SocketAddr, head: String, body: &[u8]) -> (u16, Value, String) {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(head.as_bytes()).await.unwrap();
        for piece in body.chunks(512 * 1024) {
            if stream.write_all(piece).await.is_err() {
                break;
            }
        }
        let mut out = Vec::new();
        let mut buf = [0u8; 16384];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
            if json_of(&String::from_utf8_lossy(&out)).is_some() {
                break;
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    };
    let text = tokio::time::timeout(Duration::from_secs(20), exchange)
        .await
        .expect("Envoy answers within 20 s");
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let json = json_of(&text).unwrap_or(Value::Null);
    (status, json, text)
}

/// A POST with the virtual key as Messages clients send it (`x-api-key`) on `/v1/messages`,
/// as a bearer token elsewhere.
fn head(path: &str, key: &str, framing: &str) -> String {
    let auth = if path == "/v1/messages" {
        format!("x-api-key: {key}\r\nanthropic-version: 2023-06-01")
    } else {
        format!("authorization: Bearer {key}")
    };
    format!(
        "POST {path} HTTP/1.1\r\nhost: gw\r\n{auth}\r\ncontent-type: application/json\r\n{framing}connection: close\r\n\r\n"
    )
}

fn assert_anthropic(status: u16, json: &Value, text: &str, want: (u16, &str), what: &str) {
    assert_eq!(status, want.0, "{what}: {text}");
    assert_eq!(json["type"], "error", "{what}: {text}");
    assert_eq!(json["error"]["type"], want.1, "{what}: {text}");
    assert!(json["error"]["code"].is_string(), "{what}: {text}");
    assert!(
        json["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{what}: {text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoys_own_replies_on_messages_are_in_the_anthropic_shape() {
    // A short request timeout, so Envoy's 408 comes quickly.
    let pool = |p1: &str, p2: &str| {
        standard_pool(p1, p2).replace(
            "  keyStore: { type: memory }\n",
            "  keyStore: { type: memory }\n  requestHeadersTimeoutMs: 1000\n  requestTimeoutMs: 1500\n",
        )
    };
    let gw = Gateway::start_with("messages_local_replies", pool)
        .await
        .expect("fixture");
    let addr = gw.envoy.listen_addr();
    let key = gw.virtual_key.clone();

    // A body past the buffer limit: Envoy's 413.
    let size = 100_000_000;
    let big = vec![b' '; 8 * 1024 * 1024];
    let framing = format!("content-length: {size}\r\n");
    let (status, json, text) = answer(addr, head("/v1/messages", &key, &framing), &big).await;
    assert_anthropic(
        status,
        &json,
        &text,
        (413, "request_too_large"),
        "an oversized body",
    );

    // A chunk size that is not hex: Envoy's codec answers 400.
    let chunked = "transfer-encoding: chunked\r\n";
    let (status, json, text) = answer(
        addr,
        head("/v1/messages", &key, chunked),
        b"zz\r\n{}\r\n0\r\n\r\n",
    )
    .await;
    assert_anthropic(
        status,
        &json,
        &text,
        (400, "invalid_request_error"),
        "a broken chunk",
    );

    // A body that stops short of its length: Envoy's request timeout, 408.
    let (status, json, text) = answer(
        addr,
        head("/v1/messages", &key, "content-length: 100\r\n"),
        b"{\"model\"",
    )
    .await;
    assert_anthropic(
        status,
        &json,
        &text,
        (408, "api_error"),
        "a body not received",
    );
    assert_eq!(json["error"]["code"], "request_timeout", "{text}");

    // The same on chat completions is OpenAI's shape.
    let (status, json, text) =
        answer(addr, head("/v1/chat/completions", &key, &framing), &big).await;
    assert_eq!(status, 413, "{text}");
    assert_eq!(json["error"]["code"], "request_too_large", "{text}");
    assert!(json.get("type").is_none(), "{text}");
    gw.check_no_secrets_in_logs().unwrap();
}
