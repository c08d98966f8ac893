//! The front stage's route table: which requests of the public listener it serves, as data.
//! One row per method and path pattern, read top down; [`route`] is the one lookup. The
//! Gemini API is routed before this table, by its own paths (`protocols::gemini::route`).

use crate::plan::{Operation, Protocol};

/// What a request's method and path (no query, no trailing slash) ask of the stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteKind {
    /// A model call: the operation, the caller's protocol and whether it only counts tokens.
    Call {
        op: Operation,
        protocol: Protocol,
        count_tokens: bool,
    },
    /// `GET /v1/models` and `GET /v1/models/{id}`.
    Models,
    /// `GET /health`.
    Health,
    /// `/admin/...`: the control plane's, passed through untouched once its path is canonical.
    Admin,
    /// A served path with another method: 405, in the protocol's shape.
    MethodNotAllowed(Protocol),
    /// Nothing served here: 404, in the protocol's shape.
    NotFound(Protocol),
}

/// How a row matches a path.
#[derive(Debug, Clone, Copy)]
enum Pattern {
    /// This path exactly.
    Exact(&'static str),
    /// Any path under this prefix.
    Prefix(&'static str),
}

impl Pattern {
    fn matches(self, path: &str) -> bool {
        match self {
            Pattern::Exact(p) => path == p,
            Pattern::Prefix(p) => path.starts_with(p),
        }
    }
}

/// One row: a method (`None`: any) and a path pattern.
struct Row {
    method: Option<&'static str>,
    path: Pattern,
    kind: RouteKind,
}

const fn call(op: Operation, protocol: Protocol, count_tokens: bool) -> RouteKind {
    RouteKind::Call {
        op,
        protocol,
        count_tokens,
    }
}

const fn row(method: Option<&'static str>, path: Pattern, kind: RouteKind) -> Row {
    Row { method, path, kind }
}

use Pattern::{Exact, Prefix};

const POST: Option<&str> = Some("POST");
const GET: Option<&str> = Some("GET");
const ANY: Option<&str> = None;
const NOT_ALLOWED: RouteKind = RouteKind::MethodNotAllowed(Protocol::Chat);
const MESSAGES_NOT_ALLOWED: RouteKind = RouteKind::MethodNotAllowed(Protocol::Messages);

/// The table, first match wins; a path no row matches is [`RouteKind::NotFound`] in the chat
/// shape.
static ROUTES: &[Row] = &[
    row(
        POST,
        Exact("/v1/chat/completions"),
        call(Operation::Chat, Protocol::Chat, false),
    ),
    row(
        POST,
        Exact("/v1/embeddings"),
        call(Operation::Embeddings, Protocol::Chat, false),
    ),
    row(
        POST,
        Exact("/v1/messages"),
        call(Operation::Chat, Protocol::Messages, false),
    ),
    row(
        POST,
        Exact("/v1/messages/count_tokens"),
        call(Operation::Chat, Protocol::Messages, true),
    ),
    row(
        POST,
        Exact("/v1/responses"),
        call(Operation::Chat, Protocol::Responses, false),
    ),
    row(GET, Exact("/v1/models"), RouteKind::Models),
    row(GET, Prefix("/v1/models/"), RouteKind::Models),
    row(GET, Exact("/health"), RouteKind::Health),
    // The admin API, which the public listener routes to the control plane (`render.rs`).
    row(ANY, Prefix("/admin/"), RouteKind::Admin),
    row(ANY, Exact("/v1/messages"), MESSAGES_NOT_ALLOWED),
    row(
        ANY,
        Exact("/v1/messages/count_tokens"),
        MESSAGES_NOT_ALLOWED,
    ),
    row(ANY, Exact("/v1/chat/completions"), NOT_ALLOWED),
    row(ANY, Exact("/v1/embeddings"), NOT_ALLOWED),
    row(ANY, Exact("/v1/models"), NOT_ALLOWED),
    row(ANY, Exact("/v1/responses"), NOT_ALLOWED),
    // Every answer under /v1/messages is in Anthropic's shape, a 404 too.
    row(
        ANY,
        Prefix("/v1/messages/"),
        RouteKind::NotFound(Protocol::Messages),
    ),
];

/// What `method` on `path` (no query, no trailing slash) is: the first row that matches.
pub fn route(method: &str, path: &str) -> RouteKind {
    ROUTES
        .iter()
        .find(|r| r.method.is_none_or(|m| m == method) && r.path.matches(path))
        .map_or(RouteKind::NotFound(Protocol::Chat), |r| r.kind)
}

/// Whether `path` (no query) is spelled the one way a router reads it: no empty, `.` or `..`
/// segment, no percent-escape, no backslash. Envoy forwards `/admin/...` to the control plane
/// as it came, and the control plane's gRPC port (which serves the admin routes to Envoy)
/// answers a path it does not route on its own (`/admin/../metrics`: 200 with a gRPC status):
/// an admin path spelled any other way is the stage's 404, so only the routes the path names
/// are reached.
pub fn canonical_path(path: &str) -> bool {
    !path.contains(['%', '\\'])
        && path
            .split('/')
            .skip(1)
            .all(|segment| !matches!(segment, "" | "." | ".."))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::front::Front;
    use crate::host::{Flow, Host, Side};
    use crate::state::State;
    use crate::testing::{open_key, FakeHost};
    use ai_router_contract::headers::COST as H_COST;
    use ai_router_proto::v1::Snapshot;

    #[test]
    fn the_table_routes_by_method_and_path() {
        let chat = call(Operation::Chat, Protocol::Chat, false);
        for (method, path, kind) in [
            ("POST", "/v1/chat/completions", chat),
            (
                "POST",
                "/v1/embeddings",
                call(Operation::Embeddings, Protocol::Chat, false),
            ),
            (
                "POST",
                "/v1/messages",
                call(Operation::Chat, Protocol::Messages, false),
            ),
            (
                "POST",
                "/v1/messages/count_tokens",
                call(Operation::Chat, Protocol::Messages, true),
            ),
            (
                "POST",
                "/v1/responses",
                call(Operation::Chat, Protocol::Responses, false),
            ),
            ("GET", "/v1/models", RouteKind::Models),
            ("GET", "/v1/models/openai%2Fgpt-4o", RouteKind::Models),
            ("GET", "/health", RouteKind::Health),
            ("GET", "/admin/keys", RouteKind::Admin),
            ("DELETE", "/admin/keys/k1", RouteKind::Admin),
            ("GET", "/v1/messages", MESSAGES_NOT_ALLOWED),
            ("GET", "/v1/messages/count_tokens", MESSAGES_NOT_ALLOWED),
            ("GET", "/v1/chat/completions", NOT_ALLOWED),
            ("PUT", "/v1/embeddings", NOT_ALLOWED),
            ("POST", "/v1/models", NOT_ALLOWED),
            ("GET", "/v1/responses", NOT_ALLOWED),
            (
                "GET",
                "/v1/messages/batches",
                RouteKind::NotFound(Protocol::Messages),
            ),
            ("POST", "/v1/models/m1", RouteKind::NotFound(Protocol::Chat)),
            ("POST", "/health", RouteKind::NotFound(Protocol::Chat)),
            ("GET", "/administrator", RouteKind::NotFound(Protocol::Chat)),
            ("post", "/v1/chat/completions", NOT_ALLOWED),
            ("GET", "/", RouteKind::NotFound(Protocol::Chat)),
        ] {
            assert_eq!(route(method, path), kind, "{method} {path}");
        }
    }

    /// `/admin/...` is the control plane's (Envoy routes it there): the front stage neither
    /// answers it nor authenticates it as a model call, keeps the admin token on it, leaves
    /// the answer alone and reports no call.
    #[test]
    fn the_admin_api_passes_through_untouched() {
        let mut snap = Snapshot::default();
        snap.virtual_keys
            .push(open_key("key_app", "sk-starci-app-0123456789abcdef"));
        for (method, path) in [
            ("GET", "/admin/keys"),
            ("POST", "/admin/keys/key_1/rotate"),
            ("GET", "/admin/keys/key_1/usage?from=2026-01-01"),
            ("GET", "/admin/events?types=breaker"),
        ] {
            let mut host = FakeHost::with_state(State::new(1, snap.clone()));
            for (k, v) in [
                (":method", method),
                (":path", path),
                ("authorization", "Bearer admin-token"),
            ] {
                host.add(Side::Request, k, v.as_bytes());
            }
            let mut front = Front::default();
            assert_eq!(
                front.on_request_headers(&mut host, false),
                Flow::Continue,
                "{path}"
            );
            assert!(host.answered.is_none(), "{path}");
            assert_eq!(
                host.header_text(Side::Request, "authorization").as_deref(),
                Some("Bearer admin-token"),
                "{path}"
            );
            assert_eq!(front.on_request_body(&mut host, 0, true), Flow::Continue);
            host.add(Side::Response, ":status", b"401");
            assert_eq!(front.on_response_headers(&mut host, false), Flow::Continue);
            assert_eq!(host.header_text(Side::Response, H_COST), None, "{path}");
            assert_eq!(front.on_response_body(&mut host, 0, true), Flow::Continue);
            front.on_log(&mut host);
            assert!(host.reports.is_empty(), "{path}");
        }
        // Neither a model route nor the admin API: 404 from the stage.
        let mut host = FakeHost::with_state(State::new(1, snap.clone()));
        host.add(Side::Request, ":method", b"GET");
        host.add(Side::Request, ":path", b"/administrator");
        Front::default().on_request_headers(&mut host, false);
        assert_eq!(host.answered.as_ref().map(|a| a.status), Some(404));
        // An admin path spelled another way never reaches the control plane.
        for path in [
            "/admin/../metrics",
            "/admin/./keys",
            "/admin//keys",
            "/admin/keys/../../health",
            "/admin/%2e%2e/metrics",
            "/admin/..%2fmetrics",
            "/admin/%6beys",
            "/admin/..\\metrics",
        ] {
            let mut host = FakeHost::with_state(State::new(1, snap.clone()));
            host.add(Side::Request, ":method", b"GET");
            host.add(Side::Request, ":path", path.as_bytes());
            host.add(Side::Request, "authorization", b"Bearer admin-token");
            let mut front = Front::default();
            front.on_request_headers(&mut host, false);
            assert_eq!(
                host.answered.as_ref().map(|a| a.status),
                Some(404),
                "{path}"
            );
        }
    }
}
