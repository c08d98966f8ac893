//! Scoped admin tokens, end to end: tokens issued by `ai-router admin-tokens` (on the config's
//! key store, SQLite or Postgres, and through the admin API) and by `POST /admin/tokens`; each
//! is checked through the control plane's admin port and through Envoy's `/admin/` route, and
//! over gRPC: a `read` token reads but cannot reset or create keys (403 `insufficient_scope`),
//! an `operate` token resets, an expired and a revoked token are refused (401), every action is
//! an `admin` event naming the token's label, and no token appears in any answer but its
//! creation's, nor in any log or event (the whole-run secret scan).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use ai_router_e2e::servers::PostgresServer;
use ai_router_e2e::{openai_error_problem, poll, scan, standard_pool, Gateway, Reply, TestDir};
use ai_router_proto::v1 as pb;
use ai_router_proto::v1::admin_client::AdminClient;
use serde_json::{json, Value};

/// One admin call: `base` is the control plane's admin port or Envoy's listener.
async fn call(
    method: reqwest::Method,
    base: &str,
    path: &str,
    token: &str,
    body: Option<Value>,
) -> Reply {
    ai_router_e2e::Admin::new(base, Some(token))
        .unwrap()
        .call(method, path, body.as_ref())
        .await
        .unwrap()
}

fn assert_error(reply: &Reply, status: u16, code: &str, what: &str) {
    if let Some(problem) = openai_error_problem(reply, status, code) {
        panic!("{what}: {problem}");
    }
}

/// `ai-router admin-tokens ...` with the fixture's environment.
async fn cli(gw: &Gateway, args: &[&str], extra: &[(&str, &str)]) -> Value {
    let mut env = vec![
        ("P1_KEY_A", gw.key_a.as_str()),
        ("P1_KEY_B", gw.key_b.as_str()),
        ("P2_KEY_C", gw.key_c.as_str()),
        ("STARCI_AI_KEY", gw.virtual_key.as_str()),
    ];
    env.extend_from_slice(extra);
    let (ok, value, out) = ai_router_e2e::run_cli(&[&["admin-tokens"], args].concat(), &env)
        .await
        .unwrap();
    assert!(ok, "admin-tokens {args:?}: {out}");
    value
}

/// The token a `create` answered, registered with the secret scan from now on.
fn secret_of(created: &Value) -> String {
    let secret = created["secret"].as_str().expect("secret").to_string();
    assert!(secret.starts_with("ara-"), "{created}");
    scan::register("an admin token", &secret);
    secret
}

async fn grpc(gw: &Gateway, token: &str) -> (AdminClient<tonic::transport::Channel>, String) {
    let client = AdminClient::connect(format!("http://{}", gw.cp.grpc_addr()))
        .await
        .unwrap();
    (client, format!("Bearer {token}"))
}

fn authed<T>(message: T, bearer: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("authorization", bearer.parse().unwrap());
    request
}

