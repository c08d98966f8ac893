//! The operator's console (`/ui`) in a real browser: Debian's headless Chromium, driven by
//! Playwright for Python (`tests/console/drive.py`, one step per line), against the standard
//! gateway with real traffic through Envoy. Each page loads with the run's data and logs no
//! console error; a key created in the console serves through Envoy and is refused once revoked
//! there; a reset from the pool page brings a blacklisted key back through Envoy; a model name
//! carrying `<script>` shows as text; the overview's spend per provider and per client protocol
//! and the CSV export (the run's calls per key, day, provider, model and protocol) match the
//! run's traffic by chat completions and Anthropic messages; a call held by its provider shows
//! in flight on the pool page. Screenshots go to `target/e2e/console/`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use ai_router_e2e::{
    poll, python_bin, scan, script, standard_pool, workspace_root, Gateway, Reply,
};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

/// A model id a provider could name: markup, which the console must show as text.
const HOSTILE_MODEL: &str = "<script>window.__xss=1</script>";

/// The standard pool with p1's keys under limits (the ledger's windows and forecasts), `m1`
/// priced (spend) and p2 serving [`HOSTILE_MODEL`] too.
fn pool(p1: &str, p2: &str) -> String {
    standard_pool(p1, p2)
        .replace(
            "      - { alias: b, env: P1_KEY_B }\n",
            "      - { alias: b, env: P1_KEY_B }\n    limits: { rpm: 100, tpd: 100000 }\n",
        )
        .replace(
            "      - { id: m1, aliases: [chat] }\n",
            "      - { id: m1, aliases: [chat], cost: { input: 1000, output: 1000 } }\n",
        )
        .replace(
            "      - { id: m2, aliases: [backup] }\n",
            &format!(
                "      - {{ id: m2, aliases: [backup] }}\n      - {{ id: \"{HOSTILE_MODEL}\" }}\n"
            ),
        )
}

/// How long one browser step may take (page loads, clicks, waits inside it are bounded by
/// the driver's own 15 s).
const STEP_TIMEOUT: Duration = Duration::from_secs(60);

struct Browser {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    stderr: PathBuf,
}

impl Browser {
    async fn start(console_url: &str, token: &str, out: &std::path::Path) -> Browser {
        let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
        assert!(
            std::path::Path::new(&chromium).exists(),
            "no Chromium at {chromium}: run scripts/setup.sh (it installs Debian's chromium)"
        );
        let stderr = out.join("drive.stderr");
        let mut child = tokio::process::Command::new(python_bin().unwrap())
            .arg(workspace_root().join("tests/console/drive.py"))
            .env("CONSOLE_URL", console_url)
            .env("CONSOLE_TOKEN", token)
            .env("CONSOLE_OUT", out)
            .env("CHROMIUM", &chromium)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .kill_on_drop(true)
            .spawn()
            .expect("the Python with Playwright (scripts/setup.sh installs it into .venv)");
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Browser {
            child,
            stdin,
            lines,
            stderr,
        }
    }

    /// Runs one step; fails the test with the driver's error, or with a console error the
    /// page logged.
    async fn step(&mut self, step: &str) -> Value {
        let reply = self.step_logging(step).await;
        assert_eq!(reply["errors"], json!([]), "step {step}: console errors");
        reply
    }

    /// Runs one step; fails the test with the driver's error; the console errors logged so far
    /// are the answer's `errors`.
    async fn step_logging(&mut self, step: &str) -> Value {
        self.stdin
            .write_all(format!("{step}\n").as_bytes())
            .await
            .unwrap();
        self.stdin.flush().await.unwrap();
        let line = tokio::time::timeout(STEP_TIMEOUT, self.lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("step {step}: no answer in {STEP_TIMEOUT:?}"))
            .unwrap()
            .unwrap_or_else(|| {
                panic!(
                    "step {step}: the driver ended; its stderr:\n{}",
                    ai_router_e2e::tail_file(&self.stderr, 40)
                )
            });
        let reply: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(reply["ok"], true, "step {step}: {}", reply["error"]);
        reply
    }
}

impl Browser {
    /// Runs a `page NAME` step and returns the page's text.
    async fn text(&mut self, step: &str) -> String {
        let reply = self.step(step).await;
        reply["text"].as_str().unwrap_or_default().to_owned()
    }

