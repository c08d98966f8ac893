//! The attempt stage's view of an OpenAI chat-completions stream: hold everything until the
//! first token, fail over on anything that goes wrong before it, and after it forward events as
//! they come, dropping the usage chunk the client did not ask for (and adding the answer's cost,
//! `usage.cost`, to the one it did) and ending a broken stream with an OpenAI error event.

use serde_json::Value;

use ai_router_contract::kinds::DailyReset;

use crate::classify::{classify_stream_error, failure::Failure};
use crate::plan::Protocol;
use crate::protocols::NativeStream;
use crate::vocab::{usage_of, Usage};
use crate::wire::sse::{Event, Parser, Passed};
use ai_router_contract::error_code::ErrorCode;
use ai_router_contract::failure::ErrorClass;

/// What a fed chunk means for the attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Still before the first token: keep holding.
    Hold,
    /// The first token arrived: release, forwarding these events in place of everything held.
    Release(Passed),
    /// After the first token: forward these events in place of the chunk.
    Forward(Passed),
    /// The stream failed before the first token: fail over.
    Fail(Failure),
}

#[derive(Debug)]
pub struct Gate {
    kind: String,
    /// When the provider's days end (its `dailyResetTimezone`, else its kind's).
    daily_reset: Option<DailyReset>,
    include_usage: bool,
    parser: Parser,
    released: bool,
    held: Passed,
    /// Events with data seen so far (comments and keep-alives are not chunks).
    chunks: u64,
    done: bool,
    /// A chat chunk carried a finish reason.
    finished: bool,
    errored: bool,
    /// What ended the stream after the first token (an error event, malformed data).
    failed: Option<Failure>,
    pub usage: Option<Usage>,
    /// Estimated tokens of the text generated so far: what the stream counts as when the
    /// provider sends no usage.
    pub answer_tokens: u64,
    pub model: Option<String>,
    /// A stream in the caller's own protocol (Messages, Responses), read by its own rules.
    native: Option<NativeStream>,
    /// The answering model's price: the usage chunk gets the answer's cost (`usage.cost`).
    price: Option<ai_router_proto::v1::Cost>,
}

impl Gate {
    pub fn new(kind: &str, include_usage: bool) -> Self {
        Self {
            kind: kind.to_string(),
            daily_reset: None,
            include_usage,
            parser: Parser::new(),
            released: false,
            held: Passed::default(),
            chunks: 0,
            done: false,
            finished: false,
            errored: false,
            failed: None,
            usage: None,
            answer_tokens: 0,
            model: None,
            native: None,
            price: None,
        }
    }

    /// The usage chunk the client gets states the answer's cost at `price` (`usage.cost`, in
    /// the unit of the pool's prices, as OpenRouter's usage does): the response headers went
    /// out before the usage was known.
    pub fn with_price(mut self, price: Option<ai_router_proto::v1::Cost>) -> Self {
        self.price = price;
        self
    }

    /// Errors in the stream are classified for a provider whose days end in `daily_reset`.
    pub fn with_daily_reset(mut self, daily_reset: Option<DailyReset>) -> Self {
        self.daily_reset = daily_reset;
        if let Some(native) = &mut self.native {
            native.daily_reset = daily_reset;
        }
        self
    }

    /// A gate for a stream a provider sends in the caller's own protocol: the same holding
    /// and failover, its own events for tokens, the end and errors, and its own error event.
    pub fn native(kind: &str, protocol: Protocol) -> Self {
        Self {
            native: Some(NativeStream::new(protocol, kind)),
            ..Self::new(kind, true)
        }
    }

    /// The event that ends the stream for the client after its first token.
    fn end_event(&self, message: &str) -> Vec<u8> {
        match &self.native {
            Some(native) => native.error_event(message),
            None => error_event(message, ErrorCode::StreamInterrupted),
        }
    }

    pub fn released(&self) -> bool {
        self.released
    }

    /// How many events with data the provider sent so far: what bounds a gap in the stream.
    pub fn chunks(&self) -> u64 {
        self.chunks
    }

    /// Whether the provider ended the stream properly (`[DONE]`).
    pub fn completed(&self) -> bool {
        self.answer_complete() && self.failed.is_none()
    }

