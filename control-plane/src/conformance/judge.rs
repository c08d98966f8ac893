//! What a client saw of one call, and whether it is what the gateway owes it under a fault.

use serde::Serialize;
use serde_json::Value;

/// What the gateway owes the client under a fault.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "expect")]
pub enum Expect {
    /// The fault happened before anything reached the client: another lane answers and the
    /// client sees one clean answer, nothing of the faulted lane.
    Failover,
    /// Not a fault to fail over from (a slow but healthy provider): the faulted lane's own
    /// answer arrives whole.
    Served { text: String },
    /// The stream broke after its first token: the client keeps the tokens sent before the cut
    /// (`sent`), then gets an error event or a broken transfer, never a clean end.
    Interrupted { sent: String },
    /// A final error object with this status and code.
    Error { status: u16, code: String },
    /// Too big to hold, perhaps: the whole answer (`bytes` of content, starting with
    /// [`FAULTED_MARKER`]), another lane's, or an error object; never a cut answer passed off
    /// as whole.
    WholeOrError { bytes: usize },
}

/// What the client saw.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Seen {
    /// The HTTP status, 0 when no response came.
    pub status: u16,
    pub content_type: String,
    /// The connection failed: before any response (with `status` 0) or mid-body.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transport_error: Option<String>,
    /// A unary body parsed as JSON (`Null` when it is not JSON).
    #[serde(skip_serializing_if = "Value::is_null")]
    pub json: Value,
    /// A stream's `data:` payloads in order (`[DONE]` included).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<String>,
    pub streamed: bool,
}

impl Seen {
    /// The text the client got: the unary message, or the stream's content deltas joined.
    pub fn text(&self) -> String {
        if !self.streamed {
            return self
                .json
                .pointer("/choices/0/message/content")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
        }
        self.events
            .iter()
            .filter_map(|event| serde_json::from_str::<Value>(event).ok())
            .filter_map(|event| {
                event
                    .pointer("/choices/0/delta/content")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            })
            .collect()
    }

    fn done_events(&self) -> usize {
        self.events
            .iter()
            .filter(|event| *event == "[DONE]")
            .count()
    }

    /// The `error` object of the last stream event, when it is one.
    fn error_event(&self) -> Option<Value> {
        let last: Value = serde_json::from_str(self.events.last()?).ok()?;
        last.get("error").cloned()
    }

    fn stream_errors(&self) -> usize {
        self.events
            .iter()
            .filter_map(|event| serde_json::from_str::<Value>(event).ok())
            .filter(|event| event.get("error").is_some())
            .count()
    }

    /// A short account for the report: status, what arrived, how it ended.
    pub fn summary(&self) -> String {
        if self.status == 0 {
            return format!(
                "no response ({})",
                self.transport_error.as_deref().unwrap_or("?")
            );
        }
        let mut out = format!("{}", self.status);
        if let Some(code) = self.json.pointer("/error/code").and_then(Value::as_str) {
            out.push_str(&format!(" {code}"));
        }
        if self.streamed {
            let text = self.text();
            out.push_str(&format!(
                ", {} event(s), {} content byte(s)",
                self.events.len(),
                text.len()
            ));
            if let Some(error) = self.error_event() {
                let code = error.get("code").and_then(Value::as_str).unwrap_or("?");
                out.push_str(&format!(", error event {code}"));
            }
            if self.done_events() > 0 {
                out.push_str(", [DONE]");
            }
        } else if self.status == 200 {
            out.push_str(&format!(", {} content byte(s)", self.text().len()));
        }
        if self.status != 0 {
            if let Some(error) = &self.transport_error {
                out.push_str(&format!(", broken transfer ({error})"));
            }
        }
        out
    }
}

/// The marker every faulted lane's content carries, so that a client that got any of it can
/// be told apart from one served by another lane.
pub const FAULTED_MARKER: &str = "faulted-lane";