    /// Opens page `name` and returns its text, checking that it shows none of `secrets` and
    /// that each of its controls has a name and is reachable by the keyboard.
    async fn visit(&mut self, name: &str, secrets: &[String]) -> String {
        let text = self.text(&format!("page {name}")).await;
        for secret in secrets {
            assert!(!text.contains(secret.as_str()), "{name} shows a secret");
        }
        let controls = self.step("unlabelled").await;
        assert_eq!(
            controls["controls"],
            json!([]),
            "{name}: unnamed or unreachable controls"
        );
        text
    }

    /// How many elements of the current page match a CSS selector (Playwright's, with
    /// `:text-is()`, `:has()`).
    async fn count(&mut self, selector: &str) -> u64 {
        self.step(&format!("count {selector}")).await["count"]
            .as_u64()
            .unwrap()
    }
}

/// Calls Envoy for `model` with `key` until it answers `status`; returns that answer.
async fn until_status(gw: &Gateway, model: &str, key: &str, status: u16, what: &str) -> Reply {
    poll(what, Duration::from_secs(5), || {
        let (c, m, k) = (gw.client.clone(), model.to_owned(), key.to_owned());
        async move {
            let r = c.chat(&m, Some(&k)).await?;
            Ok((r.status == status).then_some(r))
        }
    })
    .await
    .unwrap()
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_the_run_and_acts_on_the_gateway() {
    let gw = Gateway::start_with("console", pool).await.expect("fixture");
    gw.script_usage(12, 30).await.unwrap();

    // Real traffic: the standard models and the hostile one, by chat completions, and m1 by
    // Anthropic's messages too.
    for model in ["chat", "chat", "backup", HOSTILE_MODEL] {
        let r = gw.chat(model).await.unwrap();
        assert_eq!(r.status, 200, "{model}: {r}");
    }
    let messages = json!({
        "model": "chat", "max_tokens": 32, "messages": [{ "role": "user", "content": "hi" }],
    });
    let r = gw.post("/v1/messages", &messages).await.unwrap();
    assert_eq!((r.status, &r.json["type"]), (200, &json!("message")), "{r}");
    // p2's key c is refused by its provider: blacklisted.
    gw.mock2
        .script(json!([script::always(vec![script::status(
            401,
            json!({}),
            Some(json!({ "error": { "message": "Incorrect API key provided", "code": "invalid_api_key" } }))
        )])]))
        .await
        .unwrap();
    let r = gw.chat("backup").await.unwrap();
    assert!(r.status >= 400, "the refused key fails the call: {r}");
    gw.script_usage(12, 30).await.unwrap();
    let r = gw.chat("backup").await.unwrap();
    assert!(r.status >= 400, "the key stays out: {r}");

    // The run's reports reached the control plane: its usage rows carry the spend (three
    // priced calls of m1 so far: $0.126).
    poll("the run's spend", Duration::from_secs(10), || async {
        let o = gw.admin().get_json("/admin/console").await?;
        Ok((o["spend"]["today"].as_f64() > Some(0.12)).then_some(()))
    })
    .await
    .unwrap();

    // Spend per provider, model and protocol comes from the same stored usage rows: m1's
    // priced calls on p1 by both protocols, the hostile model's on p2. Each worker reports on
    // its own: the spend above may come before the hostile call's row.
    let usage = poll(
        "every lane's usage row",
        Duration::from_secs(10),
        || async {
            let usage = gw.admin().get_json("/admin/console/usage").await?;
            let rows = usage["lanes"].as_array().cloned().unwrap_or_default();
            let has = |provider: &str, model: &str, protocol: &str| {
                rows.iter().any(|l| {
                    l["provider"] == provider && l["model"] == model && l["protocol"] == protocol
                })
            };
            let all = has("p1", "m1", "chat")
                && has("p1", "m1", "messages")
                && has("p2", HOSTILE_MODEL, "chat");
            Ok(all.then_some(usage))
        },
    )
    .await
    .unwrap();
    let lane = |provider: &str, model: &str, protocol: &str| {
        usage["lanes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["provider"] == provider && l["model"] == model && l["protocol"] == protocol)
            .cloned()
            .unwrap_or_else(|| panic!("no row for {provider}/{model}/{protocol}: {usage}"))
    };
    let cost = |row: Value| row["cost"].as_f64().unwrap_or_default();
    assert!(
        (cost(lane("p1", "m1", "chat")) - 0.084).abs() < 1e-9,
        "{usage}"
    );
    assert!(
        (cost(lane("p1", "m1", "messages")) - 0.042).abs() < 1e-9,
        "{usage}"
    );
    assert_eq!(lane("p2", HOSTILE_MODEL, "chat")["successes"], 1, "{usage}");
    let overview = gw.admin().get_json("/admin/console").await.unwrap();
    let spent = |list: &str, name: &str| {
        overview["spend"][list]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .and_then(|p| p["today"].as_f64())
            .unwrap_or_else(|| panic!("no {list} {name}: {overview}"))
    };
    for (list, name, want) in [
        ("providers", "p1", 0.126),
        ("protocols", "chat", 0.084),
        ("protocols", "messages", 0.042),
    ] {
        assert!(
            (spent(list, name) - want).abs() < 1e-9,
            "{list} {name}: {overview}"
        );
    }

    let out = workspace_root().join("target/e2e/console");
    std::fs::create_dir_all(&out).unwrap();
    let url = format!("http://{}/ui", gw.cp.http_addr());
    let mut browser = Browser::start(&url, &gw.admin_token, &out).await;
    // What no page may show: the provider keys, the mounted virtual key, the admin token.
    let secrets = [
        gw.key_a.clone(),
        gw.key_b.clone(),
        gw.key_c.clone(),
        gw.virtual_key.clone(),
        gw.admin_token.clone(),
    ];

    // A call just before the overview, so that its last minute holds one.
    let r = gw.chat("chat").await.unwrap();
    assert_eq!(r.status, 200, "{r}");
    poll(
        "the last call in the overview",
        Duration::from_secs(10),
        || async {
            let o = gw.admin().get_json("/admin/console").await?;
            Ok(
                (o["spend"]["today"].as_f64() > Some(0.16) && o["calls"]["requests"] != 0)
                    .then_some(()),
            )
        },
    )
    .await
    .unwrap();
    browser.step("login").await;

    // Overview: what is wrong (key c out) on top, the last minute's figures, the spend.
    let text = browser.visit("overview", &secrets).await;
    assert!(text.contains("What is wrong now"), "{text}");
    assert!(text.contains("Key p2/c out: auth"), "{text}");
    let wrong = text.find("What is wrong now").unwrap();
    assert!(wrong < text.find("Success rate").unwrap(), "on top: {text}");
    // Four priced calls of 42 tokens at $1000 per million: $0.168 today, all on p1; three by
    // chat completions ($0.126), one by Anthropic messages ($0.042).
    assert!(text.contains("$0.1680"), "the spend of the run: {text}");
    for (selector, want) in [
        (
            r#".tile:has(.label:text-is("Latency p50")) .value:text-matches("^[0-9,]+ ms$")"#,
            1,
        ),
        (
            r#".tile:has(.label:text-is("Latency p99")) .value:text-matches("^[0-9,]+ ms$")"#,
            1,
        ),
        (
            r#".tile:has(.label:text-is("Success rate")) .value:text-matches("^[0-9.]+ %$")"#,
            1,
        ),
        (
            r#".tile:has(.label:text-matches("^Calls per second")) .value:not(:text-is("—"))"#,
            1,
        ),
        (
            r#"table:has(caption:text-is("Spend per provider")) tr:has(td:text-is("p1")):has(td:text-is("$0.1680"))"#,
            1,
        ),
        (
            r#"table:has(caption:text-is("Spend per client protocol")) tr:has(td:text-is("chat")):has(td:text-is("$0.1260"))"#,
            1,
        ),
        (
            r#"table:has(caption:text-is("Spend per client protocol")) tr:has(td:text-is("messages")):has(td:text-is("$0.0420"))"#,
            1,
        ),
        (
            r#"table:has(caption:text-is("Spend per client protocol")) tbody tr"#,
            2,
        ),
        (
            r#"table:has(caption:text-is("Calls per provider, last minute")) td:text-is("p1")"#,
            1,
        ),
        (
            r#"table:has(caption:text-is("Calls per client protocol, last minute")) td:text-is("chat")"#,
            1,
        ),
    ] {
        assert_eq!(browser.count(selector).await, want, "{selector}: {text}");
    }

    // Pool: providers, keys with their states, the ledger.
    let text = browser.visit("pool", &secrets).await;
    assert!(
        text.contains("Keys of p1") && text.contains("Keys of p2"),
        "{text}"
    );
    // Key c: blacklisted with its reason and code, with no end.
    assert!(
        text.contains("auth") && text.contains("invalid_api_key") && text.contains("no end"),
        "{text}"
    );
    assert!(text.contains("Provider breaker: closed"), "{text}");
    // p1's windows: remaining, source, age, reset and a forecast from the run's rate.
    assert!(text.contains("tpd") && text.contains("rpm"), "{text}");
    for column in ["remaining", "source", "age", "resets", "forecast"] {
        assert!(text.contains(column), "{column}: {text}");
    }
    assert!(
        text.contains("runs out") || text.contains("lasts until reset"),
        "{text}"
    );
    for (selector, want) in [
        (
            r#"table:has(caption:text-is("Keys of p1")) th:text-is("breaker")"#,
            1,
        ),
        (
            r#"table:has(caption:text-is("Ledger of p1/a")) td:text-is("estimated")"#,
            2,
        ),
        // The families and how many lanes serve each.
        (
            r#"table:has(caption:text-is("Families and the lanes serving them")) tr:has(td:text-is("m1")):has(td:text-is("1"))"#,
            1,
        ),
    ] {
        assert_eq!(browser.count(selector).await, want, "{selector}: {text}");
    }
    // The latency of the keys that served.
    let latency = r#"table:has(caption:text-is("Keys of p1")) td:text-matches("^[0-9]+ ms$")"#;
    assert!(browser.count(latency).await >= 1, "{text}");
    // A reset asks first: cancelled with Escape, it does nothing.
    let cancelled = browser.step("cancel-reset p2 c").await;
    assert!(
        !cancelled["status"].as_str().unwrap().contains("Reset"),
        "{cancelled}"
    );
    let text = browser.visit("pool", &secrets).await;
    assert!(text.contains("invalid_api_key"), "still out: {text}");
    // The keyboard alone opens a page.
    browser.step("keyboard usage").await;

    // Usage: charts and tables of the run's calls per key and per provider and model, with
    // what was saved.
    let text = browser.visit("usage", &secrets).await;
    assert!(text.contains("Per key") && text.contains("e2e"), "{text}");
    assert!(
        text.contains("cheaper lanes saved") && text.contains("the response cache answered"),
        "{text}"
    );
    assert!(
        text.contains(HOSTILE_MODEL),
        "the model name as text: {text}"
    );
    assert_eq!(browser.count("svg.chart").await, 2, "{text}");

    // The CSV export, downloaded from the usage page: one line per key, day, provider, model
    // and protocol, as the run's traffic made them. First, every call of the run is stored.
    let calls_of_run = 8; // six answered, two refused by p2's key
    poll(
        "the run's calls stored",
        Duration::from_secs(10),
        || async {
            let u = gw.admin().get_json("/admin/console/usage").await?;
            let e2e = u["keys"]
                .as_array()
                .and_then(|k| k.iter().find(|k| k["label"] == "e2e"));
            Ok(e2e
                .is_some_and(|k| k["total"]["requests"] == calls_of_run)
                .then_some(()))
        },
    )
    .await
    .unwrap();
    let download = browser.step("csv").await;
    let rows = parse_csv(download["csv"].as_str().unwrap());
    assert_eq!(
        rows[0].join(","),
        "day,key,key id,provider,model,protocol,calls,successes,failures,prompt tokens,\
         completion tokens,cost usd,saved usd",
        "{download}"
    );
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let today = ai_router_contract::calendar::utc_day(i64::try_from(now_ms).unwrap());
    let e2e: Vec<&Vec<String>> = rows[1..].iter().filter(|r| r[1] == "e2e").collect();
    assert!(e2e.iter().all(|r| r[0] == today), "{rows:?}");
    let calls: u64 = e2e.iter().map(|r| r[6].parse::<u64>().unwrap()).sum();
    assert_eq!(calls, calls_of_run, "every call of the key, once: {rows:?}");
    let lane = |provider: &str, model: &str, protocol: &str| {
        *e2e.iter()
            .find(|r| r[3] == provider && r[4] == model && r[5] == protocol)
            .unwrap_or_else(|| panic!("no line for {provider}/{model}/{protocol}: {rows:?}"))
    };
    // Calls of 12 + 30 tokens on p1's m1, at $1000 per million: three by chat completions
    // ($0.126), one by Anthropic messages ($0.042).
    for (protocol, calls, tokens, cost) in [
        ("chat", "3", ["36", "90"], 0.126),
        ("messages", "1", ["12", "30"], 0.042),
    ] {
        let m1 = lane("p1", "m1", protocol);
        assert_eq!(
            &m1[6..11],
            [calls, calls, "0", tokens[0], tokens[1]],
            "{m1:?}"
        );
        assert!(
            (m1[11].parse::<f64>().unwrap() - cost).abs() < 1e-9,
            "{m1:?}"
        );
    }
    // The hostile model's call on p2, its name as it is.
    assert_eq!(
        &lane("p2", HOSTILE_MODEL, "chat")[6..8],
        ["1", "1"],
        "{rows:?}"
    );
    assert!(
        download["name"]
            .as_str()
            .is_some_and(|n| n.ends_with(&format!("{today}.csv"))),
        "{download}"
    );

    // In flight: a call p1 holds a while shows on the pool page as one attempt in flight on
    // one of p1's keys, and none once it is answered.
    gw.mock1
        .script(json!([script::always(vec![
            json!({ "text": "slow", "latencyMs": 8_000 })
        ])]))
        .await
        .unwrap();
    let slow = tokio::spawn({
        let (client, key) = (gw.client.clone(), gw.virtual_key.clone());
        async move { client.chat("chat", Some(&key)).await }
    });
    let held = browser.step("in-flight p1 1").await;
    let r = slow.await.unwrap().unwrap();
    assert_eq!(r.status, 200, "{r}");
    assert!(
        held["counts"]
            .as_object()
            .is_some_and(|c| c.values().any(|n| n == "1") && c.len() == 2),
        "{held}"
    );
    browser.step("in-flight p1 0").await;
    gw.script_usage(12, 30).await.unwrap();

    // Configuration: the catalog, read-only, the hostile model id as text.
    let text = browser.visit("config", &secrets).await;
    for part in ["Profiles", "Models", "Rules", "Budgets", "Discovery"] {
        assert!(text.contains(part), "{part}: {text}");
    }
    assert!(
        text.contains("m1") && text.contains(HOSTILE_MODEL),
        "{text}"
    );
    assert_eq!(
        browser.count("#page button, #page input").await,
        0,
        "read-only"
    );
    let probe = browser.step("probe").await;
    assert_eq!(
        probe["injected"],
        Value::Null,
        "the model name ran: {probe}"
    );
    assert_eq!(
        probe["scripts"], 1,
        "only the console's own script: {probe}"
    );
    assert_eq!(
        (probe["token_in_url"].as_bool(), probe["cookies"].as_str()),
        (Some(false), Some("")),
        "{probe}"
    );

    // Events: live; a call made now shows.
    browser.visit("events", &secrets).await;
    let r = gw.chat("chat").await.unwrap();
    assert_eq!(r.status, 200, "{r}");
    browser.step("wait-event request").await;

    // Virtual keys: the mounted key read-only (its usage readable); a key created in the
    // console serves through Envoy, its secret shown once with a copy button.
    let text = browser.visit("keys", &secrets).await;
    assert!(text.contains("mounted (read-only)"), "{text}");
    for action in ["Revoke", "Rotate", "Disable"] {
        let selector = format!("button[aria-label=\"{action} e2e\"]");
        assert_eq!(browser.count(&selector).await, 0, "{selector}");
    }
    let usage = browser.step("key-usage e2e").await;
    assert!(
        usage["text"].as_str().unwrap().contains(&today) && usage["charts"] == 1,
        "{usage}"
    );
    let created = browser.step("create console_made").await;
    let secret = created["secret"].as_str().unwrap().to_owned();
    scan::register("a virtual key", &secret);
    assert!(secret.starts_with("sk-"), "{created}");
    assert_eq!(
        browser
            .count("#new-secret ~ button:text-is(\"Copy\")")
            .await,
        1,
        "a copy button"
    );
    until_status(&gw, "chat", &secret, 200, "the new key to serve").await;
    // Shown once: the page shown again has no secret.
    browser.visit("overview", &secrets).await;
    let text = browser
        .visit(
            "keys",
            &[secrets.as_slice(), std::slice::from_ref(&secret)].concat(),
        )
        .await;
    assert_eq!(browser.count("#new-secret").await, 0, "{text}");
    // Disabled, Envoy refuses it; enabled, it serves again.
    browser.step("toggle Disable console_made").await;
    until_status(&gw, "chat", &secret, 401, "the disabled key to be refused").await;
    browser.step("toggle Enable console_made").await;
    until_status(&gw, "chat", &secret, 200, "the enabled key to serve").await;
    // Rotated: the old secret is refused, the new one serves.
    let rotated = browser.step("rotate console_made").await;
    let new_secret = rotated["secret"].as_str().unwrap().to_owned();
    scan::register("a virtual key", &new_secret);
    assert_ne!(new_secret, secret);
    until_status(&gw, "chat", &secret, 401, "the old secret to be refused").await;
    until_status(&gw, "chat", &new_secret, 200, "the new secret to serve").await;
    // Its use over days.
    let usage = browser.step("key-usage console_made").await;
    assert!(
        usage["text"]
            .as_str()
            .unwrap()
            .contains("Usage of console_made"),
        "{usage}"
    );
    // Revoked there, Envoy refuses it.
    browser.step("revoke console_made").await;
    let r = until_status(
        &gw,
        "chat",
        &new_secret,
        401,
        "the revoked key to be refused",
    )
    .await;
    assert_eq!(r.error_code(), Some("invalid_api_key"), "{r}");

    // A reset from the pool page brings the blacklisted key back through Envoy.
    browser.step("reset p2 c").await;
    until_status(
        &gw,
        "backup",
        &gw.virtual_key,
        200,
        "the reset key to serve",
    )
    .await;
    let text = browser.visit("pool", &secrets).await;
    assert!(!text.contains("invalid_api_key"), "key c is back: {text}");
    // A whole provider's reset, confirmed, says what it lifted.
    let reset = browser.step("reset-provider p1").await;
    assert!(
        reset["status"]
            .as_str()
            .unwrap()
            .contains("Reset provider p1:"),
        "{reset}"
    );

    // Events filtered by type, provider and key: of a call on p1 then one on p2's key c, only
    // the attempt on c shows.
    browser.step("filter-events attempt p2 c").await;
    for model in ["chat", "backup"] {
        let r = gw.chat(model).await.unwrap();
        assert_eq!(r.status, 200, "{model}: {r}");
    }
    browser.step("wait-event attempt").await;
    let rows = browser.step("event-rows").await;
    for row in rows["rows"].as_array().unwrap() {
        assert_eq!(
            (&row[1], &row[2], &row[3]),
            (&json!("attempt"), &json!("p2"), &json!("c")),
            "{rows}"
        );
    }

    // Readable at a phone's width: nothing but the tables scrolls sideways.
    for page in ["overview", "pool", "keys", "usage", "events", "config"] {
        let phone = browser.step(&format!("phone {page}")).await;
        assert_eq!(phone["overflow"], 0, "{page} at 390 px: {phone}");
    }

    // Through the gateway's own listener too: the page and its figures under /admin/.
    let page = ai_router_e2e::get_text(&format!("{}/admin/ui", gw.envoy.base_url()))
        .await
        .unwrap();
    assert!(page.contains("ui/app.js"), "{page}");

    // The page's headers: a strict CSP (no inline script, no other origin, no framing).
    let answer = ai_router_e2e::http_client()
        .unwrap()
        .get(&url)
        .send()
        .await
        .unwrap();
    let csp = answer.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    for part in [
        "default-src 'self'",
        "script-src 'self'",
        "frame-ancestors 'none'",
        "object-src 'none'",
    ] {
        assert!(csp.contains(part), "{csp}");
    }
    assert!(!csp.contains("unsafe"), "{csp}");
    // No CSRF: an action with the browser's cookies but no token is refused, and another
    // origin's page may not send the token (no CORS answer to its preflight).
    let client = ai_router_e2e::http_client().unwrap();
    let reset = format!("http://{}/admin/reset", gw.cp.http_addr());
    let forged = client
        .post(&reset)
        .header("Origin", "http://evil.example")
        .header("Cookie", "session=operator")
        .json(&json!({ "provider": "p1" }))
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), 401);
    let preflight = client
        .request(reqwest::Method::OPTIONS, &reset)
        .header("Origin", "http://evil.example")
        .header("Access-Control-Request-Method", "POST")
        .header(
            "Access-Control-Request-Headers",
            "authorization,content-type",
        )
        .send()
        .await
        .unwrap();
    assert!(
        preflight
            .headers()
            .get("access-control-allow-origin")
            .is_none(),
        "{:?}",
        preflight.headers()
    );
}

