//! The coding agents users run, pinned in tests/conformance/node/package.json and installed by
//! scripts/setup.sh, pointed at the gateway exactly as the README's "Use it with…" section
//! says, with mock providers behind it: Claude Code (`claude -p`) on a lane of its own
//! protocol (kind anthropic, `/v1/messages` passed natively) and on a translated one
//! (openai-compatible); Codex (`codex exec`) on an openai lane (`/v1/responses` natively) and
//! on a translated one; the Gemini CLI (`gemini -p`) and Google's genai SDKs (npm and PyPI) on
//! the Gemini API, translated lanes behind it; Qwen Code (`qwen -p`) and opencode
//! (`opencode run`), OpenAI Chat Completions callers, on an anthropic lane (translated) with an
//! openai-compatible fallback; the Vercel AI SDK (`ai` with its OpenAI, Anthropic and Google
//! providers) and the OpenAI Agents SDK (its Responses and Chat Completions models) on each
//! protocol's own lane and a translated one; aider (`aider --message`, from .venv-aider) through
//! litellm's OpenAI and Anthropic providers. Each must exit 0 with the mock's answer as its own.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use ai_router_e2e::{script, workspace_root, Gateway};
use serde_json::{json, Value};

/// An agent run may take a while on a loaded machine (Claude Code starts a Node runtime of
/// ~200 MB); it talks only to the gateway.
const AGENT_LIMIT: Duration = Duration::from_secs(180);

/// `claude` (kind anthropic, mock 1, key a) serving `claude-m`; `gpt` (kind openai, mock 1,
/// key b) serving `gpt-m`; `p2` (openai-compatible, mock 2, key c) serving `m2`. No fallbacks:
/// each model is served by the lane the test names.
fn agents_pool(p1: &str, p2: &str) -> String {
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
  - id: claude
    kind: anthropic
    baseUrl: {p1}
    keys:
      - {{ alias: a, env: P1_KEY_A }}
    models:
      - {{ id: claude-m }}
  - id: gpt
    kind: openai
    baseUrl: {p1}
    keys:
      - {{ alias: b, env: P1_KEY_B }}
    models:
      - {{ id: gpt-m }}
  - id: p2
    kind: openai-compatible
    baseUrl: {p2}
    keys:
      - {{ alias: c, env: P2_KEY_C }}
    models:
      - {{ id: m2 }}
defaults:
  deadlineMs: 60000
"#
    )
}

/// The agent's executable in tests/conformance/node/node_modules/.bin.
fn agent_bin(name: &str) -> PathBuf {
    let bin = workspace_root()
        .join("tests/conformance/node/node_modules/.bin")
        .join(name);
    assert!(
        bin.exists(),
        "{} is not installed: run scripts/setup.sh (npm ci in tests/conformance/node)",
        bin.display()
    );
    bin
}

struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
    /// How long the agent ran (the WebSocket refusal is measured by it).
    took: Duration,
}

/// Runs `program args` in `cwd` with only `env` (plus PATH) set, saving its outputs as
/// `<name>.stdout` / `.stderr` in the test directory.
async fn run_agent(
    gw: &Gateway,
    name: &str,
    program: &Path,
    args: &[&str],
    cwd: &Path,
    env: &[(&str, String)],
) -> Run {
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .current_dir(cwd)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("NO_PROXY", "*")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (k, v) in env {
        command.env(k, v);
    }
    let started = Instant::now();
    let child = command
        .spawn()
        .unwrap_or_else(|e| panic!("running {}: {e}", program.display()));
    let out = tokio::time::timeout(AGENT_LIMIT, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{name} finishes within {AGENT_LIMIT:?}"))
        .unwrap();
    let run = Run {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        took: started.elapsed(),
    };
    std::fs::write(gw.dir.join(&format!("{name}.stdout")), &run.stdout).unwrap();
    std::fs::write(gw.dir.join(&format!("{name}.stderr")), &run.stderr).unwrap();
    run
}

fn dir_in(gw: &Gateway, name: &str) -> PathBuf {
    let dir = gw.dir.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `claude -p "Say hi" --model MODEL --output-format json` with the README's settings.
async fn claude(gw: &Gateway, name: &str, model: &str) -> Run {
    claude_with(gw, name, model, &[]).await
}

/// [`claude`] with `extra` variables set over the README's (another key, fewer retries).
async fn claude_with(gw: &Gateway, name: &str, model: &str, extra: &[(&str, String)]) -> Run {
    let home = dir_in(gw, &format!("{name}-home"));
    let mut env = vec![
        ("ANTHROPIC_BASE_URL", gw.envoy.base_url()),
        ("ANTHROPIC_API_KEY", gw.virtual_key.clone()),
        ("DISABLE_TELEMETRY", "1".to_string()),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".to_string()),
        ("HOME", home.display().to_string()),
    ];
    env.extend_from_slice(extra);
    let args = ["-p", "Say hi", "--model", model, "--output-format", "json"];
    run_agent(gw, name, &agent_bin("claude"), &args, &home, &env).await
}

/// Claude Code's `--output-format json` result: exit 0, no error, the answer in `result`.
fn claude_answer(run: &Run) -> String {
    let line = run
        .stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .unwrap_or("");
    let v: Value = serde_json::from_str(line).unwrap_or(Value::Null);
    assert!(
        run.ok && v["is_error"] == false,
        "claude failed\n----- stdout -----\n{}\n----- stderr -----\n{}",
        run.stdout,
        run.stderr
    );
    v["result"].as_str().unwrap_or("").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_answers_through_a_native_and_a_translated_lane() {
    let gw = Gateway::start_with("agents_claude_code", agents_pool)
        .await
        .expect("fixture");
    for mock in [&gw.mock1, &gw.mock2] {
        mock.script(json!([script::always(vec![script::stream(&[
            "Hi", " from", " the", " pool"
        ])])]))
        .await
        .unwrap();
    }

    // Its own protocol: the request goes to the anthropic lane as Claude Code wrote it.
    let run = claude(&gw, "claude-native", "claude-m").await;
    assert_eq!(claude_answer(&run), "Hi from the pool");
    let calls = gw.mock1.calls().await.unwrap();
    let call = calls
        .iter()
        .find(|c| c.path.ends_with("/messages"))
        .unwrap_or_else(|| panic!("an anthropic call in {calls:?}"));
    for field in [
        "context_management",
        "thinking",
        "output_config",
        "metadata",
        "system",
        "tools",
    ] {
        assert!(
            call.body.get(field).is_some(),
            "{field} kept: {}",
            call.body
        );
    }
    assert!(
        call.body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["role"] == "system"),
        "the system turn inside messages, as sent"
    );
    assert!(call
        .header("anthropic-beta")
        .is_some_and(|b| b.contains("claude-code")));
    assert_eq!(
        call.header("anthropic-version").as_deref(),
        Some("2023-06-01")
    );
    assert_eq!(call.key.as_deref(), Some(gw.key_a.as_str()));

    // A translated lane: the system turn folded into the system prompt.
    let run = claude(&gw, "claude-translated", "m2").await;
    assert_eq!(claude_answer(&run), "Hi from the pool");
    let calls = gw.mock2.calls().await.unwrap();
    let call = calls
        .iter()
        .find(|c| c.path.ends_with("/chat/completions"))
        .unwrap_or_else(|| panic!("a chat call in {calls:?}"));
    let roles: Vec<&str> = call.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["role"].as_str())
        .collect();
    assert_eq!(roles[0], "system");
    assert_eq!(
        roles.iter().filter(|r| **r == "system").count(),
        1,
        "{roles:?}"
    );
    for field in ["context_management", "thinking", "output_config"] {
        assert!(
            call.body.get(field).is_none(),
            "{field} dropped: {}",
            call.body
        );
    }
}

/// `$CODEX_HOME/config.toml` pointing Codex at the gateway (the README's settings), plus `extra`.
fn codex_home(gw: &Gateway, name: &str, extra: &str) -> PathBuf {
    let home = dir_in(gw, &format!("{name}-home"));
    let config = format!(
        "model_provider = \"gw\"\n{extra}\n[model_providers.gw]\nname = \"ai-router\"\nbase_url = \"{}\"\nenv_key = \"AI_ROUTER_API_KEY\"\nwire_api = \"responses\"\n",
        gw.openai_base_url()
    );
    std::fs::write(home.join("config.toml"), config).unwrap();
    home
}

async fn codex(gw: &Gateway, name: &str, model: &str, home: &Path) -> Run {
    codex_with(gw, name, model, home, &[]).await
}

/// [`codex`] with `extra` variables set over the README's (another key).
async fn codex_with(
    gw: &Gateway,
    name: &str,
    model: &str,
    home: &Path,
    extra: &[(&str, String)],
) -> Run {
    let work = dir_in(gw, &format!("{name}-work"));
    let mut env = vec![
        ("CODEX_HOME", home.display().to_string()),
        ("HOME", home.display().to_string()),
        ("AI_ROUTER_API_KEY", gw.virtual_key.clone()),
    ];
    env.extend_from_slice(extra);
    let args = ["exec", "--skip-git-repo-check", "-m", model, "Say hi"];
    run_agent(gw, name, &agent_bin("codex"), &args, &work, &env).await
}

fn codex_answer(run: &Run) -> String {
    assert!(
        run.ok,
        "codex failed\n----- stdout -----\n{}\n----- stderr -----\n{}",
        run.stdout, run.stderr
    );
    run.stdout.trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_answers_through_a_native_and_a_translated_lane() {
    let gw = Gateway::start_with("agents_codex", agents_pool)
        .await
        .expect("fixture");
    for mock in [&gw.mock1, &gw.mock2] {
        mock.script(json!([script::always(vec![script::stream(&[
            "Hi", " from", " the", " pool"
        ])])]))
        .await
        .unwrap();
    }

    // An openai lane: the request as Codex wrote it, namespace and hosted tools included.
    let home = codex_home(&gw, "codex-native", "");
    let run = codex(&gw, "codex-native", "gpt-m", &home).await;
    assert_eq!(codex_answer(&run), "Hi from the pool");
    let calls = gw.mock1.calls().await.unwrap();
    let call = calls
        .iter()
        .find(|c| c.path.ends_with("/responses"))
        .unwrap_or_else(|| panic!("a responses call in {calls:?}"));
    let types: Vec<&str> = call.body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["type"].as_str())
        .collect();
    assert!(
        types.contains(&"namespace") && types.contains(&"web_search"),
        "{types:?}"
    );

    // A translated lane refuses its hosted web search, naming it, as Codex shows it.
    let run = codex(&gw, "codex-refused", "m2", &home).await;
    assert!(!run.ok, "{}", run.stdout);
    assert!(
        run.stderr.contains("web_search") || run.stdout.contains("web_search"),
        "the refusal names the tool type\n{}",
        run.stderr
    );
    // With web search off, the namespace's tools flattened to function tools.
    let home = codex_home(&gw, "codex-translated", "web_search = \"disabled\"");
    let run = codex(&gw, "codex-translated", "m2", &home).await;
    assert_eq!(codex_answer(&run), "Hi from the pool");
    let calls = gw.mock2.calls().await.unwrap();
    let call = calls
        .iter()
        .find(|c| c.path.ends_with("/chat/completions"))
        .unwrap_or_else(|| panic!("a chat call in {calls:?}"));
    let names: Vec<&str> = call.body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["function"]["name"].as_str())
        .collect();
    assert!(
        names.iter().any(|n| n.starts_with("multi_agent_v1__")),
        "{names:?}"
    );
}