    /// `[DONE]` (or the native stream's end) came, or a chat stream's answer is whole without
    /// it: a finish reason, then the usage chunk (some servers never send `[DONE]`).
    fn answer_complete(&self) -> bool {
        self.done || (self.native.is_none() && self.finished && self.usage.is_some())
    }

    /// The failure that ended the stream after its first token, if one did: the client got one
    /// OpenAI error event in its place, and nothing after it.
    pub fn failed_after_first_token(&self) -> Option<&Failure> {
        self.failed.as_ref()
    }

    /// Feeds newly received bytes.
    pub fn feed(&mut self, bytes: &[u8], now_ms: i64) -> Step {
        let mut out = Passed::default();
        let mut released_now = false;
        if self.failed.is_some() {
            // The stream already ended for the client: nothing more reaches it.
            return Step::Forward(out);
        }
        for event in self.parser.feed(bytes) {
            match self.judge(&event, now_ms) {
                Judged::Keep { token } => {
                    if self.released {
                        out.event(event);
                    } else {
                        self.held.event(event);
                        if token {
                            self.released = true;
                            released_now = true;
                            out.append(&mut self.held);
                        }
                    }
                }
                Judged::Replace(bytes) => {
                    if self.released {
                        out.bytes(bytes);
                    } else {
                        self.held.bytes(bytes);
                    }
                }
                Judged::Drop => {}
                Judged::Error(failure) => {
                    if self.released {
                        // One OpenAI error event ends the stream, whatever shape the provider's
                        // error had (or no shape: malformed data); `[DONE]` never follows.
                        self.errored = true;
                        out.bytes(self.end_event(&format!(
                            "The provider's stream failed after the answer had started: {}",
                            failure.message
                        )));
                        self.failed = Some(failure);
                        break;
                    } else {
                        return Step::Fail(failure);
                    }
                }
            }
        }
        if self.parser.overflowed() && self.failed.is_none() {
            let failure = overlong_event();
            if !self.released {
                return Step::Fail(failure);
            }
            self.errored = true;
            out.bytes(self.end_event(&format!(
                "The provider's stream failed after the answer had started: {}",
                failure.message
            )));
            self.failed = Some(failure);
        }
        if released_now {
            Step::Release(out)
        } else if self.released {
            Step::Forward(out)
        } else {
            Step::Hold
        }
    }

    /// The stream ended. Before the first token an empty or cut-off stream is a failure; after
    /// it, a stream that did not finish gets an error event. Returns what to append (or the
    /// failure).
    pub fn finish(&mut self) -> Result<Vec<u8>, Failure> {
        let tail = self.parser.take_pending();
        if self.failed.is_some() {
            return Ok(Vec::new());
        }
        if !self.released {
            if self.done {
                // A complete stream with no content at all: pass it on as it is.
                self.released = true;
                let mut out = std::mem::take(&mut self.held).into_bytes();
                out.extend_from_slice(&tail);
                return Ok(out);
            }
            return Err(Failure::local(
                ErrorClass::Stream,
                200,
                "the stream ended before the first token",
            ));
        }
        let mut out = tail;
        if self.errored {
        } else if !self.answer_complete() {
            out.extend(self.end_event(ErrorCode::StreamInterrupted.message()));
        } else if !self.done {
            // Whole without `[DONE]`: the client's stream ends as a chat stream does.
            out.extend_from_slice(b"data: [DONE]\n\n");
        }
        Ok(out)
    }

