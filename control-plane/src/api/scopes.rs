//! The admin API's route → scope table: the one place that says which admin-token scope
//! ([`Scope`]) each HTTP route and each `airouter.v1.Admin` method needs. The HTTP guard
//! ([`crate::api::admin::guard`]) and every gRPC method look their route up here; a path under
//! `/admin/` that is not in the table needs `admin` (a route added without a row is closed,
//! and the tests below fail until it has one).

use axum::http::Method;

use crate::keys::admin_tokens::Scope;

/// One route: its HTTP method and path (`{id}` matches one segment), the gRPC method that
/// does the same (empty when none does), and the scope it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    pub method: &'static str,
    pub path: &'static str,
    pub grpc: &'static str,
    pub scope: Scope,
}

const fn route(
    method: &'static str,
    path: &'static str,
    grpc: &'static str,
    scope: Scope,
) -> Route {
    Route {
        method,
        path,
        grpc,
        scope,
    }
}

use Scope::{Admin, Keys, Operate, Read};

/// Every admin route and the scope it needs.
pub const ROUTES: &[Route] = &[
    // `GET /health` answers everyone; with a `read` token it adds the pool.
    route("GET", "/health", "Health", Read),
    route("GET", "/admin/whoami", "Whoami", Read),
    route("GET", "/admin/health", "PoolHealth", Read),
    route("GET", "/admin/stats", "Stats", Read),
    route("GET", "/admin/catalog", "Catalog", Read),
    route("GET", "/admin/ledger", "Ledger", Read),
    route("GET", "/admin/events", "Events", Read),
    route("GET", "/admin/console", "", Read),
    route("GET", "/admin/console/ledger", "", Read),
    route("GET", "/admin/console/usage", "", Read),
    route("GET", "/admin/keys", "ListKeys", Read),
    route("GET", "/admin/keys/{id}", "GetKey", Read),
    route("GET", "/admin/keys/{id}/usage", "KeyUsage", Read),
    route("POST", "/admin/reset", "Reset", Operate),
    route("POST", "/admin/keys", "CreateKey", Keys),
    route("PATCH", "/admin/keys/{id}", "UpdateKey", Keys),
    route("POST", "/admin/keys/{id}/revoke", "RevokeKey", Keys),
    route("POST", "/admin/keys/{id}/rotate", "RotateKey", Keys),
    route("GET", "/admin/tokens", "ListTokens", Admin),
    route("POST", "/admin/tokens", "CreateToken", Admin),
    route("DELETE", "/admin/tokens/{id}", "RevokeToken", Admin),
];

/// The console's paths that need no token (its page, script and style: they hold no data). The
/// console's router ([`crate::api::console::routes`]) serves exactly these.
pub const ASSETS: &[&str] = &[
    "/ui",
    "/ui/",
    "/ui/app.js",
    "/ui/app.css",
    "/admin/ui",
    "/admin/ui/app.js",
    "/admin/ui/app.css",
];

/// Whether `path` is one of the console's [`ASSETS`].
pub fn is_asset(path: &str) -> bool {
    ASSETS.contains(&path)
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

/// What a token lacking `need` is told.
pub fn lacking(need: Scope, have: Scope) -> String {
    format!(
        "this call needs an admin token of scope {need} (or wider); this token's scope is {have}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(method, path)` of every `.route(...)` in a router's source.
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
        let routes = routes_in(include_str!("admin.rs"));
        assert!(routes.len() >= 15, "{routes:?}");
        for (method, path) in routes.iter().chain(&routes_in(include_str!("console.rs"))) {
            if !path.starts_with("/admin/") && path != "/health" {
                continue;
            }
            assert!(
                ROUTES.iter().any(|r| r.method == method && r.path == path),
                "{method} {path} has no row in the scope table"
            );
        }
        // And each row names a route that exists.
        for r in ROUTES {
            assert!(
                routes.iter().any(|(m, p)| m == r.method && p == r.path)
                    || r.path.starts_with("/admin/console"),
                "{r:?} is no route"
            );
        }
    }

    #[test]
    fn every_grpc_method_has_a_scope_and_mirrors_its_route() {
        let proto = include_str!("../../../proto/airouter/v1/admin.proto");
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
