//! Keeping a lane's key out of what a client receives: the key whole, the truncated forms
//! providers echo it in (`sk-…abcd`, `sk-proj-****abcd`: a prefix of the key, a mask, its last
//! four characters), and a key a stream splits across two deltas (every SDK joins them).

use serde_json::Value;

use crate::plan::Protocol;
use crate::wire::sse::{Event, Parser, Passed, Piece};

const REDACTED: &[u8] = b"[redacted]";
/// A key shorter than this is not redacted (it would match ordinary text).
const MIN_SECRET: usize = 4;
/// A truncated echo: at least this much of the key's start, a mask, then its last
/// [`TAIL`] characters.
const MIN_PREFIX: usize = 3;
const TAIL: usize = 4;
/// The longest mask a truncated echo is recognised with (in mask characters).
const MAX_MASK: usize = 64;
/// The characters providers mask a key with.
const MASKS: [&[u8]; 4] = [b"*", b".", "…".as_bytes(), "•".as_bytes()];

fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The length of the mask character `b` starts with.
fn mask_len(b: &[u8]) -> Option<usize> {
    MASKS.iter().find(|m| b.starts_with(m)).map(|m| m.len())
}

/// Whether truncated echoes of `secret` are recognised (a key too short for a prefix, a mask
/// and a tail that do not overlap is only redacted whole).
fn truncatable(secret: &[u8]) -> bool {
    secret.len() > MIN_PREFIX + TAIL
}

/// Where the key's occurrence that starts `b` ends (the key whole, or truncated).
fn match_at(b: &[u8], secret: &[u8]) -> Option<usize> {
    if b.starts_with(secret) {
        return Some(secret.len());
    }
    if !truncatable(secret) {
        return None;
    }
    let k = common_prefix(b, secret);
    if k < MIN_PREFIX {
        return None;
    }
    let (mut j, mut masks) = (k, 0);
    while let Some(m) = b.get(j..).and_then(mask_len) {
        j += m;
        masks += 1;
        if masks > MAX_MASK {
            return None;
        }
    }
    let tail = &secret[secret.len() - TAIL..];
    (masks > 0 && b[j..].starts_with(tail)).then_some(j + TAIL)
}

/// Whether `b`, the end of a text so far, could be the start of an occurrence of the key that
/// the text's next bytes complete.
fn could_start(b: &[u8], secret: &[u8]) -> bool {
    let k = common_prefix(b, secret);
    if k == b.len() {
        return k < secret.len();
    }
    if k < MIN_PREFIX || !truncatable(secret) {
        return false;
    }
    let (mut j, mut masks) = (k, 0);
    while j < b.len() {
        match mask_len(&b[j..]) {
            Some(m) => {
                j += m;
                masks += 1;
                if masks > MAX_MASK {
                    return false;
                }
            }
            // A mask character cut at the end.
            None if MASKS
                .iter()
                .any(|m| m.len() > b.len() - j && m.starts_with(&b[j..])) =>
            {
                return true
            }
            None => break,
        }
    }
    let tail = &secret[secret.len() - TAIL..];
    masks > 0 && b.len() - j < TAIL && tail.starts_with(&b[j..])
}

/// `bytes` with every occurrence of `secret` (whole or truncated) replaced by `[redacted]`,
/// or `None` when it holds none (the common case, which copies nothing). Works on raw bytes:
/// a provider's answer need not be UTF-8 for its echo of a key to be caught.
pub fn redact_bytes(bytes: &[u8], secret: &str) -> Option<Vec<u8>> {
    let (out, _) = scan(bytes, secret.as_bytes(), false);
    out
}

/// Replaces every occurrence of `secret` (whole or truncated) in `text` with `[redacted]`.
pub fn redact(text: &str, secret: &str) -> String {
    match redact_bytes(text.as_bytes(), secret) {
        Some(clean) => String::from_utf8_lossy(&clean).into_owned(),
        None => text.to_string(),
    }
}

