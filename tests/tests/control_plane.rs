//! The control plane as a process: the data path keeps serving while it is down and the filter
//! reconnects when it is back; bad configs are refused at load; `render-envoy` reproduces the
//! checked-in `envoy/envoy.yaml`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use ai_router_e2e::{ai_router_bin, script, workspace_root, Gateway, Process, TestDir};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_keep_succeeding_while_the_control_plane_is_down_and_the_filter_reconnects() {
    let mut gw = Gateway::start("control_plane_restart")
        .await
        .expect("fixture");
    gw.mock1
        .script(json!([script::always(vec![script::stream(&[
            "Hello", " there"
        ])])]))
        .await
        .unwrap();
    let r = gw.chat("chat").await.unwrap();
    assert_eq!(r.status, 200, "{r}");

    gw.cp.stop();

    // From the last state: unary and streamed calls, on this connection and on new ones.
    for i in 0..5 {
        let r = gw.chat("chat").await.unwrap();
        assert_eq!(r.status, 200, "call {i} with the control plane down:\n{r}");
        assert_eq!(r.content(), Some("Hello there"), "{r}");
    }
    let s = gw.stream("chat").await.unwrap();
    assert_eq!(s.status, 200, "{s}");
    assert_eq!(s.contents(), ["Hello", " there"], "{s}");
    for i in 0..4 {
        let fresh = ai_router_e2e::Client::new(&gw.envoy.base_url()).unwrap();
        let r = fresh.chat("chat", Some(&gw.virtual_key)).await.unwrap();
        assert_eq!(
            r.status, 200,
            "new connection {i} with the control plane down:\n{r}"
        );
    }
    let r = gw
        .client
        .chat("chat", Some(&ai_router_e2e::new_virtual_key()))
        .await
        .unwrap();
    assert_eq!(
        r.status, 401,
        "auth still applies from the last state:\n{r}"
    );

    // Back on the same port with a new mounted virtual key: once the filter has reconnected
    // and received the new state, the new key is accepted and the old one refused.
    let new_key = ai_router_e2e::new_virtual_key();
    gw.cp
        .restart(&[("STARCI_AI_KEY".to_string(), new_key.clone())])
        .await
        .unwrap();
    ai_router_e2e::poll(
        "the filter to reconnect and accept the new virtual key",
        Duration::from_secs(45),
        || {
            let c = gw.client.clone();
            let k = new_key.clone();
            async move {
                let r = c.chat("chat", Some(&k)).await?;
                Ok((r.status == 200).then_some(()))
            }
        },
    )
    .await
    .unwrap();
    let r = gw.chat("chat").await.unwrap();
    assert_eq!(
        r.status, 401,
        "the old virtual key is gone with the new state:\n{r}"
    );
    let r = gw.client.chat("chat", Some(&new_key)).await.unwrap();
    assert_eq!(r.status, 200, "{r}");
    assert_eq!(r.content(), Some("Hello there"), "{r}");

    let logs = format!("{}\n{}", gw.cp.logs(), gw.envoy.logs());
    assert!(
        !logs.contains(&new_key),
        "the new virtual key appears in the logs"
    );
    gw.check_no_secrets_in_logs().unwrap();
}

/// Runs `ai-router serve` on `config` and expects a refusal: a non-zero exit before it binds,
/// stderr naming `field`, and none of `secrets` in any output.
async fn assert_refused(test: &str, config: &str, field: &str, secrets: &[&str]) {
    let dir = TestDir::new(test).unwrap();
    let path = dir.write("pool.yaml", config).unwrap();
    let args = [
        "serve",
        "--config",
        &path.display().to_string(),
        "--http-listen",
        "127.0.0.1:0",
        "--grpc-listen",
        "127.0.0.1:0",
    ]
    .map(String::from);
    let env = [
        ("P1_KEY_A".to_string(), "sk-p1-a-envvalue".to_string()),
        (
            "STARCI_AI_KEY".to_string(),
            ai_router_e2e::new_virtual_key(),
        ),
    ];
    let mut p = Process::spawn(&dir, "serve", &ai_router_bin().unwrap(), &args, &env).unwrap();
    let status = p
        .wait_exit(Duration::from_secs(20))
        .await
        .unwrap_or_else(|e| panic!("serve must refuse this config and exit: {e:#}"));
    let logs = p.logs();
    assert!(
        !status.success(),
        "serve accepted a bad config ({status}):\n{}",
        p.tail()
    );
    assert!(
        !logs
            .lines()
            .any(|l| l.trim_start().starts_with("{\"http\"")),
        "serve bound its ports before refusing:\n{}",
        p.tail()
    );
    assert!(
        logs.contains(field),
        "the refusal must name {field:?}:\n{}",
        p.tail()
    );
    for s in secrets {
        assert!(
            !logs.contains(s),
            "the literal secret {s:?} was printed:\n{}",
            p.tail()
        );
    }
}

