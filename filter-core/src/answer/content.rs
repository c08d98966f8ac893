//! `telemetry.includeContent`: what an attempt carried, for its report and so for the attempt
//! event. Off by default; the attempt stage keeps nothing then.
//!
//! Each side is bounded by [`CONTENT_MAX_BYTES`]: the request body as the caller sent it, and
//! the provider's answer as it came (a stream's events as they arrived), cut on a UTF-8
//! boundary and marked truncated past it. The answering key's secret is redacted before the cut
//! (so a secret that straddles the cut cannot leave a prefix behind), and headers are never
//! content: no credential of the request or of the answer is in it.

use ai_router_proto::v1::AttemptContent;

use crate::answer::redact::redact_bytes;

use ai_router_contract::defaults::CONTENT_MAX_BYTES;

/// The first bytes of one side, as they arrive.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Capture {
    bytes: Vec<u8>,
    /// More came than was kept.
    over: bool,
}

impl Capture {
    /// Keeps what fits of `more`: the bound plus `slack` bytes, so that a secret of that length
    /// starting before the bound is whole when it is redacted.
    pub fn push(&mut self, more: &[u8], slack: usize) {
        let room = (CONTENT_MAX_BYTES + slack).saturating_sub(self.bytes.len());
        if more.len() > room {
            self.over = true;
        }
        self.bytes.extend_from_slice(&more[..more.len().min(room)]);
    }

    /// The text to report: `secret` redacted, then cut to the bound on a char boundary;
    /// whether anything was cut.
    pub fn text(&self, secret: &str) -> (String, bool) {
        let clean = redact_bytes(&self.bytes, secret);
        let bytes = clean.as_deref().unwrap_or(&self.bytes);
        let mut text = String::from_utf8_lossy(bytes).into_owned();
        let mut truncated = self.over;
        if text.len() > CONTENT_MAX_BYTES {
            let mut end = CONTENT_MAX_BYTES;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text.truncate(end);
            truncated = true;
        }
        (text, truncated)
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

/// Both sides of one attempt.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Content {
    pub request: Capture,
    pub response: Capture,
    /// The length of the lane's secret: the slack each side keeps past the bound.
    slack: usize,
}

impl Content {
    /// Starts with the caller's request body, for a lane whose secret is `secret_len` long.
    pub fn of_request(body: &[u8], secret_len: usize) -> Self {
        let mut content = Self {
            slack: secret_len,
            ..Self::default()
        };
        content.request.push(body, secret_len);
        content
    }

    /// Bytes of the provider's answer, as they come.
    pub fn answer(&mut self, bytes: &[u8]) {
        let slack = self.slack;
        self.response.push(bytes, slack);
    }

    /// The report's content, `secret` redacted from both sides.
    pub fn to_proto(&self, secret: &str) -> AttemptContent {
        let (request, request_truncated) = self.request.text(secret);
        let (response, response_truncated) = self.response.text(secret);
        AttemptContent {
            request,
            request_truncated,
            response,
            response_truncated,
        }
    }
}

/// The bytes a report's content takes (what the outbox and its batches are bounded by).
pub fn size_of(content: Option<&AttemptContent>) -> usize {
    content.map_or(0, |c| c.request.len() + c.response.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "sk-lane-secret-0123456789";

    #[test]
    fn short_sides_are_whole_and_the_secret_is_redacted() {
        let mut c = Content::of_request(br#"{"messages":[{"content":"hi"}]}"#, SECRET.len());
        c.answer(format!(r#"{{"error":"bad key {SECRET}"}}"#).as_bytes());
        let p = c.to_proto(SECRET);
        assert_eq!(p.request, r#"{"messages":[{"content":"hi"}]}"#);
        assert!(!p.request_truncated);
        assert_eq!(p.response, r#"{"error":"bad key [redacted]"}"#);
        assert!(!p.response_truncated);
    }

    #[test]
    fn a_long_side_is_cut_on_a_char_boundary_and_marked() {
        // "é" is two bytes: an odd prefix puts the bound inside one.
        let body = format!("x{}", "é".repeat(CONTENT_MAX_BYTES));
        let c = Content::of_request(body.as_bytes(), SECRET.len());
        let p = c.to_proto(SECRET);
        assert!(p.request_truncated);
        assert!(p.request.len() <= CONTENT_MAX_BYTES);
        assert!(p.request.len() >= CONTENT_MAX_BYTES - 1);
        assert!(p.request.starts_with("xé"));
        assert!(!p.request.contains('\u{fffd}'), "no broken character");
    }

    #[test]
    fn an_answer_in_many_pieces_is_bounded_as_it_comes() {
        let mut c = Content::of_request(b"{}", SECRET.len());
        for _ in 0..1_000 {
            c.answer(&[b'a'; 100]);
        }
        assert!(c.response.bytes.len() <= CONTENT_MAX_BYTES + SECRET.len());
        let p = c.to_proto(SECRET);
        assert_eq!(p.response.len(), CONTENT_MAX_BYTES);
        assert!(p.response_truncated);
        assert_eq!(size_of(Some(&p)), 2 + CONTENT_MAX_BYTES);
        assert_eq!(size_of(None), 0);
    }

    #[test]
    fn a_secret_across_the_bound_leaves_no_prefix() {
        // The secret starts a few bytes before the bound: kept whole, redacted, then cut.
        let body = format!("{}{SECRET} and more", "a".repeat(CONTENT_MAX_BYTES - 6));
        let c = Content::of_request(body.as_bytes(), SECRET.len());
        let p = c.to_proto(SECRET);
        assert!(p.request_truncated);
        assert!(
            !p.request.contains("sk-la"),
            "{}",
            &p.request[p.request.len() - 20..]
        );
        assert!(p.request.ends_with("[redac"));
    }

    #[test]
    fn invalid_utf8_is_reported_as_text() {
        let c = Content::of_request(&[0xff, b'o', b'k'], SECRET.len());
        let p = c.to_proto(SECRET);
        assert_eq!(p.request, "\u{fffd}ok");
    }
}
