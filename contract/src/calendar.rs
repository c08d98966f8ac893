//! UTC calendar math on milliseconds since the Unix epoch, without a date library: civil dates
//! (proleptic Gregorian, after Howard Hinnant's algorithms), the day and month boundaries quotas
//! and budgets roll over at, and midnight in America/Los_Angeles (when some providers' daily
//! free tiers reset), DST-aware by the US rules.

pub const HOUR_MS: i64 = 3_600_000;
pub const DAY_MS: i64 = 86_400_000;

/// Days since 1970-01-01 of a civil date.
pub fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let (month, day) = (i64::from(month), i64::from(day));
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The civil date `(year, month, day)` of a count of days since 1970-01-01.
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    // In range by construction: 1..=12 and 1..=31.
    (
        year,
        u32::try_from(month).unwrap_or(1),
        u32::try_from(day).unwrap_or(1),
    )
}

/// The UTC day of a moment, as `YYYY-MM-DD`.
pub fn utc_day(ms: i64) -> String {
    let (y, m, d) = civil_from_days(ms.div_euclid(DAY_MS));
    format!("{y:04}-{m:02}-{d:02}")
}

/// The next UTC midnight after a moment.
pub fn next_utc_midnight_ms(ms: i64) -> i64 {
    (ms.div_euclid(DAY_MS) + 1).saturating_mul(DAY_MS)
}

/// `year * 12 + month - 1` of a moment (UTC): consecutive months are consecutive numbers.
pub fn month_index(ms: i64) -> i64 {
    let (y, m, _) = civil_from_days(ms.div_euclid(DAY_MS));
    y * 12 + i64::from(m) - 1
}

/// The first moment of the UTC month after the one holding `ms`.
pub fn first_of_next_month_ms(ms: i64) -> i64 {
    let next = month_index(ms) + 1;
    let year = next.div_euclid(12);
    let month = u32::try_from(next.rem_euclid(12) + 1).unwrap_or(1);
    days_from_civil(year, month, 1).saturating_mul(DAY_MS)
}

/// The day (days since 1970-01-01) of the `nth` Sunday of a month.
fn nth_sunday(year: i64, month: u32, nth: i64) -> i64 {
    let first = days_from_civil(year, month, 1);
    // 1970-01-01 was a Thursday: (days + 4) mod 7 is 0 on a Sunday.
    let weekday = (first + 4).rem_euclid(7);
    first + (7 - weekday) % 7 + 7 * (nth - 1)
}

/// The days summer time begins and ends in America/Los_Angeles (the US rules since 2007: the
/// second Sunday of March at 02:00 PST, the first Sunday of November at 02:00 PDT).
fn pacific_dst_days(year: i64) -> (i64, i64) {
    (nth_sunday(year, 3, 2), nth_sunday(year, 11, 1))
}

/// Whether Pacific time is on PDT at a moment.
fn pacific_dst_at(ms: i64) -> bool {
    let (year, _, _) = civil_from_days(ms.div_euclid(DAY_MS));
    let (start, end) = pacific_dst_days(year);
    // 02:00 PST is 10:00 UTC; 02:00 PDT is 09:00 UTC.
    (start * DAY_MS + 10 * HOUR_MS..end * DAY_MS + 9 * HOUR_MS).contains(&ms)
}

/// The next midnight in America/Los_Angeles after a moment.
pub fn next_pacific_midnight_ms(ms: i64) -> i64 {
    let offset = |dst: bool| if dst { 7 * HOUR_MS } else { 8 * HOUR_MS };
    let local_day = (ms - offset(pacific_dst_at(ms))).div_euclid(DAY_MS);
    let next = local_day + 1;
    let (year, _, _) = civil_from_days(next);
    let (start, end) = pacific_dst_days(year);
    // The clocks change at 02:00: midnight on the day PDT begins is still PST, midnight on the
    // day it ends still PDT.
    next * DAY_MS + offset(next > start && next <= end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates_round_trip() {
        for days in [-719_468, -1, 0, 1, 10_957, 19_723, 20_000, 2_932_896] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(utc_day(1_709_251_199_999), "2024-02-29");
    }

    #[test]
    fn boundaries() {
        // 2024-02-29T12:00:00Z
        let ms = 1_709_208_000_000;
        assert_eq!(next_utc_midnight_ms(ms), 1_709_251_200_000);
        assert_eq!(first_of_next_month_ms(ms), 1_709_251_200_000);
        // 2024-12-31T23:59:59Z → 2025-01-01
        assert_eq!(first_of_next_month_ms(1_735_689_599_000), 1_735_689_600_000);
        assert_eq!(month_index(0), 1970 * 12);
    }

    #[test]
    fn pacific_midnight_follows_summer_time() {
        // 2024-07-01T12:00:00Z (PDT): next midnight 2024-07-02T07:00:00Z.
        assert_eq!(
            next_pacific_midnight_ms(1_719_835_200_000),
            1_719_903_600_000
        );
        // 2024-01-15T12:00:00Z (PST): next midnight 2024-01-16T08:00:00Z.
        assert_eq!(
            next_pacific_midnight_ms(1_705_320_000_000),
            1_705_392_000_000
        );
    }

    #[test]
    fn pacific_midnight_follows_the_us_dst_rules() {
        // (now, the next 00:00 America/Los_Angeles), worked out with Python's zoneinfo.
        for (now, midnight) in [
            (1_741_514_399_000, 1_741_590_000_000), // 2025-03-09 01:59:59 PST
            (1_762_073_999_000, 1_762_156_800_000), // 2025-11-02 01:59:59 PDT
            (1_762_074_000_000, 1_762_156_800_000), // 2025-11-02 01:00:00 PST
            (1_899_367_200_000, 1_899_442_800_000), // 2030-03-10 03:00 PDT
            (1_919_916_000_000, 1_919_919_600_000), // 2030-11-02 23:00 PDT
            (1_709_193_599_000, 1_709_193_600_000), // 2024-02-28 23:59:59 PST
            (1_709_193_600_000, 1_709_280_000_000), // 2024-02-29 00:00 PST
        ] {
            assert_eq!(next_pacific_midnight_ms(now), midnight, "{now}");
        }
        assert_eq!(
            pacific_dst_days(2026),
            (days_from_civil(2026, 3, 8), days_from_civil(2026, 11, 1))
        );
        assert_eq!(civil_from_days(days_from_civil(2028, 2, 29)), (2028, 2, 29));
    }
}
