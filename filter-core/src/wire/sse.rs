//! An incremental server-sent-events parser: feed bytes as they arrive, get whole events with
//! their raw bytes (so they can be forwarded untouched) and their parsed fields.

use serde_json::Value;

/// One complete event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The bytes of the event including its terminating blank line.
    pub raw: Vec<u8>,
    /// The `event:` field, if any.
    pub name: Option<String>,
    /// The `data:` lines joined with `\n`.
    pub data: String,
}

/// A stream's events on their way on, in order: events as a provider sent them (parsed
/// already, so the next reader takes their fields instead of parsing their bytes again) and
/// bytes written in place of others (each whole events).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Passed(Vec<Piece>);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Event(Event),
    Bytes(Vec<u8>),
}

impl Passed {
    pub fn event(&mut self, event: Event) {
        self.0.push(Piece::Event(event));
    }

    pub fn bytes(&mut self, bytes: Vec<u8>) {
        if !bytes.is_empty() {
            self.0.push(Piece::Bytes(bytes));
        }
    }

    /// Moves `other`'s pieces to the end of these.
    pub fn append(&mut self, other: &mut Passed) {
        self.0.append(&mut other.0);
    }

    pub fn pieces(self) -> Vec<Piece> {
        self.0
    }

    /// The bytes, as they go on.
    pub fn into_bytes(self) -> Vec<u8> {
        let mut out = Vec::new();
        for piece in self.0 {
            match piece {
                Piece::Event(e) => out.extend(e.raw),
                Piece::Bytes(b) => out.extend(b),
            }
        }
        out
    }
}

/// The most an event may hold (its bytes, up to its blank line). A provider's events are
/// deltas, a few hundred bytes; the largest real one (a Responses stream's last event, which
/// repeats the whole answer) stays far below this. Past it the parser drops what it holds and
/// reads nothing more ([`Parser::overflowed`]): a wasm VM's memory only grows, so one endless
/// line must not grow it for good.
pub const MAX_EVENT_BYTES: usize = 1 << 20;

/// Holds the bytes of an incomplete event between feeds.
#[derive(Debug, Default)]
pub struct Parser {
    pending: Vec<u8>,
    /// Where the scan for the end of the pending event resumes: the start of its first line
    /// not yet complete. An event sent in many small chunks is scanned once, not once a chunk.
    scanned: usize,
    /// An event passed [`MAX_EVENT_BYTES`]: the stream is no longer read.
    overflowed: bool,
}

impl Parser {
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes received but not yet part of a complete event.
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }

    /// Takes the incomplete tail (at the end of a stream).
    pub fn take_pending(&mut self) -> Vec<u8> {
        self.scanned = 0;
        std::mem::take(&mut self.pending)
    }

    /// Whether an event passed [`MAX_EVENT_BYTES`] (nothing after it is read).
    pub fn overflowed(&self) -> bool {
        self.overflowed
    }

    /// Adds bytes and returns every event they complete.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<Event> {
        if self.overflowed {
            return Vec::new();
        }
        let room = MAX_EVENT_BYTES + 1 - self.pending.len().min(MAX_EVENT_BYTES);
        // Only as much as could still end an event is copied at once: the rest waits for the
        // events this part completes to leave.
        if bytes.len() > room {
            let (head, tail) = bytes.split_at(room);
            let mut events = self.feed(head);
            events.extend(self.feed(tail));
            return events;
        }
        self.pending.extend_from_slice(bytes);
        let mut events = Vec::new();
        // Events are cut from the front, and the pending bytes moved once per feed (not once
        // per event: a chunk of many small events stays linear).
        let mut start = 0;
        let mut from = self.scanned;
        loop {
            let rest = self.pending.get(start..).unwrap_or_default();
            match event_end(rest, from) {
                Ok(end) => {
                    let raw = rest.get(..end).unwrap_or_default().to_vec();
                    start += end;
                    from = 0;
                    if let Some(event) = parse_event(raw) {
                        events.push(event);
                    }
                }
                Err(resume) => {
                    self.scanned = resume;
                    break;
                }
            }
        }
        self.pending.drain(..start);
        if self.pending.len() > MAX_EVENT_BYTES {
            self.pending = Vec::new();
            self.scanned = 0;
            self.overflowed = true;
        }
        events
    }
}

/// A translation of a chat-completions stream into another protocol's events, fed one SSE
/// event at a time: chunks, the end (`[DONE]`) and the gateway's error event for a stream cut
/// after its first token.
pub trait FromChatStream {
    /// Whether the translated stream has ended (nothing more is sent).
    fn ended(&self) -> bool;
    fn chunk(&mut self, out: &mut Vec<u8>, chunk: &Value);
    fn finish(&mut self, out: &mut Vec<u8>);
    fn fail(&mut self, out: &mut Vec<u8>, error: &Value);

    /// The translated events of one chat-completions event (keep-alives and data that is not
    /// JSON make none).
    fn feed(&mut self, event: &Event) -> Vec<u8> {
        let mut out = Vec::new();
        let data = event.data.trim();
        if self.ended() || data.is_empty() {
            return out;
        }
        if data == "[DONE]" {
            self.finish(&mut out);
            return out;
        }
        if let Ok(chunk) = serde_json::from_str::<Value>(data) {
            match chunk.get("error") {
                Some(error) => self.fail(&mut out, error),
                None => self.chunk(&mut out, &chunk),
            }
        }
        out
    }
}

