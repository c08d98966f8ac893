//! Beyond one machine: two control planes and two Envoys on one real Redis (the state store)
//! and one real Postgres (the key store), both started by the test on free ports.
//!
//! - a key created through control plane A authenticates through B's Envoy, and a key revoked
//!   through B is refused by A's Envoy; usage written by both adds up to the calls served;
//! - a key refused with a 401 through Envoy A is out of rotation at Envoy B within about a
//!   second, and B's Envoy stops using it;
//! - a reset received by control plane B voids Envoy A's own holds on a key within about a
//!   second (the reset's mark is shared through the store);
//! - killing Redis under load fails no call, and when Redis comes back the state is in it again
//!   (a blacklist set during the outage included);
//! - stopping Postgres under load fails no call, key writes answer 503 `unavailable` meanwhile,
//!   and the usage of every call is there, once, after it comes back;
//! - stopping (SIGKILL) control plane A under load fails no call through its Envoy, whose stream
//!   was at A (its first listed) and moves to B; the usage of every call is counted once;
//! - a half-open provider breaker lets exactly one probe through, counted at the provider,
//!   while calls arrive through both Envoys at once; the others answer from the fallback;
//! - 200 calls over both Envoys with `requestsPerMinute: 50` admit 50 to 60 (the stated bound:
//!   the limit plus one block per Envoy);
//! - a hard budget spent through control plane A's Envoy is enforced (429 `budget_exceeded`
//!   with `Retry-After`) through control plane B's Envoy within [`BUDGET_SHARED`];
//! - 50 calls at once through both Envoys (one per control plane) against a scope with 10
//!   requests left send 10 at most: both control planes split the figure among both Envoys.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use ai_router_e2e::servers::{PostgresServer, RedisServer};
use ai_router_e2e::{
    poll, random_hex, script, standard_pool, Client, Fixture, Mock, PoolSetup, Reply, Site, TestDir,
};
use serde_json::{json, Value};

/// "About a second": the poll interval of both stores plus a push, with room for a loaded
/// machine.
const SHARED: Duration = Duration::from_secs(3);

/// The pool both control planes load, with `resilience` lines (two-space indented) added.
fn pool_with(mock: &str, resilience: &str, top: &str) -> String {
    let standard =
        standard_pool(mock, mock).replace("resilience:\n", &format!("resilience:\n{resilience}"));
    let standard = standard.replace(
        "keyStore: { type: memory }",
        "keyStore: { type: postgres, url: { env: AI_ROUTER_PG_URL } }",
    );
    assert!(standard.contains("type: postgres"));
    format!(
        "stateStore: {{ type: redis, url: {{ env: AI_ROUTER_REDIS_URL }} }}\nstoreNamespace: e2e\n{top}{standard}"
    )
}

struct Cluster {
    redis: RedisServer,
    postgres: PostgresServer,
    mock: Mock,
    a: Site,
    b: Site,
    key_a: String,
    key_b: String,
    virtual_key: String,
    admin_token: String,
    dir: TestDir,
}

impl Cluster {
    async fn start(test: &str) -> Cluster {
        Self::start_with(test, "").await
    }

    /// [`Cluster::start`] with `resilience` lines added to the pool.
    async fn start_with(test: &str, resilience: &str) -> Cluster {
        Self::start_full(test, resilience, "").await
    }

    /// [`Cluster::start_with`] with `top` (whole top-level lines) added to the pool too.
    async fn start_full(test: &str, resilience: &str, top: &str) -> Cluster {
        Self::start_edited(test, resilience, top, |pool| pool).await
    }

    /// [`Cluster::start_full`] with the pool passed through `edit` last.
    async fn start_edited(
        test: &str,
        resilience: &str,
        top: &str,
        edit: fn(String) -> String,
    ) -> Cluster {
        let redis = RedisServer::start().expect("redis-server");
        let postgres = PostgresServer::start().expect("postgres");
        let key_a = format!("sk-p1-a-{}", random_hex(24));
        let key_b = format!("sk-p1-b-{}", random_hex(24));
        let admin_token = format!("admin-{}", random_hex(32));
        // Two sites on one mock: each Envoy syncs from its own control plane and fails over
        // to the other.
        let stack = Fixture::new(test)
            .mocks(1)
            .sites(2)
            .start(|urls, _| {
                let env = [
                    ("P1_KEY_A", key_a.as_str()),
                    ("P1_KEY_B", key_b.as_str()),
                    ("P2_KEY_C", "sk-p2-c-unused"),
                    ("AI_ROUTER_ADMIN_TOKEN", admin_token.as_str()),
                    ("AI_ROUTER_REDIS_URL", redis.url().as_str()),
                    ("AI_ROUTER_PG_URL", postgres.url().as_str()),
                ]
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
                Ok(PoolSetup {
                    yaml: edit(pool_with(&format!("{}/v1", urls[0]), resilience, top)),
                    env,
                    names: Vec::new(),
                })
            })
            .await
            .unwrap();
        let mut sites = stack.sites;
        let b = sites.pop().unwrap();
        let a = sites.pop().unwrap();
        Cluster {
            redis,
            postgres,
            mock: stack.mocks.into_iter().next().unwrap(),
            a,
            b,
            key_a,
            key_b,
            virtual_key: stack.virtual_key,
            admin_token,
            dir: stack.dir,
        }
    }