/// A `read` admin token signs in and sees every page, without a control that acts; a page told
/// it may act (its whoami forged) is refused by the API (403), and shows the refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_token_sees_every_page_and_cannot_act() {
    let gw = Gateway::start_with("console-read", pool)
        .await
        .expect("fixture");
    for model in ["chat", "backup"] {
        let r = gw.chat(model).await.unwrap();
        assert_eq!(r.status, 200, "{model}: {r}");
    }
    let created: Value = gw
        .admin()
        .post(
            "/admin/tokens",
            &json!({ "label": "viewer", "scope": "read" }),
        )
        .await
        .unwrap()
        .json;
    let token = created["secret"].as_str().expect("a token").to_owned();
    scan::register("an admin token", &token);

    let out = workspace_root().join("target/e2e/console-read");
    std::fs::create_dir_all(&out).unwrap();
    let url = format!("http://{}/ui", gw.cp.http_addr());
    let mut browser = Browser::start(&url, &token, &out).await;
    browser.step("login").await;
    let actions = "#create-key, button[aria-label^='Reset'], button[aria-label^='Revoke'], \
                   button[aria-label^='Rotate'], button[aria-label^='Disable'], \
                   button[aria-label^='Enable']";
    for page in ["overview", "pool", "keys", "usage", "events", "config"] {
        let text = browser.text(&format!("page {page}")).await;
        assert!(!text.trim().is_empty(), "{page}");
        let count = browser.step(&format!("count {actions}")).await;
        assert_eq!(count["count"], 0, "{page} shows an action: {count}");
    }
    // The pages that act say why they do not.
    let text = browser.text("page pool").await;
    assert!(
        text.contains("Keys of p1") && text.contains("changes here need operate"),
        "{text}"
    );
    let text = browser.text("page keys").await;
    assert!(text.contains("changes here need keys"), "{text}");

    // The API is the guard: a page that believes it may act is refused, and says so.
    browser.step("forge-scope admin").await;
    let refused = browser.step_logging("force-reset p1 a").await;
    let status = refused["status"].as_str().unwrap_or_default();
    assert!(status.contains("scope operate"), "{refused}");
    // The only console error is the refused request's own.
    for e in refused["errors"].as_array().unwrap() {
        assert!(e.as_str().is_some_and(|e| e.contains("403")), "{refused}");
    }
    assert!(
        !refused["errors"].as_array().unwrap().is_empty(),
        "{refused}"
    );
}

/// The lines of a CSV text (RFC 4180: quoted cells may hold commas, quotes and line breaks).
fn parse_csv(text: &str) -> Vec<Vec<String>> {
    let (mut rows, mut row, mut cell) = (Vec::new(), Vec::new(), String::new());
    let (mut quoted, mut chars) = (false, text.chars().peekable());
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                cell.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => cell.push(c),
            (false, '"') => quoted = true,
            (false, ',') => row.push(std::mem::take(&mut cell)),
            (false, '\r') => {}
            (false, '\n') => {
                row.push(std::mem::take(&mut cell));
                rows.push(std::mem::take(&mut row));
            }
            (false, c) => cell.push(c),
        }
    }
    rows
}
