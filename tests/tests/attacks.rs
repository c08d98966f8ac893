//! The attacks that hit our peers, through a real Envoy and control plane: duplicate and
//! case-variant JSON keys smuggled past the scope check, paths and hosts that might reach a
//! route the path does not name, a client choosing the upstream, keys in the error texts of
//! unreachable providers, and hostile strings through the key stores (SQLite, Postgres).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ai_router_e2e::servers::PostgresServer;
use ai_router_e2e::{
    openai_error_problem, poll, pool_yaml_header, standard_pool, status_of, Gateway, Pool,
    PoolSetup, Reply,
};
use serde_json::{json, Value};

/// How long a key the admin API wrote may take to reach Envoy.
const PUSH: Duration = Duration::from_secs(10);

/// [`ai_router_e2e::raw_http1`], failing the test on a transport error.
async fn raw_http1(addr: SocketAddr, request: &[u8]) -> String {
    ai_router_e2e::raw_http1(addr, request).await.unwrap()
}

/// `METHOD target HTTP/1.1` with `host`, `headers` and `body`, asking to close.
fn request(
    method: &str,
    target: &str,
    host: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Vec<u8> {
    let mut r = format!("{method} {target} HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n");
    for (k, v) in headers {
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() {
        r.push_str(&format!(
            "content-type: application/json\r\ncontent-length: {}\r\n",
            body.len()
        ));
    }
    r.push_str("\r\n");
    r.push_str(body);
    r.into_bytes()
}

/// One HTTP/2 request without TLS (prior knowledge) whose `:authority` is the URI's, whatever
/// address the connection goes to.
async fn h2c(
    addr: SocketAddr,
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let mut req = hyper::Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if !body.is_empty() {
        req = req.header("content-type", "application/json");
    }
    let req = req
        .body(http_body_util::Full::new(bytes::Bytes::from(
            body.to_string(),
        )))
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(20), send.send_request(req))
        .await
        .expect("an h2c answer")
        .unwrap();
    let status = resp.status().as_u16();
    let body = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    let text = String::from_utf8_lossy(&body).into_owned();
    ai_router_e2e::scan::observe("an h2c answer", text.as_bytes());
    (status, text)
}

/// A listener that counts the connections made to it: where an attacker would want the
/// gateway to send a call (and its key).
async fn attacker() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    tokio::spawn(async move {
        while let Ok((_stream, _)) = listener.accept().await {
            seen.fetch_add(1, Ordering::SeqCst);
        }
    });
    (addr, count)
}

/// Creates a key bound to `models` and waits until Envoy knows it.
async fn scoped_key(gw: &Gateway, models: &[&str]) -> String {
    let (_, secret) = gw
        .admin()
        .create_key(&json!({ "label": "scoped", "models": models }))
        .await
        .unwrap();
    poll("the new key to reach Envoy", PUSH, || {
        let c = gw.client.clone();
        let secret = secret.clone();
        let model = models[0].to_string();
        async move { Ok((c.chat(&model, Some(&secret)).await?.status == 200).then_some(())) }
    })
    .await
    .unwrap();
    secret
}

// ---------------------------------------------------------------------------------------------
// Duplicate and case-variant JSON keys
// ---------------------------------------------------------------------------------------------

