//! The Postgres store against a real server (`crate::store::servers`).

use std::path::{Path, PathBuf};

use super::connection::*;
use super::rows::*;
use super::tls::*;
use super::usage::*;
use crate::config::QuotaConfig;
use crate::keys::store::{BudgetUse, KeyStore, KeyStoreError, StoredKey, UsageDay};
use crate::store::health::StoreHealth;
use crate::store::lock;
use crate::store::servers;

static HEALTH: StoreHealth = StoreHealth::new("pg-test");
const MIGRATION_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

fn key(id: &str, sha: &str) -> StoredKey {
    StoredKey {
        id: id.into(),
        label: "team".into(),
        sha256: sha.into(),
        hint: "abcd".into(),
        owner: Some("o".into()),
        profiles: vec!["default".into()],
        models: vec!["m1".into(), "m2".into()],
        allow_fallback: true,
        quota: QuotaConfig {
            requests_per_minute: Some(50),
            tokens_per_day: None,
            cost_per_day: Some(1.5),
            cost_per_month: None,
        },
        enabled: true,
        revoked: false,
        created_at_ms: 1_700_000_000_000,
        cache: None,
    }
}

fn day(day: &str, requests: u64, outcome: &str) -> UsageDay {
    UsageDay {
        day: day.into(),
        requests,
        successes: requests,
        cost: 0.25 * requests as f64,
        outcomes: [(outcome.to_owned(), requests)].into(),
        ..UsageDay::default()
    }
}

#[test]
fn waiting_usage_stays_bounded_and_adds_up() {
    let mut unsent: Vec<UsageBatch> = (0..MAX_UNSENT_BATCHES + 1)
        .map(|n| UsageBatch {
            id: new_batch_id(),
            rows: vec![("vk".to_owned(), day("2026-12-01", 1, "success"))],
            budgets: vec![BudgetUse {
                budget: "b".to_owned(),
                until_ms: 1,
                tokens: 2,
                ..BudgetUse::default()
            }],
            reports: vec![format!("report-{n}")],
        })
        .collect();
    let first = unsent[0].id.clone();
    bound_unsent(&mut unsent);
    assert!(unsent.len() < MAX_UNSENT_BATCHES);
    assert_eq!(unsent[0].id, first, "the one maybe in flight keeps its id");
    let total: u64 = unsent
        .iter()
        .flat_map(|batch| batch.rows.iter().map(|(_, r)| r.requests))
        .sum();
    assert_eq!(total, MAX_UNSENT_BATCHES as u64 + 1);
    let reports: usize = unsent.iter().map(|batch| batch.reports.len()).sum();
    assert_eq!(reports, MAX_UNSENT_BATCHES + 1, "no report id is lost");
    let tokens: u64 = unsent
        .iter()
        .flat_map(|batch| batch.budgets.iter().map(|b| b.tokens))
        .sum();
    assert_eq!(tokens, 2 * (MAX_UNSENT_BATCHES as u64 + 1));
}

#[test]
fn a_server_not_serving_yet_is_an_outage_to_wait_for_and_a_refusal_is_not() {
    use tokio_postgres::error::SqlState;
    for code in [
        SqlState::CANNOT_CONNECT_NOW,
        SqlState::ADMIN_SHUTDOWN,
        SqlState::CRASH_SHUTDOWN,
    ] {
        assert!(not_serving(&code), "{code:?}");
    }
    for code in [SqlState::INVALID_PASSWORD, SqlState::UNDEFINED_TABLE] {
        assert!(!not_serving(&code), "{code:?}");
    }
    assert!(waiting_helps("postgres does not answer: no connection"));
    assert!(waiting_helps(
        "postgres does not answer: the database system is starting up"
    ));
    assert!(!waiting_helps(
        "postgres does not answer: the TLS handshake failed: invalid peer certificate"
    ));
    assert!(!waiting_helps(
        "postgres: the schema version 99 is newer than this binary's (9); upgrade ai-router"
    ));
}

#[test]
fn admin_tokens_through_a_real_postgres() -> anyhow::Result<()> {
    let pg = servers::PostgresServer::start()?;
    let store = PostgresKeyStore::with_health(&pg.url(), &HEALTH)?;
    crate::keys::admin_tokens::tests::exercise(&store)?;
    // Another control plane on the database sees them.
    let other = PostgresKeyStore::with_health(&pg.url(), &HEALTH)?;
    assert_eq!(other.admin_tokens()?.len(), 3);
    Ok(())
}

