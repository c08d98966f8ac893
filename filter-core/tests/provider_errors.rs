//! The table test: the classifier over every case of the provider error table
//! (testdata/provider-errors/<kind>.yaml, the files the mock answers from), at several moments
//! of the year, checking the verdict each case states: class, hold and window.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;

use ai_router_contract::failure::{ErrorClass, Hold};
use ai_router_contract::kinds::ProviderKind;
use ai_router_filter_core::classify::{
    classify,
    window::{MAX_DAILY_LIMIT_COOLDOWN_MS, MAX_QUOTA_HOLD_MS},
};
use serde::Deserialize;

/// The table's file of `kind`, for every kind of the one enum.
fn table_file(kind: ProviderKind) -> String {
    let path = format!(
        "{}/../testdata/provider-errors/{}.yaml",
        env!("CARGO_MANIFEST_DIR"),
        kind.as_str()
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TableFile {
    kind: String,
    cases: Vec<Case>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    name: String,
    #[serde(default)]
    note: Option<String>,
    #[serde(default)]
    same_as: Option<String>,
    #[serde(default)]
    status: Option<u16>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    body: Option<String>,
    #[serde(default)]
    expect: Option<Expect>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Expect {
    class: String,
    hold: String,
    /// Seconds from now.
    #[serde(default)]
    retry_after_s: Option<f64>,
    /// A moment, ms since the epoch, or a placeholder naming one.
    #[serde(default)]
    until_ms: Option<String>,
}

/// A moment the table is classified at, with its placeholders' values worked out by hand
/// (Python's zoneinfo for America/Los_Angeles), not by the code under test.
struct Moment {
    at: &'static str,
    now_ms: i64,
    next_utc_midnight_ms: i64,
    next_pacific_midnight_ms: i64,
    /// 00:00 in China (UTC+8, no summer time): 16:00 UTC.
    next_china_midnight_ms: i64,
    first_of_next_month: &'static str,
    first_of_next_month_ms: i64,
}

const MOMENTS: [Moment; 9] = [
    // 2026-03-07 23:59 PST: midnight is still PST.
    Moment {
        at: "2026-03-08T07:59:00Z",
        now_ms: 1_772_956_740_000,
        next_utc_midnight_ms: 1_773_014_400_000,
        next_pacific_midnight_ms: 1_772_956_800_000,
        next_china_midnight_ms: 1_773_014_400_000 - 8 * 3_600_000,
        first_of_next_month: "2026-04-01",
        first_of_next_month_ms: 1_775_001_600_000,
    },
    // 01:59 PST on the day PDT begins: the next midnight is PDT (07:00 UTC).
    Moment {
        at: "2026-03-08T09:59:00Z",
        now_ms: 1_772_963_940_000,
        next_utc_midnight_ms: 1_773_014_400_000,
        next_pacific_midnight_ms: 1_773_039_600_000,
        next_china_midnight_ms: 1_773_014_400_000 - 8 * 3_600_000,
        first_of_next_month: "2026-04-01",
        first_of_next_month_ms: 1_775_001_600_000,
    },
    // 03:00 PDT, the first minute of summer time.
    Moment {
        at: "2026-03-08T10:00:00Z",
        now_ms: 1_772_964_000_000,
        next_utc_midnight_ms: 1_773_014_400_000,
        next_pacific_midnight_ms: 1_773_039_600_000,
        next_china_midnight_ms: 1_773_014_400_000 - 8 * 3_600_000,
        first_of_next_month: "2026-04-01",
        first_of_next_month_ms: 1_775_001_600_000,
    },
    // 23:59:59 PDT: midnight is one second away.
    Moment {
        at: "2026-07-15T06:59:59Z",
        now_ms: 1_784_098_799_000,
        next_utc_midnight_ms: 1_784_160_000_000,
        next_pacific_midnight_ms: 1_784_098_800_000,
        next_china_midnight_ms: 1_784_160_000_000 - 8 * 3_600_000,
        first_of_next_month: "2026-08-01",
        first_of_next_month_ms: 1_785_542_400_000,
    },
    // 2026-10-31 23:59:59 PDT: the midnight of the day PST returns is still PDT.
    Moment {
        at: "2026-11-01T06:59:59Z",
        now_ms: 1_793_516_399_000,
        next_utc_midnight_ms: 1_793_577_600_000,
        next_pacific_midnight_ms: 1_793_516_400_000,
        next_china_midnight_ms: 1_793_577_600_000 - 8 * 3_600_000,
        first_of_next_month: "2026-12-01",
        first_of_next_month_ms: 1_796_083_200_000,
    },
    // 01:30 PDT, the first of the two 01:30s: the next midnight is PST (08:00 UTC).
    Moment {
        at: "2026-11-01T08:30:00Z",
        now_ms: 1_793_521_800_000,
        next_utc_midnight_ms: 1_793_577_600_000,
        next_pacific_midnight_ms: 1_793_606_400_000,
        next_china_midnight_ms: 1_793_577_600_000 - 8 * 3_600_000,
        first_of_next_month: "2026-12-01",
        first_of_next_month_ms: 1_796_083_200_000,
    },
    // 01:30 PST, the second 01:30.
    Moment {
        at: "2026-11-01T09:30:00Z",
        now_ms: 1_793_525_400_000,
        next_utc_midnight_ms: 1_793_577_600_000,
        next_pacific_midnight_ms: 1_793_606_400_000,
        next_china_midnight_ms: 1_793_577_600_000 - 8 * 3_600_000,
        first_of_next_month: "2026-12-01",
        first_of_next_month_ms: 1_796_083_200_000,
    },
    // New Year's Eve 15:30 PST: the next UTC day, month and year are half an hour away.
    Moment {
        at: "2026-12-31T23:30:00Z",
        now_ms: 1_798_759_800_000,
        next_utc_midnight_ms: 1_798_761_600_000,
        next_pacific_midnight_ms: 1_798_790_400_000,
        next_china_midnight_ms: 1_798_761_600_000 + 16 * 3_600_000,
        first_of_next_month: "2027-01-01",
        first_of_next_month_ms: 1_798_761_600_000,
    },
    // An ordinary winter morning.
    Moment {
        at: "2027-02-15T12:00:00Z",
        now_ms: 1_802_692_800_000,
        next_utc_midnight_ms: 1_802_736_000_000,
        next_pacific_midnight_ms: 1_802_764_800_000,
        next_china_midnight_ms: 1_802_736_000_000 - 8 * 3_600_000,
        first_of_next_month: "2027-03-01",
        first_of_next_month_ms: 1_803_859_200_000,
    },
];

impl Moment {
    fn fill(&self, text: &str) -> String {
        text.replace("{now_ms}", &self.now_ms.to_string())
            .replace(
                "{next_utc_midnight_ms}",
                &self.next_utc_midnight_ms.to_string(),
            )
            .replace(
                "{next_pacific_midnight_ms}",
                &self.next_pacific_midnight_ms.to_string(),
            )
            .replace(
                "{next_china_midnight_ms}",
                &self.next_china_midnight_ms.to_string(),
            )
            .replace(
                "{first_of_next_month_ms}",
                &self.first_of_next_month_ms.to_string(),
            )
            .replace("{first_of_next_month}", self.first_of_next_month)
    }
}

/// A case with its answer resolved (`same_as`) and its verdict.
struct Row<'a> {
    kind: &'static str,
    name: &'a str,
    note: Option<&'a str>,
    status: u16,
    headers: &'a BTreeMap<String, String>,
    body: &'a str,
    expect: &'a Expect,
}

fn files() -> Vec<(&'static str, TableFile)> {
    ProviderKind::ALL
        .into_iter()
        .map(|each| {
            let kind = each.as_str();
            let file: TableFile = serde_yaml_ng::from_str(&table_file(each))
                .unwrap_or_else(|e| panic!("testdata/provider-errors/{kind}.yaml: {e}"));
            assert_eq!(file.kind, kind);
            (kind, file)
        })
        .collect()
}

fn rows<'a>(files: &'a [(&'static str, TableFile)]) -> Vec<Row<'a>> {
    let mut rows = Vec::new();
    for (kind, file) in files {
        for case in &file.cases {
            let source = match &case.same_as {
                Some(other) => file
                    .cases
                    .iter()
                    .find(|c| c.name == *other && c.same_as.is_none())
                    .unwrap_or_else(|| panic!("{kind}.{}: same_as {other}", case.name)),
                None => case,
            };
            let what = |field| format!("{kind}.{} has no {field}", source.name);
            rows.push(Row {
                kind,
                name: &case.name,
                note: source.note.as_deref(),
                status: source
                    .status
                    .unwrap_or_else(|| panic!("{}", what("status"))),
                headers: &source.headers,
                body: source
                    .body
                    .as_deref()
                    .unwrap_or_else(|| panic!("{}", what("body"))),
                expect: source
                    .expect
                    .as_ref()
                    .unwrap_or_else(|| panic!("{}", what("expect"))),
            });
        }
    }
    rows
}

/// The verdict one case gets at one moment, or what is wrong with it.
fn check(row: &Row<'_>, moment: &Moment) -> Result<(), String> {
    let now = moment.now_ms;
    let headers: Vec<(String, String)> = row
        .headers
        .iter()
        .map(|(k, v)| (k.clone(), moment.fill(v)))
        .collect();
    let body = moment.fill(row.body);
    let failure = classify(row.kind, row.status, &headers, body.as_bytes(), now);

    let want_class = ErrorClass::parse(&row.expect.class)
        .ok_or_else(|| format!("unknown class {:?}", row.expect.class))?;
    // The widest cap of the class: a case states a narrower one's window as capped.
    let cap = match want_class {
        ErrorClass::Quota => MAX_QUOTA_HOLD_MS,
        _ => MAX_DAILY_LIMIT_COOLDOWN_MS,
    };
    let want_until = match (&row.expect.retry_after_s, &row.expect.until_ms) {
        (Some(secs), None) => Some(now + (secs * 1000.0).round() as i64),
        (None, Some(at)) => Some(
            moment
                .fill(at)
                .parse::<i64>()
                .map_err(|e| format!("until_ms {at:?}: {e}"))?,
        ),
        (None, None) => None,
        (Some(_), Some(_)) => return Err("both retry_after_s and until_ms".into()),
    }
    .map(|until| until.min(now + cap));

    let mut wrong = Vec::new();
    if failure.class != want_class {
        wrong.push(format!(
            "class {} (want {})",
            failure.class.as_str(),
            want_class.as_str()
        ));
    }
    if failure.hold().as_str() != row.expect.hold {
        wrong.push(format!(
            "hold {} (want {})",
            failure.hold().as_str(),
            row.expect.hold
        ));
    }
    if failure.retry_at_ms != want_until {
        let show = |at: Option<i64>| match at {
            Some(at) => format!("now{:+}ms", at - now),
            None => "none".to_owned(),
        };
        wrong.push(format!(
            "window {} (want {})",
            show(failure.retry_at_ms),
            show(want_until)
        ));
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join(", "))
    }
}

#[test]
fn every_case_of_the_table_gets_its_verdict() {
    let files = files();
    let rows = rows(&files);
    let mut wrong = Vec::new();
    for row in &rows {
        for moment in &MOMENTS {
            if let Err(what) = check(row, moment) {
                wrong.push(format!(
                    "{}.{} at {}: {what}{}",
                    row.kind,
                    row.name,
                    moment.at,
                    row.note.map(|n| format!(" [{n}]")).unwrap_or_default()
                ));
                // One moment is enough to show a case is wrong.
                break;
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} cases wrong:\n{}",
        wrong.len(),
        rows.len(),
        wrong.join("\n")
    );
}

#[test]
fn the_table_covers_every_kind_and_the_common_cases() {
    let files = files();
    let rows = rows(&files);
    for kind in ProviderKind::ALL.map(ProviderKind::as_str) {
        for case in [
            "rate_limited",
            "quota_exhausted",
            "invalid_key",
            "overloaded",
            "bad_request",
        ] {
            assert!(
                rows.iter().any(|r| r.kind == kind && r.name == case),
                "{kind}.{case}"
            );
        }
    }
    let holds: Vec<&str> = rows.iter().map(|r| r.expect.hold.as_str()).collect();
    for hold in [Hold::Lane, Hold::Key, Hold::Nothing] {
        assert!(holds.contains(&hold.as_str()), "no case holds {hold:?}");
    }
    assert!(rows.len() >= 76, "{}", rows.len());
}
