//! The control API under `/_mock/`: the script, the recorded calls, a reset, the error table.

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};

use super::errors::{self, provider_error_names};
use super::http::{json_response, Body};
use super::script::{Rule, Script};
use super::state::Shared;

pub(super) async fn control(shared: &Shared, request: Request<Incoming>) -> Response<Body> {
    let method = request.method().clone();
    let path = request.uri().path().trim_end_matches('/').to_owned();
    let body = match request.into_body().collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(error) => {
            return control_error(
                StatusCode::BAD_REQUEST,
                &format!("reading the body: {error}"),
            )
        }
    };
    let text = String::from_utf8_lossy(&body);
    match (method, path.as_str()) {
        (Method::GET, "/_mock/health") => json_response(StatusCode::OK, &json!({"status": "ok"})),
        (Method::PUT, "/_mock/script") => match Script::from_json(&text) {
            Ok(script) => {
                let mut state = shared.lock();
                state.rules.replace(script);
                json_response(StatusCode::OK, &json!({"rules": state.rules.len()}))
            }
            Err(error) => control_error(StatusCode::BAD_REQUEST, &error.to_string()),
        },
        (Method::POST, "/_mock/rules") => match Rule::from_json(&text) {
            Ok(rule) => {
                let mut state = shared.lock();
                state.rules.push(rule);
                json_response(StatusCode::OK, &json!({"rules": state.rules.len()}))
            }
            Err(error) => control_error(StatusCode::BAD_REQUEST, &error.to_string()),
        },
        (Method::GET, "/_mock/calls") => {
            let calls = shared.lock().calls.clone();
            json_response(StatusCode::OK, &json!({ "calls": calls }))
        }
        (Method::DELETE, "/_mock/calls") => {
            let mut state = shared.lock();
            let cleared = state.calls.len();
            state.calls.clear();
            json_response(StatusCode::OK, &json!({ "cleared": cleared }))
        }
        (Method::POST, "/_mock/reset") => {
            shared.lock().reset();
            json_response(StatusCode::OK, &json!({"status": "reset"}))
        }
        (Method::GET, "/_mock/errors") => {
            let table: serde_json::Map<String, Value> = provider_error_names()
                .into_iter()
                .filter_map(|name| {
                    let reply = errors::provider_error_by_name(&name)?;
                    Some((
                        name,
                        json!({"status": reply.status, "headers": reply.headers, "body": reply.body}),
                    ))
                })
                .collect();
            json_response(StatusCode::OK, &Value::Object(table))
        }
        (method, path) => control_error(
            StatusCode::NOT_FOUND,
            &format!("no mock control route {method} {path}"),
        ),
    }
}

fn control_error(status: StatusCode, message: &str) -> Response<Body> {
    json_response(status, &json!({"error": {"message": message}}))
}
