//! The shared state store: `stateStore: { type: redis, url: { env: NAME } }`.
//!
//! TLS: a `rediss://` URL connects over TLS and verifies the server's certificate and name
//! against `stateStore.caFile` (or the system's CAs); a server whose certificate does not
//! verify is refused at start ([`RedisStateStore::open`]), and later in the health message.
//!
//! Every control plane on one Redis holds the same durable state: blacklists (with the refused
//! fingerprint), cooldowns, breakers, headroom, provider spend, and the half-open probe lease.
//! Keys, all under the pool's `storeNamespace` (`<ns>` below):
//!
//! - `<ns>:state:blacklists`, `<ns>:state:cooldowns`, `<ns>:state:breakers`,
//!   `<ns>:state:headroom`, `<ns>:state:spend`, `<ns>:state:resets` (an operator's recent
//!   resets, which every control plane pushes to its Envoys): one hash per table, the field the entry's id as
//!   a JSON array, the value the entry as a JSON array;
//! - `<ns>:rpm:<virtual key id>:<UTC minute>`: the calls of the key's `requestsPerMinute`
//!   granted to Envoys in that minute (`store::minute_calls`), by a script; it expires after two
//!   minutes;
//! - `<ns>:watchers`: every control plane's open `Watch` streams, which split the headroom
//!   (`api::shares`): a sorted set of `<plane>/<stream>`, scored by when each registration
//!   lapses (renewed every second), replaced per plane by a script;
//! - `<ns>:lease:<scope>:<provider/key as JSON>`: the probe lease, `until|holder`, taken by a
//!   script (atomic: one round trip that reads the lease, compares its end with the caller's
//!   clock and sets it with `PX`), released by holder with a compare-and-delete script.
//!
//! How a change reaches every control plane: polling, not pub/sub. The engine already exchanges
//! state with its store every second ([`crate::engine::STORE_POLL_INTERVAL`]) and on every change
//! of its own, by three-way merge; a load is one pipelined round trip (five `HGETALL`s of small
//! hashes). Polling needs no subscriber connection to keep, loses nothing while a control plane
//! or Redis is away (the next load sees everything), and bounds the delay at about a second,
//! which is what the gateway promises.
//!
//! An outage: every call answers an error within a deadline; the engine keeps serving its own
//! state and retries each second, a lease is granted from a local table meanwhile (so during an
//! outage each control plane may let one probe through, not one for all), and
//! [`crate::store::health::STATE`] feeds the log line and `/metrics`. When Redis answers again
//! the engine merges what it holds with what Redis holds (see `Engine::sync_store`).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use serde_json::{json, Value};
use tokio::sync::Mutex as AsyncMutex;

use crate::store::breaker::{Breaker, BreakerId, BreakerPhase, BreakerScope};
use crate::store::bridge::Bridge;
use crate::store::durable::{
    Blacklist, BlacklistReason, DurableChanges, DurableState, LaneHeadroom, LeaseGrant, StateStore,
    StoreError,
};
use crate::store::health::{StoreHealth, STATE};
use crate::store::memory::MemoryStateStore;
use crate::store::spend::Spend;
use crate::store::start_wait::OpenFailure;

/// A load or a write: small, one round trip.
const CALL_DEADLINE: Duration = Duration::from_secs(2);
/// A lease is on a request's way: short, then the local table answers.
const LEASE_DEADLINE: Duration = Duration::from_millis(300);
/// A shared-cache look-up waits on a call's way (the filter bounds it tighter still).
const CACHE_DEADLINE: Duration = Duration::from_millis(100);

const TABLES: [&str; 6] = [
    "blacklists",
    "cooldowns",
    "breakers",
    "headroom",
    "spend",
    "resets",
];

/// Takes the lease unless a holder's lease runs past `now` (the callers' clocks decide, as with
/// the SQLite store: hosts keep time): `{1, 0}` granted, `{0, until}` held. The value is
/// `until|holder`; `PX` lets Redis drop it once it cannot matter any more.
/// KEYS[1] lease; ARGV holder, until, now, ttl.
const LEASE_SCRIPT: &str = r"
local v = redis.call('GET', KEYS[1])
if v then
  local sep = string.find(v, '|', 1, true)
  local ends = sep and tonumber(string.sub(v, 1, sep - 1))
  if ends and ends > tonumber(ARGV[3]) then
    return {0, ends}
  end
end
redis.call('SET', KEYS[1], ARGV[2] .. '|' .. ARGV[1], 'PX', ARGV[4])
return {1, 0}
";

/// Grants up to ARGV[1] calls of a key's minute under the limit ARGV[2] and counts them; the
/// count expires ARGV[3] ms after its first grant. KEYS[1] the count. Returns the grant.
const MINUTE_CALLS_SCRIPT: &str = r"
local counted = tonumber(redis.call('GET', KEYS[1]) or '0')
local left = tonumber(ARGV[2]) - counted
if left <= 0 then
  return 0
