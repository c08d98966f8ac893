//! A control plane whose shared store does not answer at start waits for it instead of
//! exiting (`storeStartWaitMs`, README "Configuration"), with a real Postgres (and Redis)
//! started by the test on a free port:
//!
//! - started before Postgres listens, it logs that it waits (at warn, naming the store, no URL,
//!   no password) and does not answer `/health` meanwhile; once Postgres starts it comes up,
//!   the same process, and serves the admin API from the database;
//! - another control plane holding the migration lock (a migration longer than the calls'
//!   5 s deadline) is waited for without an outage, and the control plane then comes up;
//! - two control planes started together on one fresh database both come up, migrating once.
//! - started before Redis (the state store) listens, it waits for it the same way.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;
use std::process::{Child, Stdio};

use ai_router_e2e::servers::{PostgresServer, RedisServer};
use ai_router_e2e::{
    http_client, poll, random_hex, standard_pool, Admin, ControlPlane, TestDir, START_TIMEOUT,
};
use serde_json::json;
use tokio::task::JoinHandle;

/// The control plane's migration lock (`keys/postgres/schema.rs`, "airouter").
const MIGRATION_LOCK: i64 = 0x6169_726f_7574_6572;
/// A password in the URL (trust authentication ignores it): it must appear in no output.
const PASSWORD: &str = "startwait-password-never-logged";

fn postgres_pool() -> String {
    let pool = standard_pool("http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1").replace(
        "keyStore: { type: memory }",
        "keyStore: { type: postgres, url: { env: AI_ROUTER_PG_URL } }",
    );
    assert!(pool.contains("type: postgres"));
    pool
}

/// The standard pool with its state in Redis (`AI_ROUTER_REDIS_URL`), its keys in memory.
fn redis_pool() -> String {
    format!(
        "stateStore: {{ type: redis, url: {{ env: AI_ROUTER_REDIS_URL }} }}\n{}",
        standard_pool("http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1")
    )
}

/// The control plane's environment with `admin_token` and `store` (the store's URL variable).
fn env(admin_token: &str, store: (&str, String)) -> Vec<(String, String)> {
    [
        ("P1_KEY_A", format!("sk-p1-a-{}", random_hex(24))),
        ("P2_KEY_C", format!("sk-p2-c-{}", random_hex(24))),
        ("AI_ROUTER_SYNC_TOKEN", format!("sync-{}", random_hex(32))),
        ("AI_ROUTER_ADMIN_TOKEN", admin_token.to_string()),
        store,
    ]
    .map(|(k, v)| (k.to_string(), v))
    .to_vec()
}

/// `AI_ROUTER_PG_URL`: `postgres`' URL with [`PASSWORD`].
fn pg_url(postgres: &PostgresServer) -> (&'static str, String) {
    let url = postgres
        .url()
        .replace("postgres@", &format!("postgres:{PASSWORD}@"));
    ("AI_ROUTER_PG_URL", url)
}

