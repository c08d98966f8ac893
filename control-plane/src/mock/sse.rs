//! Server-sent events: a provider-neutral plan of events, scheduled into timed body steps
//! (delays, stalls and the scripted failure), and the streaming body that plays them.

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, StreamBody};
use hyper::body::Frame;

use super::script::{FailWith, StreamSpec};

/// One `data:` event.
pub fn data(value: &serde_json::Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

/// One named event (`event:` then `data:`), as Anthropic sends them.
pub fn event(name: &str, value: &serde_json::Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {value}\n\n"))
}

/// One event of the content part of a stream.
#[derive(Debug, Clone, PartialEq)]
pub struct Piece {
    pub bytes: Bytes,
    /// Whether it carries content (a text or tool-call delta): these are the chunks that
    /// `failAfter` and `stallAfter` count and `delayMs` spaces out.
    pub counts: bool,
}

impl Piece {
    pub fn content(bytes: Bytes) -> Self {
        Self {
            bytes,
            counts: true,
        }
    }

    pub fn framing(bytes: Bytes) -> Self {
        Self {
            bytes,
            counts: false,
        }
    }
}

/// A stream before timing: what comes before the content, the content, what ends it, and the
/// streamed error object for `failWith: error-event`.
#[derive(Debug, Clone, Default)]
pub struct StreamPlan {
    pub head: Vec<Bytes>,
    pub content: Vec<Piece>,
    pub tail: Vec<Bytes>,
    pub error_event: Bytes,
}

/// One step of a streaming body.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Wait, then send these bytes as one flushed frame.
    Send { delay: Duration, bytes: Bytes },
    /// Wait, then abort the connection mid-body.
    Abort { delay: Duration },
}

/// Turns a plan into timed steps following the stream settings.
pub fn schedule(plan: StreamPlan, spec: &StreamSpec) -> Vec<Step> {
    let delay = Duration::from_millis(spec.delay_ms.unwrap_or(0));
    let stall = Duration::from_millis(spec.stall_ms.unwrap_or(0));
    let content_count = plan.content.iter().filter(|piece| piece.counts).count();
    let fail_with = match (spec.fail_with, spec.fail_after) {
        (Some(how), _) => Some(how),
        (None, Some(_)) => Some(FailWith::Network),
        (None, None) => None,
    };
    let fail_at = fail_with.map(|_| spec.fail_after.unwrap_or(content_count).min(content_count));

    let mut steps = Vec::new();
    // Extra wait carried to the next step (a stall).
    let mut pending = Duration::ZERO;
    let mut sent = 0usize;

    for bytes in plan.head {
        steps.push(Step::Send {
            delay: std::mem::take(&mut pending),
            bytes,
        });
    }
    let after_count = |sent: usize, pending: &mut Duration| {
        if spec.stall_after == Some(sent) {
            *pending += stall;
        }
    };
    after_count(0, &mut pending);

    let fail =
        |steps: &mut Vec<Step>, pending: Duration, how: FailWith, error_event: Bytes| match how {
            FailWith::Network => steps.push(Step::Abort {
                delay: pending + delay,
            }),
            FailWith::ErrorEvent => steps.push(Step::Send {
                delay: pending + delay,
                bytes: error_event,
            }),
            FailWith::Truncate => {}
            FailWith::Malformed => steps.push(Step::Send {
                delay: pending + delay,
                bytes: Bytes::from_static(b"data: {\"choices\": [{\"delta\": \n\n"),
            }),
        };

    for piece in plan.content {
        if piece.counts {
            if let (Some(at), Some(how)) = (fail_at, fail_with) {
                if sent == at {
                    fail(&mut steps, pending, how, plan.error_event.clone());
                    if how != FailWith::Malformed {
                        return steps;
                    }
                }
            }
            steps.push(Step::Send {
                delay: std::mem::take(&mut pending) + delay,
                bytes: piece.bytes,
            });
            sent += 1;
            after_count(sent, &mut pending);
        } else {
            steps.push(Step::Send {
                delay: std::mem::take(&mut pending),
                bytes: piece.bytes,
            });
        }
    }
    match fail_with {
        // Already sent among the content.
        Some(FailWith::Malformed) if fail_at.is_some_and(|at| at < sent) => {}
        Some(FailWith::Malformed) => {
            fail(&mut steps, pending, FailWith::Malformed, plan.error_event)
        }
        Some(how) => {
            fail(&mut steps, pending, how, plan.error_event);
            return steps;
        }
        None => {}
    }
    for (index, bytes) in plan.tail.into_iter().enumerate() {
        let wait = if index == 0 { delay } else { Duration::ZERO };
        steps.push(Step::Send {
            delay: std::mem::take(&mut pending) + wait,
            bytes,
        });
    }
    steps
}

