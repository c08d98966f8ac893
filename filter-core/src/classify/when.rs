//! When a provider says to come back: `retry-after` and reset headers, and the waits and
//! moments its messages name.

use ai_router_contract::calendar::days_from_civil;

/// `retry-after-ms`, else `retry-after` (seconds, or an HTTP date: RFC 9110's IMF-fixdate and
/// its two obsolete forms), else the OpenAI-style reset headers are left to headroom logic. A
/// date in the past is now.
pub fn retry_at(headers: &[(String, String)], now_ms: i64) -> Option<i64> {
    let get = |name: &str| header(headers, name);
    if let Some(ms) = get("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        if ms >= 0.0 {
            // `as` saturates a huge or infinite value; the sum must too.
            return Some(now_ms.saturating_add(ms.ceil() as i64));
        }
    }
    let value = get("retry-after")?;
    if let Ok(s) = value.parse::<f64>() {
        return (s >= 0.0).then(|| now_ms.saturating_add((s * 1000.0).ceil() as i64));
    }
    http_date_ms(&value).map(|at| at.max(now_ms))
}

/// An HTTP date as ms since the epoch: `Sun, 06 Nov 1994 08:49:37 GMT` (IMF-fixdate),
/// `Sunday, 06-Nov-94 08:49:37 GMT` (RFC 850, two-digit years read as 19xx/20xx by RFC 9110's
/// 50-year rule) or `Sun Nov  6 08:49:37 1994` (asctime).
pub(super) fn http_date_ms(value: &str) -> Option<i64> {
    const MONTHS: [&str; 12] = [
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ];
    let month_of = |m: &str| {
        MONTHS
            .iter()
            .position(|name| m.eq_ignore_ascii_case(name))
            .map(|i| i as i64 + 1)
    };
    let words: Vec<&str> = value.split_whitespace().collect();
    let (day, month, year, time) = match words.as_slice() {
        // IMF-fixdate: day-name, DD Mon YYYY HH:MM:SS GMT
        [_, d, m, y, t, "GMT"] => (d.parse().ok()?, month_of(m)?, y.parse::<i64>().ok()?, *t),
        // RFC 850: day-name, DD-Mon-YY HH:MM:SS GMT
        [_, dmy, t, "GMT"] => {
            let mut parts = dmy.split('-');
            let (d, m, y) = (parts.next()?, parts.next()?, parts.next()?);
            let y: i64 = y.parse().ok()?;
            let year = if y >= 100 {
                y
            } else if y >= 70 {
                1900 + y
            } else {
                2000 + y
            };
            (d.parse().ok()?, month_of(m)?, year, *t)
        }
        // asctime: day-name Mon D HH:MM:SS YYYY
        [_, m, d, t, y] => (d.parse().ok()?, month_of(m)?, y.parse::<i64>().ok()?, *t),
        _ => return None,
    };
    let mut hms = time.split(':').map(|n| n.parse::<i64>().ok());
    let (h, mi, sec) = (hms.next()??, hms.next()??, hms.next()??);
    if !(0..24).contains(&h) || !(0..60).contains(&mi) || !(0..61).contains(&sec) {
        return None;
    }
    Some((days_of(year, month, day)? * 86_400 + h * 3_600 + mi * 60 + sec) * 1000)
}

pub(super) fn header(headers: &[(String, String)], name: &str) -> Option<String> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim().to_string())
}

/// An `X-RateLimit-Reset` value: ms since the epoch (OpenRouter), seconds since the epoch, or
/// seconds from now.
pub(super) fn reset_moment(value: &str, now_ms: i64) -> Option<i64> {
    let n = value.trim().parse::<f64>().ok().filter(|n| *n >= 0.0)?;
    Some(if n >= 1e11 {
        n as i64
    } else if n >= 1e9 {
        (n * 1000.0) as i64
    } else {
        now_ms + (n * 1000.0).ceil() as i64
    })
}