    async fn admin(
        &self,
        site: &Site,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Reply {
        site.admin(&self.admin_token)
            .unwrap()
            .call(method, path, body.as_ref())
            .await
            .unwrap()
    }

    /// Creates a virtual key through `site`'s admin API from `spec`; returns its id and secret.
    async fn create_key(&self, site: &Site, spec: Value) -> (String, String) {
        let r = self
            .admin(site, reqwest::Method::POST, "/admin/keys", Some(spec))
            .await;
        assert_eq!(r.status, 201, "{r}");
        let id = r.json["key"]["id"].as_str().unwrap().to_string();
        let secret = r.json["secret"].as_str().unwrap().to_string();
        (id, secret)
    }

    /// The successes the usage of key `id` counts, as `site` reads it.
    async fn successes(&self, site: &Site, id: &str) -> u64 {
        let r = self
            .admin(
                site,
                reqwest::Method::GET,
                &format!("/admin/keys/{id}/usage"),
                None,
            )
            .await;
        r.json["total"]["successes"].as_u64().unwrap_or(0)
    }

    /// Scripts key a to answer 401 (everything else succeeds) and calls through Envoy A until
    /// key a was tried once (the call itself fails over to key b); returns when that happened.
    async fn refuse_key_a_through_a(&self) -> Instant {
        let unauthorized = script::status(
            401,
            json!({}),
            Some(json!({ "error": { "message": "bad key", "code": "invalid_api_key" } })),
        );
        self.mock
            .script(json!([
                script::for_key(&self.key_a, vec![unauthorized]),
                script::always(vec![script::text("ok")]),
            ]))
            .await
            .unwrap();
        poll(
            "a call through A to try key a",
            Duration::from_secs(10),
            || async {
                let r = self.a.client.chat("chat", Some(&self.virtual_key)).await?;
                anyhow::ensure!(r.status == 200, "{r}");
                let calls = self.mock.calls().await?;
                let tried = calls
                    .iter()
                    .any(|m| m.key.as_deref() == Some(self.key_a.as_str()));
                Ok(tried.then(Instant::now))
            },
        )
        .await
        .unwrap()
    }

    /// Every log of every process holds none of the test's secrets.
    fn check_no_secrets_in_logs(&self, extra: &[&str]) {
        let mut secrets = vec![
            self.key_a.as_str(),
            self.key_b.as_str(),
            self.virtual_key.as_str(),
            self.admin_token.as_str(),
        ];
        secrets.extend_from_slice(extra);
        for site in [&self.a, &self.b] {
            let logs = format!("{}{}", site.cp.logs(), site.envoy.logs());
            for secret in &secrets {
                assert!(!logs.contains(secret), "a secret is in a log");
            }
        }
    }

    fn tails(&self) -> String {
        format!(
            "--- control plane a ---\n{}\n--- control plane b ---\n{}\n--- envoy a ---\n{}\n--- envoy b ---\n{}",
            self.a.cp.tail(),
            self.b.cp.tail(),
            self.a.envoy.tail(),
            self.b.envoy.tail()
        )
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.tails());
        }
        let _ = &self.dir;
    }
}

/// What one load task saw: each call's status and body.
type Replies = Vec<anyhow::Result<(u16, String)>>;

/// Calls in a loop through each client until stopped.
struct Load {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<Replies>>,
}

impl Load {
    fn start(clients: &[&Client], key: &str) -> Load {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let tasks = clients
            .iter()
            .map(|client| {
                let (stop, client, key) = (stop.clone(), (*client).clone(), key.to_owned());
                tokio::spawn(async move {
                    let mut replies = Vec::new();
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let reply = client.chat("chat", Some(&key)).await;
                        replies.push(reply.map(|r| (r.status, r.text)));
                    }
                    replies
                })
            })
            .collect();
        Load { stop, tasks }
    }

    /// Stops the load; every call answered 200. Returns how many there were.
    async fn stop_all_ok(self, when: &str) -> usize {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut total = 0;
        for task in self.tasks {
            for reply in task.await.unwrap() {
                let (status, text) = reply.unwrap();
                assert_eq!(status, 200, "a call failed {when}: {text}");
                total += 1;
            }
        }
        total
    }
}

/// Waits until a chat through `site` with `key` answers `status`; returns how long it took.
async fn until_status(site: &Site, key: &str, status: u16, what: &str) -> Duration {
    let started = Instant::now();
    poll(what, Duration::from_secs(15), || {
        let c = site.client.clone();
        let key = key.to_string();
        async move { Ok((c.chat("chat", Some(&key)).await?.status == status).then_some(())) }
    })
    .await
    .unwrap();
    started.elapsed()
}

#[tokio::test]
async fn keys_made_anywhere_work_everywhere_and_usage_adds_up() {
    let c = Cluster::start("distributed-keys").await;
    c.mock
        .script(json!([script::always(vec![script::text("hi")])]))
        .await
        .unwrap();

    let (id, secret) = c
        .create_key(&c.a, json!({ "label": "shared", "models": ["*"] }))
        .await;
    let took = until_status(
        &c.b,
        &secret,
        200,
        "B's Envoy to take the key made through A",
    )
    .await;
    eprintln!("a key made through A reached Envoy B in {took:?}");
    assert!(took < SHARED, "{took:?}");
    // Each Envoy may watch either control plane (the cluster fails over round robin): A's
    // holds the key within the same bound.
    let took = until_status(
        &c.a,
        &secret,
        200,
        "A's Envoy to take the key made through A",
    )
    .await;
    assert!(took < SHARED, "{took:?}");

    // Calls over both Envoys; the usage both control planes write adds up, once each.
    let mut served = 0u64;
    for i in 0..20 {
        let site = if i % 2 == 0 { &c.a } else { &c.b };
        let r = site.client.chat("chat", Some(&secret)).await.unwrap();
        assert_eq!(r.status, 200, "{r}");
        served += 1;
    }
    // The calls that found the key at B and at A counted too.
    served += 2;
    let usage = poll(
        "usage from both control planes",
        Duration::from_secs(10),
        || {
            let c = &c;
            let id = id.clone();
            async move {
                let r = c
                    .admin(
                        &c.b,
                        reqwest::Method::GET,
                        &format!("/admin/keys/{id}/usage"),
                        None,
                    )
                    .await;
                let n = r.json["total"]["successes"].as_u64().unwrap_or(0);
                Ok((n >= served).then_some(r))
            }
        },
    )
    .await
    .unwrap();
    // Settle: a late double write would show up now.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let again = c
        .admin(
            &c.a,
            reqwest::Method::GET,
            &format!("/admin/keys/{id}/usage"),
            None,
        )
        .await;
    assert_eq!(
        usage.json["total"]["successes"].as_u64(),
        Some(served),
        "{usage}"
    );
    assert_eq!(
        again.json["total"]["successes"].as_u64(),
        Some(served),
        "{again}"
    );
    assert_eq!(
        again.json["total"]["requests"].as_u64(),
        Some(served),
        "{again}"
    );

    // Revoked through B: refused by A's Envoy.
    let r = c
        .admin(
            &c.b,
            reqwest::Method::POST,
            &format!("/admin/keys/{id}/revoke"),
            None,
        )
        .await;
    assert_eq!(r.status, 200, "{r}");
    let took = until_status(
        &c.a,
        &secret,
        401,
        "A's Envoy to refuse the key revoked through B",
    )
    .await;
    eprintln!("a key revoked through B was refused at Envoy A in {took:?}");
    assert!(took < SHARED, "{took:?}");
    c.check_no_secrets_in_logs(&[&secret]);
}