/// A WebSocket handshake on `/v1/responses` (what Codex's built-in OpenAI provider tries
/// first), sent raw: the status line of the answer.
async fn websocket_handshake(gw: &Gateway) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let authority = gw
        .envoy
        .base_url()
        .trim_start_matches("http://")
        .to_string();
    let mut stream = tokio::net::TcpStream::connect(&authority).await.unwrap();
    let request = format!(
        "GET /v1/responses HTTP/1.1\r\nHost: {authority}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
         Authorization: Bearer {}\r\n\r\n",
        gw.virtual_key
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut answer))
        .await
        .expect("an answer to the handshake")
        .unwrap();
    String::from_utf8_lossy(&answer[..n]).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_with_its_built_in_provider_is_told_at_once_to_use_https() {
    let gw = Gateway::start_with("agents_codex_websocket", agents_pool)
        .await
        .expect("fixture");
    gw.mock1
        .script(json!([script::always(vec![script::stream(&[
            "Hi", " there"
        ])])]))
        .await
        .unwrap();
    let answer = websocket_handshake(&gw).await;
    assert!(
        answer.starts_with("HTTP/1.1 426"),
        "the upgrade refused with 426, which Codex reads as 'use HTTPS':\n{answer}"
    );

    // Its built-in provider pointed at the gateway: one handshake refused, then HTTPS.
    let home = dir_in(&gw, "codex-builtin-home");
    std::fs::write(
        home.join("config.toml"),
        format!("openai_base_url = \"{}\"\n", gw.openai_base_url()),
    )
    .unwrap();
    let work = dir_in(&gw, "codex-builtin-work");
    let env = [
        ("CODEX_HOME", home.display().to_string()),
        ("HOME", home.display().to_string()),
        ("CODEX_API_KEY", gw.virtual_key.clone()),
    ];
    let args = ["exec", "--skip-git-repo-check", "-m", "gpt-m", "Say hi"];
    let run = run_agent(
        &gw,
        "codex-builtin",
        &agent_bin("codex"),
        &args,
        &work,
        &env,
    )
    .await;
    assert_eq!(codex_answer(&run), "Hi there");
    println!("codex exec with its built-in provider took {:?}", run.took);
}

/// A file in the agent's working directory whose content only a tool call can read.
const NOTE: &str = "NOTE-CONTENT-42";

/// The mock's script for a tool round trip: a call of `tool` with `arguments`, then (once the
/// result is sent back) the final answer.
fn tool_round_trip(tool: &str, arguments: Value) -> Value {
    json!([script::always(vec![
        json!({ "toolCalls": [{ "id": "call_note", "name": tool, "arguments": arguments }] }),
        script::stream(&["The note", " was read."]),
    ])])
}