end
local granted = math.min(left, tonumber(ARGV[1]))
if redis.call('INCRBY', KEYS[1], granted) == granted then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return granted
";

/// Deletes the lease only when `holder` (ARGV[1]) holds it.
const RELEASE_SCRIPT: &str = r"
local v = redis.call('GET', KEYS[1])
if v then
  local sep = string.find(v, '|', 1, true)
  if sep and string.sub(v, sep + 1) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
  end
end
return 0
";

/// Replaces control plane ARGV[3]'s registered `Watch` streams with ARGV[5..], standing until
/// ARGV[2] (ms, the callers' clocks), drops every registration past ARGV[1] (now) and answers
/// all that stand; the set goes ARGV[4] ms after its last registration.
/// KEYS[1] the sorted set (score: until when a registration stands).
const WATCHERS_SCRIPT: &str = r"
local key = KEYS[1]
local prefix = ARGV[3]
redis.call('ZREMRANGEBYSCORE', key, '-inf', ARGV[1])
for _, m in ipairs(redis.call('ZRANGE', key, 0, -1)) do
  if string.sub(m, 1, #prefix) == prefix then
    redis.call('ZREM', key, m)
  end
end
for i = 5, #ARGV do
  redis.call('ZADD', key, ARGV[2], ARGV[i])
end
redis.call('PEXPIRE', key, ARGV[4])
return redis.call('ZRANGE', key, 0, -1)
";

/// A response-cache key as the filter makes it: lowercase hex SHA-256 (nothing else becomes a
/// Redis key).
fn is_cache_key(key: &str) -> bool {
    key.len() == 64 && key.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

struct Shared {
    client: redis::Client,
    conn: AsyncMutex<Option<MultiplexedConnection>>,
}

impl Shared {
    /// The connection, opened on first use and again after a failure.
    async fn conn(&self) -> Result<MultiplexedConnection, String> {
        let mut slot = self.conn.lock().await;
        if let Some(conn) = slot.as_ref() {
            return Ok(conn.clone());
        }
        let conn = self
            .client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| redis_error(&e))?;
        *slot = Some(conn.clone());
        Ok(conn)
    }

    async fn forget(&self) {
        *self.conn.lock().await = None;
    }
}

/// Redis errors without the URL (it may carry a password).
fn redis_error(err: &redis::RedisError) -> String {
    let kind = format!("{:?}", err.kind());
    if let Some(why) = crate::tls::client::handshake_failure(err) {
        return format!("redis: {kind}: {TLS_REFUSED}: {why}");
    }
    match err.detail() {
        Some(detail) => format!("redis: {kind}: {detail}"),
        // The socket's own words (refused, a name that does not resolve, a reset) say why;
        // they name no URL.
        None if err.is_io_error() => match crate::tls::client::find_cause::<std::io::Error>(err) {
            Some(io) => format!("redis: {kind}: not reachable ({io})"),
            None => format!("redis: {kind}: not reachable"),
        },
        None => format!("redis: {kind}"),
    }
}

/// What a message says when the TLS handshake failed (a certificate that does not verify).
const TLS_REFUSED: &str = "the TLS handshake failed";
/// How long the start waits for a `rediss://` server to verify.
const TLS_CHECK_DEADLINE: Duration = Duration::from_secs(3);

/// Whether `url` is Redis over TLS.
fn is_tls(url: &str) -> bool {
    url.trim_start()
        .get(..9)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("rediss://"))
}

/// The client for `url` (parsed, not connected); with `ca_file`, a `rediss://` server's
/// certificate must chain to that CA instead of the system's.
fn client(url: &str, ca_file: Option<&Path>) -> Result<redis::Client, StoreError> {
    let parse = |e: redis::RedisError| StoreError(format!("stateStore.url: {}", redis_error(&e)));
    let Some(ca_file) = ca_file else {
        return redis::Client::open(url).map_err(parse);
    };
    if !is_tls(url) {
        return Err(StoreError(
            "stateStore.caFile: the url is not rediss:// (Redis over TLS), so no certificate is verified; use rediss:// or remove caFile".into(),
        ));
    }
    let pem = std::fs::read(ca_file).map_err(|e| {
        StoreError(format!(
            "stateStore.caFile: reading {}: {e}",
            ca_file.display()
        ))
    })?;
    crate::tls::client::roots_from_pem(ca_file, &pem)
        .map_err(|e| StoreError(format!("stateStore.caFile: {e}")))?;
    let certificates = redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(pem),
    };
    redis::Client::build_with_tls(url, certificates).map_err(parse)
}

pub struct RedisStateStore {
    shared: Arc<Shared>,
    namespace: String,
    bridge: Bridge,
    /// Leases while Redis does not answer.
    local: MemoryStateStore,
    health: &'static StoreHealth,
}