#[test]
fn sslmode_and_sslrootcert_are_taken_out_of_the_url() {
    let verify = |ca: Option<&str>| PgTls::Verify {
        ca_file: ca.map(PathBuf::from),
    };
    let url = "postgres://u:p%3F@db:5432/keys";
    for (given, ca_file, rest, tls) in [
        (url.to_owned(), None, url, PgTls::Off { disable: false }),
        (
            format!("{url}?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem"),
            None,
            url,
            verify(Some("/etc/ca.pem")),
        ),
        (
            format!("{url}?connect_timeout=5&sslmode=require&application_name=x"),
            Some("/ca.pem"),
            "postgres://u:p%3F@db:5432/keys?connect_timeout=5&application_name=x",
            verify(Some("/ca.pem")),
        ),
        (
            format!("{url}?sslmode=verify-ca&sslrootcert=system"),
            None,
            url,
            verify(None),
        ),
        (
            format!("{url}?sslmode=disable"),
            None,
            url,
            PgTls::Off { disable: true },
        ),
        (
            "host=db  user=u sslmode=verify-full sslrootcert=/ca.pem dbname=keys".to_owned(),
            None,
            "host=db  user=u dbname=keys",
            verify(Some("/ca.pem")),
        ),
    ] {
        let split = split_tls(&given, ca_file.map(Path::new));
        assert_eq!(split, Ok((rest.to_owned(), tls)), "{given}");
    }
    for (given, ca_file, says) in [
        (format!("{url}?sslmode=verify"), None, "sslmode is one of"),
        (
            format!("{url}?sslmode=prefer"),
            Some("/ca.pem"),
            "add sslmode=verify-full",
        ),
        (url.to_owned(), Some("/ca.pem"), "add sslmode=verify-full"),
        (
            format!("{url}?sslmode=verify-full&sslrootcert=/a.pem"),
            Some("/b.pem"),
            "keep one",
        ),
    ] {
        let message = split_tls(&given, ca_file.map(Path::new))
            .err()
            .unwrap_or_default();
        assert!(message.contains(says), "{given}: {message}");
        assert!(!message.contains("u:p"), "no URL in {message}");
    }
}