/// The tool's result (the note, under the call's id) reached the model: it is in a request
/// the mock saw after its first `first + 1` calls (`first`: the calls before the agent ran).
async fn assert_result_sent_back(mock: &ai_router_e2e::Mock, name: &str, first: usize) {
    let calls = mock.calls().await.unwrap();
    let later: Vec<String> = calls
        .iter()
        .skip(first + 1)
        .map(|c| c.body.to_string())
        .collect();
    assert!(
        later
            .iter()
            .any(|b| b.contains(NOTE) && b.contains("call_note")),
        "{name}: the tool's result went back to the model:\n{later:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_runs_a_tool_and_sends_its_result_back_on_either_lane_kind() {
    let gw = Gateway::start_with("agents_claude_tools", agents_pool)
        .await
        .expect("fixture");
    for (name, model, mock) in [
        ("claude-tool-native", "claude-m", &gw.mock1),
        ("claude-tool-translated", "m2", &gw.mock2),
    ] {
        let home = dir_in(&gw, &format!("{name}-home"));
        let note = home.join("note.txt");
        std::fs::write(&note, NOTE).unwrap();
        mock.script(tool_round_trip(
            "Read",
            json!({ "file_path": note.display().to_string() }),
        ))
        .await
        .unwrap();
        let run = claude(&gw, name, model).await;
        assert_eq!(claude_answer(&run), "The note was read.");
        assert_result_sent_back(mock, name, 0).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_runs_a_tool_and_sends_its_result_back_on_either_lane_kind() {
    let gw = Gateway::start_with("agents_codex_tools", agents_pool)
        .await
        .expect("fixture");
    for (name, model, mock) in [
        ("codex-tool-native", "gpt-m", &gw.mock1),
        ("codex-tool-translated", "m2", &gw.mock2),
    ] {
        let home = codex_home(&gw, name, "web_search = \"disabled\"");
        let work = dir_in(&gw, &format!("{name}-work"));
        std::fs::write(work.join("note.txt"), NOTE).unwrap();
        mock.script(tool_round_trip(
            "exec_command",
            json!({ "cmd": "cat note.txt" }),
        ))
        .await
        .unwrap();
        let run = codex(&gw, name, model, &home).await;
        assert_eq!(codex_answer(&run), "The note was read.");
        assert_result_sent_back(mock, name, 0).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_tokens_is_anthropics_on_an_anthropic_lane_and_the_gateways_otherwise() {
    let gw = Gateway::start_with("agents_count_tokens", agents_pool)
        .await
        .expect("fixture");
    let count = |model: &str| {
        json!({ "model": model, "system": "Be brief.",
                "messages": [{ "role": "user", "content": "How many tokens is this?" }] })
        .to_string()
    };
    let ask = |body: String| {
        gw.client.request(
            reqwest::Method::POST,
            "/v1/messages/count_tokens?beta=true",
            Some(&gw.virtual_key),
            Some(body),
        )
    };
    let reply = ask(count("claude-m")).await.unwrap();
    assert_eq!(reply.status, 200, "{reply}");
    assert!(
        reply.json["input_tokens"].as_u64().is_some_and(|n| n > 0),
        "{reply}"
    );
    let calls = gw.mock1.calls().await.unwrap();
    assert!(
        calls
            .iter()
            .any(|c| c.path.ends_with("/messages/count_tokens")),
        "passed to the anthropic lane: {calls:?}"
    );
    let reply = ask(count("m2")).await.unwrap();
    assert_eq!(reply.status, 200, "{reply}");
    assert!(
        reply.json["input_tokens"].as_u64().is_some_and(|n| n > 0),
        "{reply}"
    );
    assert!(
        gw.mock2.calls().await.unwrap().is_empty(),
        "counted by the gateway"
    );
    // Any other path under /v1/messages answers in Anthropic's shape.
    let reply = gw
        .client
        .request(
            reqwest::Method::POST,
            "/v1/messages/batches",
            Some(&gw.virtual_key),
            Some("{}".into()),
        )
        .await
        .unwrap();
    assert_eq!(
        (reply.status, reply.json["error"]["type"].clone()),
        (404, json!("not_found_error")),
        "{reply}"
    );
}

// ---------------------------------------------------------------------------------------------
// Gemini: Google's genai SDK and the Gemini CLI on the gateway's Gemini API, translated lanes
// (openai-compatible mocks) behind it.
// ---------------------------------------------------------------------------------------------

/// The Gemini API's base URL at the gateway (no `/v1beta`: the clients add it).
fn gemini_env(gw: &Gateway) -> Vec<(&'static str, String)> {
    vec![
        ("GOOGLE_GEMINI_BASE_URL", gw.envoy.base_url()),
        ("GEMINI_API_KEY", gw.virtual_key.clone()),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_genai_sdk_generates_streams_and_calls_functions_through_the_gemini_api() {
    let gw = Gateway::start("agents_genai_sdk").await.expect("fixture");
    gw.mock1
        .script(json!([script::rule(
            json!({ "model": "m1" }),
            vec![script::stream(&["Hello", " from", " the", " pool"])]
        ),]))
        .await
        .unwrap();
    gw.mock2.script(weather_round_trip()).await.unwrap();
    let mut env = gemini_env(&gw);
    env.extend([
        ("AI_ROUTER_MODEL", "chat".to_string()),
        ("AI_ROUTER_EXPECT", "Hello from the pool".to_string()),
        ("AI_ROUTER_TOOLS_MODEL", "m2".to_string()),
    ]);
    let node = std::env::var_os("AI_ROUTER_NODE").unwrap_or_else(|| "node".into());
    let work = dir_in(&gw, "genai-work");
    run_client(&gw, Path::new(&node), "node/gemini.mjs", &work, &env).await;
    // The translated request: the system instruction first, the tool's result under its id.
    let calls = gw.mock1.calls().await.unwrap();
    let first = calls.first().expect("a call to p1");
    assert_eq!(
        first.body["messages"][0]["role"], "system",
        "{}",
        first.body
    );
    assert_result_of(&gw.mock2, "call_w", "sunny").await;

    // The Python SDK, the same way (its function response carries no id: matched by name).
    gw.mock2.script(weather_round_trip()).await.unwrap();
    let before = gw.mock2.calls().await.unwrap().len();
    let python = ai_router_e2e::python_bin().unwrap();
    run_client(&gw, &python, "gemini.py", &work, &env).await;
    let calls = gw.mock2.calls().await.unwrap();
    let answer = calls
        .get(before + 1)
        .expect("the function's result sent back");
    assert!(answer.body.to_string().contains("sunny"), "{}", answer.body);
}

/// The mock's script for the SDKs' function call: `get_weather` for Paris, then the answer.
fn weather_round_trip() -> Value {
    json!([script::always(vec![
        json!({ "toolCalls": [{ "id": "call_w", "name": "get_weather", "arguments": { "city": "Paris" } }] }),
        script::stream(&["Sunny", " in Paris."]),
    ])])
}

/// Runs the client script `script` (under tests/conformance/) with `program`; it must exit 0.
async fn run_client(
    gw: &Gateway,
    program: &Path,
    script: &str,
    cwd: &Path,
    env: &[(&str, String)],
) {
    let path = workspace_root().join("tests/conformance").join(script);
    let name = script.replace('/', "-");
    let run = run_agent(gw, &name, program, &[path.to_str().unwrap()], cwd, env).await;
    assert!(
        run.ok,
        "{script} failed\n----- stdout -----\n{}\n----- stderr -----\n{}",
        run.stdout, run.stderr
    );
}

/// A request the mock saw after the first carries the tool's `result` under the call's `id`.
async fn assert_result_of(mock: &ai_router_e2e::Mock, id: &str, result: &str) {
    let calls = mock.calls().await.unwrap();
    let later: Vec<String> = calls.iter().skip(1).map(|c| c.body.to_string()).collect();
    assert!(
        later.iter().any(|b| b.contains(result) && b.contains(id)),
        "the function's result went back to the model:\n{later:?}"
    );
}

/// Raw Gemini API calls: the key by `?key=` (never forwarded), the JSON-array stream without
/// `alt=sse`, and an error in Google's shape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gemini_api_takes_a_query_key_and_streams_a_json_array() {
    let gw = Gateway::start("agents_gemini_raw").await.expect("fixture");
    gw.mock1
        .script(json!([script::always(vec![script::stream(&[
            "Hi", " there"
        ])])]))
        .await
        .unwrap();
    let body = json!({ "contents": [{ "role": "user", "parts": [{ "text": "Say hi" }] }],
                       "generationConfig": { "maxOutputTokens": 20, "thinkingConfig": { "thinkingBudget": 0 } } })
    .to_string();
    let path = format!(
        "/v1beta/models/chat:streamGenerateContent?key={}",
        gw.virtual_key
    );
    let reply = gw
        .client
        .request(reqwest::Method::POST, &path, None, Some(body.clone()))
        .await
        .unwrap();
    assert_eq!(reply.status, 200, "{reply}");
    let chunks = reply
        .json
        .as_array()
        .unwrap_or_else(|| panic!("a JSON array: {reply}"));
    let text: String = chunks
        .iter()
        .filter_map(|c| c["candidates"][0]["content"]["parts"][0]["text"].as_str())
        .collect();
    assert_eq!(text, "Hi there");
    assert_eq!(
        chunks.last().unwrap()["candidates"][0]["finishReason"],
        "STOP"
    );
    let calls = gw.mock1.calls().await.unwrap();
    let call = calls.last().unwrap();
    assert!(call.path.ends_with("/chat/completions"), "{}", call.path);
    assert!(!call.path.contains("key="), "{}", call.path);
    let lane_key = call.key.as_deref().unwrap_or("");
    assert!(lane_key == gw.key_a || lane_key == gw.key_b, "{lane_key}");
    assert!(!call.body.to_string().contains(&gw.virtual_key));
    assert!(call.body.get("thinkingConfig").is_none());
    // Refused in Google's shape: a hosted tool the lane cannot run.
    let refused = json!({ "contents": [{ "role": "user", "parts": [{ "text": "hi" }] }],
                          "tools": [{ "googleSearch": {} }] })
    .to_string();
    let reply = gw
        .client
        .request(
            reqwest::Method::POST,
            &format!("/v1beta/models/chat:generateContent?key={}", gw.virtual_key),
            None,
            Some(refused),
        )
        .await
        .unwrap();
    assert_eq!(
        (reply.status, reply.json["error"]["status"].clone()),
        (400, json!("INVALID_ARGUMENT")),
        "{reply}"
    );
    assert!(reply.json["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("googleSearch")));
}

/// `gemini -p PROMPT -m MODEL` with the README's settings: the gateway as its base URL, the
/// virtual key as its API key, telemetry, usage statistics and update checks off.
async fn gemini_cli(gw: &Gateway, name: &str, model: &str, prompt: &str) -> Run {
    gemini_cli_with(gw, name, model, prompt, &[], None).await
}

/// [`gemini_cli`] with `extra` variables set over the README's (another key), and at most
/// `max_attempts` attempts per model call (`general.maxAttempts`; its default is 10, with
/// backoff).
async fn gemini_cli_with(
    gw: &Gateway,
    name: &str,
    model: &str,
    prompt: &str,
    extra: &[(&str, String)],
    max_attempts: Option<u32>,
) -> Run {
    let home = dir_in(gw, &format!("{name}-home"));
    let settings = home.join(".gemini");
    std::fs::create_dir_all(&settings).unwrap();
    std::fs::write(
        settings.join("settings.json"),
        json!({
            "security": { "auth": { "selectedType": "gemini-api-key" } },
            "privacy": { "usageStatisticsEnabled": false },
            "telemetry": { "enabled": false },
            "general": { "enableAutoUpdate": false, "enableAutoUpdateNotification": false,
                         "maxAttempts": max_attempts },
        })
        .to_string(),
    )
    .unwrap();
    let mut env = gemini_env(gw);
    env.extend([
        ("HOME", home.display().to_string()),
        ("GEMINI_CLI_TRUST_WORKSPACE", "true".to_string()),
        ("GEMINI_CLI_NO_RELAUNCH", "true".to_string()),
    ]);
    env.extend_from_slice(extra);
    let args = ["-p", prompt, "-m", model, "--output-format", "json"];
    run_agent(gw, name, &agent_bin("gemini"), &args, &home, &env).await
}

/// The Gemini CLI's `--output-format json` result: exit 0, the answer in `response`.
fn gemini_answer(run: &Run) -> String {
    let start = run.stdout.find('{').unwrap_or(0);
    let v: Value = serde_json::from_str(&run.stdout[start..]).unwrap_or(Value::Null);
    assert!(
        run.ok && v.get("error").is_none_or(Value::is_null),
        "gemini failed\n----- stdout -----\n{}\n----- stderr -----\n{}",
        run.stdout,
        run.stderr
    );
    v["response"].as_str().unwrap_or("").trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gemini_cli_answers_and_runs_a_tool_on_a_translated_lane() {
    let gw = Gateway::start("agents_gemini_cli").await.expect("fixture");
    // The first lane fails before its first token: the CLI never sees it.
    gw.mock1
        .script(json!([script::always(vec![script::status(
            500,
            json!({}),
            Some(json!({ "error": { "message": "boom", "type": "server_error" } }))
        )])]))
        .await
        .unwrap();
    gw.mock2
        .script(json!([script::always(vec![script::stream(&[
            "Hi", " from", " the", " pool"
        ])])]))
        .await
        .unwrap();
    let run = gemini_cli(&gw, "gemini-text", "chat", "Say hi").await;
    assert_eq!(gemini_answer(&run), "Hi from the pool");
    assert!(
        !gw.mock1.calls().await.unwrap().is_empty(),
        "the first lane was tried"
    );
    println!("gemini -p (text) took {:?}", run.took);

    // A tool round trip: the CLI reads the note with its own tool and sends the result back.
    let name = "gemini-tool";
    let home = gw.dir.join(&format!("{name}-home"));
    std::fs::create_dir_all(&home).unwrap();
    let note = home.join("note.txt");
    std::fs::write(&note, NOTE).unwrap();
    gw.mock2
        .script(tool_round_trip(
            "read_file",
            json!({ "file_path": note.display().to_string() }),
        ))
        .await
        .unwrap();
    let before = gw.mock2.calls().await.unwrap().len();
    let run = gemini_cli(&gw, name, "chat", "Read note.txt").await;
    assert_eq!(gemini_answer(&run), "The note was read.");
    assert_result_sent_back(&gw.mock2, name, before).await;
}

// ---------------------------------------------------------------------------------------------
// Qwen Code and opencode: OpenAI Chat Completions callers, on an anthropic lane (translated)
// that falls back to an openai-compatible one.
// ---------------------------------------------------------------------------------------------

/// [`agents_pool`] with `claude-m` (kind anthropic, mock 1, key a) also named `chat`: a Chat
/// Completions caller is translated to it; `m2` (openai-compatible, mock 2, key c) is its
/// fallback.
fn translated_pool(p1: &str, p2: &str) -> String {
    agents_pool(p1, p2)
        .replace("{ id: claude-m }", "{ id: claude-m, aliases: [chat] }")
        .replace("defaults:\n", "defaults:\n  fallbacks: [m2]\n")
}

/// The first lane fails before its first token (500): the second serves `chunks`.
async fn first_lane_fails(gw: &Gateway, chunks: &[&str]) {
    gw.mock1
        .script(json!([script::always(vec![script::status(
            500,
            json!({}),
            Some(json!({ "type": "error", "error": { "type": "api_error", "message": "boom" } }))
        )])]))
        .await
        .unwrap();
    gw.mock2
        .script(json!([script::always(vec![script::stream(chunks)])]))
        .await
        .unwrap();
}

/// The anthropic lane saw a translated call (on `/v1/messages`, the caller's system prompt
/// folded into `system`).
async fn assert_translated_to_anthropic(gw: &Gateway) {
    let calls = gw.mock1.calls().await.unwrap();
    let call = calls
        .iter()
        .find(|c| c.path.ends_with("/messages"))
        .unwrap_or_else(|| panic!("an anthropic call in {calls:?}"));
    assert!(call.body.get("system").is_some(), "{}", call.body);
    assert!(
        call.body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["role"] == "user" || m["role"] == "assistant"),
        "{}",
        call.body
    );
    assert_eq!(call.key.as_deref(), Some(gw.key_a.as_str()));
}

/// `qwen -p PROMPT --output-format json` with the README's settings: its OpenAI sign-in
/// (`OPENAI_BASE_URL`, `OPENAI_API_KEY`, `OPENAI_MODEL`) at the gateway, and
/// `~/.qwen/settings.json` with usage statistics, telemetry, update checks and its background
/// memory extraction (a second model call per prompt) off.
async fn qwen(gw: &Gateway, name: &str, model: &str, prompt: &str) -> Run {
    let home = dir_in(gw, &format!("{name}-home"));
    let settings = home.join(".qwen");
    std::fs::create_dir_all(&settings).unwrap();
    std::fs::write(
        settings.join("settings.json"),
        json!({
            "security": { "auth": { "selectedType": "openai" } },
            "privacy": { "usageStatisticsEnabled": false },
            "telemetry": { "enabled": false },
            "general": { "enableAutoUpdate": false },
            "memory": { "enableManagedAutoMemory": false },
        })
        .to_string(),
    )
    .unwrap();
    let env = [
        ("OPENAI_BASE_URL", gw.openai_base_url()),
        ("OPENAI_API_KEY", gw.virtual_key.clone()),
        ("OPENAI_MODEL", model.to_string()),
        ("HOME", home.display().to_string()),
        ("QWEN_CODE_NO_RELAUNCH", "true".to_string()),
    ];
    let args = ["-p", prompt, "--output-format", "json"];
    run_agent(gw, name, &agent_bin("qwen"), &args, &home, &env).await
}

/// Qwen Code's `--output-format json` result: exit 0, a JSON array of events ending with a
/// `result` that is not an error.
fn qwen_answer(run: &Run) -> String {
    let start = run.stdout.find('[').unwrap_or(0);
    let v: Value = serde_json::from_str(run.stdout[start..].trim()).unwrap_or(Value::Null);
    let result = v
        .as_array()
        .and_then(|events| events.iter().rev().find(|e| e["type"] == "result"))
        .cloned()
        .unwrap_or(Value::Null);
    assert!(
        run.ok && result["is_error"] == false,
        "qwen failed\n----- stdout -----\n{}\n----- stderr -----\n{}",
        run.stdout,
        run.stderr
    );
    result["result"].as_str().unwrap_or("").trim().to_string()
}

/// The Chat Completions agents.
#[derive(Clone, Copy)]
enum ChatAgent {
    Qwen,
    Opencode,
}

impl ChatAgent {
    fn name(self) -> &'static str {
        match self {
            ChatAgent::Qwen => "qwen",
            ChatAgent::Opencode => "opencode",
        }
    }

    async fn run(self, gw: &Gateway, name: String, model: &str, prompt: &str) -> Run {
        match self {
            ChatAgent::Qwen => qwen(gw, &name, model, prompt).await,
            ChatAgent::Opencode => opencode(gw, &name, model, prompt).await,
        }
    }

    fn answer(self, run: &Run) -> String {
        match self {
            ChatAgent::Qwen => qwen_answer(run),
            ChatAgent::Opencode => opencode_answer(run),
        }
    }

    /// Its file-reading tool and that tool's path argument.
    fn read_tool(self) -> (&'static str, &'static str) {
        match self {
            ChatAgent::Qwen => ("read_file", "file_path"),
            ChatAgent::Opencode => ("read", "filePath"),
        }
    }
}

/// On [`translated_pool`]: text, a failure before the first token, and a tool round trip.
async fn chat_agent_checks(test: &str, chat_agent: ChatAgent) {
    let gw = Gateway::start_with(test, translated_pool)
        .await
        .expect("fixture");
    let gw = &gw;
    let agent = chat_agent.name();
    let run = |name: String, model: &'static str, prompt: &'static str| {
        chat_agent.run(gw, name, model, prompt)
    };
    let answer = |r: &Run| chat_agent.answer(r);
    let (read, path_arg) = chat_agent.read_tool();
    // Text on the anthropic lane, translated.
    gw.mock1
        .script(json!([script::always(vec![script::stream(&[
            "Hi", " from", " the", " pool"
        ])])]))
        .await
        .unwrap();
    let out = run(format!("{agent}-text"), "chat", "Say hi").await;
    assert_eq!(answer(&out), "Hi from the pool");
    assert_translated_to_anthropic(gw).await;
    println!("{agent} (text) took {:?}", out.took);

    // The anthropic lane fails before its first token: the fallback serves, unseen.
    first_lane_fails(gw, &["Served", " by", " the", " fallback"]).await;
    let tried = gw.mock1.calls().await.unwrap().len();
    let out = run(format!("{agent}-failover"), "chat", "Say hi").await;
    assert_eq!(answer(&out), "Served by the fallback");
    assert!(
        gw.mock1.calls().await.unwrap().len() > tried,
        "the first lane was tried"
    );

    // A tool round trip on the translated lane: the agent reads the note with its own tool.
    let name = format!("{agent}-tool");
    let note = dir_in(gw, &format!("{name}-home")).join("note.txt");
    std::fs::write(&note, NOTE).unwrap();
    gw.mock1
        .script(tool_round_trip(
            read,
            json!({ path_arg: note.display().to_string() }),
        ))
        .await
        .unwrap();
    let before = gw.mock1.calls().await.unwrap().len();
    let out = run(name.clone(), "chat", "Read note.txt").await;
    assert_eq!(answer(&out), "The note was read.");
    assert_result_sent_back(&gw.mock1, &name, before).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qwen_code_answers_fails_over_and_runs_a_tool_on_a_translated_lane() {
    chat_agent_checks("agents_qwen_code", ChatAgent::Qwen).await;
}

/// `opencode run -m gw/MODEL --format json PROMPT` with the README's settings: a provider `gw`
/// (`@ai-sdk/openai-compatible`, bundled) at the gateway in `~/.config/opencode/opencode.json`,
/// the virtual key from `AI_ROUTER_API_KEY`, its title generation (a second model call per
/// session) off, and its update, model-catalog, plugin and LSP downloads off.
async fn opencode(gw: &Gateway, name: &str, model: &str, prompt: &str) -> Run {
    let home = dir_in(gw, &format!("{name}-home"));
    let config = home.join(".config/opencode");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(
        config.join("opencode.json"),
        json!({
            "$schema": "https://opencode.ai/config.json",
            "autoupdate": false,
            "share": "disabled",
            "agent": { "title": { "disable": true } },
            "provider": { "gw": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "ai-router",
                "options": { "baseURL": gw.openai_base_url(), "apiKey": "{env:AI_ROUTER_API_KEY}" },
                "models": { model: {} },
            } },
        })
        .to_string(),
    )
    .unwrap();
    let env = [
        ("HOME", home.display().to_string()),
        ("AI_ROUTER_API_KEY", gw.virtual_key.clone()),
        ("OPENCODE_DISABLE_AUTOUPDATE", "1".to_string()),
        ("OPENCODE_DISABLE_MODELS_FETCH", "1".to_string()),
        ("OPENCODE_DISABLE_DEFAULT_PLUGINS", "1".to_string()),
        ("OPENCODE_DISABLE_LSP_DOWNLOAD", "1".to_string()),
    ];
    let model = format!("gw/{model}");
    let args = ["run", "-m", &model, "--format", "json", prompt];
    run_agent(gw, name, &agent_bin("opencode"), &args, &home, &env).await
}

/// opencode's `--format json` events: exit 0, no `error` event, the answer in its `text` parts.
fn opencode_answer(run: &Run) -> String {
    let events: Vec<Value> = run
        .stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert!(
        run.ok && !events.is_empty() && events.iter().all(|e| e["type"] != "error"),
        "opencode failed\n----- stdout -----\n{}\n----- stderr -----\n{}",
        run.stdout,
        run.stderr
    );
    events
        .iter()
        .filter(|e| e["type"] == "text")
        .filter_map(|e| e["part"]["text"].as_str())
        .collect::<String>()
        .trim()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_answers_fails_over_and_runs_a_tool_on_a_translated_lane() {
    chat_agent_checks("agents_opencode", ChatAgent::Opencode).await;
}

// ---------------------------------------------------------------------------------------------
// Refusals as each agent meets them, in its own protocol's error shape.
// ---------------------------------------------------------------------------------------------

/// A well-formed virtual key the gateway does not know.
fn unknown_key() -> String {
    format!("sk-starci-e2e-{}", "0".repeat(48))
}

/// What an agent printed, both streams.
fn printed(run: &Run) -> String {
    format!("{}\n{}", run.stdout, run.stderr)
}

/// Claude Code's `--output-format json` result of a refused call: exit 1, `is_error`, the
/// gateway's status and Anthropic error type, and its message in `result`.
fn assert_claude_error(run: &Run, status: u16, error_type: &str, message: &str) {
    let line = run
        .stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or("");
    let v: Value = serde_json::from_str(line).unwrap_or(Value::Null);
    assert!(!run.ok, "{}", printed(run));
    assert_eq!(
        (
            v["is_error"].clone(),
            v["api_error_status"].clone(),
            v["api_error_type"].clone()
        ),
        (json!(true), json!(status), json!(error_type)),
        "{}",
        printed(run)
    );
    assert!(
        v["result"].as_str().is_some_and(|r| r.contains(message)),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_agent_shows_an_unknown_virtual_key_as_its_protocols_401() {
    let gw = Gateway::start_with("agents_bad_key", agents_pool)
        .await
        .expect("fixture");
    let bad = unknown_key();
    const MESSAGE: &str = "The API key is unknown, revoked or disabled.";

    // Claude Code reads Anthropic's shape (type authentication_error); it retries even a 401
    // (ten times, with backoff) unless CLAUDE_CODE_MAX_RETRIES says otherwise.
    let extra = [
        ("ANTHROPIC_API_KEY", bad.clone()),
        ("CLAUDE_CODE_MAX_RETRIES", "0".to_string()),
    ];
    let run = claude_with(&gw, "claude-bad-key", "claude-m", &extra).await;
    assert_claude_error(&run, 401, "authentication_error", MESSAGE);

    // Codex reads OpenAI's shape: the status and the error's message.
    let home = codex_home(&gw, "codex-bad-key", "");
    let extra = [("AI_ROUTER_API_KEY", bad.clone())];
    let run = codex_with(&gw, "codex-bad-key", "gpt-m", &home, &extra).await;
    assert!(!run.ok, "{}", printed(&run));
    assert!(
        run.stderr.contains("401 Unauthorized") && run.stderr.contains(MESSAGE),
        "{}",
        printed(&run)
    );

    // The Gemini CLI reads Google's shape: code 401, status UNAUTHENTICATED.
    let extra = [("GEMINI_API_KEY", bad.clone())];
    let run = gemini_cli_with(&gw, "gemini-bad-key", "claude-m", "Say hi", &extra, None).await;
    assert!(!run.ok, "{}", printed(&run));
    let out = printed(&run);
    assert!(
        out.contains("UNAUTHENTICATED") && out.contains("\"code\": 401") && out.contains(MESSAGE),
        "{out}"
    );
    for mock in [&gw.mock1, &gw.mock2] {
        assert!(
            mock.calls().await.unwrap().is_empty(),
            "nothing reached a provider"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_agent_shows_a_rate_limited_pool_in_its_protocols_shape() {
    let gw = Gateway::start_with("agents_rate_limited", agents_pool)
        .await
        .expect("fixture");
    for mock in [&gw.mock1, &gw.mock2] {
        mock.script(json!([script::always(vec![script::status(
            429,
            json!({ "retry-after": "1" }),
            Some(json!({ "error": { "type": "rate_limit_error", "message": "slow down" } }))
        )])]))
        .await
        .unwrap();
    }
    // Every lane of the model answers 429: the gateway's 503 pool_rate_limited (README,
    // "Errors"), each agent's retries turned off so that it shows the first answer.
    const MESSAGE: &str = "Every key that can serve this call is rate limited.";
    let extra = [("CLAUDE_CODE_MAX_RETRIES", "0".to_string())];
    let run = claude_with(&gw, "claude-rate-limited", "claude-m", &extra).await;
    assert_claude_error(&run, 503, "overloaded_error", MESSAGE);

    let home = codex_home(&gw, "codex-rate-limited", "");
    let config = std::fs::read_to_string(home.join("config.toml")).unwrap();
    std::fs::write(
        home.join("config.toml"),
        format!("{config}request_max_retries = 0\nstream_max_retries = 0\n"),
    )
    .unwrap();
    let run = codex(&gw, "codex-rate-limited", "gpt-m", &home).await;
    assert!(!run.ok, "{}", printed(&run));
    assert!(
        run.stderr.contains("503 Service Unavailable") && run.stderr.contains(MESSAGE),
        "{}",
        printed(&run)
    );

    let run = gemini_cli_with(
        &gw,
        "gemini-rate-limited",
        "claude-m",
        "Say hi",
        &[],
        Some(1),
    )
    .await;
    assert!(!run.ok, "{}", printed(&run));
    let out = printed(&run);
    assert!(
        out.contains("\"code\": 503") && out.contains(MESSAGE),
        "{out}"
    );
}

// ---------------------------------------------------------------------------------------------
// The Vercel AI SDK (`ai` with its OpenAI, Anthropic and Google providers), each provider on a
// lane of its own protocol where one exists and on a translated one.
// ---------------------------------------------------------------------------------------------

/// The SDKs driven by a client script under tests/conformance/ that takes `VARIANT MODEL
/// CHECK...` (the checks `text`, `stream`, `tools`, `refused`; the script says what each does).
#[derive(Clone, Copy)]
enum Sdk {
    /// The Vercel AI SDK (node/ai_sdk.mjs); variants are its providers.
    Vercel,
    /// The OpenAI Agents SDK (agents_sdk.py); variants are its model classes.
    OpenAiAgents,
}

/// Runs `sdk`'s script with the README's settings and `extra` variables (the expected answer,
/// another key); it must exit 0.
async fn sdk(
    gw: &Gateway,
    sdk: Sdk,
    variant: &str,
    model: &str,
    checks: &[&str],
    extra: &[(&str, String)],
) {
    let (label, program, script, base_url) = match sdk {
        Sdk::Vercel => (
            "ai-sdk",
            PathBuf::from(std::env::var_os("AI_ROUTER_NODE").unwrap_or_else(|| "node".into())),
            "node/ai_sdk.mjs",
            gw.envoy.base_url(),
        ),
        Sdk::OpenAiAgents => (
            "agents-sdk",
            ai_router_e2e::python_bin().unwrap(),
            "agents_sdk.py",
            gw.openai_base_url(),
        ),
    };
    let script = workspace_root().join("tests/conformance").join(script);
    let mut args = vec![script.to_str().unwrap(), variant, model];
    args.extend_from_slice(checks);
    let mut env = vec![
        ("AI_ROUTER_BASE_URL", base_url),
        ("AI_ROUTER_API_KEY", gw.virtual_key.clone()),
        ("OPENAI_AGENTS_DISABLE_TRACING", "1".to_string()),
    ];
    env.extend_from_slice(extra);
    let name = format!("{label}-{variant}-{model}-{}", checks.join("-"));
    let work = dir_in(gw, &format!("{name}-work"));
    let run = run_agent(gw, &name, &program, &args, &work, &env).await;
    assert!(
        run.ok,
        "{name} failed\n----- stdout -----\n{}\n----- stderr -----\n{}",
        run.stdout, run.stderr
    );
}

/// For each `(variant, model, mock 1 or 2, the path that mock is called on)`: a text answer, a
/// streamed one and a tool round trip (unary, then streamed), all on that lane, the tool's
/// result sent back under the call's id each time.
async fn sdk_lane_checks(gw: &Gateway, kind: Sdk, lanes: &[(&str, &str, usize, &str)]) {
    let mocks = [&gw.mock1, &gw.mock2];
    for &(variant, model, n, path) in lanes {
        let mock = mocks[n - 1];
        // The mock's replies in the order the checks ask for them.
        let hi = script::stream(&["Hi", " from", " the", " pool"]);
        let round_trip = [
            json!({ "toolCalls": [{ "id": "call_w", "name": "get_weather", "arguments": { "city": "Paris" } }] }),
            script::stream(&["Sunny", " in Paris."]),
        ];
        let replies = [
            vec![hi.clone(), hi],
            round_trip.to_vec(),
            round_trip.to_vec(),
        ]
        .concat();
        mock.script(json!([script::always(replies)])).await.unwrap();
        mock.clear_calls().await.unwrap();
        let expect = [
            ("AI_ROUTER_EXPECT", "Hi from the pool".to_string()),
            ("AI_ROUTER_EXPECT_TOOLS", "Sunny in Paris.".to_string()),
        ];
        sdk(
            gw,
            kind,
            variant,
            model,
            &["text", "stream", "tools"],
            &expect,
        )
        .await;
        let calls = mock.calls().await.unwrap();
        let paths: Vec<&str> = calls.iter().map(|c| c.path.as_str()).collect();
        assert!(
            paths.len() == 6 && paths.iter().all(|p| p.ends_with(path)),
            "{variant} on {model}: {paths:?}"
        );
        for answer in [&calls[3], &calls[5]] {
            let body = answer.body.to_string();
            assert!(
                body.contains("sunny-and-21C") && body.contains("call_w"),
                "{variant} on {model}: the tool's result under its id: {body}"
            );
        }
    }
}

/// The mock's path for each protocol the SDK's providers reach it with.
const RESPONSES: &str = "/responses";
const MESSAGES: &str = "/messages";
const CHAT: &str = "/chat/completions";

/// Each provider on its own protocol's lane and on a translated one: `(provider, model, mock
/// 1 or 2, the path that mock is called on)`. The Gemini API has no native lane (a `kind:
/// gemini` lane is reached over Google's OpenAI-compatible endpoint): both of Google's are
/// translated.
const AI_SDK_LANES: [(&str, &str, usize, &str); 8] = [
    ("openai", "gpt-m", 1, RESPONSES),
    ("openai", "m2", 2, CHAT),
    ("openai-chat", "m2", 2, CHAT),
    ("openai-chat", "claude-m", 1, MESSAGES),
    ("anthropic", "claude-m", 1, MESSAGES),
    ("anthropic", "m2", 2, CHAT),
    ("google", "m2", 2, CHAT),
    ("google", "claude-m", 1, MESSAGES),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ai_sdk_answers_streams_and_runs_tools_on_native_and_translated_lanes() {
    let gw = Gateway::start_with("agents_ai_sdk", translated_pool)
        .await
        .expect("fixture");
    sdk_lane_checks(&gw, Sdk::Vercel, &AI_SDK_LANES).await;
}

/// [`translated_pool`] whose breakers never open: every call tries the failing first lane
/// again, so each client meets a failover rather than a lane already ruled out.
fn failing_first_lanes_pool(p1: &str, p2: &str) -> String {
    let never_open = "{ failureThreshold: 1000000, cooldownMs: 1000, maxCooldownMs: 1000 }";
    format!(
        "{}resilience:\n  backoff: {{ baseMs: 5, factor: 1, maxMs: 5 }}\n  keyBreaker: {never_open}\n  providerBreaker: {never_open}\n",
        translated_pool(p1, p2)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdks_never_see_a_failover_and_show_a_refusal_as_their_api_errors() {
    let gw = Gateway::start_with("agents_sdks_failover", failing_first_lanes_pool)
        .await
        .expect("fixture");
    // Every first lane (mock 1) fails before its first token; the fallback m2 serves.
    first_lane_fails(&gw, &["Served", " by", " the", " fallback"]).await;
    let expect = [("AI_ROUTER_EXPECT", "Served by the fallback".to_string())];
    for (kind, variant, model) in [
        (Sdk::Vercel, "openai", "gpt-m"),
        (Sdk::Vercel, "openai-chat", "chat"),
        (Sdk::Vercel, "anthropic", "claude-m"),
        (Sdk::Vercel, "google", "chat"),
        (Sdk::OpenAiAgents, "responses", "gpt-m"),
        (Sdk::OpenAiAgents, "chat", "chat"),
    ] {
        let tried = gw.mock1.calls().await.unwrap().len();
        sdk(&gw, kind, variant, model, &["text", "stream"], &expect).await;
        assert_eq!(
            gw.mock1.calls().await.unwrap().len(),
            tried + 2,
            "{variant} on {model}: the first lane was tried for each call"
        );
    }

    // An unknown virtual key: the SDK's own API error (the AI SDK's APICallError, the openai
    // package's AuthenticationError under the Agents SDK) with the gateway's 401 and message.
    let refused = [
        ("AI_ROUTER_API_KEY", unknown_key()),
        ("AI_ROUTER_STATUS", "401".to_string()),
        (
            "AI_ROUTER_MESSAGE",
            "The API key is unknown, revoked or disabled.".to_string(),
        ),
    ];
    gw.mock1.clear_calls().await.unwrap();
    gw.mock2.clear_calls().await.unwrap();
    for (kind, variant) in [
        (Sdk::Vercel, "openai"),
        (Sdk::Vercel, "openai-chat"),
        (Sdk::Vercel, "anthropic"),
        (Sdk::Vercel, "google"),
        (Sdk::OpenAiAgents, "responses"),
        (Sdk::OpenAiAgents, "chat"),
    ] {
        sdk(&gw, kind, variant, "chat", &["refused"], &refused).await;
    }
    for mock in [&gw.mock1, &gw.mock2] {
        assert!(
            mock.calls().await.unwrap().is_empty(),
            "nothing reached a provider"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The OpenAI Agents SDK (`openai-agents`): Runner with its Responses model and its Chat
// Completions model, an `AsyncOpenAI` client at the gateway.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_agents_sdk_runs_streams_and_calls_tools_on_native_and_translated_lanes() {
    let gw = Gateway::start_with("agents_openai_agents_sdk", translated_pool)
        .await
        .expect("fixture");
    let lanes = [
        ("responses", "gpt-m", 1, RESPONSES),
        ("responses", "m2", 2, CHAT),
        ("chat", "m2", 2, CHAT),
        ("chat", "claude-m", 1, MESSAGES),
    ];
    sdk_lane_checks(&gw, Sdk::OpenAiAgents, &lanes).await;
}

// ---------------------------------------------------------------------------------------------
// aider (`aider --message`, in its own venv, .venv-aider: it pins openai 2.x), through litellm's
// OpenAI and Anthropic providers.
// ---------------------------------------------------------------------------------------------

/// `aider --message PROMPT --model MODEL FILES...` in `work` with the README's settings: the
/// gateway as litellm's OpenAI base (`--openai-api-base`) or Anthropic base
/// (`ANTHROPIC_API_BASE`), the virtual key as both API keys, and every network call of its own
/// off (update check, analytics, litellm's and aider's model-price downloads: the model's
/// metadata comes from `--model-metadata-file`).
async fn aider(
    gw: &Gateway,
    name: &str,
    model: &str,
    work: &Path,
    files: &[&str],
    extra: &[(&str, String)],
) -> Run {
    let metadata = work.join("aider-models.json");
    let entry = json!({ "max_input_tokens": 32000, "max_output_tokens": 4096,
                        "input_cost_per_token": 0, "output_cost_per_token": 0, "mode": "chat" });
    std::fs::write(
        &metadata,
        json!({ "openai/chat": entry, "anthropic/claude-m": entry }).to_string(),
    )
    .unwrap();
    let mut env = vec![
        ("HOME", work.display().to_string()),
        ("OPENAI_API_KEY", gw.virtual_key.clone()),
        ("ANTHROPIC_API_KEY", gw.virtual_key.clone()),
        ("ANTHROPIC_API_BASE", gw.envoy.base_url()),
        ("LITELLM_LOCAL_MODEL_COST_MAP", "True".to_string()),
    ];
    env.extend_from_slice(extra);
    let base = gw.openai_base_url();
    let metadata = metadata.display().to_string();
    // Its histories in `work` (by default it writes them at the root of the enclosing git
    // repository, --no-git or not).
    let chat_history = work.join("chat.history.md").display().to_string();
    let input_history = work.join("input.history").display().to_string();
    let mut args = vec![
        "--chat-history-file",
        &chat_history,
        "--input-history-file",
        &input_history,
        "--model",
        model,
        "--openai-api-base",
        &base,
        "--model-metadata-file",
        &metadata,
        "--edit-format",
        "whole",
        "--message",
        "Rewrite note.txt",
        "--yes-always",
        "--no-git",
        "--no-check-update",
        "--analytics-disable",
        "--no-show-model-warnings",
        "--no-show-release-notes",
        "--no-pretty",
    ];
    args.extend_from_slice(files);
    let bin = workspace_root().join(".venv-aider/bin/aider");
    assert!(
        bin.exists(),
        "{} is not installed: run scripts/setup.sh",
        bin.display()
    );
    run_agent(gw, name, &bin, &args, work, &env).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aider_answers_edits_a_file_fails_over_and_shows_a_refusal() {
    let gw = Gateway::start_with("agents_aider", translated_pool)
        .await
        .expect("fixture");
    // A text answer through litellm's OpenAI provider, on the anthropic lane (translated).
    gw.mock1
        .script(json!([script::always(vec![script::stream(&[
            "Hi", " from", " the", " pool"
        ])])]))
        .await
        .unwrap();
    let work = dir_in(&gw, "aider-text");
    let run = aider(&gw, "aider-text", "openai/chat", &work, &[], &[]).await;
    assert!(
        run.ok && run.stdout.contains("Hi from the pool"),
        "{}",
        printed(&run)
    );
    assert_translated_to_anthropic(&gw).await;

    // A file edit through litellm's Anthropic provider, on the anthropic lane (natively): the
    // model's whole-file answer written to note.txt.
    let edit = "note.txt\n```\nEDITED-THROUGH-THE-GATEWAY\n```\n";
    gw.mock1
        .script(json!([script::always(vec![
            json!({ "text": edit, "stream": { "chunks": [&edit[..12], &edit[12..]] } })
        ])]))
        .await
        .unwrap();
    gw.mock1.clear_calls().await.unwrap();
    let work = dir_in(&gw, "aider-edit");
    std::fs::write(work.join("note.txt"), NOTE).unwrap();
    let run = aider(
        &gw,
        "aider-edit",
        "anthropic/claude-m",
        &work,
        &["note.txt"],
        &[],
    )
    .await;
    assert!(run.ok, "{}", printed(&run));
    assert_eq!(
        std::fs::read_to_string(work.join("note.txt")).unwrap(),
        "EDITED-THROUGH-THE-GATEWAY\n",
        "{}",
        printed(&run)
    );
    let calls = gw.mock1.calls().await.unwrap();
    assert!(
        !calls.is_empty() && calls.iter().all(|c| c.path.ends_with("/messages")),
        "{calls:?}"
    );
    assert!(
        calls[0].body.to_string().contains(NOTE),
        "the file went to the model"
    );

    // The anthropic lane fails before its first token: the fallback serves, unseen.
    first_lane_fails(&gw, &["Served", " by", " the", " fallback"]).await;
    let tried = gw.mock1.calls().await.unwrap().len();
    let work = dir_in(&gw, "aider-failover");
    let run = aider(&gw, "aider-failover", "openai/chat", &work, &[], &[]).await;
    assert!(
        run.ok && run.stdout.contains("Served by the fallback"),
        "{}",
        printed(&run)
    );
    assert!(gw.mock1.calls().await.unwrap().len() > tried);

    // An unknown virtual key: litellm's AuthenticationError with the gateway's message.
    let work = dir_in(&gw, "aider-bad-key");
    let extra = [("OPENAI_API_KEY", unknown_key())];
    let run = aider(&gw, "aider-bad-key", "openai/chat", &work, &[], &extra).await;
    // (aider wraps its lines at the terminal's width.)
    let out = printed(&run)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        out.contains("litellm.AuthenticationError")
            && out.contains("The API key is unknown, revoked or disabled."),
        "{out}"
    );
}