/// Test support: feeds `bytes` to `translate` event by event, cut in two at every position;
/// asserts every cut gives the same output and returns it.
#[cfg(test)]
pub fn translated_at_every_cut<F>(bytes: &[u8], mut translate: impl FnMut() -> F) -> Vec<u8>
where
    F: FnMut(&Event) -> Vec<u8>,
{
    let run = |split: usize, f: &mut F| {
        let mut parser = Parser::new();
        let mut out = Vec::new();
        for part in [&bytes[..split], &bytes[split..]] {
            for event in parser.feed(part) {
                out.extend(f(&event));
            }
        }
        out
    };
    let whole = run(0, &mut translate());
    for split in 1..bytes.len() {
        assert_eq!(run(split, &mut translate()), whole, "cut at {split}");
    }
    whole
}

/// The index just past the blank line that ends the first event, if complete; else where a
/// later scan resumes (the start of the first incomplete line). `from` is a line start all of
/// whose earlier lines are complete and not empty.
fn event_end(buf: &[u8], from: usize) -> Result<usize, usize> {
    let mut i = from;
    while i < buf.len() {
        // A line ends at \n, \r\n or a lone \r; an event at an empty line.
        let line_end = match buf[i..].iter().position(|b| *b == b'\n' || *b == b'\r') {
            Some(p) => i + p,
            None => return Err(i),
        };
        let mut next = line_end + 1;
        if buf[line_end] == b'\r' {
            if next >= buf.len() {
                // "\r" at the very end: wait to see whether "\n" follows.
                return Err(i);
            }
            if buf[next] == b'\n' {
                next += 1;
            }
        }
        if line_end == i {
            // An empty line: the event ends here.
            return Ok(next);
        }
        i = next;
    }
    Err(i)
}

/// An event's fields, read from its raw bytes in place (copied only when they are not UTF-8),
/// its `data:` lines joined as they are read: one allocation for the data, none for the rest of
/// a common event. Comments and blank lines only (keep-alives) make an event with no name and no
/// data, still forwarded raw by callers that want them.
fn parse_event(raw: Vec<u8>) -> Option<Event> {
    let (name, data) = {
        let text = String::from_utf8_lossy(&raw);
        let (mut name, mut data, mut data_lines) = (None, String::new(), 0usize);
        for line in text.split(['\n', '\r']) {
            if line.is_empty() || line.starts_with(':') {
                continue;
            }
            let (field, value) = match line.find(':') {
                Some(p) => {
                    let v = &line[p + 1..];
                    (&line[..p], v.strip_prefix(' ').unwrap_or(v))
                }
                None => (line, ""),
            };
            match field {
                "event" => name = Some(value.to_string()),
                "data" => {
                    if data_lines > 0 {
                        data.push('\n');
                    }
                    data.push_str(value);
                    data_lines += 1;
                }
                _ => {}
            }
        }
        (name, data)
    };
    Some(Event { raw, name, data })
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAM: &str =
        "data: {\"a\":1}\n\nevent: ping\ndata: x\n\n: keep-alive\n\ndata: [DONE]\n\n";

    fn datas(events: &[Event]) -> Vec<String> {
        events
            .iter()
            .filter(|e| !e.data.is_empty())
            .map(|e| e.data.clone())
            .collect()
    }

    #[test]
    fn every_split_position_gives_the_same_events() {
        let whole = Parser::new().feed(STREAM.as_bytes());
        assert_eq!(datas(&whole), vec!["{\"a\":1}", "x", "[DONE]"]);
        assert_eq!(whole[1].name.as_deref(), Some("ping"));
        for split in 0..=STREAM.len() {
            let mut p = Parser::new();
            let mut got = p.feed(&STREAM.as_bytes()[..split]);
            got.extend(p.feed(&STREAM.as_bytes()[split..]));
            assert_eq!(got, whole, "split at {split}");
            assert!(p.pending().is_empty());
        }
    }

    #[test]
    fn byte_by_byte_with_crlf() {
        let s = "data: one\r\ndata: two\r\n\r\ndata: three\r\r\n";
        let mut p = Parser::new();
        let mut got = Vec::new();
        for b in s.as_bytes() {
            got.extend(p.feed(&[*b]));
        }
        assert_eq!(datas(&got), vec!["one\ntwo", "three"]);
        let raw: Vec<u8> = got.iter().flat_map(|e| e.raw.clone()).collect();
        assert_eq!(raw, s.as_bytes());
    }

    #[test]
    fn an_event_past_the_bound_stops_the_parser_and_frees_what_it_held() {
        let mut p = Parser::new();
        let mut got = p.feed(b"data: a\n\ndata: ");
        for _ in 0..40 {
            got.extend(p.feed(&vec![b'x'; 64 * 1024]));
        }
        assert!(p.overflowed());
        assert_eq!(datas(&got), vec!["a"]);
        assert!(p.pending().is_empty() && p.pending.capacity() == 0);
        assert!(p.feed(b"\n\ndata: b\n\n").is_empty());
        // One large feed of many events, each under the bound, is read whole.
        let many = "data: 0123456789\n\n".repeat(MAX_EVENT_BYTES / 8);
        let mut p = Parser::new();
        assert_eq!(p.feed(many.as_bytes()).len(), MAX_EVENT_BYTES / 8);
        assert!(!p.overflowed());
    }

    #[test]
    fn incomplete_tail_is_pending() {
        let mut p = Parser::new();
        assert!(p.feed(b"data: par").is_empty());
        assert_eq!(p.take_pending(), b"data: par");
    }
}