#[tokio::test]
async fn a_key_refused_through_envoy_a_is_avoided_by_envoy_b() {
    let c = Cluster::start("distributed-blacklist").await;
    let started = c.refuse_key_a_through_a().await;
    for site in [&c.a, &c.b] {
        site.cp
            .metric_line(&["ai_router_key_out{", "key=\"a\"", "reason=\"auth\""])
            .await
            .unwrap();
    }
    let took = started.elapsed();
    eprintln!("a 401 seen through A took key a out at both control planes in {took:?}");
    assert!(took < SHARED, "{took:?}");
    // Envoy B has it too (the push is immediate): none of its calls uses key a.
    c.b.envoy.wait_for_state_of(&c.b.cp).await.unwrap();
    c.mock.clear_calls().await.unwrap();
    for _ in 0..12 {
        let r = c.b.client.chat("chat", Some(&c.virtual_key)).await.unwrap();
        assert_eq!(r.status, 200, "{r}");
    }
    let keys: Vec<Option<String>> = c
        .mock
        .calls()
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.key)
        .collect();
    assert_eq!(keys.len(), 12, "one attempt each, all on key b");
    assert!(
        keys.iter().all(|k| k.as_deref() == Some(c.key_b.as_str())),
        "key a was used through B"
    );
    c.check_no_secrets_in_logs(&[]);
}