#[test]
fn verify_full_checks_the_ca_and_the_name_of_a_real_postgres() -> anyhow::Result<()> {
    static TLS_HEALTH: StoreHealth = StoreHealth::new("tls test");
    let cas = crate::tls::testing::two_cas("pg-tls")?;
    let pg =
        servers::PostgresServer::start_tls(&servers::ServerTls::in_dir(&cas.right.control_plane))?;
    let verify_full = format!("{}?sslmode=verify-full", pg.url());
    let right = cas.right.ca.as_path();
    let store = PostgresKeyStore::with_tls(&verify_full, Some(right), &TLS_HEALTH, MIGRATION_WAIT)?;
    store.insert(&key("vk_tls", "h_tls"))?;
    let in_url = format!("{verify_full}&sslrootcert={}", right.display());
    let again = PostgresKeyStore::with_tls(&in_url, None, &TLS_HEALTH, MIGRATION_WAIT)?;
    assert_eq!(again.get("vk_tls")?, Some(key("vk_tls", "h_tls")));
    // The server really speaks TLS to it: Postgres says so for this session.
    let ssl = again.call(|client| async move {
        client
            .query_one(
                "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
                &[],
            )
            .await
            .map(|row| row.get::<_, bool>(0))
            .map_err(|e| pg_error(&e))
    })?;
    assert!(ssl, "the session is not encrypted");

    let refused = |url: &str, ca: &Path| {
        PostgresKeyStore::with_tls(url, Some(ca), &TLS_HEALTH, MIGRATION_WAIT)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    let unknown_ca = refused(&verify_full, &cas.wrong.ca);
    assert!(
        unknown_ca.contains("the TLS handshake failed")
            && unknown_ca.contains("invalid peer certificate"),
        "{unknown_ca}"
    );
    // Reached at 127.0.0.1 under a name its certificate does not carry.
    let wrong_name = format!(
        "postgres://postgres@db.invalid:{}/postgres?hostaddr=127.0.0.1&sslmode=verify-full",
        pg.port
    );
    let wrong_name = refused(&wrong_name, right);
    assert!(
        wrong_name.contains("the TLS handshake failed")
            && wrong_name.contains("not valid for name \"db.invalid\""),
        "{wrong_name}"
    );
    Ok(())
}

#[test]
fn a_server_that_closes_in_the_middle_of_the_tls_handshake_is_away_not_refused(
) -> anyhow::Result<()> {
    use std::io::{Read, Write};
    static CUT_HEALTH: StoreHealth = StoreHealth::new("tls cut test");
    let cas = crate::tls::testing::two_cas("pg-tls-cut")?;
    // Says yes to the client's SSLRequest, then closes as its ClientHello arrives: what a
    // server going away in the middle of the handshake does.
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    let server = std::thread::spawn(move || {
        for _ in 0..8 {
            let Ok((mut conn, _)) = listener.accept() else {
                return;
            };
            let mut ssl_request = [0u8; 8];
            if conn.read_exact(&mut ssl_request).is_err() || conn.write_all(b"S").is_err() {
                continue;
            }
            let mut hello = [0u8; 5];
            let _ = conn.read_exact(&mut hello);
        }
    });
    let url = format!("postgres://postgres@localhost:{port}/postgres?sslmode=verify-full");
    let err = PostgresKeyStore::with_tls(
        &url,
        Some(cas.right.ca.as_path()),
        &CUT_HEALTH,
        MIGRATION_WAIT,
    )
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(
        err.contains("postgres does not answer: the connection closed during the TLS handshake"),
        "{err}"
    );
    assert!(
        waiting_helps(err.trim_start_matches("key store unavailable: ")),
        "{err}"
    );
    drop(server);
    Ok(())
}

#[test]
fn a_handshake_cut_short_is_told_from_one_refused() {
    use std::io::{Error, ErrorKind};
    for kind in [
        ErrorKind::UnexpectedEof,
        ErrorKind::ConnectionReset,
        ErrorKind::ConnectionAborted,
        ErrorKind::BrokenPipe,
        ErrorKind::TimedOut,
    ] {
        assert!(cut_short(&Error::from(kind)), "{kind:?}");
    }
    let refused = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
    assert!(!cut_short(&Error::new(
        ErrorKind::InvalidData,
        refused.clone()
    )));
    assert!(!cut_short(&Error::new(ErrorKind::ConnectionReset, refused)));
    assert!(!cut_short(&Error::from(ErrorKind::PermissionDenied)));
    assert!(!cut_short(&std::fmt::Error));
}

#[test]
fn keys_usage_and_migrations_through_a_real_postgres() -> anyhow::Result<()> {
    let pg = servers::PostgresServer::start()?;
    let a = PostgresKeyStore::with_health(&pg.url(), &HEALTH)?;
    // A second control plane on the same database migrates nothing and sees everything.
    let b = PostgresKeyStore::with_health(&pg.url(), &HEALTH)?;
    let g0 = b.generation()?;
    a.insert(&key("vk_1", "h1"))?;
    assert!(a.insert(&key("vk_1", "h2")).is_err(), "ids are unique");
    assert!(a.insert(&key("vk_2", "h1")).is_err(), "hashes are unique");
    assert_eq!(b.get("vk_1")?, Some(key("vk_1", "h1")));
    assert!(b.generation()? > g0);
    let mut changed = key("vk_1", "h3");
    changed.enabled = false;
    changed.quota.requests_per_minute = None;
    b.replace(&changed)?;
    assert_eq!(a.list()?, vec![changed]);
    assert_eq!(
        a.replace(&key("vk_9", "h9")),
        Err(KeyStoreError::NotFound("vk_9".into()))
    );

    // Usage from both adds up.
    a.record_usage(&[("vk_1".into(), day("2026-12-01", 2, "success"))])?;
    b.record_usage(&[("vk_1".into(), day("2026-12-01", 3, "success"))])?;
    b.record_usage(&[("vk_1".into(), day("2026-12-02", 1, "error:auth"))])?;
    let rows = a.usage("vk_1", "2026-12-01", "2026-12-31")?;
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].requests, 5);
    assert!((rows[0].cost - 1.25).abs() < 1e-9);
    assert_eq!(rows[0].outcomes.get("success"), Some(&5));
    assert_eq!(rows[1].outcomes.get("error:auth"), Some(&1));
    // The quota recheck's one read: the day's and the month's figures of every key.
    b.record_usage(&[(
        "vk_2".into(),
        UsageDay {
            prompt_tokens: 7,
            completion_tokens: 3,
            ..day("2026-11-30", 1, "success")
        },
    )])?;
    let quota = a.quota_usage("2026-12-01", "2026-12-02")?;
    assert_eq!(quota.len(), 1, "November is another month: {quota:?}");
    assert!((quota["vk_1"].day_cost - 0.25).abs() < 1e-9);
    assert!((quota["vk_1"].month_cost - 1.5).abs() < 1e-9);
    assert_eq!(
        a.quota_usage("2026-11-01", "2026-11-30")?["vk_2"].day_tokens,
        10
    );

    // Budgets' use from both adds up too; an ended window is not read.
    let budget = |until_ms, tokens| BudgetUse {
        budget: "team".to_owned(),
        subject: "vk_1".to_owned(),
        until_ms,
        tokens,
        cost: 0.5,
    };
    let (soon, ended) = (now_ms() + 3_600_000, now_ms() - 1);
    a.record_report_usage(&[], &[budget(soon, 100), budget(ended, 7)], &[])?;
    b.record_report_usage(&[], &[budget(soon, 50)], &[])?;
    let used = a.budget_use(now_ms())?;
    assert_eq!(used.len(), 1, "{used:?}");
    assert_eq!((used[0].until_ms, used[0].tokens), (soon, 150));
    assert!((used[0].cost - 1.0).abs() < 1e-9);

    // A batch whose commit went through but whose answer was lost is not counted twice.
    let batch = UsageBatch {
        id: new_batch_id(),
        rows: vec![("vk_1".to_owned(), day("2026-12-03", 4, "success"))],
        budgets: vec![budget(soon, 10)],
        reports: Vec::new(),
    };
    a.call({
        let batch = batch.clone();
        move |client| write_batch(client, batch)
    })?;
    lock(&a.unsent).push(batch);
    a.flush_usage()?;
    assert_eq!(a.usage("vk_1", "2026-12-03", "2026-12-03")?[0].requests, 4);
    assert_eq!(b.budget_use(now_ms())?[0].tokens, 160);

    // The version lives in the database; a newer one is refused.
    a.call(|client| async move {
        client
            .execute("UPDATE ai_router_schema SET version = version + 1", &[])
            .await
            .map_err(|e| pg_error(&e))
    })?;
    let refused = PostgresKeyStore::with_health(&pg.url(), &HEALTH).map(|_| ());
    assert!(
        matches!(&refused, Err(KeyStoreError::Storage(m)) if m.contains("newer")),
        "{refused:?}"
    );
    Ok(())
}

