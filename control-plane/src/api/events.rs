//! `GET /admin/events`: the operator's events, live, as server-sent events (admin token;
//! `?types=attempt,breaker` to filter). Each SSE event is named by the event's type and carries
//! its JSON; a subscriber that fell behind gets a `lagged` event with how many it lost.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event as Sse, KeepAlive};
use axum::response::{IntoResponse, Response};

use crate::api::admin::{authorize, AdminApi};
use crate::api::error::{ApiError, ErrorCode};
use crate::engine::events::{parse_types, Next};

#[derive(Debug, serde::Deserialize)]
pub struct EventsQuery {
    types: Option<String>,
}

pub async fn events(
    State(api): State<Arc<AdminApi>>,
    headers: HeaderMap,
    Query(query): Query<EventsQuery>,
) -> Response {
    if let Err(e) = authorize(&api, &headers) {
        return e.into_response();
    }
    let types = match parse_types(query.types.as_deref()) {
        Ok(t) => t,
        Err(message) => return ApiError::new(ErrorCode::InvalidRequest, message).into_response(),
    };
    let subscription = api.engine().events().watch(types);
    let stream = futures::stream::unfold(subscription, |mut sub| async move {
        let item = match sub.next().await? {
            Next::Event(e) => Sse::default().event(e.type_name()).data(e.to_json()),
            Next::Lagged(n) => Sse::default()
                .event("lagged")
                .data(format!(r#"{{"type":"lagged","missed":{n}}}"#)),
        };
        Some((Ok::<_, Infallible>(item), sub))
    });
    axum::response::Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}
