//! The admin API's route table, the one place that says which routes exist, which handler
//! answers each, which `airouter.v1.Admin` gRPC method does the same and which admin-token
//! scope ([`Scope`]) each needs. The HTTP router is built from it ([`routes`]), the HTTP guard
//! ([`guard`]) and every gRPC method ([`for_grpc`]) look their scope up in it: a route cannot
//! be served without a scope. A path under `/admin/` that is not in the table needs `admin`
//! (closed by default).

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, Method};
use axum::response::{IntoResponse, Response as HttpResponse};
use axum::routing::{delete, get, patch, post, MethodRouter};
use axum::{Json, Router};
use serde_json::{json, Value};

use super::state::AdminApi;
use super::{catalog, keys, pool};
use crate::api::console;
use crate::keys::admin_tokens::Scope;

/// The HTTP handler of a route, on the admin API's state.
pub type Handler = fn() -> MethodRouter<Arc<AdminApi>>;

/// One route: its HTTP method and path (`{id}` matches one segment), the gRPC method that
/// does the same (empty when none does), the scope it needs and its handler.
#[derive(Debug, Clone, Copy)]
pub struct Route {
    pub method: &'static str,
    pub path: &'static str,
    pub grpc: &'static str,
    pub scope: Scope,
    pub handler: Handler,
}

const fn route(
    method: &'static str,
    path: &'static str,
    grpc: &'static str,
    scope: Scope,
    handler: Handler,
) -> Route {
    Route {
        method,
        path,
        grpc,
        scope,
        handler,
    }
}

use Scope::{Admin, Keys, Operate, Read};

/// Every admin route: what it does is in its handler's doc (and the module doc of
/// [`crate::api::admin`]); the console's are [`crate::api::console`]'s.
#[rustfmt::skip]
pub const ROUTES: &[Route] = &[
    // `GET /health` answers everyone; with a `read` token it adds the pool.
    route("GET", "/health", "Health", Read, || get(health)),
    route("GET", "/admin/whoami", "Whoami", Read, || get(keys::whoami)),
    route("GET", "/admin/health", "PoolHealth", Read, || get(pool::admin_health)),
    route("GET", "/admin/stats", "Stats", Read, || get(pool::stats)),
    route("GET", "/admin/catalog", "Catalog", Read, || get(catalog::catalog)),
    route("GET", "/admin/ledger", "Ledger", Read, || get(pool::ledger)),
    route("GET", "/admin/events", "Events", Read, || get(pool::events)),
    route("GET", "/admin/console", "", Read, || get(console::overview)),
    route("GET", "/admin/console/ledger", "", Read, || get(console::ledger)),
    route("GET", "/admin/console/usage", "", Read, || get(console::usage)),
    route("GET", "/admin/keys", "ListKeys", Read, || get(keys::list_keys)),
    route("GET", "/admin/keys/{id}", "GetKey", Read, || get(keys::get_key)),
    route("GET", "/admin/keys/{id}/usage", "KeyUsage", Read, || get(keys::key_usage)),
    route("POST", "/admin/reset", "Reset", Operate, || post(pool::reset)),
    route("POST", "/admin/keys", "CreateKey", Keys, || post(keys::create_key)),
    route("PATCH", "/admin/keys/{id}", "UpdateKey", Keys, || patch(keys::update_key)),
    route("POST", "/admin/keys/{id}/revoke", "RevokeKey", Keys, || post(keys::revoke_key)),
    route("POST", "/admin/keys/{id}/rotate", "RotateKey", Keys, || post(keys::rotate_key)),
    route("GET", "/admin/tokens", "ListTokens", Admin, || get(keys::list_tokens)),
    route("POST", "/admin/tokens", "CreateToken", Admin, || post(keys::create_token)),
    route("DELETE", "/admin/tokens/{id}", "RevokeToken", Admin, || delete(keys::revoke_token)),
];

