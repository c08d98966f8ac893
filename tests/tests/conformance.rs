//! Real clients, pointed at Envoy's listener as their base URL: the `openai` Python package and
//! `langchain-openai` complete a chat and a stream (tests/conformance/clients.py), use tools,
//! JSON mode and embeddings (protocols.py), and the SDK raises on every stream the gateway cuts
//! after its first token (cut_streams.py); the `anthropic` SDK on `/v1/messages` and
//! `client.responses` on `/v1/responses`, in Python (ingress.py) and from npm
//! (node/ingress.mjs).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Stdio;
use std::time::Duration;

use ai_router_e2e::{python_bin, script, workspace_root, Gateway};
use serde_json::{json, Value};

/// Runs the Python client script `name` (in tests/conformance/) against the gateway with
/// `env` (the base URL and the virtual key are set); returns its stdout, after saving both of
/// its outputs in the test directory. Panics with them when it does not exit 0 within `limit`.
async fn run_client_script(
    gw: &Gateway,
    name: &str,
    env: &[(&str, &str)],
    limit: Duration,
) -> String {
    let python = python_bin().unwrap();
    run_client(gw, &python, name, env, limit).await
}

/// Runs the npm clients' script `name` (in tests/conformance/node/, whose packages
/// scripts/setup.sh installs) like [`run_client_script`].
async fn run_node_script(
    gw: &Gateway,
    name: &str,
    env: &[(&str, &str)],
    limit: Duration,
) -> String {
    let modules = workspace_root().join("tests/conformance/node/node_modules");
    assert!(
        modules.join("openai").is_dir() && modules.join("@anthropic-ai/sdk").is_dir(),
        "the npm clients are not installed: run scripts/setup.sh"
    );
    let node = std::env::var_os("AI_ROUTER_NODE").unwrap_or_else(|| "node".into());
    run_client(
        gw,
        std::path::Path::new(&node),
        &format!("node/{name}"),
        env,
        limit,
    )
    .await
}

