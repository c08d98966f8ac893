//! A key's credit as its provider reports it: OpenRouter's `GET {baseUrl}/key` (`data.limit`,
//! `data.usage`, `data.limit_remaining`, in US dollars, `null` limits for a key without one;
//! `data.is_free_tier`). The poll itself is [`super::key_poll`]; this is what it reads and
//! when each key is asked again.

use serde::Deserialize;

/// How often a key is asked when nothing happens.
pub const POLL_INTERVAL_MS: i64 = 60_000;
/// A 402 or 429 asks again at once, but not sooner than this after the last ask.
pub const POLL_AFTER_REFUSAL_MS: i64 = 5_000;
/// An ask with no result after this long (the task stopped) may be made again.
pub const POLL_STUCK_MS: i64 = 30_000;

/// What a key's provider says of its credit.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyCredit {
    /// The credit limit; `None`: the key has none.
    pub limit: Option<f64>,
    pub usage: f64,
    /// What is left of the limit; `None` without a limit.
    pub remaining: Option<f64>,
    pub free_tier: bool,
}

impl KeyCredit {
    /// Nothing left to spend.
    pub fn spent(&self) -> bool {
        self.remaining.is_some_and(|r| r <= 0.0)
    }
}

#[derive(Deserialize)]
struct Answer {
    data: Data,
}

#[derive(Deserialize)]
struct Data {
    #[serde(default)]
    limit: Option<f64>,
    #[serde(default)]
    usage: Option<f64>,
    #[serde(default)]
    limit_remaining: Option<f64>,
    #[serde(default)]
    is_free_tier: Option<bool>,
}

/// Reads the answer of `GET /key`; the error says what is wrong with it (never its content).
pub fn parse(body: &[u8]) -> Result<KeyCredit, String> {
    let answer: Answer =
        serde_json::from_slice(body).map_err(|e| format!("not OpenRouter's key answer: {e}"))?;
    let d = answer.data;
    let finite = |v: Option<f64>| v.filter(|v| v.is_finite());
    let limit = finite(d.limit);
    let usage = finite(d.usage).unwrap_or(0.0);
    // Older answers have no limit_remaining: the limit less the usage.
    let remaining = finite(d.limit_remaining).or(limit.map(|l| l - usage));
    Ok(KeyCredit {
        limit,
        usage,
        remaining: limit.and(remaining),
        free_tier: d.is_free_tier.unwrap_or(false),
    })
}

/// One key's asking schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KeyPoll {
    /// When the key is asked next (0: at once).
    pub due_ms: i64,
    /// When it was last asked (0: never).
    pub asked_ms: i64,
    /// An ask is under way.
    pub in_flight: bool,
}

impl KeyPoll {
    /// Marks it asked when due; returns whether it is.
    pub fn take(&mut self, now_ms: i64) -> bool {
        let stuck = self.in_flight && now_ms - self.asked_ms >= POLL_STUCK_MS;
        if (self.in_flight && !stuck) || now_ms < self.due_ms {
            return false;
        }
        self.in_flight = true;
        self.asked_ms = now_ms;
        true
    }

    /// The answer came (or the ask failed): the next one in an interval.
    pub fn done(&mut self, now_ms: i64) {
        self.in_flight = false;
        self.due_ms = now_ms + POLL_INTERVAL_MS;
    }

    /// A refusal (402, 429): ask soon, at most once per [`POLL_AFTER_REFUSAL_MS`].
    pub fn soon(&mut self, now_ms: i64) {
        let at = now_ms.max(self.asked_ms + POLL_AFTER_REFUSAL_MS);
        self.due_ms = self.due_ms.min(at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openrouter_s_answer_is_read_with_or_without_a_limit() {
        let spent = parse(
            br#"{"data":{"label":"sk-or-v1-1...","limit":5,"usage":5.0,"limit_remaining":0,"is_free_tier":true,"rate_limit":{"requests":20,"interval":"10s"}}}"#,
        );
        assert_eq!(
            spent,
            Ok(KeyCredit {
                limit: Some(5.0),
                usage: 5.0,
                remaining: Some(0.0),
                free_tier: true
            })
        );
        assert!(spent.is_ok_and(|c| c.spent()));
        let unlimited = parse(br#"{"data":{"limit":null,"usage":12.5,"limit_remaining":null}}"#);
        assert!(unlimited
            .as_ref()
            .is_ok_and(|c| c.remaining.is_none() && !c.spent()));
        // No limit_remaining: the limit less the usage.
        let old = parse(br#"{"data":{"limit":10,"usage":2.5}}"#);
        assert_eq!(old.map(|c| c.remaining), Ok(Some(7.5)));
        assert!(parse(b"<html>").is_err());
        assert!(parse(br#"{"error":{"message":"no"}}"#).is_err());
    }

    #[test]
    fn a_key_is_asked_each_interval_and_soon_after_a_refusal_but_not_in_a_burst() {
        let mut poll = KeyPoll::default();
        assert!(poll.take(1_000));
        assert!(!poll.take(1_001), "one ask at a time");
        poll.done(2_000);
        assert!(!poll.take(2_000 + POLL_INTERVAL_MS - 1));
        // A 429 right after the ask: not before the gap.
        poll.soon(2_500);
        assert_eq!(poll.due_ms, 1_000 + POLL_AFTER_REFUSAL_MS);
        assert!(poll.take(1_000 + POLL_AFTER_REFUSAL_MS));
        poll.done(7_000);
        // A burst of refusals costs one ask.
        for t in 7_100..7_200 {
            poll.soon(t);
        }
        assert!(poll.take(7_100 + POLL_AFTER_REFUSAL_MS));
        assert!(!poll.take(7_200 + POLL_AFTER_REFUSAL_MS));
        // An ask that never ended is made again after a while.
        assert!(poll.take(7_100 + POLL_AFTER_REFUSAL_MS + POLL_STUCK_MS));
    }
}