    fn judge(&mut self, event: &Event, now_ms: i64) -> Judged {
        let data = event.data.trim();
        if data.is_empty() {
            // Comments and keep-alives.
            return Judged::Keep { token: false };
        }
        self.chunks += 1;
        if let Some(native) = self.native.as_mut() {
            let judged = native.judge(event, now_ms);
            self.usage = native.usage().or(self.usage);
            if self.usage.is_none() {
                // Read only while no usage has come (a native stream reports it early).
                if let Ok(value) = serde_json::from_str::<Value>(data) {
                    self.answer_tokens += crate::protocols::context::estimate_answer_tokens(&value);
                }
            }
            if let Some(failure) = judged.error {
                return Judged::Error(failure);
            }
            self.done |= judged.done;
            return Judged::Keep {
                token: judged.token,
            };
        }
        if data == "[DONE]" {
            self.done = true;
            return Judged::Keep { token: false };
        }
        if event.name.as_deref() != Some("error") {
            // The common chunk, read without a `Value` (what it yields is what reading it
            // whole below would).
            if let Some(plain) = super::chunk::read_plain(data) {
                if self.model.is_none() {
                    self.model = plain.model.map(std::borrow::Cow::into_owned);
                }
                self.answer_tokens += plain.answer_tokens;
                self.finished |= plain.finished;
                return Judged::Keep { token: plain.token };
            }
        }
        let Ok(value) = serde_json::from_str::<Value>(data) else {
            return Judged::Error(Failure::local(
                ErrorClass::Stream,
                200,
                "the provider sent malformed stream data",
            ));
        };
        if value.get("error").is_some() || event.name.as_deref() == Some("error") {
            return Judged::Error(classify_stream_error(
                &self.kind,
                self.daily_reset,
                &value,
                now_ms,
            ));
        }
        if self.model.is_none() {
            self.model = value
                .get("model")
                .and_then(Value::as_str)
                .map(str::to_string);
        }
        if let Some(choices) = value.get("choices") {
            self.answer_tokens += crate::protocols::context::estimate_answer_tokens(choices);
        }
        let choices_empty = value
            .get("choices")
            .and_then(Value::as_array)
            .is_none_or(|c| c.is_empty());
        if let Some(u) = usage_of(&value) {
            self.usage = Some(u);
            if choices_empty && !self.include_usage {
                return Judged::Drop;
            }
            if let (true, Some(price)) = (choices_empty, &self.price) {
                return Judged::Replace(with_cost(value, crate::lanes::cost::of_usage(price, &u)));
            }
        }
        self.finished |= value
            .get("choices")
            .and_then(Value::as_array)
            .is_some_and(|c| {
                c.iter()
                    .any(|c| c.get("finish_reason").is_some_and(|f| !f.is_null()))
            });
        Judged::Keep {
            token: has_token(&value),
        }
    }
}

enum Judged {
    Keep {
        token: bool,
    },
    /// Kept, as these bytes (the usage chunk with its cost).
    Replace(Vec<u8>),
    Drop,
    Error(Failure),
}

/// The usage chunk's event with `usage.cost` set.
fn with_cost(mut chunk: Value, cost: f64) -> Vec<u8> {
    if let Some(usage) = chunk.get_mut("usage").and_then(Value::as_object_mut) {
        usage.insert("cost".into(), Value::from(cost));
    }
    format!("data: {chunk}\n\n").into_bytes()
}

/// The first token: a delta that carries anything besides the role (content, a refusal, tool
/// calls), or a finish reason.
pub(super) fn has_token(chunk: &Value) -> bool {
    let Some(choices) = chunk.get("choices").and_then(Value::as_array) else {
        return false;
    };
    choices.iter().any(|c| {
        let delta_has = c.get("delta").and_then(Value::as_object).is_some_and(|d| {
            d.iter().any(|(k, v)| {
                k != "role"
                    && match v {
                        Value::Null => false,
                        Value::String(s) => !s.is_empty(),
                        Value::Array(a) => !a.is_empty(),
                        _ => true,
                    }
            })
        });
        delta_has || c.get("finish_reason").is_some_and(|f| !f.is_null())
    })
}

/// A provider's stream event past [`crate::wire::sse::MAX_EVENT_BYTES`]: the stream is not read
/// further.
pub fn overlong_event() -> Failure {
    Failure::local(
        ErrorClass::Stream,
        200,
        format!(
            "the provider sent a stream event longer than {} bytes",
            crate::wire::sse::MAX_EVENT_BYTES
        ),
    )
}