#[test]
fn usage_rows_before_the_protocol_migrate_with_an_empty_one_and_new_ones_split_by_it(
) -> anyhow::Result<()> {
    static PROTOCOLS: StoreHealth = StoreHealth::new("pg-protocol-test");
    let pg = servers::PostgresServer::start()?;
    let a = PostgresKeyStore::with_health(&pg.url(), &PROTOCOLS)?;
    // The database as the binary before usage rows had a protocol left it, with a row.
    a.call(|client| async move {
        let err = |e: tokio_postgres::Error| pg_error(&e);
        client
            .batch_execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public;")
            .await
            .map_err(err)?;
        for migration in &super::schema::MIGRATIONS[..8] {
            client.batch_execute(migration).await.map_err(err)?;
        }
        client
            .batch_execute(
                "CREATE TABLE ai_router_schema (id INTEGER PRIMARY KEY CHECK (id = 1), \
                 version INTEGER NOT NULL); \
                 INSERT INTO ai_router_schema (id, version) VALUES (1, 8); \
                 INSERT INTO key_usage (key_id, day, provider, model, requests, cost) \
                 VALUES ('vk', '2026-12-01', 'p1', 'm1', 3, 0.75);",
            )
            .await
            .map_err(err)
    })?;
    let b = PostgresKeyStore::with_health(&pg.url(), &PROTOCOLS)?;
    let lanes = |store: &PostgresKeyStore| -> anyhow::Result<Vec<(String, String, u64)>> {
        Ok(store
            .lane_usage("2026-12-01", "2026-12-01", None)?
            .into_iter()
            .map(|l| (l.provider, l.protocol, l.requests))
            .collect())
    };
    assert_eq!(lanes(&b)?, [("p1".into(), String::new(), 3)]);
    let by = |protocol: &str, requests| UsageDay {
        provider: "p1".into(),
        model: "m1".into(),
        protocol: protocol.into(),
        ..day("2026-12-01", requests, "success")
    };
    b.record_usage(&[
        ("vk".into(), by("messages", 2)),
        ("vk".into(), by("chat", 1)),
    ])?;
    b.record_usage(&[("vk".into(), by("messages", 1))])?;
    assert_eq!(
        lanes(&b)?,
        [
            ("p1".into(), String::new(), 3),
            ("p1".into(), "chat".into(), 1),
            ("p1".into(), "messages".into(), 3),
        ]
    );
    // A key's day adds up every protocol, as before.
    let days = b.usage("vk", "2026-12-01", "2026-12-01")?;
    assert_eq!((days.len(), days[0].requests), (1, 7));
    assert!((days[0].cost - 1.75).abs() < 1e-9, "{days:?}");
    assert!(days[0].protocol.is_empty(), "{days:?}");
    Ok(())
}

