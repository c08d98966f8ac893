//! Real clients, pointed at Envoy's listener as their base URL: the `openai` Python package and
//! `langchain-openai` complete a chat and a stream (tests/conformance/clients.py).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Stdio;
use std::time::Duration;

use ai_router_e2e::{python_bin, script, workspace_root, Gateway};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_and_langchain_python_clients_chat_and_stream_through_the_gateway() {
    let python = python_bin().unwrap();
    let gw = Gateway::start("python_clients").await.expect("fixture");
    let reply = script::stream(&["Hello", " from", " the", " pool"]);
    for mock in [&gw.mock1, &gw.mock2] {
        mock.script(json!([script::always(vec![reply.clone()])]))
            .await
            .unwrap();
    }

    let script_path = workspace_root().join("tests/conformance/clients.py");
    let child = tokio::process::Command::new(&python)
        .arg(&script_path)
        .env("AI_ROUTER_BASE_URL", gw.openai_base_url())
        .env("AI_ROUTER_API_KEY", &gw.virtual_key)
        .env("AI_ROUTER_MODEL", "chat")
        .env("AI_ROUTER_EXPECT", "Hello from the pool")
        .env("NO_PROXY", "*")
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("HTTP_PROXY")
        .env_remove("HTTPS_PROXY")
        .env_remove("http_proxy")
        .env_remove("https_proxy")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("running {}: {e}", python.display()));
    let out = tokio::time::timeout(Duration::from_secs(180), child.wait_with_output())
        .await
        .expect("the client script finishes within 3 minutes")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    std::fs::write(gw.dir.join("clients.stdout"), stdout.as_bytes()).unwrap();
    std::fs::write(gw.dir.join("clients.stderr"), stderr.as_bytes()).unwrap();
    assert!(
        out.status.success(),
        "{} {} exited {}\n----- stdout -----\n{stdout}\n----- stderr -----\n{stderr}",
        python.display(),
        script_path.display(),
        out.status
    );
    assert!(
        !gw.mock1.calls().await.unwrap().is_empty() || !gw.mock2.calls().await.unwrap().is_empty(),
        "the clients' calls reached a provider"
    );
    gw.check_no_secrets_in_logs().unwrap();
}