/// Every route of [`ROUTES`] (the admin routes and `/health`), on the shared state.
pub fn routes() -> Router<Arc<AdminApi>> {
    router(|_| true)
}

/// The `/admin/...` routes alone: what the gateway's listener forwards (through Envoy, to the
/// gRPC port: [`crate::api::sync::serve_with_admin`]).
pub fn admin_routes() -> Router<Arc<AdminApi>> {
    router(|r| r.path.starts_with("/admin/"))
}

fn router(keep: impl Fn(&Route) -> bool) -> Router<Arc<AdminApi>> {
    ROUTES
        .iter()
        .filter(|r| keep(r))
        .fold(Router::new(), |router, r| {
            router.route(r.path, (r.handler)())
        })
}

/// Whether `path` is one of the console's assets ([`crate::api::console::ASSETS`]).
pub fn is_asset(path: &str) -> bool {
    crate::api::console::ASSETS.contains(&path)
}

fn matches(pattern: &str, path: &str) -> bool {
    let mut want = pattern.split('/');
    let mut got = path.split('/');
    loop {
        match (want.next(), got.next()) {
            (None, None) => return true,
            (Some(w), Some(g)) if w == g || (w.starts_with('{') && !g.is_empty()) => {}
            _ => return false,
        }
    }
}

/// The scope an HTTP request needs: its route's, else `admin` for any other `/admin/` path
/// (closed by default); `None` for a path outside the admin API.
pub fn for_http(method: &Method, path: &str) -> Option<Scope> {
    let found = ROUTES
        .iter()
        .find(|r| r.method == method.as_str() && matches(r.path, path));
    match found {
        Some(r) => Some(r.scope),
        None if path.starts_with("/admin/") => Some(Admin),
        None => None,
    }
}

/// The scope a gRPC method of `airouter.v1.Admin` needs (`admin` for one not in the table).
pub fn for_grpc(method: &str) -> Scope {
    ROUTES
        .iter()
        .find(|r| !r.grpc.is_empty() && r.grpc == method)
        .map_or(Admin, |r| r.scope)
}