/// `Ok` when the client saw what it is owed, else what is wrong.
pub fn judge(expect: &Expect, seen: &Seen) -> Result<(), String> {
    match expect {
        Expect::Failover => {
            whole_answer(seen)?;
            if seen.text().contains(FAULTED_MARKER) {
                return Err("the client got content of the faulted lane".to_owned());
            }
            if seen.text().is_empty() {
                return Err("the answer has no content".to_owned());
            }
            Ok(())
        }
        Expect::Served { text } => {
            whole_answer(seen)?;
            if seen.text() != *text {
                return Err(format!(
                    "expected the lane's own text {text:?}, got {:?}",
                    seen.text()
                ));
            }
            Ok(())
        }
        Expect::Interrupted { sent } => interrupted(seen, sent),
        Expect::Error { status, code } => error_object(seen, *status, code),
        Expect::WholeOrError { bytes } => {
            if seen.status == 200 {
                whole_answer(seen)?;
                // Without the marker another lane answered (the big answer took longer than
                // the attempt's timeout): a failover, fine. With it, it must be all there.
                if seen.text().contains(FAULTED_MARKER) && seen.text().len() != *bytes {
                    return Err(format!(
                        "an answer of {} content bytes passed off as whole ({bytes} sent)",
                        seen.text().len()
                    ));
                }
                Ok(())
            } else {
                let code = seen
                    .json
                    .pointer("/error/code")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
                error_object(seen, seen.status, &code)?;
                if seen.status < 500 && seen.status != 413 {
                    return Err(format!("a {} for the provider's big answer", seen.status));
                }
                Ok(())
            }
        }
    }
}

/// A 200 that ended cleanly: a unary completion, or a stream with `[DONE]` once and no error.
fn whole_answer(seen: &Seen) -> Result<(), String> {
    if seen.status != 200 {
        return Err(format!("expected 200, got {}", seen.summary()));
    }
    if let Some(error) = &seen.transport_error {
        return Err(format!("the transfer broke: {error}"));
    }
    if seen.streamed {
        if !seen.content_type.starts_with("text/event-stream") {
            return Err(format!("a stream of content-type {:?}", seen.content_type));
        }
        if seen.stream_errors() > 0 {
            return Err("an error event in a stream that should be clean".to_owned());
        }
        if seen.done_events() != 1 || seen.events.last().map(String::as_str) != Some("[DONE]") {
            return Err("the stream does not end with exactly one [DONE]".to_owned());
        }
    } else if seen.json.pointer("/choices/0/message").is_none() {
        return Err("the 200 is not a chat completion".to_owned());
    }
    Ok(())
}

fn interrupted(seen: &Seen, sent: &str) -> Result<(), String> {
    if seen.status != 200 || !seen.streamed {
        return Err(format!(
            "the stream had started: expected 200, got {}",
            seen.summary()
        ));
    }
    if seen.done_events() > 0 {
        return Err("a broken stream ended with [DONE]".to_owned());
    }
    let text = seen.text();
    if !sent.starts_with(text.as_str()) || text.is_empty() {
        return Err(format!(
            "expected the first token(s) {sent:?} and nothing after, got {text:?}"
        ));
    }
    match (seen.error_event(), &seen.transport_error) {
        (Some(error), _) => {
            let has_message = error
                .get("message")
                .and_then(Value::as_str)
                .is_some_and(|message| !message.is_empty());
            if !has_message || error.get("type").is_none() || error.get("code").is_none() {
                return Err(format!("an error event without message/type/code: {error}"));
            }
            Ok(())
        }
        (None, Some(_)) => Ok(()),
        (None, None) => Err("the broken stream ended cleanly, without an error event".to_owned()),
    }
}