fn pool_with(provider_extra: &str, key_entry: &str) -> String {
    format!(
        r#"gateway:
  host: 127.0.0.1
  port: 0
providers:
  - id: p1
    kind: openai-compatible
    baseUrl: http://127.0.0.1:9/v1
{provider_extra}    keys:
      - {key_entry}
    models:
      - {{ id: m1, aliases: [chat] }}
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_refuses_a_literal_secret_naming_the_field() {
    let secret = "sk-literal-9f8e7d6c5b4a39281706f5e4d3c2b1a0";
    assert_refused(
        "refuse_literal_api_key",
        &pool_with("", &format!("{{ alias: a, apiKey: {secret} }}")),
        "apiKey",
        &[secret],
    )
    .await;
    let header_secret = "Bearer sk-literal-0a1b2c3d4e5f60718293a4b5c6d7e8f9";
    assert_refused(
        "refuse_literal_auth_header",
        &pool_with(
            &format!("    headers: {{ authorization: \"{header_secret}\" }}\n"),
            "{ alias: a, env: P1_KEY_A }",
        ),
        "authorization",
        &[header_secret, "sk-literal-0a1b2c3d4e5f60718293a4b5c6d7e8f9"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_refuses_an_unknown_field_naming_it() {
    assert_refused(
        "refuse_unknown_provider_field",
        &pool_with("    colour: blue\n", "{ alias: a, env: P1_KEY_A }"),
        "colour",
        &[],
    )
    .await;
    let top_level = format!(
        "gatewayy: {{ port: 0 }}\n{}",
        pool_with("", "{ alias: a, env: P1_KEY_A }")
    );
    assert_refused(
        "refuse_unknown_top_level_field",
        &top_level,
        "gatewayy",
        &[],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn render_envoy_of_the_example_pool_equals_the_checked_in_envoy_yaml() {
    let root = workspace_root();
    let checked_in = root.join("envoy/envoy.yaml");
    let regenerate =
        "regenerate it with: cargo run -q -p ai-router-control-plane --bin ai-router -- \
                      render-envoy --config examples/pool.yaml > envoy/envoy.yaml";
    let expected = std::fs::read_to_string(&checked_in)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}; {regenerate}", checked_in.display()));
    let out = std::process::Command::new(ai_router_bin().unwrap())
        .args(["render-envoy", "--config", "examples/pool.yaml"])
        .current_dir(&root)
        .env_remove("AI_ROUTER_SYNC_TOKEN")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "render-envoy failed ({}): {stderr}",
        out.status
    );
    let rendered = String::from_utf8_lossy(&out.stdout);
    if rendered != expected {
        let first_diff = rendered
            .lines()
            .zip(expected.lines())
            .enumerate()
            .find(|(_, (a, b))| a != b)
            .map(|(i, (a, b))| format!("line {}:\n  rendered:   {a}\n  checked in: {b}", i + 1))
            .unwrap_or_else(|| {
                format!(
                    "one is a prefix of the other ({} vs {} lines)",
                    rendered.lines().count(),
                    expected.lines().count()
                )
            });
        panic!(
            "`ai-router render-envoy --config examples/pool.yaml` differs from envoy/envoy.yaml at {first_diff}\n{regenerate}"
        );
    }
}
