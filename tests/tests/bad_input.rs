//! Bad input at the public listener, through a real Envoy: every malformed, oversized, mistyped
//! or slow request gets a clear OpenAI error object with the right status and code — never a
//! crash, a hang or a 500 — and reaches no provider.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ai_router_e2e::{standard_pool, Gateway};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The answer to one raw HTTP/1.1 exchange.
#[derive(Debug)]
struct Raw {
    status: u16,
    head: String,
    json: Value,
    text: String,
}

impl Raw {
    fn parse(bytes: &[u8]) -> Raw {
        let text = String::from_utf8_lossy(bytes).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        // A chunked answer: the JSON is the first chunk's data.
        let body = if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            body.split_once("\r\n").map_or(body, |(_, rest)| rest)
        } else {
            body
        };
        let json = serde_json::Deserializer::from_str(body.trim_start())
            .into_iter::<Value>()
            .next()
            .and_then(Result::ok)
            .unwrap_or(Value::Null);
        Raw {
            status,
            head: head.to_owned(),
            json,
            text,
        }
    }
}

/// Sends `head` then `body` (in pieces, stopping when Envoy stops reading), then reads until
/// Envoy closes; all within `bound`.
async fn exchange(addr: SocketAddr, head: &[u8], body: &[u8], bound: Duration) -> Raw {
    let started = Instant::now();
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(head).await.unwrap();
    for piece in body.chunks(256 * 1024) {
        let left = bound.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, stream.write_all(piece)).await {
            Ok(Ok(())) => {}
            // Envoy answered and closed (or stopped reading) before the whole body.
            Ok(Err(_)) | Err(_) => break,
        }
    }
    let mut out = Vec::new();
    let mut buf = [0u8; 16384];
    loop {
        let left = bound.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Err(_) => panic!(
                "no end within {bound:?}; read so far: {:?}",
                String::from_utf8_lossy(&out)
            ),
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
        }
    }
    Raw::parse(&out)
}

fn post_head(key: &str, extra: &str, length: Option<usize>) -> Vec<u8> {
    let length = length.map_or(String::new(), |n| format!("content-length: {n}\r\n"));
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer {key}\r\n{extra}{length}connection: close\r\n\r\n"
    )
    .into_bytes()
}

/// An OpenAI error object with `status` and one of `codes`.
fn assert_error(raw: &Raw, status: u16, codes: &[&str], what: &str) {
    assert_eq!(raw.status, status, "{what}: {}", raw.text);
    assert!(
        raw.head
            .to_ascii_lowercase()
            .contains("content-type: application/json"),
        "{what}: {}",
        raw.head
    );
    let error = &raw.json["error"];
    let code = error["code"].as_str().unwrap_or_default();
    assert!(codes.contains(&code), "{what}: code {code:?}: {}", raw.text);
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{what}: {}",
        raw.text
    );
    assert!(error["type"].is_string(), "{what}: {}", raw.text);
}