/// An OpenAI-style error event for a stream that cannot go on.
pub fn error_event(message: &str, code: ErrorCode) -> Vec<u8> {
    let body = serde_json::json!({
        "error": {
            "message": message,
            "type": code.openai_type(),
            "param": null,
            "code": code.as_str(),
        }
    });
    format!("data: {body}\n\n").into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_reads_the_cached_prompt_tokens() {
        let v: Value = serde_json::from_str(
            r#"{"usage":{"prompt_tokens":9,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":4}}}"#,
        )
        .unwrap();
        assert_eq!(
            usage_of(&v),
            Some(Usage {
                prompt_tokens: 9,
                completion_tokens: 2,
                cached_tokens: 4
            })
        );
    }

    fn chunk(delta: &str) -> String {
        format!("data: {{\"id\":\"c\",\"model\":\"m1\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":null}}]}}\n\n")
    }

    fn whole() -> String {
        let mut s = chunk(r#"{"role":"assistant","content":""}"#);
        s += &chunk(r#"{"content":"Hel"}"#);
        s += &chunk(r#"{"content":"lo"}"#);
        s += "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\n";
        s += "data: [DONE]\n\n";
        s
    }

    fn run(input: &str, split: usize, include_usage: bool) -> (Vec<u8>, Gate) {
        let mut g = Gate::new("openai", include_usage);
        let mut out = Vec::new();
        for part in [&input.as_bytes()[..split], &input.as_bytes()[split..]] {
            match g.feed(part, 0) {
                Step::Hold => {}
                Step::Release(b) | Step::Forward(b) => out.extend(b.into_bytes()),
                Step::Fail(f) => panic!("failed: {f:?}"),
            }
        }
        out.extend(g.finish().unwrap());
        (out, g)
    }

    #[test]
    fn holds_until_first_token_then_forwards_everything_once() {
        let input = whole();
        for split in 0..=input.len() {
            let (out, g) = run(&input, split, true);
            assert_eq!(String::from_utf8(out).unwrap(), input, "split {split}");
            assert_eq!(
                g.usage,
                Some(Usage {
                    prompt_tokens: 3,
                    completion_tokens: 2,
                    cached_tokens: 0
                })
            );
            assert!(g.completed());
        }
    }

    #[test]
    fn a_whole_answer_without_done_ends_cleanly_and_a_cut_one_with_an_error_event() {
        let finish = "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n";
        let usage = "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\n";
        let head = chunk(r#"{"content":"Hello"}"#);
        let (out, g) = run(&format!("{head}{finish}{usage}"), 0, true);
        let out = String::from_utf8(out).unwrap();
        assert!(g.completed(), "{out}");
        assert!(!out.contains("error"), "{out}");
        assert!(out.ends_with("data: [DONE]\n\n"), "{out}");
        // Without the usage chunk, or without the finish reason, the answer may be cut.
        for cut in [format!("{head}{finish}"), format!("{head}{usage}")] {
            let (out, g) = run(&cut, 0, true);
            assert!(!g.completed());
            assert!(String::from_utf8(out).unwrap().contains("\"error\""));
        }
    }

    #[test]
    fn an_endless_line_fails_over_before_the_first_token_and_ends_the_stream_after_it() {
        let line = vec![b'x'; crate::wire::sse::MAX_EVENT_BYTES / 4];
        let mut g = Gate::new("openai", true);
        assert_eq!(g.feed(b"data: ", 0), Step::Hold);
        let mut step = Step::Hold;
        for _ in 0..5 {
            step = g.feed(&line, 0);
        }
        assert!(matches!(step, Step::Fail(f) if f.class == ErrorClass::Stream));
        let mut g = Gate::new("openai", true);
        assert!(matches!(
            g.feed(chunk(r#"{"content":"Hi"}"#).as_bytes(), 0),
            Step::Release(_)
        ));
        let mut out = Vec::new();
        g.feed(b"data: ", 0);
        for _ in 0..5 {
            if let Step::Forward(b) = g.feed(&line, 0) {
                out.extend(b.into_bytes());
            }
        }
        let out = String::from_utf8(out).unwrap();
        assert!(
            out.contains("stream_interrupted") && out.contains("longer than"),
            "{out}"
        );
        assert!(g.failed_after_first_token().is_some());
        assert!(out.len() < 1_000, "nothing of the line reaches the client");
    }

    #[test]
    fn usage_chunk_dropped_unless_asked() {
        let (out, g) = run(&whole(), 10, false);
        let text = String::from_utf8(out).unwrap();
        assert!(!text.contains("usage"));
        assert!(text.ends_with("data: [DONE]\n\n"));
        assert_eq!(g.usage.unwrap().completion_tokens, 2);
    }

    #[test]
    fn the_usage_chunk_states_the_answers_cost_at_every_split() {
        let mut price = ai_router_proto::v1::Cost::default();
        (price.input, price.output) = (1.0, 2.0);
        let input = whole();
        for split in 0..=input.len() {
            let mut g = Gate::new("openai", true).with_price(Some(price));
            let mut out = Vec::new();
            for part in [&input.as_bytes()[..split], &input.as_bytes()[split..]] {
                if let Step::Release(b) | Step::Forward(b) = g.feed(part, 0) {
                    out.extend(b.into_bytes());
                }
            }
            out.extend(g.finish().unwrap());
            let text = String::from_utf8(out).unwrap();
            let usage: Value = text
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .filter_map(|d| serde_json::from_str::<Value>(d).ok())
                .find_map(|v| v.get("usage").cloned())
                .expect("the usage chunk");
            // 3 prompt tokens at 1 and 2 completion tokens at 2 per million.
            assert_eq!(usage["cost"].as_f64(), Some(7e-6), "split {split}");
            assert_eq!(usage["completion_tokens"], 2);
            assert!(text.ends_with("data: [DONE]\n\n"));
        }
        // Not asked for: still dropped.
        let mut g = Gate::new("openai", false).with_price(Some(price));
        let Step::Release(out) = g.feed(whole().as_bytes(), 0) else {
            panic!("released");
        };
        assert!(!String::from_utf8_lossy(&out.into_bytes()).contains("usage"));
    }

    #[test]
    fn role_chunk_alone_is_held() {
        let mut g = Gate::new("openai", false);
        assert_eq!(
            g.feed(chunk(r#"{"role":"assistant","content":""}"#).as_bytes(), 0),
            Step::Hold
        );
        assert!(matches!(
            g.feed(chunk(r#"{"content":"x"}"#).as_bytes(), 0),
            Step::Release(_)
        ));
    }

    #[test]
    fn error_before_first_token_fails_over() {
        let mut g = Gate::new("openai", false);
        assert_eq!(
            g.feed(chunk(r#"{"role":"assistant"}"#).as_bytes(), 0),
            Step::Hold
        );
        match g.feed(
            b"data: {\"error\":{\"message\":\"overloaded\",\"type\":\"server_error\"}}\n\n",
            0,
        ) {
            Step::Fail(f) => assert_eq!(f.class, ErrorClass::Transient),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn cut_before_first_token_is_a_failure() {
        let mut g = Gate::new("openai", false);
        assert_eq!(
            g.feed(chunk(r#"{"role":"assistant"}"#).as_bytes(), 0),
            Step::Hold
        );
        assert_eq!(g.finish().unwrap_err().class, ErrorClass::Stream);
    }

    #[test]
    fn cut_after_first_token_ends_with_error_event() {
        let mut g = Gate::new("openai", false);
        assert!(matches!(
            g.feed(chunk(r#"{"content":"x"}"#).as_bytes(), 0),
            Step::Release(_)
        ));
        let tail = String::from_utf8(g.finish().unwrap()).unwrap();
        assert!(tail.starts_with("data: {\"error\""));
        assert!(tail.contains("stream_interrupted"));
    }

    #[test]
    fn after_the_first_token_a_failure_is_one_error_event_and_the_end() {
        for bad in [
            "data: {not json\n\n",
            "data: {\"error\":{\"code\":500,\"status\":\"INTERNAL\",\"message\":\"boom\"}}\n\n",
        ] {
            let mut g = Gate::new("openai", false);
            assert!(matches!(
                g.feed(chunk(r#"{"content":"x"}"#).as_bytes(), 0),
                Step::Release(_)
            ));
            let rest = format!("{bad}{}data: [DONE]\n\n", chunk(r#"{"content":"y"}"#));
            let Step::Forward(out) = g.feed(rest.as_bytes(), 0) else {
                panic!("forwarded");
            };
            let out = String::from_utf8(out.into_bytes()).unwrap();
            assert_eq!(out.matches("data: ").count(), 1, "{out}");
            assert!(out.contains("\"code\":\"stream_interrupted\""), "{out}");
            assert!(
                !out.contains("[DONE]") && !out.contains("{not json"),
                "{out}"
            );
            assert!(g.failed_after_first_token().is_some());
            assert!(!g.completed());
            // Whatever follows is dropped, and the end adds nothing.
            assert_eq!(
                g.feed(chunk(r#"{"content":"z"}"#).as_bytes(), 0),
                Step::Forward(Passed::default())
            );
            assert_eq!(g.finish().unwrap(), Vec::<u8>::new());
        }
    }

    #[test]
    fn malformed_data_before_token_fails() {
        let mut g = Gate::new("openai", false);
        assert!(matches!(g.feed(b"data: {not json\n\n", 0), Step::Fail(_)));
    }
}