/// The error a body yields to make hyper drop the connection without the terminating chunk.
fn aborted() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        "scripted network failure mid-stream",
    )
}

/// A streaming body playing the steps; each step is its own frame, so its timing is visible.
pub fn body(steps: Vec<Step>) -> UnsyncBoxBody<Bytes, std::io::Error> {
    let frames = futures::stream::iter(steps).then(|step| async move {
        match step {
            Step::Send { delay, bytes } => {
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                Ok(Frame::data(bytes))
            }
            Step::Abort { delay } => {
                if delay.is_zero() {
                    // hyper flushes what it buffered only when the body is pending; an error
                    // straight after the last frame would drop the frames with the connection.
                    tokio::task::yield_now().await;
                } else {
                    tokio::time::sleep(delay).await;
                }
                Err(aborted())
            }
        }
    });
    StreamBody::new(frames).boxed_unsync()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn plan() -> StreamPlan {
        StreamPlan {
            head: vec![Bytes::from_static(b"H")],
            content: vec![
                Piece::framing(Bytes::from_static(b"[")),
                Piece::content(Bytes::from_static(b"a")),
                Piece::content(Bytes::from_static(b"b")),
                Piece::framing(Bytes::from_static(b"]")),
            ],
            tail: vec![Bytes::from_static(b"F"), Bytes::from_static(b"D")],
            error_event: Bytes::from_static(b"E"),
        }
    }

    fn text(steps: &[Step]) -> String {
        steps
            .iter()
            .map(|step| match step {
                Step::Send { bytes, .. } => String::from_utf8_lossy(bytes).into_owned(),
                Step::Abort { .. } => "!".to_owned(),
            })
            .collect()
    }

    #[test]
    fn a_clean_stream_sends_everything() {
        let steps = schedule(plan(), &StreamSpec::default());
        assert_eq!(text(&steps), "H[ab]FD");
    }

    #[test]
    fn fail_after_counts_content_chunks_and_defaults_to_network() {
        let spec = |fail_after, fail_with| StreamSpec {
            fail_after,
            fail_with,
            ..StreamSpec::default()
        };
        assert_eq!(text(&schedule(plan(), &spec(Some(0), None))), "H[!");
        assert_eq!(text(&schedule(plan(), &spec(Some(1), None))), "H[a!");
        assert_eq!(text(&schedule(plan(), &spec(Some(9), None))), "H[ab]!");
        assert_eq!(
            text(&schedule(
                plan(),
                &spec(Some(1), Some(FailWith::ErrorEvent))
            )),
            "H[aE"
        );
        assert_eq!(
            text(&schedule(plan(), &spec(None, Some(FailWith::Truncate)))),
            "H[ab]"
        );
    }

    #[test]
    fn malformed_data_then_the_rest_of_the_stream() {
        let spec = StreamSpec {
            fail_after: Some(1),
            fail_with: Some(FailWith::Malformed),
            ..StreamSpec::default()
        };
        let out = text(&schedule(plan(), &spec));
        assert!(out.starts_with("H[a"), "{out}");
        assert!(out.contains("data: {\"choices\""), "{out}");
        assert!(
            out.ends_with("b]FD"),
            "the rest follows, tail included: {out}"
        );
    }

    #[test]
    fn delays_space_content_and_stalls_add_once() {
        let spec = StreamSpec {
            delay_ms: Some(10),
            stall_after: Some(1),
            stall_ms: Some(100),
            ..StreamSpec::default()
        };
        let delays: Vec<u64> = schedule(plan(), &spec)
            .iter()
            .map(|step| match step {
                Step::Send { delay, .. } | Step::Abort { delay } => delay.as_millis() as u64,
            })
            .collect();
        // H [ a b ] F D
        assert_eq!(delays, vec![0, 0, 10, 110, 0, 10, 0]);
    }

    #[test]
    fn a_stall_before_the_first_token() {
        let spec = StreamSpec {
            stall_after: Some(0),
            stall_ms: Some(50),
            ..StreamSpec::default()
        };
        let steps = schedule(plan(), &spec);
        assert_eq!(
            steps[1],
            Step::Send {
                delay: Duration::from_millis(50),
                bytes: Bytes::from_static(b"[")
            }
        );
    }

    #[test]
    fn sse_framing() {
        let value = serde_json::json!({"a": 1});
        assert_eq!(data(&value), Bytes::from_static(b"data: {\"a\":1}\n\n"));
        assert_eq!(
            event("ping", &value),
            Bytes::from_static(b"event: ping\ndata: {\"a\":1}\n\n")
        );
    }
}
