//! Reload under `ai-router up`: a change of the config file adds a provider while Envoy keeps
//! running (its model answers through the same listener), and SIGHUP to the `up` process
//! reloads the pool again without stopping anything; then SIGTERM stops it cleanly.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ai_router_e2e::{scan, script, Client, Mock, TestDir, Up};
use serde_json::json;
use tokio::io::AsyncBufReadExt;

fn pool(mocks: &[&Mock]) -> String {
    let mut yaml = "gateway: { host: 127.0.0.1, port: 0, keyStore: { type: memory } }\n\
                    controlPlane: { host: 127.0.0.1, httpPort: 0, grpcPort: 0 }\n\
                    providers:\n"
        .to_string();
    for (i, mock) in mocks.iter().enumerate() {
        let n = i + 1;
        yaml.push_str(&format!(
            "  - id: p{n}\n    kind: openai-compatible\n    baseUrl: {}/v1\n    keys: [{{ alias: a, env: UP_KEY }}]\n    models: [{{ id: m{n} }}]\n",
            mock.url()
        ));
    }
    yaml.push_str("defaults: { maxAttempts: 2, deadlineMs: 10000 }\n");
    yaml
}

/// Replaces the file whole (written aside, then renamed), as the docs ask.
fn replace(dir: &TestDir, path: &std::path::Path, text: &str) {
    let aside = dir.write("pool.yaml.new", text).unwrap();
    std::fs::rename(aside, path).unwrap();
}

fn signal(pid: u32, sig: &str) {
    let sent = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap();
    assert!(sent.success(), "kill {sig} {pid}");
}