/// A reset received by control plane B voids the holds Envoy A's workers put on a key (an
/// auth hold lasts until the secret changes): Envoy A uses the key again within about a second.
#[tokio::test]
async fn a_reset_through_control_plane_b_voids_envoy_a_s_own_holds() {
    let c = Cluster::start("distributed-reset").await;
    c.refuse_key_a_through_a().await;
    // Both control planes hold key a out (B's reset is to clear it there too).
    for site in [&c.a, &c.b] {
        site.cp
            .metric_line(&["ai_router_key_out{", "key=\"a\"", "reason=\"auth\""])
            .await
            .unwrap();
    }
    // The provider takes key a again (the operator fixed it there).
    c.mock
        .script(json!([script::always(vec![script::text("ok")])]))
        .await
        .unwrap();
    let r = c
        .admin(&c.b, reqwest::Method::POST, "/admin/reset", Some(json!({})))
        .await;
    assert_eq!(r.status, 200, "{r}");
    let reset_at = Instant::now();
    c.mock.clear_calls().await.unwrap();
    poll("Envoy A to use key a again", SHARED, || async {
        let r = c.a.client.chat("chat", Some(&c.virtual_key)).await?;
        anyhow::ensure!(r.status == 200, "{r}");
        let calls = c.mock.calls().await?;
        Ok(calls
            .iter()
            .any(|m| m.key.as_deref() == Some(c.key_a.as_str()))
            .then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", c.tails()));
    eprintln!(
        "a reset through B reached Envoy A's holds in {:?}",
        reset_at.elapsed()
    );
    c.check_no_secrets_in_logs(&[]);
}

/// The response cache's entries under the pool's namespace in Redis, with their PTTL.
fn redis_cache_entries(redis: &RedisServer) -> Vec<(String, i64)> {
    let port = redis.port.to_string();
    let cli = |args: &[&str]| {
        std::process::Command::new("redis-cli")
            .args(["-p", &port])
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default()
    };
    cli(&["--scan", "--pattern", "e2e:cache:*"])
        .lines()
        .map(|key| {
            let ttl = cli(&["PTTL", key]).parse().unwrap_or(-3);
            (key.to_owned(), ttl)
        })
        .collect()
}

#[tokio::test]
async fn an_answer_stored_through_envoy_a_is_a_hit_through_envoy_b_and_redis_away_is_a_miss() {
    const TTL_MS: i64 = 120_000;
    let mut c = Cluster::start_full(
        "distributed-cache",
        "",
        // A generous bound for a loaded machine; the default is 25 ms.
        &format!("cache: {{ ttlMs: {TTL_MS}, sharedLookupMs: 500 }}\n"),
    )
    .await;
    c.mock
        .script(json!([script::always(vec![script::text("shared words")])]))
        .await
        .unwrap();
    let key = c.virtual_key.clone();
    let first = c.a.client.chat("chat", Some(&key)).await.unwrap();
    assert_eq!(first.status, 200, "{first}");
    assert_eq!(first.header("x-ai-router-cache").as_deref(), Some("miss"));
    assert_eq!(first.content(), Some("shared words"));
    // The stored entry goes up to Redis under the namespace, with the entry's TTL.
    let started = Instant::now();
    let entries = poll("the entry in Redis", SHARED, || async {
        let found = redis_cache_entries(&c.redis);
        Ok((!found.is_empty()).then_some(found))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", c.tails()));
    eprintln!(
        "the entry stored through A was in Redis in {:?}",
        started.elapsed()
    );
    assert_eq!(entries.len(), 1, "{entries:?}");
    let (name, ttl) = &entries[0];
    assert_eq!(name.len(), "e2e:cache:".len() + 64, "{name}");
    assert!((1..=TTL_MS).contains(ttl), "{ttl}");

    // Envoy B never saw the call: a hit from the shared tier, no provider called.
    c.mock.clear_calls().await.unwrap();
    let started = Instant::now();
    let hit = c.b.client.chat("chat", Some(&key)).await.unwrap();
    eprintln!(
        "a hit through B from the shared tier took {:?}",
        started.elapsed()
    );
    assert_eq!(hit.status, 200, "{hit}");
    assert_eq!(hit.header("x-ai-router-cache").as_deref(), Some("hit"));
    assert_eq!(hit.header("x-ai-router-cost").as_deref(), Some("0"));
    assert_eq!(hit.json, first.json, "the answer stored through A");
    // Streamed, it replays as SSE.
    let streamed = c.b.client.stream("chat", Some(&key)).await.unwrap();
    assert_eq!(streamed.status, 200);
    assert_eq!(streamed.header("x-ai-router-cache").as_deref(), Some("hit"));
    assert_eq!(streamed.text(), "shared words");
    assert!(
        c.mock.calls().await.unwrap().is_empty(),
        "a provider was called"
    );

    // Redis away: B still answers what its own slots hold, and a new request is a miss that
    // goes to the provider, never a failed call.
    c.redis.kill();
    let local = c.b.client.chat("chat", Some(&key)).await.unwrap();
    assert_eq!(local.status, 200, "{local}");
    assert_eq!(local.header("x-ai-router-cache").as_deref(), Some("hit"));
    for i in 0..3 {
        let mut body = ai_router_e2e::chat_body("chat", false);
        body["messages"][0]["content"] = json!(format!("Something new {i}."));
        let started = Instant::now();
        let r = c.b.client.chat_with(&body, Some(&key)).await.unwrap();
        eprintln!(
            "a miss through B with Redis away took {:?}",
            started.elapsed()
        );
        assert_eq!(r.status, 200, "{r}");
        assert_eq!(r.header("x-ai-router-cache").as_deref(), Some("miss"));
        assert_eq!(r.content(), Some("shared words"));
    }
    assert_eq!(
        c.mock.calls().await.unwrap().len(),
        3,
        "each miss called the provider"
    );
    c.check_no_secrets_in_logs(&[]);
}

#[tokio::test]
async fn killing_redis_under_load_fails_no_call_and_the_state_comes_back() {
    let mut c = Cluster::start("distributed-redis-outage").await;
    c.mock
        .script(json!([script::always(vec![script::text("ok")])]))
        .await
        .unwrap();

    // Load over both Envoys while Redis dies and comes back.
    let load = Load::start(&[&c.a.client, &c.b.client], &c.virtual_key);
    tokio::time::sleep(Duration::from_millis(500)).await;
    c.redis.kill();
    for site in [&c.a, &c.b] {
        site.cp
            .metric_line(&["ai_router_shared_store_up{store=\"state\"} 0"])
            .await
            .unwrap();
    }
    // A key refused while Redis is away: known where it was seen, in no Redis.
    c.refuse_key_a_through_a().await;
    c.a.cp
        .metric_line(&["ai_router_key_out{", "key=\"a\""])
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    c.redis.restart().unwrap();
    let back = Instant::now();
    for site in [&c.a, &c.b] {
        site.cp
            .metric_line(&["ai_router_shared_store_up{store=\"state\"} 1"])
            .await
            .unwrap();
        site.cp
            .metric_line(&["ai_router_shared_store_recoveries_total{store=\"state\"} 1"])
            .await
            .unwrap();
    }
    // The restarted Redis started empty; the control planes wrote their state back, the
    // blacklist of the outage included.
    let redis_port = c.redis.port.to_string();
    poll("the outage's blacklist in Redis", SHARED, || {
        let port = redis_port.clone();
        async move {
            let held = std::process::Command::new("redis-cli")
                .args(["-p", &port, "HKEYS", "e2e:state:blacklists"])
                .output()?;
            let held = String::from_utf8_lossy(&held.stdout).to_string();
            Ok(held.contains("[\"p1\",\"a\"]").then_some(()))
        }
    })
    .await
    .unwrap();
    for site in [&c.a, &c.b] {
        site.cp
            .metric_line(&["ai_router_key_out{", "key=\"a\""])
            .await
            .unwrap();
    }
    let reconciled = back.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let total = load.stop_all_ok("during the Redis outage").await;
    eprintln!("{total} calls over both Envoys across the Redis outage, all 200; the outage's blacklist in Redis and at both control planes {reconciled:?} after Redis came back");
    assert!(total > 20, "{total}");
    for site in [&c.a, &c.b] {
        for line in site
            .cp
            .logs()
            .lines()
            .filter(|l| l.contains("shared store"))
        {
            assert!(
                !line.contains(&c.redis.url()) || !line.contains('@'),
                "{line}"
            );
        }
    }
    assert!(c.a.cp.logs().contains("the shared store does not answer"));
    assert!(c.a.cp.logs().contains("the shared store answers again"));
    c.check_no_secrets_in_logs(&[]);
}

#[tokio::test]
async fn stopping_postgres_under_load_fails_no_call_and_usage_adds_up_after() {
    let mut c = Cluster::start("distributed-postgres-outage").await;
    c.mock
        .script(json!([script::always(vec![script::text("hi")])]))
        .await
        .unwrap();
    let (id, secret) = c
        .create_key(&c.a, json!({ "label": "counted", "models": ["*"] }))
        .await;
    until_status(&c.b, &secret, 200, "B's Envoy to take the key").await;
    until_status(&c.a, &secret, 200, "A's Envoy to take the key").await;

    let load = Load::start(&[&c.a.client, &c.b.client], &secret);
    tokio::time::sleep(Duration::from_millis(500)).await;
    c.postgres.stop();
    let stopped = Instant::now();
    // Administration answers a clear error at both control planes meanwhile.
    for site in [&c.a, &c.b] {
        let refused = poll("a key write refused", Duration::from_secs(15), || {
            let (c, site) = (&c, site);
            async move {
                let r = c
                    .admin(
                        site,
                        reqwest::Method::POST,
                        "/admin/keys",
                        Some(json!({ "label": "during", "models": ["*"] })),
                    )
                    .await;
                Ok((r.status == 503).then_some(r))
            }
        })
        .await
        .unwrap();
        assert_eq!(refused.error_code(), Some("unavailable"), "{refused}");
        let message = refused.json["error"]["message"].as_str().unwrap();
        assert!(message.contains("postgres"), "{refused}");
        assert!(!message.contains("127.0.0.1"), "{refused}");
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    c.postgres.restart().unwrap();
    let down_for = stopped.elapsed();
    let back = Instant::now();
    let writes = poll("key writes again", Duration::from_secs(15), || {
        let c = &c;
        async move {
            let r = c
                .admin(
                    &c.b,
                    reqwest::Method::POST,
                    "/admin/keys",
                    Some(json!({ "label": "after", "models": ["*"] })),
                )
                .await;
            Ok((r.status == 201).then_some(()))
        }
    });
    writes.await.unwrap();
    let writable = back.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let total = load.stop_all_ok("while Postgres was away").await as u64;
    // The two calls that found the key at each Envoy count too.
    let served = total + 2;
    poll("usage of every call", Duration::from_secs(15), || {
        let c = &c;
        let id = id.clone();
        async move { Ok((c.successes(&c.a, &id).await >= served).then_some(())) }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", c.tails()));
    let reconciled = back.elapsed();
    // Settle: a batch written twice would show now.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (at_a, at_b) = (c.successes(&c.a, &id).await, c.successes(&c.b, &id).await);
    eprintln!(
        "Postgres away {down_for:?} under load: {total} calls over both Envoys, all 200; key writes again {writable:?} and usage complete {reconciled:?} after it came back ({at_a} successes counted for {served} served)"
    );
    assert_eq!(
        (at_a, at_b),
        (served, served),
        "usage lost or counted twice"
    );
    c.check_no_secrets_in_logs(&[&secret]);
}

/// The sync streams open at `site`'s control plane (every Envoy node together).
async fn sync_streams(site: &Site) -> anyhow::Result<u64> {
    let text = ai_router_e2e::get_text(&format!("http://{}/metrics", site.cp.http_addr())).await?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with("ai_router_sync_connections{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum())
}

/// Waits until control planes a and b hold `(a, b)` sync streams.
async fn until_streams(c: &Cluster, want: (u64, u64), what: &str) {
    poll(what, Duration::from_secs(15), || async {
        let at_b = sync_streams(&c.b).await?;
        let at_a = if want.0 == 0 {
            0
        } else {
            sync_streams(&c.a).await?
        };
        Ok(((at_a, at_b) == want).then_some(()))
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn stopping_control_plane_a_fails_no_call_through_its_envoy() {
    let mut c = Cluster::start("distributed-failover").await;
    c.mock
        .script(json!([script::always(vec![script::text("hi")])]))
        .await
        .unwrap();
    // Each Envoy holds its stream with the first control plane it lists (its own), not any.
    until_streams(
        &c,
        (1, 1),
        "each Envoy to sync from its first control plane",
    )
    .await;
    // The load's key is in Postgres, so its usage is read back from either control plane.
    let (loaded, load_secret) = c
        .create_key(&c.a, json!({ "label": "load", "models": ["*"] }))
        .await;
    until_status(&c.a, &load_secret, 200, "the load's key at Envoy A").await;
    let load = Load::start(&[&c.a.client], &load_secret);
    tokio::time::sleep(Duration::from_millis(500)).await;
    // SIGKILL: the report batches A took but did not acknowledge go to B again.
    c.a.cp.stop();
    // Envoy A fails over to the next one it lists.
    let stopped = Instant::now();
    until_streams(&c, (0, 2), "Envoy A's stream to move to control plane B").await;
    eprintln!(
        "Envoy A's sync stream was at control plane B {:?} after A stopped",
        stopped.elapsed()
    );
    // Envoy A now syncs from B: a key made through B works through Envoy A.
    let (_, secret) = c
        .create_key(&c.b, json!({ "label": "after", "models": ["*"] }))
        .await;
    let took = until_status(&c.a, &secret, 200, "Envoy A to sync from B").await;
    eprintln!("with control plane A stopped, Envoy A had B's new key after {took:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let total = load.stop_all_ok("after control plane A stopped").await;
    eprintln!("{total} calls through Envoy A across the stop, all 200");
    assert!(total > 10, "{total}");
    // Every success counted once in Postgres (the load's and the one that found the key),
    // whichever control plane took its report; a re-sent batch A had counted is known to B.
    let want = total as u64 + 1;
    poll("the usage of every call", SHARED * 5, || async {
        let counted = c.successes(&c.b, &loaded).await;
        anyhow::ensure!(
            counted <= want,
            "{counted} successes counted for {want} calls"
        );
        Ok((counted == want).then_some(()))
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        c.successes(&c.b, &loaded).await,
        want,
        "usage counted twice across the kill"
    );
    c.check_no_secrets_in_logs(&[&secret, &load_secret]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_open_provider_breaker_lets_exactly_one_probe_through_both_envoys() {
    // Provider p1 (keys a and b) opens after 2 failures in a row for 3 s; its keys' own
    // breakers stay closed, so what opens and half-opens is the provider's.
    let c = Cluster::start_with(
        "distributed-probe",
        "  providerBreaker: { failureThreshold: 2, cooldownMs: 3000, maxCooldownMs: 10000 }\n  keyBreaker: { failureThreshold: 100 }\n",
    )
    .await;
    let p1_keys = [c.key_a.clone(), c.key_b.clone()];
    let at_p1 = |calls: &[ai_router_e2e::MockCall]| {
        calls
            .iter()
            .filter(|m| {
                m.key
                    .as_deref()
                    .is_some_and(|k| p1_keys.iter().any(|p| p == k))
            })
            .count()
    };
    let down = script::status(
        503,
        json!({}),
        Some(json!({ "error": { "message": "down", "type": "server_error" } })),
    );
    c.mock
        .script(json!([
            script::for_key(&c.key_a, vec![down.clone()]),
            script::for_key(&c.key_b, vec![down]),
            script::always(vec![script::text("from p2")]),
        ]))
        .await
        .unwrap();
    // Through A until p1's breaker opens (each call fails over to p2 and answers 200).
    for _ in 0..4 {
        let r = c.a.client.chat("chat", Some(&c.virtual_key)).await.unwrap();
        assert_eq!(r.status, 200, "{r}");
    }
    for site in [&c.a, &c.b] {
        site.cp
            .metric_line(&[
                "ai_router_breaker_open{",
                "scope=\"provider\"",
                "provider=\"p1\"",
            ])
            .await
            .unwrap();
        // The metric is what the control plane pushed; its Envoy has it a push later. An
        // Envoy that has not applied it yet still sees p1 closed and sends every call there.
        site.envoy.wait_for_state_of(&site.cp).await.unwrap();
    }
    // p1 recovers, slowly: the probe is still in flight while the other calls arrive.
    c.mock
        .script(json!([
            script::for_key(
                &c.key_a,
                vec![json!({ "text": "from p1", "latencyMs": 1500 })]
            ),
            script::for_key(
                &c.key_b,
                vec![json!({ "text": "from p1", "latencyMs": 1500 })]
            ),
            script::always(vec![script::text("from p2")]),
        ]))
        .await
        .unwrap();
    // Batches of 20 concurrent calls through each Envoy at once until one reaches p1: that
    // batch sends exactly one request there, the probe; every other call answers from p2.
    let deadline = Instant::now() + Duration::from_secs(20);
    let (batches, replies) = loop {
        c.mock.clear_calls().await.unwrap();
        let replies = futures::future::join_all((0..40).map(|i| {
            let client = if i % 2 == 0 { &c.a.client } else { &c.b.client }.clone();
            let key = c.virtual_key.clone();
            async move { client.chat("chat", Some(&key)).await.unwrap() }
        }))
        .await;
        let calls = c.mock.calls().await.unwrap();
        let probes = at_p1(&calls);
        if probes > 0 {
            assert_eq!(
                probes,
                1,
                "a half-open breaker lets exactly one probe through across both Envoys; 40 calls sent {probes} requests to p1"
            );
            break (calls, replies);
        }
        assert!(
            Instant::now() < deadline,
            "no probe reached p1 within 20 s\n{}",
            c.tails()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let from_p1 = replies
        .iter()
        .filter(|r| r.content() == Some("from p1"))
        .count();
    for r in &replies {
        assert_eq!(r.status, 200, "a call of the probe's batch failed: {r}");
    }
    assert_eq!(from_p1, 1, "the probe's answer is the only one from p1");
    assert_eq!(
        batches.len(),
        40,
        "one request per call: the others went to p2 at once"
    );
    // The probe succeeded: the breaker closed everywhere, both Envoys use p1 again.
    for site in [&c.a, &c.b] {
        poll("p1 to serve again", Duration::from_secs(10), || async {
            let r = site.client.chat("chat", Some(&c.virtual_key)).await?;
            anyhow::ensure!(r.status == 200, "{r}");
            Ok((r.content() == Some("from p1")).then_some(()))
        })
        .await
        .unwrap();
    }
    c.check_no_secrets_in_logs(&[]);
}

/// How soon a budget spent through one control plane is enforced through the other: its
/// read of the key store's budget counts every `KEY_SYNC_INTERVAL` (500 ms), then a push, with
/// room for a loaded machine.
const BUDGET_SHARED: Duration = Duration::from_secs(2);

/// Scripts the mock to report `tokens` of usage (half prompt, half completion) on every call.
async fn script_usage(c: &Cluster, tokens: u64) {
    let reply = json!({
        "text": "ok",
        "usage": { "prompt_tokens": tokens / 2, "completion_tokens": tokens - tokens / 2 },
    });
    c.mock
        .script(json!([script::always(vec![reply])]))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hard_budget_spent_through_control_plane_a_is_enforced_through_control_plane_b() {
    let c = Cluster::start_full(
        "distributed-budget",
        "",
        "budgets:\n  - { name: key-day, scope: key, window: day, limits: { maxTokens: 100 }, enforcement: hard }\n",
    )
    .await;
    // Each Envoy syncs from its own control plane: what B's Envoy enforces, B's pushed.
    until_streams(&c, (1, 1), "each Envoy to sync from its own control plane").await;
    // Nothing spent yet: B's Envoy answers.
    script_usage(&c, 0).await;
    until_status(&c.b, &c.virtual_key, 200, "B's Envoy to answer").await;
    until_status(&c.a, &c.virtual_key, 200, "A's Envoy to answer").await;

    // One call through A spends 120 of the 100 tokens (counting is after the call).
    script_usage(&c, 120).await;
    let crossing = c.a.client.chat("chat", Some(&c.virtual_key)).await.unwrap();
    assert_eq!(crossing.status, 200, "the crossing call: {crossing}");
    let spent = Instant::now();
    script_usage(&c, 0).await;

    // B's control plane reads the count A's wrote to Postgres and pushes it: once the stated
    // delay has passed, the first call through B (B served nothing meanwhile, so nothing of
    // its own made it look) is refused.
    let seen = poll(
        "B's control plane to count the budget spent",
        BUDGET_SHARED,
        || async {
            let text =
                ai_router_e2e::get_text(&format!("http://{}/metrics", c.b.cp.http_addr())).await?;
            Ok(text
                .lines()
                .any(|l| l.starts_with("ai_router_budget_state{") && l.ends_with(" 2"))
                .then(|| spent.elapsed()))
        },
    )
    .await
    .unwrap();
    eprintln!("control plane B counted the budget spent through A after {seen:?}");
    tokio::time::sleep(BUDGET_SHARED.saturating_sub(spent.elapsed())).await;
    let refused = c.b.client.chat("chat", Some(&c.virtual_key)).await.unwrap();
    if let Some(problem) = ai_router_e2e::openai_error_problem(&refused, 429, "budget_exceeded") {
        panic!("through B {BUDGET_SHARED:?} after the budget was spent through A: {problem}");
    }
    let wait: u64 = refused
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no whole-second Retry-After: {refused}"));
    assert!((1..=86_400).contains(&wait), "Retry-After {wait}");
    // Refused calls reach no provider, through either Envoy.
    c.mock.clear_calls().await.unwrap();
    for site in [&c.a, &c.b] {
        let r = site
            .client
            .chat("chat", Some(&c.virtual_key))
            .await
            .unwrap();
        assert_eq!(r.status, 429, "{r}");
    }
    assert!(
        c.mock.calls().await.unwrap().is_empty(),
        "a refused call reached the mock"
    );
    c.check_no_secrets_in_logs(&[]);
}

/// The UTC minute now, and the seconds into it.
fn utc_minute() -> (u64, u64) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    (now / 60, now % 60)
}

#[tokio::test]
async fn requests_per_minute_hold_across_both_envoys() {
    use futures::StreamExt;
    const LIMIT: u64 = 50;
    // The filter's blocks for a limit of 50 (`minute_lease::block_size`): the stated bound is
    // the limit plus one block per Envoy.
    const BLOCK: u64 = 5;
    let c = Cluster::start("distributed-rpm").await;
    c.mock
        .script(json!([script::always(vec![script::text("hi")])]))
        .await
        .unwrap();
    // Everything below happens within one UTC minute: start early in one.
    let (_, second) = utc_minute();
    if second > 30 {
        tokio::time::sleep(Duration::from_secs(60 - second)).await;
    }
    let (minute, _) = utc_minute();
    let spec =
        json!({ "label": "metered", "models": ["*"], "quota": { "requestsPerMinute": LIMIT } });
    let (_, secret) = c.create_key(&c.a, spec).await;
    // One admitted call at each Envoy once it has the key (the 401s before count nowhere).
    until_status(&c.b, &secret, 200, "B's Envoy to take the metered key").await;
    until_status(&c.a, &secret, 200, "A's Envoy to take the metered key").await;
    let started = Instant::now();
    let replies: Vec<Reply> = futures::stream::iter(0..200)
        .map(|i| {
            let client = if i % 2 == 0 { &c.a.client } else { &c.b.client };
            let (client, secret) = (client.clone(), secret.clone());
            async move { client.chat("chat", Some(&secret)).await.unwrap() }
        })
        .buffer_unordered(8)
        .collect()
        .await;
    let took = started.elapsed();
    assert_eq!(
        utc_minute().0,
        minute,
        "the run crossed a minute ({took:?})"
    );
    let mut admitted = 2;
    for r in &replies {
        match r.status {
            200 => admitted += 1,
            429 => {
                assert_eq!(r.error_code(), Some("requests_per_minute_exceeded"), "{r}");
                let wait: u64 = r.header("retry-after").unwrap().parse().unwrap();
                assert!((1..=60).contains(&wait), "{r}");
            }
            _ => panic!("neither admitted nor refused for the minute: {r}"),
        }
    }
    eprintln!(
        "requestsPerMinute {LIMIT} over 2 Envoys and 2 control planes: {admitted} of 202 calls admitted in {took:?}"
    );
    assert!(
        (LIMIT..=LIMIT + 2 * BLOCK).contains(&admitted),
        "{admitted} admitted"
    );
    // The two control planes granted the whole minute, from the one count, and no more.
    let mut granted = 0;
    for site in [&c.a, &c.b] {
        let line = site
            .cp
            .metric_line(&["ai_router_minute_calls_granted_total{store=\"shared\"}"])
            .await
            .unwrap();
        granted += line.rsplit(' ').next().unwrap().parse::<u64>().unwrap();
    }
    assert_eq!(granted, LIMIT);
    // The count is in Redis, under the pool's namespace.
    let keys = std::process::Command::new("redis-cli")
        .args([
            "-p",
            &c.redis.port.to_string(),
            "--scan",
            "--pattern",
            "e2e:rpm:*",
        ])
        .output()
        .unwrap();
    let keys = String::from_utf8_lossy(&keys.stdout).to_string();
    assert!(keys.contains(&format!(":{minute}")), "Redis holds: {keys}");
    c.check_no_secrets_in_logs(&[&secret]);
}

#[tokio::test]
async fn requests_per_minute_are_counted_by_each_control_plane_while_redis_is_away() {
    const LIMIT: u64 = 20;
    let mut c = Cluster::start("distributed-rpm-redis-outage").await;
    c.mock
        .script(json!([script::always(vec![script::text("hi")])]))
        .await
        .unwrap();
    let (_, second) = utc_minute();
    if second > 40 {
        tokio::time::sleep(Duration::from_secs(60 - second)).await;
    }
    let (minute, _) = utc_minute();
    let spec =
        json!({ "label": "metered_out", "models": ["*"], "quota": { "requestsPerMinute": LIMIT } });
    let (_, secret) = c.create_key(&c.a, spec).await;
    until_status(&c.b, &secret, 200, "B's Envoy to take the key").await;
    until_status(&c.a, &secret, 200, "A's Envoy to take the key").await;
    c.redis.kill();
    for site in [&c.a, &c.b] {
        site.cp
            .metric_line(&["ai_router_shared_store_up{store=\"state\"} 0"])
            .await
            .unwrap();
    }
    let mut admitted = 2;
    for i in 0..80 {
        let site = if i % 2 == 0 { &c.a } else { &c.b };
        let r = site.client.chat("chat", Some(&secret)).await.unwrap();
        match r.status {
            200 => admitted += 1,
            429 => assert_eq!(r.error_code(), Some("requests_per_minute_exceeded"), "{r}"),
            _ => panic!("a call failed while Redis was away: {r}"),
        }
    }
    assert_eq!(utc_minute().0, minute, "the run crossed a minute");
    // Each control plane grants from its own count meanwhile: at most the limit each, and no
    // Envoy more than the limit.
    eprintln!("requestsPerMinute {LIMIT} with Redis away: {admitted} of 82 calls admitted");
    assert!((LIMIT..=2 * LIMIT).contains(&admitted), "{admitted}");
    let mut local = 0;
    for site in [&c.a, &c.b] {
        let line = site
            .cp
            .metric_line(&["ai_router_minute_calls_granted_total{store=\"local\"}"])
            .await
            .unwrap();
        local += line.rsplit(' ').next().unwrap().parse::<u64>().unwrap();
    }
    assert!(local > 0, "no block was granted from local counts");
    let logs = format!("{}{}", c.a.cp.logs(), c.b.cp.logs());
    assert!(
        logs.contains("minute budget from local counts"),
        "no log line"
    );
    c.check_no_secrets_in_logs(&[&secret]);
}

#[test]
fn the_compose_cluster_profile_validates_and_its_envoys_match_the_renderer() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let services = ai_router_e2e::compose_config(
        &["--profile", "cluster", "config", "--services"],
        &[
            ("AI_ROUTER_SYNC_TOKEN", "compose-check"),
            ("AI_ROUTER_PG_PASSWORD", "compose-check"),
        ],
    )
    .unwrap();
    for s in [
        "redis",
        "postgres",
        "control-plane-a",
        "control-plane-b",
        "envoy-a",
        "envoy-b",
    ] {
        assert!(services.lines().any(|l| l == s), "{s} missing: {services}");
    }
    // Each Envoy file is what the renderer writes for its own control plane first, then the
    // other to fail over to.
    for (site, other) in [("a", "b"), ("b", "a")] {
        let out = std::process::Command::new(ai_router_e2e::ai_router_bin().unwrap())
            .args(["render-envoy", "--config", "examples/pool-cluster.yaml"])
            .args([
                "--control-plane",
                &format!("control-plane-{site}:8082,control-plane-{other}:8082"),
            ])
            .args(["--sync-tls-dir", "/etc/ai-router/sync-tls/envoy"])
            .current_dir(&root)
            .env_remove("AI_ROUTER_SYNC_TLS_DIR")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let file =
            std::fs::read_to_string(root.join(format!("envoy/envoy-cluster-{site}.yaml"))).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            file,
            "envoy/envoy-cluster-{site}.yaml is stale"
        );
    }
}

/// What `site`'s control plane says it splits every headroom figure among.
async fn sharers(site: &Site) -> anyhow::Result<u64> {
    let text = ai_router_e2e::get_text(&format!("http://{}/metrics", site.cp.http_addr())).await?;
    text.lines()
        .find_map(|l| l.strip_prefix("ai_router_headroom_sharers "))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no ai_router_headroom_sharers in /metrics"))
}

/// p1 with key a alone and no fallback: one scope, whose figure both Envoys hold.
fn one_scope(pool: String) -> String {
    let pool = pool
        .replace("      - { alias: b, env: P1_KEY_B }\n", "")
        .replace("  fallbacks: [m2]\n", "  allowFallback: false\n");
    assert!(pool.contains("allowFallback: false") && !pool.contains("P1_KEY_B"));
    pool
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoys_of_two_control_planes_together_never_send_more_than_the_scope_has_left() {
    let c = Cluster::start_edited("distributed-headroom", "", "", one_scope).await;
    // Each control plane counts both Envoys (its own and the other's, through Redis).
    poll(
        "both control planes to split among both Envoys",
        Duration::from_secs(15),
        || async { Ok((sharers(&c.a).await? == 2 && sharers(&c.b).await? == 2).then_some(())) },
    )
    .await
    .unwrap();
    // 10 left, counted down by the provider a second per answer.
    let replies = script::counting_down(10);
    c.mock
        .script(json!([script::always(replies)]))
        .await
        .unwrap();
    let r = c.a.client.chat("chat", Some(&c.virtual_key)).await.unwrap();
    assert_eq!(r.status, 200, "{r}");
    // B's control plane has A's figure from Redis (and pushes it to B's Envoy with it).
    for site in [&c.a, &c.b] {
        poll("the figure at both control planes", SHARED, || async {
            let r = c
                .admin(site, reqwest::Method::GET, "/admin/health", None)
                .await;
            let held = r.json["headroom"].as_array().is_some_and(|hs| {
                hs.iter()
                    .any(|h| h["provider"] == "p1" && h["remainingRequests"] == 10)
            });
            Ok(held.then_some(()))
        })
        .await
        .unwrap();
    }
    // Envoy has it a push after its control plane.
    for site in [&c.a, &c.b] {
        site.envoy.wait_for_state_of(&site.cp).await.unwrap();
    }
    c.mock.clear_calls().await.unwrap();
    let clients = [&c.a.client, &c.b.client];
    let calls = (0..50).map(|i| {
        let (client, key) = (clients[i % 2].clone(), c.virtual_key.clone());
        async move { client.chat("chat", Some(&key)).await.unwrap() }
    });
    let replies = futures::future::join_all(calls).await;
    let sent = c.mock.calls().await.unwrap().len();
    let ok = |through: usize| {
        replies
            .iter()
            .enumerate()
            .filter(|(n, r)| n % 2 == through && r.status == 200)
            .count()
    };
    // Each Envoy holds half the figure (api::shares: no overshoot while the membership and the
    // figure stand, and no answer comes back before every call is decided).
    assert!(
        sent <= 10,
        "{sent} calls reached a scope with 10 requests left"
    );
    assert_eq!(ok(0) + ok(1), sent, "every call sent succeeded");
    assert!(
        ok(0) >= 4 && ok(1) >= 4,
        "each Envoy sent its part: {} + {}",
        ok(0),
        ok(1)
    );
    for r in replies.iter().filter(|r| r.status != 200) {
        assert!(
            ai_router_e2e::openai_error_problem(r, 503, "pool_rate_limited").is_none(),
            "a call past the headroom is told the pool is rate limited: {r}"
        );
    }
}