/// A body naming `model` (or `stream`) twice, or in another case, is refused 400
/// `invalid_request` in every caller protocol, in the caller's own shape, before any lane is
/// tried: the scope check and the router read one `model`, and a provider could read the
/// other (serde_json keeps the last, other parsers the first, Go's any case). The key may call
/// `m1` only; whichever order the two names come in, nothing reaches a provider.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_field_named_twice_or_in_another_case_is_refused_in_every_protocol() {
    let gw = Gateway::start_with("attacks_duplicate_keys", |p1, p2| {
        standard_pool(p1, p2).replace(
            "      - { id: m1, aliases: [chat] }\n",
            "      - { id: m1, aliases: [chat] }\n      - { id: e1, capabilities: [embeddings], dimensions: 8 }\n",
        )
    })
    .await
    .expect("fixture");
    let key = scoped_key(&gw, &["m1", "e1"]).await;
    gw.clear_calls().await.unwrap();
    // (path, the model the key may call there, the rest of the body)
    let protocols = [
        (
            "/v1/chat/completions",
            "m1",
            r#""messages":[{"role":"user","content":"hi"}]"#,
        ),
        ("/v1/responses", "m1", r#""input":"hi""#),
        (
            "/v1/messages",
            "m1",
            r#""max_tokens":16,"messages":[{"role":"user","content":"hi"}]"#,
        ),
        ("/v1/embeddings", "e1", r#""input":"hi""#),
    ];
    let smuggled = [
        r#""model":"m1","model":"m2""#,
        r#""model":"m2","model":"m1""#,
        r#""model":"m1","Model":"m2""#,
        r#""MODEL":"m2","model":"m1""#,
        r#""model":"m1","mod\u0065l":"m2""#,
        r#""model":"m1","stream":false,"stream":true"#,
    ];
    for (path, allowed, rest) in protocols {
        for fields in smuggled {
            let fields = fields.replace("m1", allowed);
            let body = format!("{{{fields},{rest}}}");
            let reply = gw
                .client
                .request(reqwest::Method::POST, path, Some(&key), Some(body.clone()))
                .await
                .unwrap();
            let what = format!("{path} {body}");
            assert_eq!(reply.status, 400, "{what}: {reply}");
            if path == "/v1/messages" {
                assert_eq!(reply.json["type"], "error", "{what}: {reply}");
                assert_eq!(
                    reply.json["error"]["type"], "invalid_request_error",
                    "{what}: {reply}"
                );
            } else if let Some(problem) = openai_error_problem(&reply, 400, "invalid_request") {
                panic!("{what}: {problem}");
            }
            let message = reply.text.to_lowercase();
            assert!(message.contains("more than once"), "{what}: {reply}");
        }
        // The same body with each field once is served (the refusal is the repeat's).
        let body = format!(r#"{{"model":"{allowed}",{rest}}}"#);
        let reply = gw
            .client
            .request(reqwest::Method::POST, path, Some(&key), Some(body.clone()))
            .await
            .unwrap();
        assert_eq!(reply.status, 200, "{path} {body}: {reply}");
    }
    let calls = gw.provider_calls().await.unwrap();
    let models: Vec<_> = calls.iter().map(|(_, c)| c.model.clone()).collect();
    assert_eq!(
        calls.len(),
        protocols.len(),
        "only the four well-formed calls reached a provider: {models:?}"
    );
    assert!(
        calls.iter().all(|(alias, c)| (alias == "a" || alias == "b")
            && matches!(c.model.as_deref(), Some("m1" | "e1"))),
        "{models:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Path and Host confusion
// ---------------------------------------------------------------------------------------------

/// Paths that spell a route in another way (doubled slashes, dot segments, percent-encoded
/// slashes, dots and letters, upper case) reach no route they do not name, on the public
/// listener (HTTP/1.1 raw, absolute-form, a `Host` or h2c `:authority` naming the control
/// plane) and on the control plane's admin port: no admin answer without the token, no model
/// call, nothing of the control plane but `/admin/...`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_and_hosts_reach_only_the_route_they_name() {
    let gw = Gateway::start("attacks_paths").await.expect("fixture");
    let public = gw.envoy.listen_addr();
    let admin = gw.cp.http_addr();
    let cp = admin.to_string();
    let vk = format!("Bearer {}", gw.virtual_key);
    let chat = r#"{"model":"chat","messages":[{"role":"user","content":"hi"}]}"#;
    gw.clear_calls().await.unwrap();

    // Public listener: none of these reaches the admin API or a model.
    for (method, target) in [
        ("GET", "//admin/keys"),
        ("GET", "/v1/../admin/keys"),
        ("GET", "/v1/%2e%2e/admin/keys"),
        ("GET", "/%61dmin/keys"),
        ("GET", "/ADMIN/keys"),
        ("GET", "/admin"),
        ("GET", "/metrics"),
        ("GET", "/admin/../metrics"),
        ("GET", "/admin/%2e%2e/metrics"),
        ("GET", "/admin/..%2fmetrics"),
        ("GET", "/admin/../health"),
        ("GET", "/admin/keys/../../metrics"),
        ("POST", "/v1/chat%2Fcompletions"),
        ("POST", "/v1/chat/completions/.."),
        ("POST", "/v1/chat/./completions"),
        ("POST", "//v1/chat/completions"),
        ("POST", "/v1/models/../chat/completions"),
        ("POST", "/%761/chat/completions"),
    ] {
        for host in ["gw", cp.as_str()] {
            let body = if method == "POST" { chat } else { "" };
            let answer = raw_http1(
                public,
                &request(method, target, host, &[("authorization", &vk)], body),
            )
            .await;
            let status = status_of(&answer);
            assert!(
                matches!(status, 400 | 401 | 404 | 405),
                "{method} {target} (host {host}) on the public listener: {answer}"
            );
            assert!(
                !answer.contains("# HELP"),
                "{target}: metrics leaked: {answer}"
            );
            assert!(
                !answer.contains("\"keys\""),
                "{target}: the key list leaked: {answer}"
            );
        }
    }
    // The admin API on the public listener, by absolute-form URI, Host or :authority naming
    // the control plane: the token is still asked for.
    for target in ["/admin/keys".to_string(), format!("http://{cp}/admin/keys")] {
        let answer = raw_http1(public, &request("GET", &target, &cp, &[], "")).await;
        assert_eq!(status_of(&answer), 401, "{target}: {answer}");
        let answer = raw_http1(
            public,
            &request("GET", &target, &cp, &[("authorization", &vk)], ""),
        )
        .await;
        assert_eq!(
            status_of(&answer),
            401,
            "{target} with a virtual key: {answer}"
        );
    }
    for path in [
        "/admin/keys",
        "//admin/keys",
        "/admin/../metrics",
        "/metrics",
        "/health/../admin/keys",
    ] {
        let (status, text) = h2c(public, "GET", &format!("http://{cp}{path}"), &[], "").await;
        assert!(
            matches!(status, 401 | 404),
            "h2c :authority {cp} {path}: {status} {text}"
        );
        assert!(
            !text.contains("# HELP") && !text.contains("\"keys\""),
            "{path}: {text}"
        );
    }
    let token = format!("Bearer {}", gw.admin_token);
    let (status, text) = h2c(
        public,
        "GET",
        &format!("http://{cp}/admin/keys"),
        &[("authorization", &token)],
        "",
    )
    .await;
    assert_eq!(status, 200, "the admin token opens the admin route: {text}");

    // The control plane's own port: the same spellings answer nothing without the token.
    for target in [
        "//admin/keys",
        "/admin//keys",
        "/admin/./keys",
        "/admin/keys/../keys",
        "/%61dmin/keys",
        "/admin/%6beys",
        "/ADMIN/keys",
        "/health/../admin/keys",
        "/metrics/../admin/keys",
        "http://gw/admin/keys",
    ] {
        let answer = raw_http1(admin, &request("GET", target, "gw", &[], "")).await;
        let status = status_of(&answer);
        assert!(
            matches!(status, 400 | 401 | 404),
            "GET {target} on the admin port: {answer}"
        );
        assert!(!answer.contains("\"keys\""), "{target}: {answer}");
    }
    let answer = raw_http1(admin, &request("GET", "/admin/keys", "gw", &[], "")).await;
    assert_eq!(status_of(&answer), 401, "{answer}");

    let calls = gw.provider_calls().await.unwrap();
    assert!(calls.is_empty(), "no path above is a model call: {calls:?}");
}

// ---------------------------------------------------------------------------------------------
// No client-chosen upstream
// ---------------------------------------------------------------------------------------------

/// Nothing a client sends picks where a call goes or which key it carries: body fields other
/// gateways read (`api_base`, `base_url`, `baseURL`, `custom_host`, `api_key`...), the same in
/// the query, headers (`x-forwarded-host`, Portkey's `x-portkey-custom-host`, Envoy's
/// `x-envoy-original-dst-host`...), the `Host`, an absolute-form URI or an h2c `:authority`
/// naming another server: each call reaches mock 1 with the pool's key `a`, and the server
/// they name receives no connection at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_client_field_chooses_the_upstream_or_its_key() {
    let gw = Gateway::start("attacks_upstream").await.expect("fixture");
    let (evil, connections) = attacker().await;
    let evil_url = format!("http://{evil}/v1");
    let attacker_key = "sk-attacker-0000";
    let public = gw.envoy.listen_addr();
    let vk = format!("Bearer {}", gw.virtual_key);
    gw.clear_calls().await.unwrap();

    let mut body = json!({ "model": "chat", "messages": [{ "role": "user", "content": "hi" }] });
    for field in [
        "api_base",
        "base_url",
        "baseURL",
        "custom_host",
        "endpoint",
        "url",
        "host",
        "provider_url",
    ] {
        body[field] = json!(evil_url);
    }
    for field in ["api_key", "apiKey", "provider_key"] {
        body[field] = json!(attacker_key);
    }
    body["extra_headers"] = json!({ "authorization": format!("Bearer {attacker_key}") });
    body["provider"] = json!({ "id": "evil", "baseUrl": evil_url });
    let body = body.to_string();
    let evil_s = evil.to_string();
    let headers: Vec<(&str, &str)> = vec![
        ("authorization", &vk),
        ("x-forwarded-host", &evil_s),
        ("x-forwarded-server", &evil_s),
        ("x-original-host", &evil_s),
        ("x-host", &evil_s),
        ("forwarded", "host=evil"),
        ("x-portkey-custom-host", &evil_url),
        ("x-portkey-provider", "openai"),
        ("x-api-base", &evil_url),
        ("x-base-url", &evil_url),
        ("x-envoy-original-dst-host", &evil_s),
        ("x-ai-router-cluster", "evil"),
        ("api-key", attacker_key),
        ("x-api-key", attacker_key),
        ("openai-organization", "org-evil"),
    ];
    let query = format!("?api_base={evil_url}&base_url={evil_url}&custom_host={evil_url}");
    let path = format!("/v1/chat/completions{query}");
    let absolute = format!("http://{evil}/v1/chat/completions{query}");
    let mut answers = Vec::new();
    answers.push(raw_http1(public, &request("POST", &path, "gw", &headers, &body)).await);
    answers.push(raw_http1(public, &request("POST", &path, &evil_s, &headers, &body)).await);
    answers.push(
        raw_http1(
            public,
            &request("POST", &absolute, &evil_s, &headers, &body),
        )
        .await,
    );
    for answer in &answers {
        assert_eq!(status_of(answer), 200, "{answer}");
    }
    let (status, text) = h2c(public, "POST", &absolute, &headers, &body).await;
    assert_eq!(status, 200, "h2c :authority {evil}: {text}");

    let calls = gw.provider_calls().await.unwrap();
    assert_eq!(calls.len(), 4, "{calls:?}");
    for (alias, call) in &calls {
        assert!(
            alias == "a" || alias == "b",
            "the pool's key p1 key, not {alias}"
        );
        assert_eq!(call.path, "/v1/chat/completions", "{call:?}");
        for (name, value) in call.header_pairs() {
            assert!(
                !value.contains(attacker_key)
                    && !value.contains(&evil_s)
                    && !value.contains("org-evil"),
                "the provider got {name}: {value}"
            );
        }
    }
    assert!(gw.mock2.calls().await.unwrap().is_empty());
    assert_eq!(
        connections.load(Ordering::SeqCst),
        0,
        "the gateway connected to the address a client named"
    );
}

// ---------------------------------------------------------------------------------------------
// Keys in the error texts of unreachable providers
// ---------------------------------------------------------------------------------------------

/// Three providers no call can reach, each with its own key: a name that does not resolve, a
/// refused port and a TLS handshake with a server that speaks plain HTTP. A call tries them
/// all (each the others' fallback), unary and streamed, and fails; no key appears in the
/// client's error, in Envoy's logs at its default level, nor in the control plane's logs (the
/// fixture's scan reads them all when it ends; the checks here name the key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_never_appear_in_dns_connect_tls_or_retry_errors() {
    let refused = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut secrets = Vec::new();
    let pool = Pool::start("attacks_error_texts", 1, |m, _dir| {
        let mut setup = PoolSetup::default();
        for (var, name) in [("K_DNS", "dns"), ("K_REFUSED", "refused"), ("K_TLS", "tls")] {
            secrets.push((name, setup.secret_env(var, name)));
        }
        let tls = m[0].replace("http://", "https://");
        setup.yaml = format!(
            "{header}providers:\n\
             \x20 - {{ id: dns, kind: openai-compatible, baseUrl: 'http://no-such-host.invalid/v1', keys: [{{ alias: k, env: K_DNS }}], models: [{{ id: m-dns }}] }}\n\
             \x20 - {{ id: refused, kind: openai-compatible, baseUrl: 'http://{refused}/v1', keys: [{{ alias: k, env: K_REFUSED }}], models: [{{ id: m-refused }}] }}\n\
             \x20 - {{ id: tls, kind: openai-compatible, baseUrl: '{tls}/v1', keys: [{{ alias: k, env: K_TLS }}], models: [{{ id: m-tls }}] }}\n\
             defaults: {{ fallbacks: [m-dns, m-refused, m-tls], deadlineMs: 15000 }}\n\
             resilience: {{ backoff: {{ baseMs: 10, factor: 2, maxMs: 50 }} }}\n",
            header = pool_yaml_header(),
        );
        Ok(setup)
    })
    .await
    .expect("fixture");
    for model in ["m-dns", "m-refused", "m-tls"] {
        let reply = pool.chat(model).await.unwrap();
        assert!(reply.status >= 500, "{model}: {reply}");
        let stream = pool
            .client
            .stream_with(
                &json!({ "model": model, "stream": true, "messages": [{ "role": "user", "content": "hi" }] }),
                Some(&pool.virtual_key),
            )
            .await
            .unwrap();
        let text = stream.body;
        for (name, secret) in &secrets {
            assert!(
                !reply.text.contains(secret.as_str()),
                "{name}'s key in {reply}"
            );
            assert!(
                !text.contains(secret.as_str()),
                "{name}'s key in the stream: {text}"
            );
        }
    }
    assert!(
        pool.mocks[0].calls().await.unwrap().is_empty(),
        "TLS never got through"
    );
    let logs = [
        ("envoy", pool.envoy.logs()),
        ("control plane", pool.cp.logs()),
    ];
    for (who, text) in &logs {
        assert!(!text.is_empty(), "the {who} wrote no log");
        for (name, secret) in &secrets {
            assert!(
                !text.contains(secret.as_str()),
                "{name}'s key in the {who} logs"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Hostile strings through the key stores
// ---------------------------------------------------------------------------------------------

/// SQL metacharacters, NUL, a 10 KB value, a right-to-left override and look-alike escapes.
fn hostile_strings() -> Vec<String> {
    vec![
        "'; DROP TABLE virtual_keys; --".into(),
        "\" OR \"1\"=\"1".into(),
        "x' OR '1'='1' --".into(),
        "%00%27%22".into(),
        "\\x00\\'".into(),
        "nul\u{0}inside".into(),
        "\u{202e}txt.exe".into(),
        "a".repeat(10_240),
    ]
}

/// Whether the admin API must refuse `owner` (README, "Virtual keys and the admin API"):
/// over 256 bytes, or holding a control or bidirectional-format character.
fn owner_refused(owner: &str) -> bool {
    owner.len() > 256
        || owner.chars().any(|c| {
            c.is_control()
                || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}')
        })
}

fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Drives hostile strings through every admin route and the public listener of a pool whose
/// keys live in `key_store`: each is stored and read back byte for byte or refused with its
/// documented 4xx (400 `invalid_request`, 401, 404 `not_found` / `model_not_found`), never a
/// 500; afterwards the store holds exactly the keys created, and a new key still serves.
async fn hostile_strings_through(test: &str, key_store: &str, extra_env: Vec<(String, String)>) {
    let token = format!("admin-{}", ai_router_e2e::random_hex(32));
    ai_router_e2e::scan::register("AI_ROUTER_ADMIN_TOKEN", &token);
    let store = key_store.to_string();
    let admin_token = token.clone();
    let pool = Pool::start(test, 1, move |m, _dir| {
        let mut setup = PoolSetup::default();
        setup.secret_env("P1_KEY", "p1-a");
        setup.env.push(("AI_ROUTER_ADMIN_TOKEN".into(), admin_token));
        setup.env.extend(extra_env);
        setup.yaml = format!(
            "{}providers:\n  - {{ id: p1, kind: openai-compatible, baseUrl: '{}/v1', keys: [{{ alias: a, env: P1_KEY }}], models: [{{ id: m1 }}] }}\n",
            pool_yaml_header().replace(
                "keyStore: { type: memory }",
                &format!("keyStore: {store}, adminToken: {{ env: AI_ROUTER_ADMIN_TOKEN }}"),
            ),
            m[0]
        );
        Ok(setup)
    })
    .await
    .expect("fixture");
    let admin = ai_router_e2e::Admin::at(pool.cp.http_addr(), &token).unwrap();
    let send = |method: reqwest::Method, path: String, body: Option<Vec<u8>>| {
        let admin = admin.clone();
        async move { admin.call_raw(method, &path, body).await.unwrap() }
    };
    let assert_refused = |reply: &Reply, status: u16, code: &str, what: &str| {
        if let Some(problem) = openai_error_problem(reply, status, code) {
            panic!("{what}: {problem}");
        }
    };
    let mut created: Vec<(String, Option<String>)> = Vec::new();
    let (_, good) = {
        let r = send(
            reqwest::Method::POST,
            "/admin/keys".into(),
            Some(
                json!({"label": "good", "models": ["m1"]})
                    .to_string()
                    .into_bytes(),
            ),
        )
        .await;
        assert_eq!(r.status, 201, "{r}");
        created.push((r.json["key"]["id"].as_str().unwrap().to_string(), None));
        let secret = r.json["secret"].as_str().unwrap().to_string();
        ai_router_e2e::scan::register("a virtual key", &secret);
        (r, secret)
    };
    let good_id = created[0].0.clone();
    for h in hostile_strings() {
        let short: String = h.chars().take(40).collect();
        // A label is [a-z0-9_], at most 64.
        let r = send(
            reqwest::Method::POST,
            "/admin/keys".into(),
            Some(
                json!({"label": h, "models": ["m1"]})
                    .to_string()
                    .into_bytes(),
            ),
        )
        .await;
        assert_refused(&r, 400, "invalid_request", &format!("label {short:?}"));
        // An owner is stored as sent, or refused.
        let r = send(
            reqwest::Method::POST,
            "/admin/keys".into(),
            Some(
                json!({"label": "owned", "owner": h, "models": ["m1"]})
                    .to_string()
                    .into_bytes(),
            ),
        )
        .await;
        if owner_refused(&h) {
            assert_refused(&r, 400, "invalid_request", &format!("owner {short:?}"));
        } else {
            assert_eq!(r.status, 201, "owner {short:?}: {r}");
            assert_eq!(r.json["key"]["owner"].as_str(), Some(h.as_str()), "{r}");
            let id = r.json["key"]["id"].as_str().unwrap().to_string();
            ai_router_e2e::scan::register("a virtual key", r.json["secret"].as_str().unwrap());
            created.push((id, Some(h.clone())));
        }
        let r = send(
            reqwest::Method::PATCH,
            format!("/admin/keys/{good_id}"),
            Some(json!({"owner": h}).to_string().into_bytes()),
        )
        .await;
        if owner_refused(&h) {
            assert_refused(
                &r,
                400,
                "invalid_request",
                &format!("patch owner {short:?}"),
            );
        } else {
            assert_eq!(r.status, 200, "patch owner {short:?}: {r}");
            assert_eq!(
                r.json["owner"].as_str().or(r.json["key"]["owner"].as_str()),
                Some(h.as_str()),
                "{r}"
            );
        }
        // A model or profile the pool does not have.
        for field in ["models", "profiles"] {
            let r = send(
                reqwest::Method::POST,
                "/admin/keys".into(),
                Some(
                    json!({"label": "bound", field: [h]})
                        .to_string()
                        .into_bytes(),
                ),
            )
            .await;
            assert_refused(&r, 400, "invalid_request", &format!("{field} {short:?}"));
        }
        // An id that is no key's, in every route that takes one.
        let id = percent_encode(&h);
        for (method, path) in [
            (reqwest::Method::GET, format!("/admin/keys/{id}")),
            (reqwest::Method::POST, format!("/admin/keys/{id}/revoke")),
            (reqwest::Method::POST, format!("/admin/keys/{id}/rotate")),
            (reqwest::Method::GET, format!("/admin/keys/{id}/usage")),
        ] {
            let r = send(method.clone(), path.clone(), None).await;
            assert_refused(&r, 404, "not_found", &format!("{method} {short:?}"));
        }
        let r = send(
            reqwest::Method::GET,
            format!("/admin/keys/{good_id}/usage?from={id}"),
            None,
        )
        .await;
        assert_refused(&r, 400, "invalid_request", &format!("usage from {short:?}"));
        let r = send(
            reqwest::Method::POST,
            "/admin/reset".into(),
            Some(json!({"provider": h}).to_string().into_bytes()),
        )
        .await;
        assert_refused(&r, 404, "not_found", &format!("reset {short:?}"));
        // As a model name on the public listener.
        let r = pool
            .chat_with(&json!({"model": h, "messages": [{"role": "user", "content": "hi"}]}))
            .await
            .unwrap();
        assert_refused(&r, 404, "model_not_found", &format!("model {short:?}"));
    }
    // Bytes that are not UTF-8 in an admin body and in a model body.
    let r = send(
        reqwest::Method::POST,
        "/admin/keys".into(),
        Some(b"{\"label\":\"bad\xff\xfe\",\"models\":[\"m1\"]}".to_vec()),
    )
    .await;
    assert!(matches!(r.status, 400 | 422) && r.status != 500, "{r}");
    let r = pool
        .client
        .request(
            reqwest::Method::POST,
            "/v1/chat/completions",
            Some(&pool.virtual_key),
            Some(String::from_utf8_lossy(b"{\"model\":\"m1\xff\"}").into_owned()),
        )
        .await
        .unwrap();
    assert_ne!(r.status, 500, "{r}");
    // Hostile virtual keys and admin tokens (header values), raw so nothing is refused on
    // the way: NUL is a malformed request (400), the rest an unknown key (401).
    let public = pool.envoy.listen_addr();
    let admin_addr = pool.cp.http_addr();
    let chat = r#"{"model":"m1","messages":[{"role":"user","content":"hi"}]}"#;
    let mut values: Vec<Vec<u8>> = hostile_strings()
        .into_iter()
        .map(String::into_bytes)
        .collect();
    values.push(b"sk-starci-\xff\xfe\x80".to_vec());
    for value in values {
        let nul = value.contains(&0);
        let not_text = std::str::from_utf8(&value).is_err();
        for (addr, target, body) in [
            (public, "/v1/chat/completions", chat),
            (public, "/admin/keys", ""),
            (admin_addr, "/admin/keys", ""),
        ] {
            let mut req = request(
                if body.is_empty() { "GET" } else { "POST" },
                target,
                "gw",
                &[],
                body,
            );
            let at = req.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 2;
            let mut header = b"authorization: Bearer ".to_vec();
            header.extend_from_slice(&value);
            header.extend_from_slice(b"\r\n");
            req.splice(at..at, header);
            let answer = raw_http1(addr, &req).await;
            let status = status_of(&answer);
            let short: String = String::from_utf8_lossy(&value).chars().take(40).collect();
            if nul {
                assert_eq!(status, 400, "{target} key {short:?}: {answer}");
            } else if not_text && addr == public && !body.is_empty() {
                // The front stage names the header (README, "Errors").
                assert_eq!(status, 400, "{target} key {short:?}: {answer}");
                assert!(answer.contains("\"invalid_request\""), "{answer}");
            } else {
                assert_eq!(status, 401, "{target} key {short:?}: {answer}");
            }
        }
    }
    // The store is whole: exactly the keys created, owners byte for byte, and it still serves.
    let listed = pool
        .admin("AI_ROUTER_ADMIN_TOKEN")
        .unwrap()
        .get_json("/admin/keys")
        .await
        .unwrap();
    let stored: Vec<&Value> = listed["keys"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|k| k["mounted"] != json!(true))
        .collect();
    assert_eq!(stored.len(), created.len(), "{listed}");
    for (id, owner) in &created[1..] {
        let key = stored.iter().find(|k| k["id"] == json!(id)).unwrap();
        assert_eq!(key["owner"].as_str(), owner.as_deref(), "{key}");
    }
    let r = pool.client.chat("m1", Some(&good)).await.unwrap();
    assert_eq!(r.status, 200, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_strings_through_the_sqlite_key_store() {
    hostile_strings_through(
        "attacks_hostile_sqlite",
        "{ type: sqlite, path: keys.sqlite }",
        Vec::new(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_strings_through_the_postgres_key_store() {
    let postgres = PostgresServer::start().expect("postgres");
    hostile_strings_through(
        "attacks_hostile_postgres",
        "{ type: postgres, url: { env: AI_ROUTER_PG_URL } }",
        vec![("AI_ROUTER_PG_URL".into(), postgres.url())],
    )
    .await;
}
