//! The request's headers: what the stage keeps of them, the route (the table in
//! [`super::routes`], the Gemini API by its own paths), the key and the checks before the body.

use ai_router_contract::headers::TRAIL as H_TRAIL;

use super::auth::quota_refusal;
use super::routes::{self, RouteKind};
use super::{AfterState, Front, GeminiCall};
use crate::answer::errors::GatewayError;
use crate::host::{Flow, Host, Side};
use crate::plan::{Operation, Protocol};
use crate::resolve::rules::Metadata;
use crate::wire::headers;
use ai_router_contract::error_code::ErrorCode;

impl Front {
    /// The request's headers: what the stage keeps of them, then the route it names.
    pub fn on_request_headers(&mut self, host: &mut impl Host, end_of_stream: bool) -> Flow {
        self.read_client_headers(host);
        let method = host
            .header_text(Side::Request, ":method")
            .unwrap_or_default();
        let full_path = host.header_text(Side::Request, ":path").unwrap_or_default();
        let path = full_path
            .split('?')
            .next()
            .unwrap_or("")
            .trim_end_matches('/')
            .to_string();
        let google_list = (path == "/v1/models" || path.starts_with("/v1/models/"))
            && crate::protocols::gemini::route::google_client(
                host.header(Side::Request, "x-goog-api-key").is_some()
                    || host.header(Side::Request, "x-goog-api-client").is_some(),
                full_path.split_once('?').map_or("", |(_, q)| q),
            );
        if google_list || crate::protocols::gemini::route::is_gemini_path(&path) {
            return self.gemini_route(host, &method, &path, &full_path, end_of_stream);
        }
        match routes::route(&method, &path) {
            RouteKind::Call {
                op,
                protocol,
                count_tokens,
            } => {
                self.protocol = protocol;
                self.count_tokens = count_tokens;
                self.op = Some(op);
                if host.state().is_none() {
                    return self.wait_for_state(host, AfterState::Call { end_of_stream });
                }
                self.with_state(host, end_of_stream)
            }
            RouteKind::Models => self.models(host, &path),
            RouteKind::Health => self.health(host),
            RouteKind::Admin => {
                if !routes::canonical_path(&path) {
                    return self.reply(host, GatewayError::not_found(&path));
                }
                self.admin = true;
                Flow::Continue
            }
            RouteKind::MethodNotAllowed(protocol) => {
                self.protocol = protocol;
                self.reply(
                    host,
                    GatewayError::new(
                        ErrorCode::MethodNotAllowed,
                        format!("{method} is not allowed on {path}."),
                    ),
                )
            }
            RouteKind::NotFound(protocol) => {
                self.protocol = protocol;
                self.reply(host, GatewayError::not_found(&path))
            }
        }
    }

    /// What the stage keeps of the client's headers (its ids, metadata, trace context), then
    /// every internal header taken out.
    fn read_client_headers(&mut self, host: &mut impl Host) {
        // Listed first: the reads below are answered from the listing (one host call). The
        // internal names a client sent, taken out at the end (usually none).
        let internal = headers::internal_names(&host.listed(Side::Request));
        self.started_ms = host.now_ms();
        self.started_us = host.now_us();
        self.rid = host
            .header_text(Side::Request, "x-request-id")
            .unwrap_or_default();
        self.idempotency_key = host.header_text(Side::Request, "idempotency-key");
        self.session_header = host.header_text(Side::Request, ai_router_contract::headers::SESSION);
        // The metadata the rules read is the one thing of the prefix a client may send.
        self.metadata = Metadata::from_headers(host);
        self.wants_trail = host
            .header_text(Side::Request, H_TRAIL)
            .is_some_and(|v| matches!(v.trim(), "1" | "true"));
        self.wants_overhead = host
            .header_text(Side::Request, ai_router_contract::headers::OVERHEAD)
            .is_some_and(|v| matches!(v.trim(), "1" | "true"));
        self.traceparent = host
            .header_text(Side::Request, "traceparent")
            .filter(|t| valid_traceparent(t))
            .unwrap_or_default();
        self.tracestate = host
            .header_text(Side::Request, "tracestate")
            .filter(|t| !self.traceparent.is_empty() && crate::wire::trace_state::valid(t))
            .map(|t| t.trim().to_owned())
            .unwrap_or_default();
        // Nothing the client sends may steer the router or impersonate the stages.
        for name in internal {
            host.set_header(Side::Request, &name, None);
        }
    }