impl std::fmt::Debug for RedisStateStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStateStore")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl RedisStateStore {
    /// Parses `url` (a control plane starts while Redis is away); a `rediss://` server that
    /// answers is asked for its certificate first, and one that does not verify (against
    /// `ca_file`, else the system's CAs) is refused.
    pub fn open(url: &str, namespace: &str, ca_file: Option<&Path>) -> Result<Self, StoreError> {
        let store = Self::from_client(client(url, ca_file)?, namespace, &STATE)?;
        if is_tls(url) {
            store.verify_tls(ca_file)?;
        }
        Ok(store)
    }

    #[cfg(test)]
    fn with_health(
        url: &str,
        namespace: &str,
        health: &'static StoreHealth,
    ) -> Result<Self, StoreError> {
        Self::from_client(client(url, None)?, namespace, health)
    }

    /// Connects once: a TLS handshake refused is an error naming the store; Redis away is not
    /// (the engine retries).
    fn verify_tls(&self, ca_file: Option<&Path>) -> Result<(), StoreError> {
        let shared = self.shared.clone();
        let answer = self
            .bridge
            .run(TLS_CHECK_DEADLINE, async move { shared.conn().await });
        match answer {
            Err(e) if e.contains(TLS_REFUSED) => {
                let against = ca_file.map_or_else(
                    || "the system's CAs (name the server's CA with stateStore.caFile)".to_owned(),
                    |f| format!("stateStore.caFile {}", f.display()),
                );
                Err(StoreError(format!(
                    "stateStore: the Redis server's TLS certificate did not verify against {against}: {e}"
                )))
            }
            _ => Ok(()),
        }
    }

    fn from_client(
        client: redis::Client,
        namespace: &str,
        health: &'static StoreHealth,
    ) -> Result<Self, StoreError> {
        Ok(Self {
            shared: Arc::new(Shared {
                client,
                conn: AsyncMutex::new(None),
            }),
            namespace: namespace.to_owned(),
            bridge: Bridge::new("ai-router-redis").map_err(StoreError)?,
            local: MemoryStateStore::default(),
            health,
        })
    }

    fn table(&self, name: &str) -> String {
        format!("{}:state:{name}", self.namespace)
    }

    /// Where the shared tier of the response cache keeps the entry of `key`.
    fn cache_key(&self, key: &str) -> String {
        format!("{}:cache:{key}", self.namespace)
    }

    fn lease_key(&self, id: &BreakerId) -> String {
        format!(
            "{}:lease:{}:{}",
            self.namespace,
            id.0.as_str(),
            json!([id.1, id.2])
        )
    }

    /// Runs `f` on the connection. Redis away (no connection, a broken one, no answer within
    /// `deadline`) marks the store down and drops the connection (the next call reconnects);
    /// a refusal from a Redis that answered does not.
    fn call<T, F, Fut>(&self, deadline: Duration, f: F) -> Result<T, Failure>
    where
        T: Send + 'static,
        F: FnOnce(MultiplexedConnection) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<T, redis::RedisError>> + Send,
    {
        let shared = self.shared.clone();
        let answer = self.bridge.run(deadline, async move {
            let conn = shared.conn().await.map_err(|e| format!("{AWAY}{e}"))?;
            match f(conn).await {
                Ok(v) => Ok(Ok(v)),
                Err(e) if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() => {
                    shared.forget().await;
                    Err(format!("{AWAY}{}", redis_error(&e)))
                }
                Err(e) => Ok(Err(redis_error(&e))),
            }
        });
        match answer {
            Ok(Ok(v)) => {
                self.health.succeeded();
                Ok(v)
            }
            Ok(Err(refused)) => {
                self.health.succeeded();
                Err(Failure::Refused(refused))
            }
            Err(err) => {
                self.health.failed(&err);
                // A deadline may have left a half-read reply on the connection.
                let shared = self.shared.clone();
                let _ = self.bridge.run(Duration::from_millis(100), async move {
                    shared.forget().await;
                    Ok(())
                });
                Err(Failure::Away(err))
            }
        }
    }
}

/// How a message about Redis being away starts.
const AWAY: &str = "not reachable: ";

/// Why a call failed.
#[derive(Debug)]
enum Failure {
    /// No connection, a broken one, or no answer in time: serve from local state.
    Away(String),
    /// Redis answered with an error.
    Refused(String),
}