async fn run_client(
    gw: &Gateway,
    program: &std::path::Path,
    name: &str,
    env: &[(&str, &str)],
    limit: Duration,
) -> String {
    let script_path = workspace_root().join("tests/conformance").join(name);
    let mut command = tokio::process::Command::new(program);
    command
        .arg(&script_path)
        .env("AI_ROUTER_BASE_URL", gw.openai_base_url())
        .env("AI_ROUTER_API_KEY", &gw.virtual_key)
        .env("NO_PROXY", "*")
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("ANTHROPIC_BASE_URL")
        .env_remove("HTTP_PROXY")
        .env_remove("HTTPS_PROXY")
        .env_remove("http_proxy")
        .env_remove("https_proxy")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (k, v) in env {
        command.env(k, v);
    }
    let child = command
        .spawn()
        .unwrap_or_else(|e| panic!("running {}: {e}", program.display()));
    let out = tokio::time::timeout(limit, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{name} finishes within {limit:?}"))
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // `node/ingress.mjs` → `node-ingress`: each client's outputs have their own name.
    let stem = name
        .replace('/', "-")
        .trim_end_matches(".py")
        .trim_end_matches(".mjs")
        .to_string();
    std::fs::write(gw.dir.join(&format!("{stem}.stdout")), stdout.as_bytes()).unwrap();
    std::fs::write(gw.dir.join(&format!("{stem}.stderr")), stderr.as_bytes()).unwrap();
    assert!(
        out.status.success(),
        "{} {} exited {}\n----- stdout -----\n{stdout}\n----- stderr -----\n{stderr}",
        program.display(),
        script_path.display(),
        out.status
    );
    stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_and_langchain_python_clients_chat_and_stream_through_the_gateway() {
    let gw = Gateway::start("python_clients").await.expect("fixture");
    let reply = script::stream(&["Hello", " from", " the", " pool"]);
    for mock in [&gw.mock1, &gw.mock2] {
        mock.script(json!([script::always(vec![reply.clone()])]))
            .await
            .unwrap();
    }

    run_client_script(
        &gw,
        "clients.py",
        &[
            ("AI_ROUTER_MODEL", "chat"),
            ("AI_ROUTER_EXPECT", "Hello from the pool"),
        ],
        Duration::from_secs(180),
    )
    .await;
    assert!(
        !gw.mock1.calls().await.unwrap().is_empty() || !gw.mock2.calls().await.unwrap().is_empty(),
        "the clients' calls reached a provider"
    );
    gw.check_no_secrets_in_logs().unwrap();
}

/// The models every protocol pool serves on mock 1 (`chat`, `tools`, `json`, under provider
/// `llm` of `kind`, keys `a` and `b`) and the embeddings model on mock 2 (`embed`, 8
/// dimensions, provider `emb`, openai-compatible, key `c`).
fn protocols_pool(kind: &'static str) -> impl Fn(&str, &str) -> String {
    move |p1: &str, p2: &str| {
        format!(
            r#"gateway:
  host: 127.0.0.1
  port: 0
  adminToken: {{ env: AI_ROUTER_ADMIN_TOKEN }}
  keyStore: {{ type: memory }}
controlPlane:
  host: 127.0.0.1
  httpPort: 0
  grpcPort: 0
providers:
  - id: llm
    kind: {kind}
    baseUrl: {p1}
    keys:
      - {{ alias: a, env: P1_KEY_A }}
      - {{ alias: b, env: P1_KEY_B }}
    models:
      - {{ id: m-chat, aliases: [chat] }}
      - {{ id: m-tools, aliases: [tools] }}
      - {{ id: m-json, aliases: [json] }}
  - id: emb
    kind: openai-compatible
    baseUrl: {p2}
    keys:
      - {{ alias: c, env: P2_KEY_C }}
    models:
      - {{ id: te3, aliases: [embed], capabilities: [embeddings], dimensions: 8 }}
defaults:
  deadlineMs: 30000
resilience:
  backoff: {{ baseMs: 10, factor: 2, maxMs: 50 }}
"#
        )
    }
}

/// The mock's rules for the models of [`protocols_pool`]: `m-chat` streams "Hello from the
/// pool", `m-tools` calls get_weather({"city": "Paris"}) in three argument chunks, `m-json`
/// answers {"answer": 42}.
fn protocol_rules() -> Vec<Value> {
    vec![
        script::rule(
            json!({ "model": "m-chat" }),
            vec![script::stream(&["Hello", " from", " the", " pool"])],
        ),
        script::rule(
            json!({ "model": "m-tools" }),
            vec![json!({ "toolCalls": [{
                "name": "get_weather",
                "argumentChunks": ["{\"city\"", ": \"Par", "is\"}"]
            }] })],
        ),
        script::rule(
            json!({ "model": "m-json" }),
            vec![script::text("{\"answer\": 42}")],
        ),
    ]
}

/// Runs tests/conformance/protocols.py against a gateway whose chat provider is of `kind`.
async fn protocol_clients(test: &str, kind: &'static str) {
    let gw = Gateway::start_with(test, protocols_pool(kind))
        .await
        .expect("fixture");
    gw.mock1
        .script(Value::Array(protocol_rules()))
        .await
        .unwrap();
    gw.mock2
        .script(json!([script::always(vec![json!({ "dimensions": 8 })])]))
        .await
        .unwrap();

    run_client_script(
        &gw,
        "protocols.py",
        &[
            ("AI_ROUTER_CHAT_MODEL", "chat"),
            ("AI_ROUTER_EXPECT", "Hello from the pool"),
            ("AI_ROUTER_TOOLS_MODEL", "tools"),
            ("AI_ROUTER_JSON_MODEL", "json"),
            ("AI_ROUTER_EMBED_MODEL", "embed"),
            ("AI_ROUTER_EMBED_DIMENSIONS", "8"),
        ],
        Duration::from_secs(240),
    )
    .await;

    // The calls went where the kind says: the Messages API for anthropic, chat completions
    // otherwise; embeddings always to the OpenAI-compatible provider.
    let chat_calls = gw.mock1.calls().await.unwrap();
    let expected_path = if kind == "anthropic" {
        "/v1/messages"
    } else {
        "/v1/chat/completions"
    };
    assert!(!chat_calls.is_empty(), "no chat call reached the provider");
    for c in &chat_calls {
        assert!(
            c.path.ends_with(expected_path),
            "{kind}: a chat call went to {}",
            c.path
        );
    }
    let embed_calls = gw.mock2.calls().await.unwrap();
    assert!(
        embed_calls.len() >= 4,
        "the embeddings calls reached the embeddings provider: {embed_calls:?}"
    );
    assert!(embed_calls
        .iter()
        .all(|c| c.path.ends_with("/v1/embeddings") && c.model.as_deref() == Some("te3")));
    gw.check_no_secrets_in_logs().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_clients_use_tools_json_mode_streams_and_embeddings_with_an_openai_provider() {
    protocol_clients("python_protocols_openai", "openai-compatible").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_clients_use_tools_json_mode_streams_and_embeddings_with_an_anthropic_provider()
{
    protocol_clients("python_protocols_anthropic", "anthropic").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_raises_on_every_stream_cut_after_its_first_token() {
    // One model per cut; profile `quick` gives 1 s between chunks.
    let gw = Gateway::start_with("python_cut_streams", |p1, p2| {
        ai_router_e2e::standard_pool(p1, p2).replace(
            "      - { id: m1, aliases: [chat] }\n",
            "      - { id: m1, aliases: [chat] }\n      - { id: m-event }\n      - { id: m-malformed }\n      - { id: m-truncate }\n      - { id: m-reset }\n      - { id: m-silent }\n",
        )
        .replace(
            "resilience:\n",
            "profiles:\n  quick: { model: m-silent, timeoutMs: 1000 }\nresilience:\n",
        )
    })
    .await
    .expect("fixture");
    let failing = |how: &str| script::stream_failing(&["one", " two", " three"], 1, how);
    gw.mock1
        .script(json!([
            script::rule(json!({ "model": "m-event" }), vec![failing("error-event")]),
            script::rule(
                json!({ "model": "m-malformed" }),
                vec![failing("malformed")]
            ),
            script::rule(json!({ "model": "m-truncate" }), vec![failing("truncate")]),
            script::rule(json!({ "model": "m-reset" }), vec![failing("network")]),
            script::rule(
                json!({ "model": "m-silent" }),
                vec![json!({
                    "stream": { "chunks": ["one", " two"], "stallAfter": 1, "stallMs": 5000 }
                })]
            ),
        ]))
        .await
        .unwrap();
    let stdout = run_client_script(
        &gw,
        "cut_streams.py",
        &[(
            "AI_ROUTER_CUTS",
            "m-event=api_error,m-malformed=api_error,m-truncate=api_error,m-reset=transport,quick=transport",
        )],
        Duration::from_secs(120),
    )
    .await;
    eprintln!("{stdout}");
    assert!(
        gw.mock2.calls().await.unwrap().is_empty(),
        "no cut stream is retried"
    );
}

/// Runs tests/conformance/ingress.py (the `anthropic` SDK on `/v1/messages`, the `openai`
/// SDK's `responses` on `/v1/responses`) against a gateway whose provider is of `kind`, then
/// checks what reached the provider: the caller's Messages body as it was for an anthropic
/// provider, its chat-completions translation for any other.
async fn ingress_clients(test: &str, kind: &'static str) {
    let pool = protocols_pool(kind);
    let gw = Gateway::start_with(test, |p1, p2| {
        pool(p1, p2).replace(
            "      - { id: m-json, aliases: [json] }\n",
            "      - { id: m-json, aliases: [json] }\n      - { id: m-cut, aliases: [cut] }\n      - { id: m-flaky, aliases: [flaky] }\n",
        )
    })
    .await
    .expect("fixture");
    let hello = script::stream(&["Hello", " from", " the", " pool"]);
    // Before its first token: the gateway fails over to the next lane, unseen.
    let early_failure = script::stream_failing(&["never"], 0, "error-event");
    let mut rules = protocol_rules();
    rules.push(script::rule(
        json!({ "model": "m-cut" }),
        vec![script::stream_failing(&["one", " two"], 1, "error-event")],
    ));
    // One failure, then the answer, for each protocol in turn.
    rules.push(script::rule(
        json!({ "model": "m-flaky" }),
        vec![early_failure.clone(), hello.clone(), early_failure, hello],
    ));
    gw.mock1.script(Value::Array(rules)).await.unwrap();

    let env = [
        ("AI_ROUTER_CHAT_MODEL", "chat"),
        ("AI_ROUTER_EXPECT", "Hello from the pool"),
        ("AI_ROUTER_TOOLS_MODEL", "tools"),
        ("AI_ROUTER_JSON_MODEL", "json"),
        ("AI_ROUTER_CUT_MODEL", "cut"),
        ("AI_ROUTER_FLAKY_MODEL", "flaky"),
    ];
    run_client_script(&gw, "ingress.py", &env, Duration::from_secs(240)).await;
    run_node_script(&gw, "ingress.mjs", &env, Duration::from_secs(240)).await;

    let calls = gw.mock1.calls().await.unwrap();
    let bodies: Vec<String> = calls.iter().map(|c| c.body.to_string()).collect();
    let any = |needle: &str| bodies.iter().any(|b| b.contains(needle));
    if kind == "anthropic" {
        assert!(
            calls.iter().all(|c| c.path.ends_with("/v1/messages")),
            "every call reached the Messages API"
        );
        // Natively: what only the Messages API has reaches the provider as the caller sent it.
        assert!(
            any("\"thinking\":{\"budget_tokens\":1024"),
            "thinking passed on"
        );
        assert!(
            any("\"type\":\"tool_result\""),
            "the tool result passed on as it was"
        );
        assert!(calls
            .iter()
            .any(|c| c.header("anthropic-version").is_some()));
    } else {
        assert!(
            calls
                .iter()
                .all(|c| c.path.ends_with("/v1/chat/completions")),
            "every call reached chat completions"
        );
        assert!(
            !any("\"thinking\""),
            "no Messages-only field reaches an OpenAI provider"
        );
        assert!(
            any("\"role\":\"tool\""),
            "tool results became tool messages"
        );
        assert!(
            any("data:image/png;base64,"),
            "images became image_url parts"
        );
        assert!(any("\"json_schema\""), "text.format became response_format");
    }
    let flaky = calls
        .iter()
        .filter(|c| c.model.as_deref() == Some("m-flaky"))
        .count();
    assert_eq!(flaky, 4, "each protocol's flaky stream failed over once");
    for c in &calls {
        assert!(
            c.header("authorization")
                .is_none_or(|h| !h.contains(&gw.virtual_key))
                && c.header("x-api-key")
                    .is_none_or(|h| !h.contains(&gw.virtual_key)),
            "the virtual key never reaches a provider"
        );
    }
    gw.check_no_secrets_in_logs().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_anthropic_and_responses_clients_with_an_openai_provider() {
    ingress_clients("ingress_clients_openai", "openai-compatible").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_anthropic_and_responses_clients_with_an_anthropic_provider() {
    ingress_clients("ingress_clients_anthropic", "anthropic").await;
}

/// google-genai's `embed_content` (one text, then a batch) on a gemini lane, natively, and on
/// an OpenAI-compatible lane, translated to `/v1/embeddings` and back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_genai_sdk_embeds_on_a_native_and_a_translated_lane() {
    let gw = Gateway::start_with("conformance_genai_embed", ai_router_e2e::gemini_pool)
        .await
        .expect("fixture");
    let base = gw.envoy.base_url();
    for (model, mock, path) in [
        ("gembed", &gw.mock1, "/models/gem-e:batchEmbedContents"),
        ("oembed", &gw.mock2, "/v1/embeddings"),
    ] {
        let env = [
            ("GOOGLE_GEMINI_BASE_URL", base.as_str()),
            ("GEMINI_API_KEY", gw.virtual_key.as_str()),
            ("AI_ROUTER_MODEL", model),
            ("AI_ROUTER_DIMENSIONS", "8"),
        ];
        run_client_script(&gw, "gemini_embed.py", &env, Duration::from_secs(60)).await;
        let calls = mock.calls().await.unwrap();
        assert!(
            calls.len() == 2 && calls.iter().all(|c| c.path.ends_with(path)),
            "{model}: {:?}",
            calls.iter().map(|c| &c.path).collect::<Vec<_>>()
        );
    }
}