/// The whole scenario on a gateway whose key store is SQLite or Postgres.
async fn scoped_tokens(gw: &Gateway) {
    gw.mock1
        .script(json!([ai_router_e2e::script::always(vec![
            ai_router_e2e::script::text("ok")
        ])]))
        .await
        .unwrap();
    let config = gw.cp.config_path().display().to_string();
    let admin_port = format!("http://{}", gw.cp.http_addr());
    let envoy = gw.envoy.base_url();
    let mut events = gw.cp.events(&gw.admin_token, "?types=admin").await.unwrap();

    // Issued three ways: on the store by the CLI, by the CLI through the admin API, by POST.
    let viewer = secret_of(
        &cli(
            gw,
            &[
                "create", "--scope", "read", "--label", "viewer", "--config", &config,
            ],
            &[],
        )
        .await,
    );
    let oncall = secret_of(
        &cli(
            gw,
            &[
                "create",
                "--scope",
                "operate",
                "--label",
                "oncall",
                "--url",
                &admin_port,
            ],
            &[("AI_ROUTER_ADMIN_TOKEN", gw.admin_token.as_str())],
        )
        .await,
    );
    let created = call(
        reqwest::Method::POST,
        &admin_port,
        "/admin/tokens",
        &gw.admin_token,
        Some(json!({ "label": "keeper", "scope": "keys", "expires": "30d" })),
    )
    .await;
    assert_eq!(created.status, 201, "{created}");
    assert_eq!(created.json["token"]["scope"], "keys", "{created}");
    assert!(created.json["token"]["expires"].is_string(), "{created}");
    let keeper = secret_of(&created.json);

    for base in [admin_port.as_str(), envoy.as_str()] {
        let whoami = call(reqwest::Method::GET, base, "/admin/whoami", &viewer, None).await;
        assert_eq!(whoami.status, 200, "{base}: {whoami}");
        assert_eq!(
            whoami.json,
            json!({ "label": "viewer", "scope": "read", "expiresAtMs": null, "expires": null })
        );
        for page in [
            "/admin/health",
            "/admin/stats",
            "/admin/catalog",
            "/admin/ledger",
            "/admin/keys",
            "/admin/console",
        ] {
            let r = call(reqwest::Method::GET, base, page, &viewer, None).await;
            assert_eq!(r.status, 200, "read token, GET {page} via {base}: {r}");
        }
        let r = call(
            reqwest::Method::POST,
            base,
            "/admin/reset",
            &viewer,
            Some(json!({})),
        )
        .await;
        assert_error(&r, 403, "insufficient_scope", "a read token resets");
        assert!(
            r.json["error"]["message"]
                .as_str()
                .unwrap_or("")
                .contains("operate"),
            "{r}"
        );
        let r = call(
            reqwest::Method::POST,
            base,
            "/admin/keys",
            &viewer,
            Some(json!({ "label": "nope", "models": ["*"] })),
        )
        .await;
        assert_error(&r, 403, "insufficient_scope", "a read token creates a key");
        assert!(
            r.json["error"]["message"]
                .as_str()
                .unwrap_or("")
                .contains("keys"),
            "{r}"
        );

        let r = call(
            reqwest::Method::POST,
            base,
            "/admin/reset",
            &oncall,
            Some(json!({})),
        )
        .await;
        assert_eq!(r.status, 200, "an operate token resets via {base}: {r}");
        let r = call(
            reqwest::Method::POST,
            base,
            "/admin/keys",
            &oncall,
            Some(json!({ "label": "nope", "models": ["*"] })),
        )
        .await;
        assert_error(
            &r,
            403,
            "insufficient_scope",
            "an operate token creates a key",
        );
        let r = call(reqwest::Method::GET, base, "/admin/tokens", &keeper, None).await;
        assert_error(
            &r,
            403,
            "insufficient_scope",
            "a keys token lists admin tokens",
        );
    }
    let r = call(
        reqwest::Method::POST,
        &envoy,
        "/admin/keys",
        &keeper,
        Some(json!({ "label": "kept", "models": ["*"] })),
    )
    .await;
    assert_eq!(r.status, 201, "a keys token creates a key: {r}");
    scan::register(
        "a virtual key",
        r.json["secret"].as_str().unwrap_or_default(),
    );

    // gRPC: the same table.
    let (mut client, bearer) = grpc(gw, &viewer).await;
    client
        .health(authed(pb::HealthRequest {}, &bearer))
        .await
        .unwrap();
    let who = client
        .whoami(authed(pb::WhoamiRequest {}, &bearer))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (who.label.as_str(), who.scope()),
        ("viewer", pb::AdminScope::Read)
    );
    let refused = client
        .reset(authed(pb::ResetRequest::default(), &bearer))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    let refused = client
        .create_key(authed(
            pb::CreateKeyRequest {
                label: "nope".into(),
                models: vec!["*".into()],
                ..Default::default()
            },
            &bearer,
        ))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    let (mut client, bearer) = grpc(gw, &oncall).await;
    client
        .reset(authed(pb::ResetRequest::default(), &bearer))
        .await
        .unwrap();

    // Each action an event naming the label, never the token.
    let mut seen = Vec::new();
    while seen.len() < 6 {
        let (_, event) = tokio::time::timeout(Duration::from_secs(10), events.recv())
            .await
            .expect("admin events")
            .expect("the event stream");
        seen.push((
            event["action"].as_str().unwrap_or("").to_owned(),
            event["by"].as_str().unwrap_or("").to_owned(),
        ));
    }
    let oncall_resets = seen
        .iter()
        .filter(|(a, by)| a == "reset" && by == "oncall")
        .count();
    assert_eq!(oncall_resets, 3, "{seen:?}");
    assert!(
        seen.contains(&("token-created".into(), "bootstrap".into())),
        "{seen:?}"
    );
    assert!(
        seen.contains(&("key-created".into(), "keeper".into())),
        "{seen:?}"
    );

    // The listing: labels, scopes, times, never a token.
    let listed = cli(gw, &["list", "--config", &config], &[]).await;
    let tokens = listed["tokens"].as_array().expect("tokens");
    let row = |label: &str| {
        tokens
            .iter()
            .find(|t| t["label"] == label)
            .cloned()
            .unwrap_or(Value::Null)
    };
    assert_eq!(row("viewer")["scope"], "read", "{listed}");
    assert_eq!(row("oncall")["scope"], "operate", "{listed}");
    assert!(row("viewer")["expires"].is_null(), "{listed}");
    assert!(row("viewer")["lastUsed"].is_string(), "{listed}");
    assert_eq!(row("viewer")["revoked"], false, "{listed}");

    // Revoked (by label, on the store): refused at once, on both ports.
    let revoked = cli(gw, &["revoke", "viewer", "--config", &config], &[]).await;
    assert_eq!(revoked["revoked"], true, "{revoked}");
    for base in [admin_port.as_str(), envoy.as_str()] {
        let r = call(reqwest::Method::GET, base, "/admin/health", &viewer, None).await;
        assert_error(&r, 401, "invalid_api_key", "a revoked token");
    }

    // Expired: works until its time, then refused.
    let brief = call(
        reqwest::Method::POST,
        &admin_port,
        "/admin/tokens",
        &gw.admin_token,
        Some(json!({ "label": "brief", "scope": "admin", "expires": "3s" })),
    )
    .await;
    assert_eq!(brief.status, 201, "{brief}");
    let brief = secret_of(&brief.json);
    let r = call(reqwest::Method::GET, &envoy, "/admin/tokens", &brief, None).await;
    assert_eq!(r.status, 200, "{r}");
    poll(
        "the short-lived token to expire",
        Duration::from_secs(15),
        || {
            let (base, brief) = (envoy.clone(), brief.clone());
            async move {
                let r = call(reqwest::Method::GET, &base, "/admin/health", &brief, None).await;
                Ok((r.status != 200).then_some(r))
            }
        },
    )
    .await
    .map(|r| assert_error(&r, 401, "invalid_api_key", "an expired token"))
    .unwrap();
    let r = call(
        reqwest::Method::GET,
        &admin_port,
        "/admin/health",
        &brief,
        None,
    )
    .await;
    assert_error(
        &r,
        401,
        "invalid_api_key",
        "an expired token on the admin port",
    );

    gw.check_no_secrets_in_logs().unwrap();
    let logs = gw.cp.logs();
    assert!(logs.contains("oncall"), "the log names the label");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scoped_admin_tokens_on_sqlite() {
    let gw = Gateway::start_with("admin_tokens_sqlite", ai_router_e2e::sqlite_pool)
        .await
        .expect("fixture");
    scoped_tokens(&gw).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scoped_admin_tokens_on_postgres() {
    let postgres = PostgresServer::start().expect("postgres");
    let dir = TestDir::new("admin_tokens_pg_url").unwrap();
    let url_file = dir.write("pg-url", &postgres.url()).unwrap();
    let url_file = url_file.display().to_string();
    let gw = Gateway::start_with("admin_tokens_postgres", |p1, p2| {
        standard_pool(p1, p2).replace(
            "keyStore: { type: memory }",
            &format!("keyStore: {{ type: postgres, url: {{ file: {url_file} }} }}"),
        )
    })
    .await
    .expect("fixture");
    scoped_tokens(&gw).await;
}