const BOUND: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_mistyped_bodies_are_400s_in_the_openai_shape() {
    let gw = Gateway::start("bad_input_bodies").await.expect("fixture");
    let addr = gw.envoy.listen_addr();
    let key = gw.virtual_key.clone();
    let json_type = "content-type: application/json\r\n";
    let depth = 100_000;
    let deep = format!(
        "{{\"model\":\"chat\",\"messages\":{}{}}}",
        "[".repeat(depth),
        "]".repeat(depth)
    );
    let deep_objects = format!(
        "{{\"model\":\"chat\",\"x\":{}1{}}}",
        "{\"a\":".repeat(depth),
        "}".repeat(depth)
    );
    let mut invalid_utf8 = br#"{"model":"chat","messages":[{"role":"user","content":""#.to_vec();
    invalid_utf8.extend_from_slice(&[0xff, 0xfe, 0xc3, 0x28]);
    invalid_utf8.extend_from_slice(br#""}]}"#);
    let message = json!([{"role": "user", "content": "hi"}]);
    let cases: Vec<(&str, Vec<u8>, &[&str])> = vec![
        (
            "a truncated JSON body",
            br#"{"model":"chat","messages":["#.to_vec(),
            &["invalid_json"],
        ),
        ("an empty body", Vec::new(), &["invalid_json"]),
        (
            "a JSON array body",
            b"[1,2,3]".to_vec(),
            &["invalid_json", "invalid_request"],
        ),
        (
            "arrays nested 100000 deep",
            deep.into_bytes(),
            &["invalid_json"],
        ),
        (
            "objects nested 100000 deep",
            deep_objects.into_bytes(),
            &["invalid_json"],
        ),
        ("invalid UTF-8", invalid_utf8, &["invalid_json"]),
        (
            "messages not an array",
            json!({"model": "chat", "messages": "hi"})
                .to_string()
                .into_bytes(),
            &["invalid_request"],
        ),
        (
            "content a number",
            json!({"model": "chat", "messages": [{"role": "user", "content": 5}]})
                .to_string()
                .into_bytes(),
            &["invalid_request"],
        ),
        (
            "model an array",
            json!({"model": ["chat"], "messages": message})
                .to_string()
                .into_bytes(),
            &["invalid_request", "missing_model"],
        ),
        (
            "stream a string",
            json!({"model": "chat", "messages": message, "stream": "yes"})
                .to_string()
                .into_bytes(),
            &["invalid_request"],
        ),
        (
            "negative max_tokens",
            json!({"model": "chat", "messages": message, "max_tokens": -1})
                .to_string()
                .into_bytes(),
            &["invalid_request"],
        ),
    ];
    for (what, body, codes) in cases {
        let head = post_head(&key, json_type, Some(body.len()));
        let raw = exchange(addr, &head, &body, BOUND).await;
        assert_error(&raw, 400, codes, what);
        eprintln!("{what}: {} {}", raw.status, raw.json["error"]["code"]);
    }
    let calls = gw.provider_calls().await.unwrap();
    assert!(
        calls.is_empty(),
        "refused bodies reach no provider: {calls:?}"
    );
    // The gateway still serves after all that.
    let ok = gw.chat("chat").await.unwrap();
    assert_eq!(ok.status, 200, "{ok}");
    gw.check_no_secrets_in_logs().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_bodies_headers_and_odd_framing_get_clear_answers() {
    let gw = Gateway::start("bad_input_sizes").await.expect("fixture");
    let addr = gw.envoy.listen_addr();
    let key = gw.virtual_key.clone();
    let json_type = "content-type: application/json\r\n";
    let limit = 4 * 1024 * 1024;

    for (what, size) in [("4 MiB + 1", limit + 1), ("100 MB", 100_000_000)] {
        let body = vec![b' '; size];
        let raw = exchange(addr, &post_head(&key, json_type, Some(size)), &body, BOUND).await;
        assert_error(&raw, 413, &["request_too_large"], what);
    }
    // Exactly at the limit is not refused for its size.
    let mut at_limit = json!({"model": "chat", "messages": [{"role": "user", "content": "hi"}]})
        .to_string()
        .into_bytes();
    at_limit.resize(limit, b' ');
    let raw = exchange(
        addr,
        &post_head(&key, json_type, Some(limit)),
        &at_limit,
        BOUND,
    )
    .await;
    assert_eq!(raw.status, 200, "a body of exactly 4 MiB: {}", raw.text);

    // Many headers, and one huge value.
    let many: String = (0..200).map(|i| format!("x-h-{i}: v\r\n")).collect();
    let raw = exchange(addr, &post_head(&key, &many, Some(2)), b"{}", BOUND).await;
    assert_error(&raw, 431, &["header_too_large"], "200 headers");
    let huge = format!("x-big: {}\r\n", "v".repeat(200 * 1024));
    let raw = exchange(addr, &post_head(&key, &huge, Some(2)), b"{}", BOUND).await;
    assert_error(&raw, 431, &["header_too_large"], "a 200 KiB header value");

    // A chunked body is a body like any other; a broken chunk framing is Envoy's 400.
    let body =
        json!({"model": "chat", "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let chunked = format!(
        "{:x}\r\n{}\r\n{:x}\r\n{}\r\n0\r\n\r\n",
        10,
        &body[..10],
        body.len() - 10,
        &body[10..]
    );
    let head = post_head(
        &key,
        "content-type: application/json\r\ntransfer-encoding: chunked\r\n",
        None,
    );
    let raw = exchange(addr, &head, chunked.as_bytes(), BOUND).await;
    assert_eq!(raw.status, 200, "a chunked body: {}", raw.text);
    assert!(
        raw.json["choices"][0]["message"]["content"].is_string(),
        "{}",
        raw.text
    );
    let raw = exchange(addr, &head, b"zz\r\n{}\r\n0\r\n\r\n", BOUND).await;
    assert_error(
        &raw,
        400,
        &["invalid_request"],
        "a chunk size that is not hex",
    );

    // The content type is not what decides: a JSON body is read as JSON, a non-JSON one is
    // refused as such whatever it claims.
    let raw = exchange(
        addr,
        &post_head(&key, "content-type: text/plain\r\n", Some(body.len())),
        body.as_bytes(),
        BOUND,
    )
    .await;
    assert_eq!(raw.status, 200, "JSON sent as text/plain: {}", raw.text);
    let form = b"model=chat&messages=hi";
    let raw = exchange(
        addr,
        &post_head(
            &key,
            "content-type: application/x-www-form-urlencoded\r\n",
            Some(form.len()),
        ),
        form,
        BOUND,
    )
    .await;
    assert_error(&raw, 400, &["invalid_json"], "a form body");
    gw.check_no_secrets_in_logs().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_paths_on_the_public_listener_reach_the_admin_api_and_nothing_else() {
    let gw = Gateway::start("bad_input_admin").await.expect("fixture");
    let addr = gw.envoy.listen_addr();
    let key = gw.virtual_key.clone();
    let admin = gw.admin_token.clone();
    let send = |method: &str, path: &str, token: &str| {
        let head = format!(
            "{method} {path} HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer {token}\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{{}}"
        );
        async move { exchange(addr, head.as_bytes(), b"", BOUND).await }
    };
    // `/admin/...` is the control plane's admin API (Envoy routes it there): the admin token
    // opens it, a virtual key does not.
    for (method, path) in [
        ("GET", "/admin/keys"),
        ("GET", "/admin/health"),
        ("POST", "/admin/reset"),
    ] {
        let what = format!("{method} {path}");
        let raw = send(method, path, &key).await;
        assert_error(&raw, 401, &["invalid_api_key"], &what);
        let raw = send(method, path, &admin).await;
        assert_eq!(raw.status, 200, "{what}: {}", raw.text);
        assert!(!raw.text.contains("sk-starci-"), "{what}: {}", raw.text);
    }
    // Nothing else of the control plane or of Envoy's admin is reachable.
    for (method, path) in [
        ("GET", "/admin"),
        ("GET", "/metrics"),
        ("GET", "/v1/../admin/keys"),
        ("GET", "/%61dmin/keys"),
        ("GET", "/stats"),
        ("GET", "/config_dump"),
    ] {
        for token in [&key, &admin] {
            let raw = send(method, path, token).await;
            let what = format!("{method} {path}");
            if raw.status == 400 {
                // A path Envoy's codec refuses as such (`..` escaping the root).
                assert_error(&raw, 400, &["invalid_request"], &what);
            } else if raw.status == 401 {
                // The admin token is not a virtual key.
                assert_error(&raw, 401, &["invalid_api_key"], &what);
            } else {
                assert_error(&raw, 404, &["not_found"], &what);
            }
            assert!(!raw.text.contains("sk-starci-"), "{what}: {}", raw.text);
        }
    }
    // The gateway's own health check is public by design: a status and nothing else.
    let head = b"GET /health HTTP/1.1\r\nhost: gw\r\nconnection: close\r\n\r\n";
    let raw = exchange(addr, head, b"", BOUND).await;
    assert_eq!(raw.status, 200, "{}", raw.text);
    assert_eq!(raw.json, json!({"status": "ok"}), "{}", raw.text);
    gw.check_no_secrets_in_logs().unwrap();
}

/// Headers trickled a byte at a time by many connections at once: each is answered 408 and
/// closed within the header timeout, and a normal call is served meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bounded_slowloris_is_cut_off_while_calls_go_on() {
    const HEADERS_TIMEOUT_MS: u64 = 1500;
    let pool = |p1: &str, p2: &str| {
        standard_pool(p1, p2).replace(
            "  keyStore: { type: memory }\n",
            &format!(
                "  keyStore: {{ type: memory }}\n  requestHeadersTimeoutMs: {HEADERS_TIMEOUT_MS}\n"
            ),
        )
    };
    let gw = Gateway::start_with("bad_input_slowloris", pool)
        .await
        .expect("fixture");
    let addr = gw.envoy.listen_addr();
    let started = Instant::now();
    let mut slow = tokio::task::JoinSet::new();
    for _ in 0..32 {
        slow.spawn(async move {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            let head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\nx-slow: ";
            stream.write_all(head).await.unwrap();
            let opened = Instant::now();
            let mut out = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                if opened.elapsed() > Duration::from_secs(10) {
                    panic!("a slow client is still connected after 10 s");
                }
                // One more header byte every 100 ms, reading what Envoy says in between.
                if stream.write_all(b"a").await.is_err() {
                    break;
                }
                match tokio::time::timeout(Duration::from_millis(100), stream.read(&mut buf)).await
                {
                    Ok(Ok(0)) | Ok(Err(_)) => break,
                    Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
                    Err(_) => {}
                }
            }
            (opened.elapsed(), Raw::parse(&out))
        });
    }
    let ok = gw.chat("chat").await.unwrap();
    assert_eq!(ok.status, 200, "a call during the slowloris: {ok}");
    while let Some(done) = slow.join_next().await {
        let (lasted, raw) = done.unwrap();
        assert!(
            lasted < Duration::from_millis(HEADERS_TIMEOUT_MS + 3000),
            "a slow client lasted {lasted:?}"
        );
        if raw.status != 0 {
            assert_error(&raw, 408, &["request_timeout"], "a trickled header");
        }
    }
    eprintln!("32 slow clients cut off within {:?}", started.elapsed());
    let ok = gw.chat("chat").await.unwrap();
    assert_eq!(ok.status, 200, "a call after the slowloris: {ok}");
}