    /// A call of the Gemini API: every answer, errors included, in Google's shape. A key sent
    /// as `?key=` is taken out of the path before anything else reads it.
    pub(super) fn gemini_route(
        &mut self,
        host: &mut impl Host,
        method: &str,
        path: &str,
        full_path: &str,
        end_of_stream: bool,
    ) -> Flow {
        use crate::protocols::gemini::route::{route, take_query_key, wants_sse, Route};
        self.protocol = Protocol::Gemini;
        let query = full_path.split_once('?').map_or("", |(_, q)| q);
        let (kept, key) = take_query_key(query);
        if key.is_some() {
            let clean = match kept.is_empty() {
                true => path.to_string(),
                false => format!("{path}?{kept}"),
            };
            host.set_header(Side::Request, ":path", Some(&clean));
            self.query_key = key;
        }
        let call = match route(method, path) {
            Route::Generate { model, stream } => GeminiCall {
                model,
                stream,
                count: false,
                embed: None,
                json_array: stream && !wants_sse(&kept),
            },
            Route::CountTokens { model } => GeminiCall {
                model,
                stream: false,
                count: true,
                embed: None,
                json_array: false,
            },
            Route::Embed { model, batch } => GeminiCall {
                model,
                stream: false,
                count: false,
                embed: Some(batch),
                json_array: false,
            },
            Route::Models(_) => return self.models(host, path),
            Route::Unserved => {
                let method_only = matches!(
                    route(if method == "GET" { "POST" } else { "GET" }, path),
                    Route::Generate { .. }
                        | Route::CountTokens { .. }
                        | Route::Embed { .. }
                        | Route::Models(_)
                );
                let err = match method_only {
                    true => GatewayError::new(
                        ErrorCode::MethodNotAllowed,
                        format!("{method} is not allowed on {path}."),
                    ),
                    false => GatewayError::new(
                        ErrorCode::NotFound,
                        format!(
                            "{path} is not served: the gateway serves generateContent, \
                             streamGenerateContent, countTokens, embedContent, \
                             batchEmbedContents and the model list of the Gemini API."
                        ),
                    ),
                };
                return self.reply(host, err);
            }
        };
        self.count_tokens = call.count;
        self.op = Some(match call.embed {
            Some(_) => Operation::Embeddings,
            None => Operation::Chat,
        });
        self.gemini = Some(call);
        if host.state().is_none() {
            return self.wait_for_state(host, AfterState::Call { end_of_stream });
        }
        self.with_state(host, end_of_stream)
    }

    /// The request phase past routing, once the gateway has its state.
    pub(super) fn with_state(&mut self, host: &mut impl Host, end_of_stream: bool) -> Flow {
        let Some(state) = host.state() else {
            return self.reply(host, GatewayError::not_ready());
        };
        self.key = self.authenticate(host);
        self.state = Some(state.clone());
        let Some(key) = self.key.as_ref() else {
            return Flow::Pause;
        };
        if let Some(err) = quota_refusal(host, key, self.started_ms) {
            return self.reply(host, err);
        }
        if let Some(len) = host
            .header_text(Side::Request, "content-length")
            .and_then(|v| v.parse::<u64>().ok())
        {
            if len > state.max_body_bytes() {
                return self.reply(
                    host,
                    GatewayError::new(
                        ErrorCode::RequestTooLarge,
                        format!("The body is larger than {} bytes.", state.max_body_bytes()),
                    ),
                );
            }
        }
        if end_of_stream {
            return self.reply(
                host,
                GatewayError::new(ErrorCode::InvalidJson, "The request has no body."),
            );
        }
        if self.protocol == Protocol::Messages {
            let version = host.header_text(Side::Request, "anthropic-version");
            match crate::protocols::anthropic_version(version.as_deref()) {
                Ok(v) => self.anthropic_version = Some(v),
                Err(message) => {
                    return self.reply(
                        host,
                        GatewayError::new(ErrorCode::InvalidRequest, message)
                            .with_param("anthropic-version"),
                    )
                }
            }
            self.anthropic_beta = host.header_text(Side::Request, "anthropic-beta");
        }
        // The client's key never goes further than this stage.
        host.set_header(Side::Request, "authorization", None);
        host.set_header(Side::Request, "x-api-key", None);
        host.set_header(Side::Request, "x-goog-api-key", None);
        if self.gemini.is_some() {
            // Its body is replaced by the chat translation.
            host.set_header(Side::Request, "content-length", None);
        }
        Flow::Pause
    }
}

/// ids not all zero (version 00; a later version may append fields after the flags).
pub fn valid_traceparent(value: &str) -> bool {
    let parts: Vec<&str> = value.trim().split('-').collect();
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    };
    let nonzero = |s: &str| s.bytes().any(|b| b != b'0');
    match parts.as_slice() {
        [version, trace, parent, flags, ..] => {
            hex(version, 2)
                && *version != "ff"
                && (*version != "00" || parts.len() == 4)
                && hex(trace, 32)
                && nonzero(trace)
                && hex(parent, 16)
                && nonzero(parent)
                && hex(flags, 2)
        }
        _ => false,
    }
}

#[cfg(test)]
#[cfg(test)]
mod traceparent_tests {
    use super::valid_traceparent;

    #[test]
    fn traceparent_shapes() {
        let ok = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert!(valid_traceparent(ok));
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        ] {
            assert!(!valid_traceparent(bad), "{bad}");
        }
        assert!(valid_traceparent(
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future"
        ));
    }
}
