//! TLS to the databases, against a real `redis-server` that speaks only TLS and a real
//! PostgreSQL with `ssl=on`, both serving a certificate `ai-router certs` issued for
//! `127.0.0.1`:
//!
//! - a control plane with its state store on `rediss://` (`stateStore.caFile`) and its key
//!   store on Postgres with `sslmode=verify-full` (`gateway.keyStore.caFile`) serves a call
//!   through Envoy, and a virtual key created through its admin API (so written to Postgres
//!   over TLS) works through Envoy;
//! - the same pool with another CA's file for either store does not start, and says which
//!   store's certificate did not verify.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use ai_router_e2e::servers::{PostgresServer, RedisServer, ServerTls};
use ai_router_e2e::{poll, run_cli, standard_pool, Gateway, TestDir};
use serde_json::json;

const PUSH: Duration = Duration::from_secs(10);

/// Two CAs and their leaves: `right/` (the servers' certificates) and `wrong/`.
struct Certs {
    dir: TestDir,
}

impl Certs {
    async fn issue(test: &str) -> Certs {
        let dir = TestDir::new(test).unwrap();
        for name in ["right", "wrong"] {
            let out = dir.join(name).display().to_string();
            let (ok, _, output) = run_cli(&["certs", "--out", &out], &[]).await.unwrap();
            assert!(ok, "ai-router certs: {output}");
        }
        Certs { dir }
    }

    fn server(&self) -> ServerTls {
        ServerTls::in_dir(&self.dir.join("right").join("control-plane"))
    }

    fn ca(&self, which: &str) -> PathBuf {
        self.dir.join(which).join("ca.pem")
    }
}

/// The standard pool on both stores over TLS; their URLs are files in `dir`.
fn tls_pool(p1: &str, p2: &str, dir: &Path, redis_ca: &Path, postgres_ca: &Path) -> String {
    let key_store = format!(
        "keyStore: {{ type: postgres, url: {{ file: {} }}, caFile: {} }}",
        dir.join("postgres.url").display(),
        postgres_ca.display()
    );
    let pool = standard_pool(p1, p2).replace("keyStore: { type: memory }", &key_store);
    assert!(pool.contains("type: postgres"));
    format!(
        "stateStore: {{ type: redis, url: {{ file: {} }}, caFile: {} }}\n{pool}",
        dir.join("redis.url").display(),
        redis_ca.display()
    )
}

/// Both servers over TLS, their URLs written in the certificates' folder.
fn servers(certs: &Certs) -> (RedisServer, PostgresServer) {
    let redis = RedisServer::start_tls(certs.server()).expect("redis-server over TLS");
    let postgres = PostgresServer::start_tls(&certs.server()).expect("postgres with ssl=on");
    assert!(redis.url().starts_with("rediss://"));
    certs.dir.write("redis.url", &redis.url()).unwrap();
    certs
        .dir
        .write(
            "postgres.url",
            &format!("{}?sslmode=verify-full", postgres.url()),
        )
        .unwrap();
    (redis, postgres)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_on_redis_and_postgres_over_verified_tls_serves_and_keeps_keys() {
    let certs = Certs::issue("db-tls-serves").await;
    let (_redis, postgres) = servers(&certs);
    let (dir, ca) = (certs.dir.path().to_path_buf(), certs.ca("right"));
    let gw = Gateway::start_with("db-tls-serves-gw", |p1, p2| {
        tls_pool(p1, p2, &dir, &ca, &ca)
    })
    .await
    .unwrap();
    gw.script_usage(10, 5).await.unwrap();

    let r = gw.client.chat("m1", Some(&gw.virtual_key)).await.unwrap();
    assert_eq!(r.status, 200, "{r}");

    // Written to Postgres over TLS, pushed to Envoy, and usable there.
    let (id, secret) = gw
        .admin()
        .create_key(&json!({ "label": "over_tls", "models": ["m1"] }))
        .await
        .unwrap();
    poll("the new key to work through Envoy", PUSH, || {
        let c = gw.client.clone();
        let secret = secret.clone();
        async move { Ok((c.chat("m1", Some(&secret)).await?.status == 200).then_some(())) }
    })
    .await
    .unwrap();
    let listed = gw.admin().get_json("/admin/keys").await.unwrap();
    assert!(listed.to_string().contains(&id), "{listed}");

    // Postgres itself says the control plane's sessions are encrypted, every one.
    let out = std::process::Command::new("psql")
        .args([postgres.url().as_str(), "-tAc"])
        .arg(
            "SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl) \
             FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE a.backend_type = 'client backend' AND a.application_name <> 'psql'",
        )
        .output()
        .expect("psql (scripts/setup.sh installs postgresql)");
    let counts = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let (tls, plain) = counts.split_once('|').unwrap_or(("", ""));
    assert!(
        tls.parse::<u32>().is_ok_and(|n| n > 0) && plain == "0",
        "sessions over TLS|plaintext: {counts:?} {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `serve` on the TLS pool with `redis_ca` and `postgres_ca`: it must not start; its output.
async fn refused_start(certs: &Certs, redis_ca: &str, postgres_ca: &str) -> String {
    let dir = certs.dir.path();
    let pool = tls_pool(
        "http://127.0.0.1:9/v1",
        "http://127.0.0.1:9/v1",
        dir,
        &certs.ca(redis_ca),
        &certs.ca(postgres_ca),
    );
    let config = certs
        .dir
        .write(&format!("pool-{redis_ca}-{postgres_ca}.yaml"), &pool)
        .unwrap();
    let config = config.display().to_string();
    let env = [
        ("P1_KEY_A", "sk-a"),
        ("P1_KEY_B", "sk-b"),
        ("P2_KEY_C", "sk-c"),
        ("AI_ROUTER_ADMIN_TOKEN", "admin-token-for-a-refused-start"),
        ("AI_ROUTER_SYNC_TOKEN", "sync-token-for-a-refused-start"),
    ];
    let args = [
        "serve",
        "--config",
        &config,
        "--http-listen",
        "127.0.0.1:0",
        "--grpc-listen",
        "127.0.0.1:0",
    ];
    let (ok, _, output) = run_cli(&args, &env).await.unwrap();
    assert!(!ok, "serve started with another CA's file: {output}");
    output
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_whose_certificate_does_not_verify_is_refused_at_start_by_name() {
    let certs = Certs::issue("db-tls-refused").await;
    let (_redis, _postgres) = servers(&certs);

    let output = refused_start(&certs, "wrong", "right").await;
    assert!(
        output.contains("stateStore: the Redis server's TLS certificate did not verify")
            && output.contains("invalid peer certificate"),
        "{output}"
    );

    let output = refused_start(&certs, "right", "wrong").await;
    assert!(
        output.contains("gateway.keyStore")
            && output.contains("the TLS handshake failed: invalid peer certificate"),
        "{output}"
    );
}