/// Scans `bytes` for the key: the redacted bytes (`None`: nothing redacted, nothing held) and,
/// with `hold`, where the bytes that could start an occurrence the next bytes complete begin.
fn scan(bytes: &[u8], secret: &[u8], hold: bool) -> (Option<Vec<u8>>, Option<usize>) {
    if secret.len() < MIN_SECRET {
        return (None, None);
    }
    let first = secret[0];
    let mut out: Option<Vec<u8>> = None;
    let (mut copied, mut i) = (0, 0);
    while let Some(p) = bytes[i..].iter().position(|&c| c == first) {
        i += p;
        if let Some(len) = match_at(&bytes[i..], secret) {
            let o = out.get_or_insert_with(|| Vec::with_capacity(bytes.len()));
            o.extend_from_slice(&bytes[copied..i]);
            o.extend_from_slice(REDACTED);
            i += len;
            copied = i;
        } else if hold && could_start(&bytes[i..], secret) {
            let mut o = out.unwrap_or_default();
            o.extend_from_slice(&bytes[copied..i]);
            return (Some(o), Some(i));
        } else {
            i += 1;
        }
    }
    let out = out.map(|mut o| {
        o.extend_from_slice(&bytes[copied..]);
        o
    });
    (out, None)
}

/// `text` redacted, split in what may go now and what is held back: the bytes at its end
/// that could start an occurrence of the key the next text completes.
fn redact_holding(text: &str, secret: &str) -> (String, String) {
    match scan(text.as_bytes(), secret.as_bytes(), true) {
        (None, _) => (text.to_string(), String::new()),
        (Some(clean), None) => (String::from_utf8_lossy(&clean).into_owned(), String::new()),
        (Some(clean), Some(at)) if text.is_char_boundary(at) => (
            String::from_utf8_lossy(&clean).into_owned(),
            text[at..].to_string(),
        ),
        // The key starts inside a character (a key that is not ASCII): nothing held.
        (Some(_), Some(_)) => {
            let (clean, _) = scan(text.as_bytes(), secret.as_bytes(), false);
            match clean {
                Some(c) => (String::from_utf8_lossy(&c).into_owned(), String::new()),
                None => (text.to_string(), String::new()),
            }
        }
    }
}

/// Where an event's delta text is: the channel it continues (deltas of one channel are joined
/// by the client) and the JSON pointer to the string.
fn delta_slots(shape: Protocol, name: Option<&str>, v: &Value) -> Vec<(String, String)> {
    let mut slots = Vec::new();
    match shape {
        Protocol::Chat => {
            let Some(choices) = v.get("choices").and_then(Value::as_array) else {
                return slots;
            };
            for (i, choice) in choices.iter().enumerate() {
                let index = choice.get("index").and_then(Value::as_u64).unwrap_or(0);
                let Some(delta) = choice.get("delta") else {
                    continue;
                };
                for field in ["content", "refusal", "reasoning_content", "reasoning"] {
                    if delta.get(field).is_some_and(Value::is_string) {
                        slots.push((
                            format!("{index}/{field}"),
                            format!("/choices/{i}/delta/{field}"),
                        ));
                    }
                }
                if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
                    for (j, call) in calls.iter().enumerate() {
                        if call
                            .pointer("/function/arguments")
                            .is_some_and(Value::is_string)
                        {
                            let t = call.get("index").and_then(Value::as_u64).unwrap_or(0);
                            slots.push((
                                format!("{index}/tool/{t}"),
                                format!("/choices/{i}/delta/tool_calls/{j}/function/arguments"),
                            ));
                        }
                    }
                }
            }
        }
        Protocol::Messages => {
            let kind = v.get("type").and_then(Value::as_str).or(name);
            if kind != Some("content_block_delta") {
                return slots;
            }
            let index = v.get("index").and_then(Value::as_u64).unwrap_or(0);
            for field in ["text", "partial_json", "thinking"] {
                if v.pointer(&format!("/delta/{field}"))
                    .is_some_and(Value::is_string)
                {
                    slots.push((format!("{index}/{field}"), format!("/delta/{field}")));
                }
            }
        }
        Protocol::Responses => {
            let kind = v.get("type").and_then(Value::as_str).or(name).unwrap_or("");
            if kind.ends_with(".delta") && v.get("delta").is_some_and(Value::is_string) {
                let at = |k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
                let channel = format!(
                    "{kind}/{}/{}/{}",
                    at("output_index"),
                    at("content_index"),
                    at("summary_index")
                );
                slots.push((channel, "/delta".to_string()));
            }
        }
        Protocol::Gemini => {
            let parts = v
                .pointer("/candidates/0/content/parts")
                .and_then(Value::as_array);
            for (i, part) in parts.into_iter().flatten().enumerate() {
                if part.get("text").is_some_and(Value::is_string) {
                    slots.push((
                        "text".to_string(),
                        format!("/candidates/0/content/parts/{i}/text"),
                    ));
                }
            }
        }
    }
    slots
}