/// The wait a message names: "Please try again in 1.23s" (Groq, OpenAI), "in 31m2.4s", "in 120ms".
pub(super) fn try_again_in(message: &str) -> Option<i64> {
    const NEEDLE: &str = "try again in ";
    let lower = message.to_ascii_lowercase();
    let rest = &lower[lower.find(NEEDLE)? + NEEDLE.len()..];
    let token = rest.split_whitespace().next()?;
    parse_reset_duration(token.trim_end_matches(['.', ',', ';']))
}

/// The end of a spent quota's window when the message names it, as Anthropic's spend cap does:
/// "... You will regain access on 2026-12-01 at 00:00 UTC."
pub(super) fn regain_access_at(message: &str) -> Option<i64> {
    let rest = &message[message.find("regain access on ")? + "regain access on ".len()..];
    let date = rest.get(..10)?;
    let time = rest.get(10..)?.strip_prefix(" at ")?.get(..5)?;
    let num = |s: &str| s.parse::<i64>().ok();
    let (y, m, d) = (
        num(date.get(..4)?)?,
        num(date.get(5..7)?)?,
        num(date.get(8..10)?)?,
    );
    let (hh, mm) = (num(time.get(..2)?)?, num(time.get(3..5)?)?);
    Some((days_of(y, m, d)? * 86_400 + hh * 3_600 + mm * 60) * 1000)
}

/// `YYYY-MM-DDTHH:MM:SS[.fff]Z` (UTC only) as ms since the epoch.
pub(super) fn parse_rfc3339(v: &str) -> Option<i64> {
    let v = v.trim();
    let num = |s: Option<&str>| s.and_then(|s| s.parse::<i64>().ok());
    let (y, mo, d) = (num(v.get(..4))?, num(v.get(5..7))?, num(v.get(8..10))?);
    if !matches!(v.get(10..11), Some("T" | "t" | " ")) {
        return None;
    }
    let (h, mi, sec) = (
        num(v.get(11..13))?,
        num(v.get(14..16))?,
        num(v.get(17..19))?,
    );
    let rest = v.get(19..)?;
    let (frac, zone) = match rest.strip_prefix('.') {
        Some(r) => {
            let digits = r.find(|c: char| !c.is_ascii_digit()).unwrap_or(r.len());
            let ms = r
                .get(..digits.min(3))
                .filter(|d| !d.is_empty())
                .and_then(|d| d.parse::<i64>().ok())
                .unwrap_or(0);
            let scale = [100, 10, 1][digits.clamp(1, 3) - 1];
            (ms * scale, &r[digits..])
        }
        None => (0, rest),
    };
    if !(zone == "Z" || zone == "z" || zone == "+00:00") {
        return None;
    }
    Some((days_of(y, mo, d)? * 86_400 + h * 3_600 + mi * 60 + sec) * 1000 + frac)
}

/// Days since 1970-01-01 of a date parsed from text; `None` for a month or day out of range.
pub(super) fn days_of(y: i64, m: i64, d: i64) -> Option<i64> {
    let (m, d) = (u32::try_from(m).ok()?, u32::try_from(d).ok()?);
    ((1..=12).contains(&m) && (1..=31).contains(&d)).then(|| days_from_civil(y, m, d))
}

/// Parses an OpenAI-style reset duration: "1s", "6m0s", "20ms", "1h2m3.5s", or plain seconds.
pub(super) fn parse_reset_duration(v: &str) -> Option<i64> {
    let v = v.trim();
    if let Ok(secs) = v.parse::<f64>() {
        return Some((secs * 1000.0).ceil() as i64);
    }
    let mut total = 0f64;
    let mut number = String::new();
    let mut chars = v.chars().peekable();
    let mut any = false;
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() || c == '.' {
            number.push(c);
            continue;
        }
        let n: f64 = number.parse().ok()?;
        number.clear();
        let unit = match c {
            'h' => 3_600_000.0,
            'm' if chars.peek() == Some(&'s') => {
                chars.next();
                1.0
            }
            'm' => 60_000.0,
            's' => 1000.0,
            _ => return None,
        };
        total += n * unit;
        any = true;
    }
    (any && number.is_empty()).then_some(total.ceil() as i64)
}