/// Who may call what, before routing and before a body is read: every `/admin/` request but
/// the console's assets is authenticated and its scope checked against the route's row in
/// [`ROUTES`] (a path with no row needs `admin`); the caller goes to the handler as an
/// extension (a handler reached without it answers 500, never unguarded). The body limit and
/// the header timeout are the server's and apply first.
pub async fn guard(
    State(api): State<Arc<AdminApi>>,
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> HttpResponse {
    let path = request.uri().path();
    if path.starts_with("/admin/") && !is_asset(path) {
        let need = for_http(request.method(), path).unwrap_or(Scope::Admin);
        let authorization = request
            .headers()
            .get(axum::http::header::AUTHORIZATION)
            .map(|v| v.as_bytes());
        match api.authorize(authorization, need).await {
            Ok(caller) => {
                request.extensions_mut().insert(caller);
            }
            Err(refused) => return refused.into_response(),
        }
    }
    next.run(request).await
}

/// The admin routes behind [`guard`] on `api`.
pub fn guarded(router: Router<Arc<AdminApi>>, api: Arc<AdminApi>) -> Router {
    router
        .layer(axum::middleware::from_fn_with_state(api.clone(), guard))
        .with_state(api)
}

/// `GET /health`: the plain answer, or the pool's with the admin token.
async fn health(State(api): State<Arc<AdminApi>>, headers: HeaderMap) -> Json<Value> {
    let authorization = headers
        .get(axum::http::header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    let admin = authorization.is_some()
        && api
            .authorize(authorization, for_grpc("Health"))
            .await
            .is_ok();
    if admin {
        Json(api.pool_health())
    } else {
        let health = api.engine.health();
        Json(json!({ "status": health.status, "version": health.version }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(method, path)` of every `.route(...)` written by hand in a router's source.
    fn routes_in(source: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for line in source.lines() {
            let Some(at) = line.find(".route(\"") else {
                continue;
            };
            let rest = &line[at + 8..];
            let Some(end) = rest.find('"') else { continue };
            let path = &rest[..end];
            for (call, method) in [
                ("get(", "GET"),
                ("post(", "POST"),
                ("patch(", "PATCH"),
                ("delete(", "DELETE"),
                ("put(", "PUT"),
            ] {
                if rest[end..].contains(call) {
                    out.push((method.to_owned(), path.to_owned()));
                }
            }
        }
        out
    }

    #[test]
    fn every_admin_route_has_a_scope() {
        // The router is built from the table; a route added by hand beside it needs a row.
        let by_hand = [
            include_str!("../console.rs"),
            include_str!("mod.rs"),
            include_str!("keys.rs"),
            include_str!("pool.rs"),
            include_str!("catalog.rs"),
            include_str!("grpc.rs"),
        ];
        for (method, path) in by_hand.iter().flat_map(|s| routes_in(s)) {
            if !path.starts_with("/admin/") && path != "/health" {
                continue;
            }
            assert!(
                ROUTES.iter().any(|r| r.method == method && r.path == path),
                "{method} {path} has no row in the scope table"
            );
        }
        assert!(ROUTES.len() >= 15, "{ROUTES:?}");
        // And each row is one route (a method and a path once).
        for (i, r) in ROUTES.iter().enumerate() {
            assert!(
                !ROUTES[..i]
                    .iter()
                    .any(|o| o.method == r.method && o.path == r.path),
                "{r:?} is listed twice"
            );
        }
    }

    #[test]
    fn every_grpc_method_has_a_scope_and_mirrors_its_route() {
        let proto = include_str!("../../../../proto/airouter/v1/admin.proto");
        let methods: Vec<&str> = proto
            .lines()
            .filter_map(|l| l.trim().strip_prefix("rpc "))
            .filter_map(|l| l.split('(').next())
            .collect();
        assert!(methods.len() >= 15, "{methods:?}");
        for m in &methods {
            assert!(
                ROUTES.iter().any(|r| r.grpc == *m),
                "gRPC {m} has no row in the scope table"
            );
        }
        for r in ROUTES.iter().filter(|r| !r.grpc.is_empty()) {
            assert!(methods.contains(&r.grpc), "{r:?}: no such gRPC method");
            assert_eq!(for_grpc(r.grpc), r.scope);
        }
        assert_eq!(for_grpc("SomethingNew"), Admin);
    }

    #[test]
    fn the_scopes_the_issue_names() {
        let http =
            |m: &str, p: &str| for_http(&Method::from_bytes(m.as_bytes()).unwrap_or_default(), p);
        assert_eq!(http("GET", "/admin/health"), Some(Read));
        assert_eq!(http("GET", "/admin/events"), Some(Read));
        assert_eq!(http("GET", "/admin/console/usage"), Some(Read));
        assert_eq!(http("GET", "/admin/keys/key_1/usage"), Some(Read));
        assert_eq!(http("POST", "/admin/reset"), Some(Operate));
        assert_eq!(http("POST", "/admin/keys"), Some(Keys));
        assert_eq!(http("PATCH", "/admin/keys/key_1"), Some(Keys));
        assert_eq!(http("POST", "/admin/keys/key_1/rotate"), Some(Keys));
        assert_eq!(http("GET", "/admin/tokens"), Some(Admin));
        assert_eq!(http("DELETE", "/admin/tokens/ops"), Some(Admin));
        // Closed by default: an unknown admin path, or a method a route does not take.
        assert_eq!(http("GET", "/admin/nope"), Some(Admin));
        assert_eq!(http("DELETE", "/admin/reset"), Some(Admin));
        assert_eq!(http("GET", "/admin/keys//usage"), Some(Admin));
        assert_eq!(http("GET", "/v1/models"), None);
    }
}