/// An event held back because its delta ends with what could start the key.
struct Held {
    name: Option<String>,
    value: Value,
    channel: String,
    pointer: String,
    /// The delta's text that may go (redacted).
    clean: String,
    /// Its end, held back.
    held: String,
}

/// A stream's events on their way to the client, the key redacted across the deltas a client
/// joins: a delta whose text ends with what could start the key is held back until the next
/// event shows whether it does (the next delta of its channel takes the held text; any other
/// event, or the end of the stream, releases it as it was).
pub struct StreamRedactor {
    secret: String,
    shape: Protocol,
    parser: Parser,
    held: Option<Held>,
}

impl StreamRedactor {
    /// A redactor for a stream of `shape`'s events (chat chunks, Messages or Responses events).
    pub fn new(secret: &str, shape: Protocol) -> Self {
        Self {
            secret: secret.to_string(),
            shape,
            parser: Parser::new(),
            held: None,
        }
    }

    fn scrub(&self, bytes: Vec<u8>) -> Vec<u8> {
        redact_bytes(&bytes, &self.secret).unwrap_or(bytes)
    }

    /// The redacted bytes of the events `bytes` completes.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        if self.secret.len() < MIN_SECRET {
            out.extend_from_slice(bytes);
            return out;
        }
        for event in self.parser.feed(bytes) {
            self.event(event, &mut out);
        }
        out
    }

    /// The redacted bytes of what a stream's gate let through: the provider's events read as
    /// the gate parsed them (while no incomplete event waits here), the gate's own bytes
    /// parsed here.
    pub fn feed_passed(&mut self, passed: Passed) -> Vec<u8> {
        let mut out = Vec::new();
        for piece in passed.pieces() {
            match piece {
                Piece::Event(event) if self.secret.len() < MIN_SECRET => out.extend(event.raw),
                Piece::Event(event) if self.parser.pending().is_empty() => {
                    self.event(event, &mut out);
                }
                Piece::Event(event) => out.extend(self.feed(&event.raw)),
                Piece::Bytes(bytes) => out.extend(self.feed(&bytes)),
            }
        }
        out
    }

    /// The end of the stream: whatever is held, and an incomplete last event, redacted.
    pub fn finish(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        self.release(&mut out);
        let tail = self.parser.take_pending();
        out.extend(self.scrub(tail));
        out
    }

    fn release(&mut self, out: &mut Vec<u8>) {
        if let Some(held) = self.held.take() {
            let text = format!("{}{}", held.clean, held.held);
            self.render(out, held.name.as_deref(), held.value, &held.pointer, text);
        }
    }

    fn render(
        &self,
        out: &mut Vec<u8>,
        name: Option<&str>,
        mut value: Value,
        pointer: &str,
        text: String,
    ) {
        if let Some(slot) = value.pointer_mut(pointer) {
            *slot = Value::String(text);
        }
        let mut bytes = Vec::new();
        if let Some(name) = name {
            bytes.extend_from_slice(format!("event: {name}\n").as_bytes());
        }
        bytes.extend_from_slice(format!("data: {value}\n\n").as_bytes());
        out.extend(self.scrub(bytes));
    }

    /// Whether an event can go as it came, without reading its JSON: nothing is held, it has
    /// no escape (so its strings' text is its bytes), and no occurrence of the key's first
    /// byte starts the key (whole or truncated) or, up to the end of a string that is not an
    /// object's key, what could start it. Then no delta of it holds or ends with the key, and the full reading would
    /// send it as it came too. The common case: most events of a stream are this.
    fn plain(&self, raw: &[u8]) -> bool {
        let secret = self.secret.as_bytes();
        if self.held.is_some() || raw.contains(&b'\\') {
            return false;
        }
        let first = secret[0];
        let mut i = 0;
        while let Some(p) = raw[i..].iter().position(|&c| c == first) {
            i += p;
            let end = raw[i..]
                .iter()
                .position(|&c| c == b'"')
                .map_or(raw.len(), |q| i + q);
            // An object's key (its string followed by `:`) is no delta's text.
            let key = raw
                .get(end + 1..)
                .and_then(|rest| rest.iter().find(|c| !c.is_ascii_whitespace()))
                == Some(&b':');
            let may_end_like_key = !key && could_start(&raw[i..end], secret);
            if match_at(&raw[i..], secret).is_some() || may_end_like_key {
                return false;
            }
            i += 1;
        }
        true
    }

    fn event(&mut self, event: Event, out: &mut Vec<u8>) {
        if self.plain(&event.raw) {
            out.extend(event.raw);
            return;
        }
        self.read_event(event, out);
    }

    /// An event read whole: its delta's text redacted, joined with what is held of its channel.
    fn read_event(&mut self, event: Event, out: &mut Vec<u8>) {
        let data = event.data.trim();
        let value = (!data.is_empty() && data != "[DONE]")
            .then(|| serde_json::from_str::<Value>(data).ok())
            .flatten();
        let slots = value.as_ref().map_or_else(Vec::new, |v| {
            delta_slots(self.shape, event.name.as_deref(), v)
        });
        let (Some(value), [(channel, pointer)]) = (value, slots.as_slice()) else {
            // Not one delta: whatever is held goes first, as it was.
            self.release(out);
            out.extend(self.scrub(event.raw));
            return;
        };
        let text = value
            .pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or_default();
        let mut before = String::new();
        if let Some(held) = self.held.take() {
            if &held.channel == channel {
                before = held.held.clone();
                let clean = held.clean.clone();
                self.render(out, held.name.as_deref(), held.value, &held.pointer, clean);
            } else {
                self.held = Some(held);
                self.release(out);
            }
        }
        let joined = format!("{before}{text}");
        let (clean, held) = redact_holding(&joined, &self.secret);
        if !held.is_empty() {
            self.held = Some(Held {
                name: event.name.clone(),
                value,
                channel: channel.clone(),
                pointer: pointer.clone(),
                clean,
                held,
            });
        } else if before.is_empty() && clean == text {
            out.extend(self.scrub(event.raw));
        } else {
            let pointer = pointer.clone();
            self.render(out, event.name.as_deref(), value, &pointer, clean);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "sk-proj-Zq81LmN0pX4vB7cD2eF9";

    #[test]
    fn the_key_whole_and_truncated_is_redacted() {
        assert_eq!(
            redact("bad key sk-123456", "sk-123456"),
            "bad key [redacted]"
        );
        let cases = [
            ("Incorrect API key provided: sk-…eF9.", false),
            ("Incorrect API key provided: sk-…2eF9.", true),
            ("Incorrect API key provided: sk-proj-****2eF9. See", true),
            (
                "key sk-proj-Zq81***********************2eF9 is invalid",
                true,
            ),
            ("key sk-...2eF9", true),
            ("key sk-•••2eF9", true),
            // Another key's tail, no mask, a prefix too short: left as they are.
            ("key sk-…abcd", false),
            ("key sk-proj-2eF9", false),
            ("key s-…2eF9", false),
        ];
        for (text, redacted) in cases {
            let out = redact(text, KEY);
            assert_eq!(out.contains("[redacted]"), redacted, "{text} -> {out}");
            if redacted {
                assert!(!out.contains("2eF9"), "{text} -> {out}");
            }
        }
        assert_eq!(
            redact("x sk-proj-****2eF9 y", KEY),
            "x [redacted] y".to_string()
        );
    }

    #[test]
    fn redacts_bytes() {
        let secret = "sk-secret-1234";
        assert_eq!(redact_bytes(b"nothing here", secret), None);
        assert_eq!(
            redact_bytes(b"a sk-secret-1234 b sk-secret-1234", secret).as_deref(),
            Some(&b"a [redacted] b [redacted]"[..])
        );
        assert_eq!(
            redact_bytes(b"\xe9sk-secret-1234\xff", secret).as_deref(),
            Some(&b"\xe9[redacted]\xff"[..])
        );
        assert_eq!(redact_bytes(b"sk-s", "sk-"), None);
    }

    fn chat_delta(text: &str) -> String {
        let chunk = serde_json::json!({"id": "c1", "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]});
        format!("data: {chunk}\n\n")
    }

    fn messages_delta(text: &str) -> String {
        let event = serde_json::json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": text}});
        format!("event: content_block_delta\ndata: {event}\n\n")
    }

    fn responses_delta(text: &str) -> String {
        let event = serde_json::json!({"type": "response.output_text.delta", "output_index": 0,
            "content_index": 0, "item_id": "msg_1", "delta": text});
        format!("event: response.output_text.delta\ndata: {event}\n\n")
    }

    /// The text a client joins from the deltas of a stream.
    fn joined(shape: Protocol, bytes: &[u8]) -> String {
        let mut text = String::new();
        for event in Parser::new().feed(bytes) {
            let Ok(v) = serde_json::from_str::<Value>(event.data.trim()) else {
                continue;
            };
            for (_, pointer) in delta_slots(shape, event.name.as_deref(), &v) {
                text.push_str(v.pointer(&pointer).and_then(Value::as_str).unwrap_or(""));
            }
        }
        text
    }

    #[test]
    fn a_key_split_across_two_deltas_is_redacted_at_every_position_in_every_protocol() {
        let end: [(Protocol, &str); 3] = [
            (Protocol::Chat, "data: [DONE]\n\n"),
            (
                Protocol::Messages,
                "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
            ),
            (
                Protocol::Responses,
                "event: response.completed\ndata: {\"type\":\"response.completed\"}\n\n",
            ),
        ];
        for (shape, last) in end {
            let delta = |t: &str| match shape {
                Protocol::Chat => chat_delta(t),
                Protocol::Messages => messages_delta(t),
                Protocol::Responses => responses_delta(t),
                Protocol::Gemini => unreachable!("no native Gemini lane"),
            };
            for echoed in [KEY, "sk-proj-****2eF9"] {
                let text = format!("Your key is {echoed} (do not share).");
                let start = text.find("sk-").unwrap_or(0);
                for cut in start..=start + echoed.len() {
                    let stream = format!("{}{}{last}", delta(&text[..cut]), delta(&text[cut..]));
                    // The stream itself arrives cut anywhere too.
                    for split in [0, stream.len() / 2, stream.len()] {
                        let mut r = StreamRedactor::new(KEY, shape);
                        let mut out = r.feed(&stream.as_bytes()[..split]);
                        out.extend(r.feed(&stream.as_bytes()[split..]));
                        out.extend(r.finish());
                        let got = joined(shape, &out);
                        assert_eq!(
                            got, "Your key is [redacted] (do not share).",
                            "{shape:?} {echoed} cut at {cut}"
                        );
                        let raw = String::from_utf8_lossy(&out);
                        assert!(!raw.contains("2eF9"), "{shape:?} cut at {cut}: {raw}");
                        assert!(raw.ends_with(last), "{shape:?} cut at {cut}: {raw}");
                    }
                }
            }
        }
    }

    #[test]
    fn an_event_passed_without_reading_is_what_reading_it_would_send() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(32);
        // Pieces that start like the key, end like it, are masked, escaped or plain.
        let pieces = [
            "sk-",
            "sk-proj-",
            "Zq81",
            "2eF9",
            "****",
            "…",
            "s",
            "k",
            "-",
            "ask ",
            "the ",
            "\"",
            "\\u0073k-",
            "é",
            " ",
            "sk-proj-Zq81LmN0pX4vB7cD2eF9",
            "\\\"",
            "s\":",
            "\":\"",
            "s\" : ",
        ];
        for _ in 0..3_000 {
            let mut stream = String::new();
            for _ in 0..rng.random_range(1..5) {
                let text: String = (0..rng.random_range(0..5))
                    .map(|_| pieces[rng.random_range(0..pieces.len())])
                    .collect();
                stream.push_str(&format!(
                    "data: {{\"id\":\"c1\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}},\"finish_reason\":null}}]}}\n\n"
                ));
            }
            stream.push_str("data: [DONE]\n\n");
            let mut fast = StreamRedactor::new(KEY, Protocol::Chat);
            let mut got = fast.feed(stream.as_bytes());
            got.extend(fast.finish());
            let mut full = StreamRedactor::new(KEY, Protocol::Chat);
            let mut want = Vec::new();
            for event in full.parser.feed(stream.as_bytes()) {
                full.read_event(event, &mut want);
            }
            want.extend(full.finish());
            assert_eq!(
                String::from_utf8_lossy(&got),
                String::from_utf8_lossy(&want),
                "{stream}"
            );
            // The same stream as a gate passes it on (its events parsed there, some bytes of
            // its own between them, the stream cut anywhere): the same bytes reach the client.
            let cut = rng.random_range(0..=stream.len());
            let mut parser = Parser::new();
            let mut passed = StreamRedactor::new(KEY, Protocol::Chat);
            let mut out = Vec::new();
            for part in [&stream.as_bytes()[..cut], &stream.as_bytes()[cut..]] {
                let mut pieces = Passed::default();
                for event in parser.feed(part) {
                    if rng.random_bool(0.2) {
                        pieces.bytes(event.raw);
                    } else {
                        pieces.event(event);
                    }
                }
                out.extend(passed.feed_passed(pieces));
            }
            out.extend(passed.feed(&parser.take_pending()));
            out.extend(passed.finish());
            assert_eq!(
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(&want),
                "{stream}"
            );
        }
    }

    #[test]
    fn text_that_only_starts_like_the_key_is_released_whole_and_in_order() {
        let stream = format!(
            "{}{}data: [DONE]\n\n",
            chat_delta("ask sk-pro"),
            chat_delta("fessional")
        );
        let mut r = StreamRedactor::new(KEY, Protocol::Chat);
        let mut out = r.feed(stream.as_bytes());
        out.extend(r.finish());
        assert_eq!(joined(Protocol::Chat, &out), "ask sk-professional");
        // A delta that does not end like the key goes as it came, byte for byte.
        let plain = chat_delta("hello");
        let mut r = StreamRedactor::new(KEY, Protocol::Chat);
        assert_eq!(r.feed(plain.as_bytes()), plain.as_bytes());
        // What is held at the end of the stream is released then.
        let mut r = StreamRedactor::new(KEY, Protocol::Chat);
        assert!(r.feed(chat_delta("tail sk-").as_bytes()).is_empty());
        assert_eq!(joined(Protocol::Chat, &r.finish()), "tail sk-");
    }
}
