//! The admin API: the gateway's virtual keys, over HTTP (on the control plane's HTTP server)
//! and gRPC (`airouter.v1.Admin`, on its gRPC server, same operations).
//!
//! Every call carries the admin token: `Authorization: Bearer <token>` (the HTTP header, or the
//! gRPC metadata entry `authorization`), compared in constant time. The token is
//! `gateway.adminToken`, else `AI_ROUTER_ADMIN_TOKEN`. With none configured every call answers
//! 403 `admin_disabled`; without a token 401 `missing_api_key`; with a wrong one 401
//! `invalid_api_key`.
//!
//! The route table is [`routes::ROUTES`]: every route once, with its handler, its gRPC twin
//! and the scope it needs; the router, the HTTP guard and the gRPC methods all read it. What
//! each route does:
//!
//! | route | does |
//! |---|---|
//! | `POST /admin/keys` | create from a key spec (`label`, `owner`, `profiles`, `models`, `allowFallback`, `quota`, `enabled`, `cache`); 201 `{ key, secret }` |
//! | `GET /admin/keys` | `{ keys: [...] }`: mounted keys (`mounted: true`) then stored ones |
//! | `GET /admin/keys/{id}` | one key |
//! | `PATCH /admin/keys/{id}` | change bindings (`owner`, `profiles`, `models`, `allowFallback`, `quota`, `enabled`, `cache`); `quota` merges limit by limit, `null` removes a limit (`quota: null`, all); `cache: null` leaves the response cache to the policy |
//! | `POST /admin/keys/{id}/revoke` | revoke for good |
//! | `POST /admin/keys/{id}/rotate` | new secret, same id, bindings and usage; 200 `{ key, secret }` |
//! | `GET /admin/keys/{id}/usage?from=YYYY-MM-DD&to=YYYY-MM-DD` | `{ id, from, to, days, total }` (default: this month) |
//! | `GET /health` (no token needed) | with the admin token, adds the pool (what `GET /admin/health` answers) |
//! | `GET /admin/health` | providers, key aliases and states, breakers, cooldowns, headroom, budgets (spent, limits, window, enforcement), lane latencies: words, `null` for no end |
//! | `GET /admin/stats`, `/admin/catalog`, `/admin/ledger` | this process's counters; profiles and models; each provider's quota windows |
//! | `GET /admin/events?types=` | the operator's events, live (server-sent events) |
//! | `POST /admin/reset` | closes breakers, lifts blacklists and cooldowns |
//! | `GET /admin/whoami` | the calling token's `{ label, scope, expiresAtMs, expires }` |
//! | `GET /admin/tokens`, `POST /admin/tokens`, `DELETE /admin/tokens/{id}` | the scoped admin tokens ([`crate::keys::admin_tokens`]): list; create from `{ label, scope, expires }`, 201 `{ token, secret }`; revoke |
//! | `GET /ui`, `/admin/console...` | the operator's console and its figures ([`crate::api::pulse`]) |
//!
//! A key is `{ id, label, owner, profiles, models, allowFallback, quota, enabled, revoked,
//! mounted, hint, createdAtMs, created }`: never its secret or hash. `profiles` and `models`
//! must name the pool's profiles and model ids or aliases (or `*`), else 400. The secret is in the
//! answer to create and rotate only. Errors are OpenAI error objects: 400 `invalid_request`,
//! 404 `not_found`, 409 `key_mounted` (revoke, rotate or PATCH of a mounted key: it changes by
//! redeploying), 409 `conflict` (a revoked key), 500 `internal_error`.
//!
//! A write is pushed to the data plane before the call answers; keys written by another
//! process sharing the SQLite store are picked up by [`run_key_sync`] within a second. The same
//! task pushes the keys' quota blocks ([`crate::keys::quotas`]) after each usage write, when the UTC
//! day rolls over, and every few seconds (usage another process wrote).//!
//! The files, by concern: [`routes`](mod@routes) (the table, the router, the guard), [`auth`] (the admin
//! token, the caller), [`state`] (the operations' state, authentication, audit), [`keys`]
//! (virtual keys and admin tokens), [`pool`] (health, stats, ledger, events, reset),
//! [`catalog`], [`grpc`] (the same operations over gRPC) and [`key_sync`] (the keys and quota
//! blocks pushed to the snapshot).

pub mod auth;
pub mod catalog;
pub mod grpc;
mod http;
pub mod key_sync;
pub mod keys;
pub mod pool;
pub mod routes;
pub mod state;
#[cfg(test)]
pub(crate) mod tests;

pub use auth::{admin_token, Caller, ADMIN_TOKEN_ENV};
pub use grpc::AdminGrpc;
pub use key_sync::{push_keys, recheck_quotas, run_key_sync, KEY_SYNC_INTERVAL};
pub use routes::{admin_routes, guard, guarded, routes};
pub use state::AdminApi;