fn error_object(seen: &Seen, status: u16, code: &str) -> Result<(), String> {
    if seen.status != status {
        return Err(format!("expected {status} {code}, got {}", seen.summary()));
    }
    let error = seen
        .json
        .get("error")
        .ok_or_else(|| format!("the {status} is not an error object"))?;
    let message_ok = error
        .get("message")
        .and_then(Value::as_str)
        .is_some_and(|message| !message.is_empty());
    if !message_ok || !error.get("type").is_some_and(Value::is_string) {
        return Err(format!("an error object without message or type: {error}"));
    }
    let got = error
        .get("code")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if got != code {
        return Err(format!("expected code {code}, got {got:?}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use serde_json::json;

    use super::*;

    fn chunk(text: &str) -> String {
        json!({"choices": [{"index": 0, "delta": {"content": text}}]}).to_string()
    }

    fn stream(events: &[String], transport_error: Option<&str>) -> Seen {
        Seen {
            status: 200,
            content_type: "text/event-stream".into(),
            transport_error: transport_error.map(str::to_owned),
            events: events.to_vec(),
            streamed: true,
            ..Seen::default()
        }
    }

    fn unary(status: u16, json: Value) -> Seen {
        Seen {
            status,
            content_type: "application/json".into(),
            json,
            ..Seen::default()
        }
    }

    fn error_event(code: &str) -> String {
        json!({"error": {"message": "cut", "type": "server_error", "code": code}}).to_string()
    }

    #[test]
    fn failover_wants_one_clean_answer_with_nothing_of_the_faulted_lane() {
        let good = stream(&[chunk("Hello"), chunk(" there"), "[DONE]".into()], None);
        assert_eq!(judge(&Expect::Failover, &good), Ok(()));
        let leaked = stream(
            &[chunk(FAULTED_MARKER), chunk("Hello"), "[DONE]".into()],
            None,
        );
        assert!(judge(&Expect::Failover, &leaked).is_err());
        let no_done = stream(&[chunk("Hello")], None);
        assert!(judge(&Expect::Failover, &no_done).is_err());
        let twice = stream(&[chunk("Hello"), "[DONE]".into(), "[DONE]".into()], None);
        assert!(judge(&Expect::Failover, &twice).is_err());
        let with_error = stream(&[chunk("Hello"), error_event("x"), "[DONE]".into()], None);
        assert!(judge(&Expect::Failover, &with_error).is_err());
        let completion = json!({"choices": [{"message": {"content": "Hello"}}]});
        assert_eq!(judge(&Expect::Failover, &unary(200, completion)), Ok(()));
        let error = json!({"error": {"message": "m", "type": "t", "code": "upstream_error"}});
        assert!(judge(&Expect::Failover, &unary(502, error)).is_err());
        assert!(judge(&Expect::Failover, &unary(200, json!({}))).is_err());
    }

    #[test]
    fn an_interrupted_stream_keeps_its_first_tokens_and_never_ends_cleanly() {
        let expect = Expect::Interrupted {
            sent: "first".into(),
        };
        let event = stream(&[chunk("first"), error_event("stream_interrupted")], None);
        assert_eq!(judge(&expect, &event), Ok(()));
        let broken = stream(&[chunk("first")], Some("connection reset"));
        assert_eq!(judge(&expect, &broken), Ok(()));
        let clean_end = stream(&[chunk("first")], None);
        assert!(judge(&expect, &clean_end).is_err());
        let done = stream(&[chunk("first"), "[DONE]".into()], Some("reset"));
        assert!(judge(&expect, &done).is_err());
        let retried = stream(&[chunk("first"), chunk("Hello"), "[DONE]".into()], None);
        assert!(judge(&expect, &retried).is_err());
        let bare_error = stream(&[chunk("first"), json!({"error": {}}).to_string()], None);
        assert!(judge(&expect, &bare_error).is_err());
    }

    #[test]
    fn an_error_must_have_the_status_the_code_and_the_shape() {
        let expect = Expect::Error {
            status: 503,
            code: "pool_rate_limited".into(),
        };
        let right = json!({"error": {"message": "m", "type": "t", "code": "pool_rate_limited"}});
        assert_eq!(judge(&expect, &unary(503, right.clone())), Ok(()));
        assert!(judge(&expect, &unary(502, right)).is_err());
        let wrong_code = json!({"error": {"message": "m", "type": "t", "code": "upstream_error"}});
        assert!(judge(&expect, &unary(503, wrong_code)).is_err());
        assert!(judge(&expect, &unary(503, json!("oops"))).is_err());
        let no_response = Seen {
            transport_error: Some("refused".into()),
            ..Seen::default()
        };
        assert!(judge(&expect, &no_response).is_err());
    }

    #[test]
    fn a_big_answer_is_whole_or_an_error_never_cut() {
        let sent = format!("{FAULTED_MARKER}abcde");
        let expect = Expect::WholeOrError { bytes: sent.len() };
        let whole = json!({"choices": [{"message": {"content": sent}}]});
        assert_eq!(judge(&expect, &unary(200, whole)), Ok(()));
        let cut = json!({"choices": [{"message": {"content": &sent[..sent.len() - 2]}}]});
        assert!(judge(&expect, &unary(200, cut)).is_err());
        let other_lane = json!({"choices": [{"message": {"content": "Hello"}}]});
        assert_eq!(judge(&expect, &unary(200, other_lane)), Ok(()));
        let error = json!({"error": {"message": "m", "type": "t", "code": "upstream_error"}});
        assert_eq!(judge(&expect, &unary(502, error)), Ok(()));
        let client_error = json!({"error": {"message": "m", "type": "t", "code": "invalid_json"}});
        assert!(judge(&expect, &unary(400, client_error)).is_err());
    }

    #[test]
    fn served_wants_the_lanes_own_text() {
        let expect = Expect::Served {
            text: "slow but whole".into(),
        };
        let whole = stream(&[chunk("slow"), chunk(" but whole"), "[DONE]".into()], None);
        assert_eq!(judge(&expect, &whole), Ok(()));
        let other = stream(&[chunk("Hello"), "[DONE]".into()], None);
        assert!(judge(&expect, &other).is_err());
    }
}