/// Waits until `stderr` holds a line with every one of `parts`.
async fn logged(stderr: &Mutex<Vec<String>>, parts: &[&str], within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        if stderr
            .lock()
            .unwrap()
            .iter()
            .any(|l| parts.iter().all(|p| l.contains(p)))
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no log line with {parts:?}:\n{}",
            stderr.lock().unwrap().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_reloads_on_a_file_change_and_on_sighup_while_envoy_keeps_serving() {
    let dir = TestDir::new("up_reload").unwrap();
    let mock1 = Mock::start(&dir, "mock1").await.unwrap();
    let mock2 = Mock::start(&dir, "mock2").await.unwrap();
    for (mock, text) in [(&mock1, "from p1"), (&mock2, "from p2")] {
        mock.script(json!([script::always(vec![script::text(text)])]))
            .await
            .unwrap();
    }
    let config = dir.write("pool.yaml", &pool(&[&mock1])).unwrap();
    let secret = scan::provider_secret("up-a");
    let Up {
        child: mut up,
        base,
        key,
        ..
    } = Up::start(
        &config,
        &[("UP_KEY", &secret), ("RUST_LOG", "info")],
        std::process::Stdio::piped(),
    )
    .await
    .unwrap();
    let stderr = Arc::new(Mutex::new(Vec::<String>::new()));
    {
        let stderr = stderr.clone();
        let mut lines = tokio::io::BufReader::new(up.stderr.take().unwrap()).lines();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                stderr.lock().unwrap().push(line);
            }
        });
    }
    let client = Client::new(&base).unwrap();
    let pid = up.id().unwrap();

    let r = client.chat("m1", Some(&key)).await.unwrap();
    assert_eq!(r.status, 200, "{r}");
    let r = client.chat("m2", Some(&key)).await.unwrap();
    assert_eq!(r.status, 404, "m2 is not in the pool yet: {r}");

    // The file changes: p2 joins, and its model answers through the same Envoy.
    replace(&dir, &config, &pool(&[&mock1, &mock2]));
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let r = client.chat("m2", Some(&key)).await.unwrap();
        if r.status == 200 {
            assert!(r.text.contains("from p2"), "{r}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "m2 never answered after the reload: {r}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    logged(
        &stderr,
        &["config reloaded", "file changed"],
        Duration::from_secs(5),
    )
    .await;

    // SIGHUP: the pool is read again, up and Envoy keep running and serving.
    signal(pid, "-HUP");
    logged(
        &stderr,
        &["config reloaded", "SIGHUP"],
        Duration::from_secs(10),
    )
    .await;
    assert!(up.try_wait().unwrap().is_none(), "up is still running");
    for (model, text) in [("m1", "from p1"), ("m2", "from p2")] {
        let r = client.chat(model, Some(&key)).await.unwrap();
        assert_eq!(r.status, 200, "{r}");
        assert!(r.text.contains(text), "{r}");
    }
    // A field of Envoy's bootstrap changes: applied at the next start of `up`, and the log says
    // so in `up`'s own words.
    replace(
        &dir,
        &config,
        &pool(&[&mock1, &mock2]).replace(
            "port: 0, keyStore",
            "port: 0, maxBodyBytes: 2000000, keyStore",
        ),
    );
    logged(
        &stderr,
        &["restart ai-router up", "gateway.maxBodyBytes"],
        Duration::from_secs(10),
    )
    .await;
    // An invalid file is refused, and the pool before keeps serving.
    replace(
        &dir,
        &config,
        &format!("{}bogusField: 1\n", pool(&[&mock1, &mock2])),
    );
    logged(
        &stderr,
        &["config reload refused", "bogusField"],
        Duration::from_secs(10),
    )
    .await;
    let r = client.chat("m2", Some(&key)).await.unwrap();
    assert_eq!(r.status, 200, "{r}");

    signal(pid, "-TERM");
    let status = tokio::time::timeout(Duration::from_secs(40), up.wait())
        .await
        .expect("up exits")
        .unwrap();
    assert!(status.success(), "up exited with {status}");
    scan::observe_operator("up's stderr", stderr.lock().unwrap().join("\n").as_bytes());
    scan::assert_no_leaks("up_reload");
}

/// With no provider key, `up` serves its pool from its own mock; a reload moves the new file
/// onto the same mock, so a model the new file adds answers (without that, its provider has
/// no key and the model would not exist).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_on_its_mock_reloads_a_new_model_onto_the_same_mock() {
    let dir = TestDir::new("up_reload_mock").unwrap();
    let pool = |models: &str| {
        format!(
            "gateway: {{ host: 127.0.0.1, port: 0, keyStore: {{ type: memory }} }}\n\
             controlPlane: {{ host: 127.0.0.1, httpPort: 0, grpcPort: 0 }}\n\
             providers:\n  - id: openai\n    kind: openai\n    keysFromEnv: NOT_SET_ANYWHERE\n    models: [{models}]\n"
        )
    };
    let config = dir.write("pool.yaml", &pool("{ id: m1 }")).unwrap();
    let mut up = Up::start(
        &config,
        &[("RUST_LOG", "info")],
        std::process::Stdio::null(),
    )
    .await
    .unwrap();
    let key = up.key.clone();
    let client = Client::new(&up.base).unwrap();
    let r = client.chat("m1", Some(&key)).await.unwrap();
    assert_eq!(r.status, 200, "the mock serves m1: {r}");
    let r = client.chat("m2", Some(&key)).await.unwrap();
    assert_eq!(r.status, 404, "m2 is not in the pool yet: {r}");

    replace(&dir, &config, &pool("{ id: m1 }, { id: m2 }"));
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let r = client.chat("m2", Some(&key)).await.unwrap();
        if r.status == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "m2 never answered from the mock after the reload: {r}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let r = client.chat("m1", Some(&key)).await.unwrap();
    assert_eq!(r.status, 200, "{r}");
    signal(up.child.id().unwrap(), "-TERM");
    let status = tokio::time::timeout(Duration::from_secs(40), up.child.wait())
        .await
        .expect("up exits")
        .unwrap();
    assert!(status.success(), "up exited with {status}");
}