#[test]
fn a_report_batch_counted_through_one_control_plane_is_known_to_all() -> anyhow::Result<()> {
    static REPORTS: StoreHealth = StoreHealth::new("pg-report-test");
    let pg = servers::PostgresServer::start()?;
    let a = PostgresKeyStore::with_health(&pg.url(), &REPORTS)?;
    assert!(!a.counted_batch("vm1-7")?);
    a.record_report_usage(
        &[("vk".into(), day("2026-12-01", 2, "success"))],
        &[],
        &["vm1-7".to_owned(), "vm2-3".to_owned()],
    )?;
    assert!(a.counted_batch("vm1-7")?);
    // Another control plane, or this one restarted: the ids are in the database.
    drop(a);
    let b = PostgresKeyStore::with_health(&pg.url(), &REPORTS)?;
    assert!(b.counted_batch("vm1-7")?);
    assert!(b.counted_batch("vm2-3")?);
    assert!(!b.counted_batch("vm1-8")?);
    assert_eq!(b.usage("vk", "2026-12-01", "2026-12-01")?[0].requests, 2);

    // While the database is away a taken batch is known from memory, then goes in with its
    // rows.
    let mut pg = pg;
    pg.stop();
    b.record_report_usage(
        &[("vk".into(), day("2026-12-01", 1, "success"))],
        &[],
        &["vm1-8".to_owned()],
    )?;
    assert!(b.counted_batch("vm1-8")?);
    pg.restart()?;
    b.generation()?;
    assert!(lock(&b.unsent).is_empty());
    let c = PostgresKeyStore::with_health(&pg.url(), &REPORTS)?;
    assert!(c.counted_batch("vm1-8")?);
    assert_eq!(c.usage("vk", "2026-12-01", "2026-12-01")?[0].requests, 3);
    Ok(())
}

#[test]
fn an_outage_keeps_usage_and_sends_it_once_back() -> anyhow::Result<()> {
    static OUTAGE: StoreHealth = StoreHealth::new("pg-outage-test");
    let pg = servers::PostgresServer::start()?;
    let url = pg.url();
    let store = PostgresKeyStore::with_health(&url, &OUTAGE)?;
    store.record_usage(&[("vk".into(), day("2026-12-01", 1, "success"))])?;
    // Stop the server, keep its directory: start it again on the same port.
    let mut pg = pg;
    pg.stop();
    let _ = url;
    // Taken (a report is not sent again, so nothing counts twice), and kept.
    store.record_usage(&[("vk".into(), day("2026-12-01", 2, "success"))])?;
    assert!(!OUTAGE.is_up());
    let listed = store.list();
    assert!(
        matches!(&listed, Err(KeyStoreError::Unavailable(m)) if !m.contains("127.0.0.1")),
        "{listed:?}"
    );
    assert_eq!(lock(&store.unsent).len(), 1);
    // Back: the kept batch goes in with the next poll, once.
    pg.restart()?;
    store.generation()?;
    assert!(lock(&store.unsent).is_empty());
    assert!(OUTAGE.is_up());
    assert_eq!(
        store.usage("vk", "2026-12-01", "2026-12-01")?[0].requests,
        3
    );
    Ok(())
}