/// One line of `psql -c sql`'s output.
fn psql(postgres: &PostgresServer, sql: &str) -> anyhow::Result<String> {
    let out = postgres.psql().args(["-c", sql]).output()?;
    anyhow::ensure!(
        out.status.success(),
        "psql -c {sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// A key created through the control plane's admin API is in the database.
async fn serves_keys_from_postgres(cp: &ControlPlane, admin_token: &str, pg: &PostgresServer) {
    let admin = Admin::at(cp.http_addr(), admin_token).unwrap();
    let label = format!("after_the_wait_{}", random_hex(4));
    let (id, _secret) = admin
        .create_key(&json!({ "label": label, "models": ["*"] }))
        .await
        .unwrap();
    let listed = admin.get_json("/admin/keys").await.unwrap();
    assert!(listed.to_string().contains(&id), "{listed}");
    let stored = psql(
        pg,
        &format!("SELECT label FROM virtual_keys WHERE id = '{id}'"),
    )
    .unwrap();
    assert_eq!(stored, label);
}

/// `ControlPlane::start` on `pool` with `store` in its environment, in a task (it returns
/// once the control plane serves): the test directory, the admin token and the task.
fn start_in_background(
    test: &str,
    pool: String,
    store: (&str, String),
) -> (TestDir, String, JoinHandle<anyhow::Result<ControlPlane>>) {
    let dir = TestDir::new(test).unwrap();
    let admin_token = format!("admin-{}", random_hex(32));
    let env = env(&admin_token, store);
    let starting = tokio::spawn({
        let dir = dir.clone();
        async move { ControlPlane::start(&dir, &pool, &env).await }
    });
    (dir, admin_token, starting)
}

/// Polls until the starting control plane logged two waits for `store` (the backoff's first
/// waits are well under a second); checks it neither exited nor bound its ports meanwhile.
async fn waits_twice_for(
    store: &str,
    dir: &TestDir,
    starting: &JoinHandle<anyhow::Result<ControlPlane>>,
) {
    let log = poll(
        &format!("the control plane to wait for {store} twice"),
        START_TIMEOUT,
        || {
            let log = stderr(dir, "control-plane");
            // A start that ended (the process exited) is reported below at once.
            let ended = starting.is_finished();
            async move {
                let waits = log.matches("does not answer yet").count();
                Ok((waits >= 2 || ended).then_some(log))
            }
        },
    )
    .await
    .unwrap();
    assert!(
        !starting.is_finished(),
        "the start ended while {store} was away:\n{log}"
    );
    let wait_line = log
        .lines()
        .find(|l| l.contains("does not answer yet"))
        .unwrap();
    assert!(
        wait_line.contains(r#""level":"WARN""#) && wait_line.contains(store),
        "{wait_line}"
    );
    // It binds nothing before the store opened: no address printed yet.
    let stdout = std::fs::read_to_string(dir.join("control-plane.stdout")).unwrap_or_default();
    assert!(stdout.is_empty(), "{stdout}");
}

/// Starts the store `server` (`start`), then awaits the waiting control plane: the same
/// process (`ControlPlane::start` fails when it exits before printing its address) answers
/// `/health`.
async fn comes_up_once_started<S: Send + 'static>(
    mut server: S,
    start: fn(&mut S) -> anyhow::Result<()>,
    starting: JoinHandle<anyhow::Result<ControlPlane>>,
) -> (S, ControlPlane) {
    let server = tokio::task::spawn_blocking(move || start(&mut server).map(|()| server))
        .await
        .unwrap()
        .unwrap();
    let cp = starting.await.unwrap().unwrap();
    let health = http_client()
        .unwrap()
        .get(format!("http://{}/health", cp.http_addr()))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    (server, cp)
}

/// The control plane's stderr so far (its log lines).
fn stderr(dir: &TestDir, name: &str) -> String {
    std::fs::read_to_string(dir.join(&format!("{name}.stderr"))).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_plane_started_before_postgres_waits_for_it_then_serves() {
    let postgres = PostgresServer::prepare().unwrap();
    let (dir, admin_token, starting) = start_in_background(
        "store_start_before_postgres",
        postgres_pool(),
        pg_url(&postgres),
    );
    // Nothing listens on Postgres' port yet.
    waits_twice_for("gateway.keyStore", &dir, &starting).await;

    let (postgres, cp) = comes_up_once_started(postgres, PostgresServer::restart, starting).await;
    serves_keys_from_postgres(&cp, &admin_token, &postgres).await;

    let logs = cp.logs();
    assert!(
        logs.contains("the shared store answers: starting"),
        "{}",
        cp.tail()
    );
    // The wait at start is the start's to report, not an outage served from local state.
    assert!(
        !logs.contains("serving from local state"),
        "the start's wait logged as an outage:\n{}",
        cp.tail()
    );
    assert!(
        !logs.contains(PASSWORD),
        "the URL's password is in the logs"
    );
    assert!(
        !logs.contains(&format!("127.0.0.1:{}", postgres.port)),
        "the store's address is in the logs"
    );
}

/// `psql` holding the migration lock until its stdin closes.
fn hold_migration_lock(postgres: &PostgresServer) -> Child {
    let mut holder = postgres
        .psql()
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdin = holder.stdin.as_mut().unwrap();
    writeln!(stdin, "SELECT pg_advisory_lock({MIGRATION_LOCK});").unwrap();
    stdin.flush().unwrap();
    holder
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_lock_held_past_the_call_deadline_is_waited_for_not_an_outage() {
    let postgres = PostgresServer::start().unwrap();
    let mut holder = hold_migration_lock(&postgres);
    let held = format!(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND objid = {}",
        MIGRATION_LOCK & 0xffff_ffff
    );
    poll("psql to hold the migration lock", START_TIMEOUT, || {
        let answer = psql(&postgres, &held);
        async move { Ok((answer? == "1").then_some(())) }
    })
    .await
    .unwrap();

    let (dir, admin_token, starting) = start_in_background(
        "store_start_migration_lock",
        postgres_pool(),
        pg_url(&postgres),
    );
    // The control plane waits on the lock for longer than a call's deadline (5 s).
    let waiting_long = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                        AND query LIKE '%pg_advisory_xact_lock%' \
                        AND now() - query_start > interval '7 seconds'";
    poll(
        "the control plane to wait on the migration lock for 7 s",
        START_TIMEOUT,
        || {
            let answer = psql(&postgres, waiting_long);
            async move { Ok((answer? == "1").then_some(())) }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", stderr(&dir, "control-plane")));
    assert!(!starting.is_finished(), "{}", stderr(&dir, "control-plane"));
    let log = stderr(&dir, "control-plane");
    assert!(
        !log.contains("does not answer"),
        "waiting on a migration is no outage:\n{log}"
    );

    // The other "control plane" is done: the lock is released and this one comes up.
    drop(holder.stdin.take());
    let _ = tokio::task::spawn_blocking(move || holder.wait()).await;
    let cp = starting.await.unwrap().unwrap();
    serves_keys_from_postgres(&cp, &admin_token, &postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_control_planes_started_together_on_a_fresh_database_both_come_up() {
    let postgres = PostgresServer::start().unwrap();
    let admin_token = format!("admin-{}", random_hex(32));
    let env = env(&admin_token, pg_url(&postgres));
    let (dir_a, dir_b) = (
        TestDir::new("store_start_together_a").unwrap(),
        TestDir::new("store_start_together_b").unwrap(),
    );
    let pool = postgres_pool();
    let (a, b) = tokio::join!(
        ControlPlane::start(&dir_a, &pool, &env),
        ControlPlane::start(&dir_b, &pool, &env)
    );
    // Each is its first process (a start fails when the process exits before printing).
    let (a, b) = (a.unwrap(), b.unwrap());
    serves_keys_from_postgres(&a, &admin_token, &postgres).await;
    serves_keys_from_postgres(&b, &admin_token, &postgres).await;
    let versions = psql(&postgres, "SELECT count(*) FROM ai_router_schema").unwrap();
    assert_eq!(versions, "1");
    for cp in [&a, &b] {
        assert!(!cp.logs().contains("does not answer"), "{}", cp.tail());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_plane_started_before_redis_waits_for_it_then_serves() {
    let redis = RedisServer::prepare().unwrap();
    let (dir, admin_token, starting) = start_in_background(
        "store_start_before_redis",
        redis_pool(),
        ("AI_ROUTER_REDIS_URL", redis.url()),
    );
    // Nothing listens on Redis' port yet.
    waits_twice_for("stateStore", &dir, &starting).await;

    let (redis, cp) = comes_up_once_started(redis, RedisServer::restart, starting).await;
    let admin = Admin::at(cp.http_addr(), &admin_token).unwrap();
    let keys = admin.get_json("/admin/keys").await.unwrap();
    assert!(keys["keys"].is_array(), "{keys}");
    assert!(
        cp.logs().contains("the shared store answers: starting"),
        "{}",
        cp.tail()
    );
    drop(redis);
}