impl From<Failure> for StoreError {
    fn from(f: Failure) -> Self {
        match f {
            Failure::Away(m) | Failure::Refused(m) => StoreError(m),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Entries as JSON
// ---------------------------------------------------------------------------------------------

fn field(parts: &[&str]) -> String {
    json!(parts).to_string()
}

fn parse_field<const N: usize>(text: &str) -> Option<[String; N]> {
    let parts: Vec<String> = serde_json::from_str(text).ok()?;
    parts.try_into().ok()
}

fn parse_value(text: &str) -> Option<Vec<Value>> {
    serde_json::from_str(text).ok()
}

fn i64_at(v: &[Value], i: usize) -> Option<i64> {
    v.get(i)?.as_i64()
}

fn encode_blacklist(b: &Blacklist) -> String {
    json!([
        b.reason.as_str(),
        b.until_ms,
        b.refused_fingerprint.to_string(),
        b.code
    ])
    .to_string()
}

fn decode_blacklist(text: &str) -> Option<Blacklist> {
    let v = parse_value(text)?;
    Some(Blacklist {
        reason: BlacklistReason::parse(v.first()?.as_str()?)?,
        until_ms: i64_at(&v, 1)?,
        refused_fingerprint: v.get(2)?.as_str()?.parse().ok()?,
        code: v.get(3)?.as_str().map(str::to_owned),
    })
}

fn encode_breaker(b: &Breaker) -> String {
    json!([b.phase.as_str(), b.failures, b.open_until_ms, b.cooldown_ms]).to_string()
}

fn decode_breaker(text: &str) -> Option<Breaker> {
    let v = parse_value(text)?;
    Some(Breaker {
        phase: BreakerPhase::parse(v.first()?.as_str()?)?,
        failures: u32::try_from(v.get(1)?.as_u64()?).ok()?,
        open_until_ms: i64_at(&v, 2)?,
        cooldown_ms: v.get(3)?.as_u64()?,
    })
}

fn encode_headroom(h: &LaneHeadroom) -> String {
    json!([h.remaining_requests, h.remaining_tokens, h.reset_at_ms]).to_string()
}

fn decode_headroom(text: &str) -> Option<LaneHeadroom> {
    let v = parse_value(text)?;
    Some(LaneHeadroom {
        remaining_requests: i64_at(&v, 0)?,
        remaining_tokens: i64_at(&v, 1)?,
        reset_at_ms: i64_at(&v, 2)?,
    })
}

fn encode_spend(s: &Spend) -> String {
    json!([s.day, s.day_cost, s.month, s.month_cost]).to_string()
}

fn decode_spend(text: &str) -> Option<Spend> {
    let v = parse_value(text)?;
    Some(Spend {
        day: i64_at(&v, 0)?,
        day_cost: v.get(1)?.as_f64()?,
        month: i64_at(&v, 2)?,
        month_cost: v.get(3)?.as_f64()?,
    })
}

/// The six hashes as a state; an entry that does not parse (written by another version) is
/// left out.
fn decode_state(tables: &[HashMap<String, String>]) -> DurableState {
    let mut state = DurableState::default();
    let empty = HashMap::new();
    let table = |i: usize| tables.get(i).unwrap_or(&empty);
    for (f, v) in table(0) {
        if let (Some([p, k]), Some(b)) = (parse_field::<2>(f), decode_blacklist(v)) {
            state.blacklists.insert((p, k), b);
        }
    }
    for (f, v) in table(1) {
        if let (Some([p, k, m]), Ok(until)) = (parse_field::<3>(f), v.parse::<i64>()) {
            state.cooldowns.insert((p, k, m), until);
        }
    }
    for (f, v) in table(2) {
        if let (Some([s, p, k]), Some(b)) = (parse_field::<3>(f), decode_breaker(v)) {
            if let Some(scope) = BreakerScope::parse(&s) {
                state.breakers.insert((scope, p, k), b);
            }
        }
    }
    for (f, v) in table(3) {
        if let (Some([p, k, m]), Some(h)) = (parse_field::<3>(f), decode_headroom(v)) {
            state.headroom.insert((p, k, m), h);
        }
    }
    for (provider, v) in table(4) {
        if let Some(s) = decode_spend(v) {
            state.spend.insert(provider.clone(), s);
        }
    }
    for (f, v) in table(5) {
        if let (Some([p, k]), Ok(at)) = (parse_field::<2>(f), v.parse::<i64>()) {
            state.resets.insert((p, k), at);
        }
    }
    state
}

/// (table, field, Some(value) to write | None to delete) for every change.
fn encode_changes(changes: &DurableChanges) -> Vec<(usize, String, Option<String>)> {
    let mut out = Vec::new();
    for (p, k) in &changes.blacklists.delete {
        out.push((0, field(&[p, k]), None));
    }
    for ((p, k), b) in &changes.blacklists.upsert {
        out.push((0, field(&[p, k]), Some(encode_blacklist(b))));
    }
    for (p, k, m) in &changes.cooldowns.delete {
        out.push((1, field(&[p, k, m]), None));
    }
    for ((p, k, m), until) in &changes.cooldowns.upsert {
        out.push((1, field(&[p, k, m]), Some(until.to_string())));
    }
    for (s, p, k) in &changes.breakers.delete {
        out.push((2, field(&[s.as_str(), p, k]), None));
    }
    for ((s, p, k), b) in &changes.breakers.upsert {
        out.push((2, field(&[s.as_str(), p, k]), Some(encode_breaker(b))));
    }
    for (p, k, m) in &changes.headroom.delete {
        out.push((3, field(&[p, k, m]), None));
    }
    for ((p, k, m), h) in &changes.headroom.upsert {
        out.push((3, field(&[p, k, m]), Some(encode_headroom(h))));
    }
    for p in &changes.spend.delete {
        out.push((4, p.clone(), None));
    }
    for (p, s) in &changes.spend.upsert {
        out.push((4, p.clone(), Some(encode_spend(s))));
    }
    for (p, k) in &changes.resets.delete {
        out.push((5, field(&[p, k]), None));
    }
    for ((p, k), at) in &changes.resets.upsert {
        out.push((5, field(&[p, k]), Some(at.to_string())));
    }
    out
}

impl RedisStateStore {
    /// Every table, one pipelined round trip.
    fn load_tables(&self) -> Result<DurableState, Failure> {
        let keys: Vec<String> = TABLES.iter().map(|t| self.table(t)).collect();
        let tables = self.call(CALL_DEADLINE, move |mut conn| async move {
            let mut pipe = redis::pipe();
            for key in &keys {
                pipe.hgetall(key);
            }
            pipe.query_async::<Vec<HashMap<String, String>>>(&mut conn)
                .await
        })?;
        Ok(decode_state(&tables))
    }
}

impl StateStore for RedisStateStore {
    fn load(&self) -> Result<DurableState, StoreError> {
        self.load_tables().map_err(StoreError::from)
    }

    /// Redis away is waited for; Redis refusing is not.
    fn load_at_start(&self) -> Result<DurableState, OpenFailure> {
        self.load_tables().map_err(|f| match f {
            Failure::Away(m) => OpenFailure::Away(StoreError(m).to_string()),
            Failure::Refused(m) => OpenFailure::Refused(StoreError(m).into()),
        })
    }

    fn apply(&self, changes: &DurableChanges) -> Result<(), StoreError> {
        let writes = encode_changes(changes);
        if writes.is_empty() {
            return Ok(());
        }
        let keys: Vec<String> = TABLES.iter().map(|t| self.table(t)).collect();
        self.call(CALL_DEADLINE, move |mut conn| async move {
            let mut pipe = redis::pipe();
            pipe.atomic();
            for (table, field, value) in &writes {
                let key = &keys[*table];
                match value {
                    Some(v) => pipe.hset(key, field, v).ignore(),
                    None => pipe.hdel(key, field).ignore(),
                };
            }
            pipe.query_async::<()>(&mut conn).await
        })
        .map_err(StoreError::from)
    }

    fn lease(
        &self,
        id: &BreakerId,
        holder: &str,
        now_ms: i64,
        ttl_ms: i64,
    ) -> Result<LeaseGrant, StoreError> {
        let key = self.lease_key(id);
        let holder_owned = holder.to_owned();
        let ttl = ttl_ms.max(1);
        let until = now_ms.saturating_add(ttl);
        let answer = self.call(LEASE_DEADLINE, move |mut conn| async move {
            redis::Script::new(LEASE_SCRIPT)
                .key(key)
                .arg(holder_owned)
                .arg(until)
                .arg(now_ms)
                .arg(ttl)
                .invoke_async::<(i64, i64)>(&mut conn)
                .await
        });
        match answer {
            Ok((1, _)) => Ok(LeaseGrant::Granted),
            Ok((_, until)) => Ok(LeaseGrant::HeldUntil(until)),
            Err(Failure::Refused(err)) => Err(StoreError(err)),
            Err(Failure::Away(err)) => {
                // Counted by `call`; a call must not fail for it.
                tracing::warn!(%err, scope = id.0.as_str(), provider = %id.1, "probe lease from local state: the shared store does not answer");
                self.health.fell_back();
                self.local.lease(id, holder, now_ms, ttl_ms)
            }
        }
    }

    fn cache_get(&self, key: &str) -> Option<Vec<u8>> {
        if !is_cache_key(key) {
            return None;
        }
        let key = self.cache_key(key);
        match self.call(CACHE_DEADLINE, move |mut conn| async move {
            redis::cmd("GET")
                .arg(key)
                .query_async::<Option<Vec<u8>>>(&mut conn)
                .await
        }) {
            Ok(entry) => entry,
            Err(Failure::Refused(err) | Failure::Away(err)) => {
                tracing::warn!(%err, "shared cache look-up: a miss, the shared store does not answer");
                None
            }
        }
    }

    fn cache_put(&self, key: &str, entry: Vec<u8>, ttl_ms: u64) -> bool {
        if !is_cache_key(key) || ttl_ms == 0 || entry.is_empty() {
            return false;
        }
        let key = self.cache_key(key);
        match self.call(CALL_DEADLINE, move |mut conn| async move {
            redis::cmd("SET")
                .arg(key)
                .arg(entry)
                .arg("PX")
                .arg(ttl_ms)
                .query_async::<()>(&mut conn)
                .await
        }) {
            Ok(()) => true,
            Err(Failure::Refused(err) | Failure::Away(err)) => {
                tracing::warn!(%err, "shared cache: an entry not stored, the shared store does not answer");
                false
            }
        }
    }

    fn take_minute_calls(
        &self,
        key_id: &str,
        minute: i64,
        calls: u64,
        limit: u64,
    ) -> Result<Option<u64>, StoreError> {
        let key = format!("{}:rpm:{key_id}:{minute}", self.namespace);
        let calls = calls.min(ai_router_contract::minute::most_granted(limit));
        let answer = self.call(LEASE_DEADLINE, move |mut conn| async move {
            redis::Script::new(MINUTE_CALLS_SCRIPT)
                .key(key)
                .arg(calls)
                .arg(limit.min(i64::MAX as u64))
                .arg(crate::store::minute_calls::KEEP_MS)
                .invoke_async::<u64>(&mut conn)
                .await
        });
        match answer {
            Ok(granted) => Ok(Some(granted)),
            Err(Failure::Refused(err)) => Err(StoreError(err)),
            Err(Failure::Away(err)) => {
                // Counted by `call`; the caller counts in its own memory meanwhile.
                tracing::warn!(%err, "minute budget from local counts: the shared store does not answer");
                self.health.fell_back();
                Ok(None)
            }
        }
    }

    fn watchers(
        &self,
        plane: &str,
        mine: &[String],
        now_ms: i64,
        ttl_ms: i64,
    ) -> Result<Option<Vec<String>>, StoreError> {
        let key = format!("{}:watchers", self.namespace);
        let prefix = format!("{plane}/");
        let mine = mine.to_vec();
        let ttl_ms = ttl_ms.max(1);
        let until = now_ms.saturating_add(ttl_ms);
        self.call(CALL_DEADLINE, move |mut conn| async move {
            let script = redis::Script::new(WATCHERS_SCRIPT);
            let mut call = script.key(key);
            call.arg(now_ms).arg(until).arg(prefix).arg(ttl_ms);
            for m in &mine {
                call.arg(m);
            }
            call.invoke_async::<Vec<String>>(&mut conn).await
        })
        .map(Some)
        .map_err(StoreError::from)
    }

    fn release(&self, id: &BreakerId, holder: Option<&str>) -> Result<(), StoreError> {
        let _ = self.local.release(id, holder);
        let key = self.lease_key(id);
        let holder = holder.map(str::to_owned);
        self.call(LEASE_DEADLINE, move |mut conn| async move {
            match holder {
                Some(holder) => {
                    redis::Script::new(RELEASE_SCRIPT)
                        .key(key)
                        .arg(holder)
                        .invoke_async::<i64>(&mut conn)
                        .await?;
                }
                None => {
                    redis::cmd("DEL")
                        .arg(key)
                        .query_async::<i64>(&mut conn)
                        .await?;
                }
            }
            Ok(())
        })
        .map_err(StoreError::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::servers;

    static TEST_HEALTH: StoreHealth = StoreHealth::new("test");

    use crate::store::durable::sample_state as sample;

    #[test]
    fn an_unreachable_redis_says_why_and_never_the_url() {
        let refused =
            redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        let message = redis_error(&refused);
        assert!(
            message.starts_with("redis: Io")
                && message.contains("not reachable (connection refused)"),
            "{message}"
        );
        // A real connection to a port nothing listens on, through a URL with a password.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or(1);
        let url = format!("redis://:s3cret-pass@127.0.0.1:{port}/");
        let err = redis::Client::open(url.as_str())
            .and_then(|c| c.get_connection())
            .err()
            .map(|e| redis_error(&e))
            .unwrap_or_default();
        assert!(
            err.contains("not reachable (") && err.contains("refused"),
            "{err}"
        );
        assert!(
            !err.contains("s3cret-pass") && !err.contains("redis://"),
            "{err}"
        );
    }

    #[test]
    fn entries_round_trip_through_json() {
        let state = sample();
        let writes = encode_changes(&DurableChanges::between(&DurableState::default(), &state));
        let mut tables = vec![HashMap::new(); TABLES.len()];
        for (t, f, v) in writes {
            if let Some(v) = v {
                tables[t].insert(f, v);
            }
        }
        assert_eq!(decode_state(&tables), state);
        // Something another version wrote is left out, not an error.
        tables[0].insert("[\"p\"]".into(), "[]".into());
        tables[2].insert(
            "[\"nope\",\"p\",\"\"]".into(),
            encode_breaker(&Breaker::default()),
        );
        assert_eq!(decode_state(&tables), state);
    }

    #[test]
    fn rediss_verifies_the_server_against_the_ca_file() -> anyhow::Result<()> {
        let cas = crate::tls::testing::two_cas("rediss")?;
        let tls = servers::ServerTls::in_dir(&cas.right.control_plane);
        let redis = servers::RedisServer::start_tls(tls)?;
        assert!(redis.url().starts_with("rediss://"));
        let store = RedisStateStore::open(&redis.url(), "tls", Some(&cas.right.ca))?;
        let state = sample();
        store.save(&state)?;
        assert_eq!(store.load()?, state);

        let refused = RedisStateStore::open(&redis.url(), "tls", Some(&cas.wrong.ca))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            refused.contains("stateStore: the Redis server's TLS certificate did not verify")
                && refused.contains("invalid peer certificate")
                && refused.contains(&cas.wrong.ca.display().to_string()),
            "{refused}"
        );
        // A CA file without TLS would verify nothing: refused, not ignored.
        let plain = format!("redis://127.0.0.1:{}/", redis.port);
        let refused = RedisStateStore::open(&plain, "tls", Some(&cas.right.ca))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            refused.contains("stateStore.caFile: the url is not rediss://"),
            "{refused}"
        );
        Ok(())
    }

    #[test]
    fn shares_state_and_leases_through_a_real_redis() -> anyhow::Result<()> {
        let redis = servers::RedisServer::start()?;
        let a = RedisStateStore::with_health(&redis.url(), "team-a", &TEST_HEALTH)?;
        let b = RedisStateStore::with_health(&redis.url(), "team-a", &TEST_HEALTH)?;
        let other = RedisStateStore::with_health(&redis.url(), "team-b", &TEST_HEALTH)?;
        assert_eq!(a.load()?, DurableState::default());
        let state = sample();
        a.save(&state)?;
        assert_eq!(b.load()?, state);
        assert_eq!(
            other.load()?,
            DurableState::default(),
            "namespaces are apart"
        );
        let mut less = state.clone();
        less.blacklists.clear();
        b.save(&less)?;
        assert_eq!(a.load()?, less);

        // One lease across both; the holder's release frees it, another's does not.
        let id = (BreakerScope::Key, "p".to_owned(), "k".to_owned());
        assert_eq!(a.lease(&id, "a#1", 1_000, 5_000)?, LeaseGrant::Granted);
        assert_eq!(
            b.lease(&id, "b#1", 2_000, 5_000)?,
            LeaseGrant::HeldUntil(6_000)
        );
        b.release(&id, Some("b#1"))?;
        assert!(matches!(
            b.lease(&id, "b#1", 1_000, 5_000)?,
            LeaseGrant::HeldUntil(_)
        ));
        a.release(&id, Some("a#1"))?;
        assert_eq!(b.lease(&id, "b#1", 1_000, 5_000)?, LeaseGrant::Granted);
        a.release(&id, None)?;
        // A lease ends by itself: by the callers' clock, and Redis drops it after its TTL.
        assert_eq!(a.lease(&id, "a#2", 10_000, 100)?, LeaseGrant::Granted);
        assert_eq!(b.lease(&id, "b#2", 10_100, 100)?, LeaseGrant::Granted);
        std::thread::sleep(Duration::from_millis(150));
        assert_eq!(b.lease(&id, "b#3", 0, 100)?, LeaseGrant::Granted);
        Ok(())
    }

    #[test]
    fn every_control_plane_s_watchers_are_one_membership_and_a_silent_one_drops_out(
    ) -> anyhow::Result<()> {
        static HEALTH: StoreHealth = StoreHealth::new("watchers-test");
        let redis = servers::RedisServer::start()?;
        let a = RedisStateStore::with_health(&redis.url(), "ns", &HEALTH)?;
        let b = RedisStateStore::with_health(&redis.url(), "ns", &HEALTH)?;
        let names = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            a.watchers("a", &names(&["a/1", "a/2"]), 1_000, 5_000)?,
            Some(names(&["a/1", "a/2"]))
        );
        let mut all = b
            .watchers("b", &names(&["b/1"]), 2_000, 5_000)?
            .unwrap_or_default();
        all.sort();
        assert_eq!(all, names(&["a/1", "a/2", "b/1"]));
        // A registration replaces the plane's earlier one.
        let mut all = a
            .watchers("a", &names(&["a/2"]), 3_000, 5_000)?
            .unwrap_or_default();
        all.sort();
        assert_eq!(all, names(&["a/2", "b/1"]));
        // a stops renewing: past its TTL its streams are gone from b's answer.
        assert_eq!(
            b.watchers("b", &names(&["b/1"]), 8_001, 5_000)?,
            Some(names(&["b/1"]))
        );
        Ok(())
    }

    #[test]
    fn minute_calls_come_from_one_count_in_redis() -> anyhow::Result<()> {
        static HEALTH: StoreHealth = StoreHealth::new("minute-test");
        let mut redis = servers::RedisServer::start()?;
        let a = RedisStateStore::with_health(&redis.url(), "ns", &HEALTH)?;
        let b = RedisStateStore::with_health(&redis.url(), "ns", &HEALTH)?;
        let other = RedisStateStore::with_health(&redis.url(), "other", &HEALTH)?;
        let mut granted = 0;
        for _ in 0..6 {
            granted += a.take_minute_calls("key_a", 7, 5, 12)?.unwrap_or(0);
            granted += b.take_minute_calls("key_a", 7, 5, 12)?.unwrap_or(0);
        }
        assert_eq!(granted, 12, "one budget across both control planes");
        assert_eq!(b.take_minute_calls("key_a", 8, 5, 12)?, Some(5));
        assert_eq!(other.take_minute_calls("key_a", 7, 5, 12)?, Some(5));
        let ttl = std::process::Command::new("redis-cli")
            .args(["-p", &redis.port.to_string(), "PTTL", "ns:rpm:key_a:7"])
            .output()?;
        let ttl: i64 = String::from_utf8_lossy(&ttl.stdout).trim().parse()?;
        assert!((1..=120_000).contains(&ttl), "{ttl}");
        // Away: no count to share, the caller counts locally.
        redis.kill();
        assert_eq!(a.take_minute_calls("key_a", 9, 5, 12)?, None);
        assert!(
            HEALTH
                .local_fallbacks
                .load(std::sync::atomic::Ordering::Relaxed)
                >= 1
        );
        Ok(())
    }

    #[test]
    fn cache_entries_are_shared_with_their_ttl_and_an_outage_is_a_miss() -> anyhow::Result<()> {
        static HEALTH: StoreHealth = StoreHealth::new("cache-test");
        let mut redis = servers::RedisServer::start()?;
        let a = RedisStateStore::with_health(&redis.url(), "ns", &HEALTH)?;
        let b = RedisStateStore::with_health(&redis.url(), "ns", &HEALTH)?;
        let other = RedisStateStore::with_health(&redis.url(), "other", &HEALTH)?;
        let key = "ab".repeat(32);
        assert_eq!(b.cache_get(&key), None);
        assert!(a.cache_put(&key, b"entry".to_vec(), 60_000));
        assert_eq!(b.cache_get(&key), Some(b"entry".to_vec()));
        assert_eq!(other.cache_get(&key), None, "namespaces are apart");
        let ttl = std::process::Command::new("redis-cli")
            .args([
                "-p",
                &redis.port.to_string(),
                "PTTL",
                &format!("ns:cache:{key}"),
            ])
            .output()?;
        let ttl: i64 = String::from_utf8_lossy(&ttl.stdout).trim().parse()?;
        assert!((1..=60_000).contains(&ttl), "{ttl}");
        // Only a hex SHA-256 names an entry; no lifetime, no entry.
        assert!(!a.cache_put("ns:state:x", b"entry".to_vec(), 60_000));
        assert!(!a.cache_put(&"cd".repeat(32), b"entry".to_vec(), 0));
        assert_eq!(a.cache_get(&"cd".repeat(32)), None);
        // An entry ends with its TTL.
        assert!(a.cache_put(&"ef".repeat(32), b"short".to_vec(), 50));
        std::thread::sleep(Duration::from_millis(120));
        assert_eq!(b.cache_get(&"ef".repeat(32)), None);
        // Away: a miss, fast, and a put that says it did not store.
        redis.kill();
        let started = std::time::Instant::now();
        assert_eq!(b.cache_get(&key), None);
        assert!(!a.cache_put(&key, b"entry".to_vec(), 60_000));
        assert!(started.elapsed() < Duration::from_secs(5));
        Ok(())
    }

    #[test]
    fn an_outage_fails_fast_leases_locally_and_recovers() -> anyhow::Result<()> {
        static HEALTH: StoreHealth = StoreHealth::new("outage-test");
        let mut redis = servers::RedisServer::start()?;
        let store = RedisStateStore::with_health(&redis.url(), "ns", &HEALTH)?;
        store.save(&sample())?;
        redis.kill();
        let started = std::time::Instant::now();
        assert!(store.load().is_err());
        assert!(!HEALTH.is_up());
        let id = (BreakerScope::Provider, "p".to_owned(), String::new());
        assert_eq!(store.lease(&id, "x#1", 0, 5_000)?, LeaseGrant::Granted);
        assert!(matches!(
            store.lease(&id, "y#1", 0, 5_000)?,
            LeaseGrant::HeldUntil(_)
        ));
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        assert!(
            HEALTH
                .local_fallbacks
                .load(std::sync::atomic::Ordering::Relaxed)
                >= 2
        );
        redis.restart()?;
        // Back, and empty (the restart lost everything): the engine writes its state again.
        assert_eq!(store.load()?, DurableState::default());
        assert!(HEALTH.is_up());
        assert_eq!(
            HEALTH.recoveries.load(std::sync::atomic::Ordering::Relaxed),
            1
        );
        Ok(())
    }
}
