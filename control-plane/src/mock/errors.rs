//! The provider error table: each provider's real error answers (status, headers and body as
//! the provider sends them), to script with `providerError: "<kind>.<case>"`.
//!
//! The table is data: `testdata/provider-errors/<kind>.yaml`, embedded here with
//! `include_str!` so the binary stays self-contained, and read by the classifier's table test
//! in filter-core, which checks the verdict each case states (`expect`; the mock ignores it).
//! Every kind has the five common cases ([`ERROR_CASES`]); some have second shapes (a daily
//! free tier, a spend cap, a billing limit...) listed by [`provider_error_names`].
//! Time-dependent values are placeholders filled in at each answer ([`fill_placeholders`]).
//! Messages never hold a real key: where a provider echoes the key, a masked test value stands
//! in.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use ai_router_contract::calendar::{self, civil_from_days, days_from_civil};
use ai_router_contract::kinds::ProviderKind;
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::Value;

/// The cases every kind answers.
pub const ERROR_CASES: [&str; 5] = [
    "rate_limited",
    "quota_exhausted",
    "invalid_key",
    "overloaded",
    "bad_request",
];

/// The table's file of `kind` (every kind has one: the match is exhaustive).
fn table_file(kind: ProviderKind) -> &'static str {
    match kind {
        ProviderKind::Anthropic => include_str!("../../../testdata/provider-errors/anthropic.yaml"),
        ProviderKind::Openrouter => {
            include_str!("../../../testdata/provider-errors/openrouter.yaml")
        }
        ProviderKind::Qwen => include_str!("../../../testdata/provider-errors/qwen.yaml"),
        ProviderKind::Deepseek => include_str!("../../../testdata/provider-errors/deepseek.yaml"),
        ProviderKind::Openai => include_str!("../../../testdata/provider-errors/openai.yaml"),
        ProviderKind::Gemini => include_str!("../../../testdata/provider-errors/gemini.yaml"),
        ProviderKind::Groq => include_str!("../../../testdata/provider-errors/groq.yaml"),
        ProviderKind::OpenaiCompatible => {
            include_str!("../../../testdata/provider-errors/openai-compatible.yaml")
        }
        ProviderKind::Mistral => include_str!("../../../testdata/provider-errors/mistral.yaml"),
        ProviderKind::Cerebras => include_str!("../../../testdata/provider-errors/cerebras.yaml"),
        ProviderKind::Kimi => include_str!("../../../testdata/provider-errors/kimi.yaml"),
        ProviderKind::Github => include_str!("../../../testdata/provider-errors/github.yaml"),
        ProviderKind::Nvidia => include_str!("../../../testdata/provider-errors/nvidia.yaml"),
        ProviderKind::Sambanova => include_str!("../../../testdata/provider-errors/sambanova.yaml"),
        ProviderKind::Cloudflare => {
            include_str!("../../../testdata/provider-errors/cloudflare.yaml")
        }
        ProviderKind::Cohere => include_str!("../../../testdata/provider-errors/cohere.yaml"),
        ProviderKind::Siliconflow => {
            include_str!("../../../testdata/provider-errors/siliconflow.yaml")
        }
        ProviderKind::Zai => include_str!("../../../testdata/provider-errors/zai.yaml"),
    }
}

/// What is wrong with a table file.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    #[error("testdata/provider-errors/{kind}.yaml: {source}")]
    Yaml {
        kind: &'static str,
        source: serde_yaml_ng::Error,
    },
    #[error("testdata/provider-errors/{file}.yaml says kind {said:?}")]
    WrongKind { file: &'static str, said: String },
    #[error("{kind}.{case}: {problem}")]
    Case {
        kind: &'static str,
        case: String,
        problem: &'static str,
    },
}

/// One file of the table, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TableFile {
    kind: String,
    cases: Vec<TableCase>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TableCase {
    name: String,
    /// Why the verdict is what it is; for readers of the file.
    #[serde(default, rename = "note")]
    _note: Option<IgnoredAny>,
    /// The same answer as another case of the file.
    #[serde(default)]
    same_as: Option<String>,
    #[serde(default)]
    status: Option<u16>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    /// The provider's bytes, placeholders unfilled.
    #[serde(default)]
    body: Option<String>,
    /// The classifier's expected verdict; checked by filter-core's table test, not here.
    #[serde(default)]
    expect: Option<IgnoredAny>,
}

/// One answer of the table, placeholders unfilled.
#[derive(Debug, Clone)]
struct Answer {
    status: u16,
    headers: BTreeMap<String, String>,
    body: String,
}

/// The table, in file order: `(kind, case, answer)`.
type Table = Vec<(&'static str, String, Answer)>;

/// The table, parsed once.
fn table() -> Result<&'static Table, &'static TableError> {
    static TABLE: OnceLock<Result<Table, TableError>> = OnceLock::new();
    TABLE.get_or_init(load_table).as_ref()
}

fn load_table() -> Result<Table, TableError> {
    let mut table = Vec::new();
    for each in ProviderKind::ALL {
        let (kind, text) = (each.as_str(), table_file(each));
        let file: TableFile =
            serde_yaml_ng::from_str(text).map_err(|source| TableError::Yaml { kind, source })?;
        if file.kind != kind {
            return Err(TableError::WrongKind {
                file: kind,
                said: file.kind,
            });
        }
        let problem = |case: &TableCase, problem| TableError::Case {
            kind,
            case: case.name.clone(),
            problem,
        };
        let mut answers: Vec<(String, Answer)> = Vec::new();
        for case in &file.cases {
            if answers.iter().any(|(name, _)| *name == case.name) {
                return Err(problem(case, "named twice"));
            }
            let answer = match (&case.same_as, case.status, &case.body) {
                (Some(other), None, None) if case.headers.is_empty() => file
                    .cases
                    .iter()
                    .find(|c| c.name == *other && c.same_as.is_none())
                    .and_then(|c| Some((c.status?, c.headers.clone(), c.body.clone()?)))
                    .ok_or_else(|| problem(case, "same_as names no case with an answer"))?,
                (None, Some(status), Some(body)) => (status, case.headers.clone(), body.clone()),
                _ => {
                    return Err(problem(
                        case,
                        "needs status and body, or same_as and nothing else",
                    ))
                }
            };
            if case.same_as.is_none() && case.expect.is_none() {
                return Err(problem(case, "states no expected verdict (expect)"));
            }
            let (status, headers, body) = answer;
            answers.push((
                case.name.clone(),
                Answer {
                    status,
                    headers,
                    body,
                },
            ));
        }
        table.extend(
            answers
                .into_iter()
                .map(|(case, answer)| (kind, case, answer)),
        );
    }
    Ok(table)
}

/// Whether the embedded table loads; the error says which file and case is wrong.
pub fn check_table() -> Result<usize, &'static TableError> {
    table().map(Vec::len)
}

/// Every `<kind>.<case>` the table holds.
pub fn provider_error_names() -> Vec<String> {
    table()
        .map(|table| {
            table
                .iter()
                .map(|(kind, case, _)| format!("{kind}.{case}"))
                .collect()
        })
        .unwrap_or_default()
}

/// A provider's error answer as the table holds it, its placeholders filled in: what a script's
/// `providerError` sends.
#[derive(Debug, Clone, PartialEq)]
pub struct ErrorAnswer {
    pub status: u16,
    pub headers: BTreeMap<String, String>,
    pub body: Value,
}

/// A `<kind>.<case>` name from the table.
pub fn provider_error_by_name(name: &str) -> Option<ErrorAnswer> {
    let (kind, case) = name.split_once('.')?;
    provider_error(kind, case)
}

/// The provider's real answer for an error case: status, headers and body, its placeholders
/// filled in for now.
pub fn provider_error(kind: &str, case: &str) -> Option<ErrorAnswer> {
    let (_, _, answer) = table()
        .ok()?
        .iter()
        .find(|(k, c, _)| *k == kind && c == case)?;
    Some(fill_answer(answer, unix_now_secs()))
}

fn fill_answer(answer: &Answer, now_secs: i64) -> ErrorAnswer {
    let mut headers: BTreeMap<String, String> = answer
        .headers
        .iter()
        .map(|(name, value)| (name.clone(), fill_placeholders(value, now_secs)))
        .collect();
    // JSON unless the case says otherwise (Cloudflare's HTML pages).
    headers
        .entry("content-type".to_owned())
        .or_insert_with(|| "application/json".to_owned());
    let text = fill_placeholders(&answer.body, now_secs);
    // JSON is sent as the provider's JSON; anything else as is.
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    ErrorAnswer {
        status: answer.status,
        headers,
        body,
    }
}

/// Fills the table's time placeholders (testdata/provider-errors/README.md) for `now_secs`:
/// `{now_ms}`, `{next_utc_midnight_ms}`, `{first_of_next_month}` (`YYYY-MM-01`, UTC),
/// `{first_of_next_month_ms}`. `{next_pacific_midnight_ms}` appears in verdicts only, which
/// the mock does not read.
pub fn fill_placeholders(text: &str, now_secs: i64) -> String {
    if !text.contains('{') {
        return text.to_owned();
    }
    let (year, month) = next_month(now_secs);
    text.replace("{now_ms}", &now_secs.saturating_mul(1000).to_string())
        .replace(
            "{next_utc_midnight_ms}",
            &next_utc_midnight_ms(now_secs).to_string(),
        )
        .replace(
            "{first_of_next_month_ms}",
            &(days_from_civil(year, month, 1) * 86_400_000).to_string(),
        )
        .replace("{first_of_next_month}", &format!("{year:04}-{month:02}-01"))
}

fn unix_now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| i64::try_from(elapsed.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn next_utc_midnight_ms(now_secs: i64) -> i64 {
    calendar::next_utc_midnight_ms(now_secs.saturating_mul(1000))
}

/// The year and month after the month holding `now_secs` (UTC).
fn next_month(now_secs: i64) -> (i64, u32) {
    let (year, month, _) = civil_from_days(now_secs.div_euclid(86_400));
    if month == 12 {
        (year + 1, 1)
    } else {
        (year, month + 1)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn every_kind_answers_every_common_case() {
        for kind in ProviderKind::ALL.map(ProviderKind::as_str) {
            for case in ERROR_CASES {
                let reply = provider_error(kind, case)
                    .unwrap_or_else(|| panic!("{kind}.{case} is missing"));
                let status = reply.status;
                assert!(status >= 400, "{kind}.{case}: {status}");
                assert!(!reply.body.is_null(), "{kind}.{case} has no body");
            }
        }
    }

    /// Every name the table held when it was Rust code: scripts and e2e tests use them.
    const NAMES_BEFORE_THE_DATA_FILES: [&str; 32] = [
        "openai.billing_hard_limit",
        "openai.tokens_rate_limited",
        "openai.server_error",
        "openai.region_unsupported",
        "openai.model_not_found",
        "anthropic.spend_cap",
        "anthropic.billing_error",
        "anthropic.permission_denied",
        "anthropic.api_error",
        "anthropic.request_too_large",
        "openrouter.free_daily",
        "openrouter.key_limit",
        "openrouter.credits_for_max_tokens",
        "openrouter.no_auth",
        "qwen.free_tier_exhausted",
        "qwen.allocation_quota",
        "qwen.content_filtered",
        "qwen.native_invalid_key",
        "qwen.native_throttling",
        "qwen.native_arrearage",
        "deepseek.invalid_format",
        "deepseek.invalid_parameters",
        "deepseek.server_error",
        "gemini.free_daily",
        "gemini.leaked_key",
        "gemini.permission_denied",
        "groq.tokens_per_day",
        "groq.flex_capacity",
        "groq.organization_restricted",
        "groq.request_too_large",
        "openai-compatible.vllm_context_length",
        "openai-compatible.ollama_model_not_found",
    ];

    #[test]
    fn the_embedded_table_loads() {
        let cases = check_table().map_err(ToString::to_string).unwrap();
        assert_eq!(cases, provider_error_names().len());
        assert!(
            cases >= 8 * 5 + NAMES_BEFORE_THE_DATA_FILES.len(),
            "{cases}"
        );
    }

    #[test]
    fn every_listed_name_resolves_and_nothing_else_does() {
        let names = provider_error_names();
        for name in &names {
            assert!(provider_error_by_name(name).is_some(), "{name}");
            assert_eq!(names.iter().filter(|n| *n == name).count(), 1, "{name}");
        }
        for name in NAMES_BEFORE_THE_DATA_FILES {
            assert!(names.iter().any(|n| n == name), "{name}");
        }
        for name in [
            "gemini.tokens_per_minute",
            "groq.requests_per_minute",
            "openai-compatible.retry_after_days",
        ] {
            assert!(names.iter().any(|n| n == name), "{name}");
        }
        assert!(provider_error_by_name("openai.nope").is_none());
        assert!(provider_error_by_name("nope.rate_limited").is_none());
        assert!(provider_error_by_name("openai").is_none());
    }

    #[test]
    fn aliases_answer_what_they_name() {
        for (alias, case) in [
            ("gemini.quota_exhausted", "gemini.free_daily"),
            ("groq.quota_exhausted", "groq.tokens_per_day"),
        ] {
            assert_eq!(
                provider_error_by_name(alias),
                provider_error_by_name(case),
                "{alias}"
            );
        }
    }

    #[test]
    fn cloudflare_pages_520_to_527_are_html_with_their_status() {
        for status in 520u16..=527 {
            let name = format!("openai-compatible.cloudflare_{status}");
            let reply = provider_error_by_name(&name).unwrap();
            assert_eq!(reply.status, status);
            assert_eq!(
                reply.headers.get("content-type").map(String::as_str),
                Some("text/html; charset=UTF-8"),
                "{name}"
            );
            let Value::String(page) = &reply.body else {
                panic!("{name}: not sent as text: {:?}", reply.body);
            };
            assert!(page.starts_with("<!DOCTYPE html>"), "{name}");
            assert!(page.contains(&format!("Error code {status}")), "{name}");
        }
        // A JSON case keeps its content type.
        let json = provider_error_by_name("openai.overloaded").unwrap();
        assert_eq!(
            json.headers.get("content-type").map(String::as_str),
            Some("application/json")
        );
    }

    #[test]
    fn placeholders_are_filled_in_every_answer() {
        for name in provider_error_names() {
            let reply = provider_error_by_name(&name).unwrap();
            let text = format!("{:?} {}", reply.headers, reply.body);
            for placeholder in [
                "{now_ms}",
                "{next_utc_midnight_ms}",
                "{first_of_next_month}",
                "{next_pacific_midnight_ms}",
            ] {
                assert!(!text.contains(placeholder), "{name}: {text}");
            }
        }
        // 2024-02-29T00:00:01Z.
        let now = 1_709_164_801;
        assert_eq!(
            fill_placeholders(
                "{now_ms} {next_utc_midnight_ms} {first_of_next_month} {first_of_next_month_ms}",
                now
            ),
            "1709164801000 1709251200000 2024-03-01 1709251200000"
        );
        let reset = provider_error_by_name("openrouter.free_daily")
            .unwrap()
            .body["error"]["metadata"]["headers"]["X-RateLimit-Reset"]
            .as_str()
            .and_then(|v| v.parse::<i64>().ok())
            .unwrap();
        assert_eq!(reset % 86_400_000, 0);
        assert!(reset > unix_now_secs() * 1000);
    }

    #[test]
    fn shapes_are_the_providers_own() {
        let get = |name: &str| provider_error_by_name(name).unwrap();
        let openai = get("openai.rate_limited");
        assert_eq!(openai.status, 429);
        assert!(openai.headers.contains_key("retry-after"));
        assert!(openai
            .headers
            .contains_key("x-ratelimit-remaining-requests"));
        let body = openai.body;
        assert_eq!(body["error"]["code"], "rate_limit_exceeded");
        assert_eq!(body["error"]["type"], "requests");
        assert!(body["error"]["param"].is_null());

        assert_eq!(
            get("openai.quota_exhausted").body["error"]["code"],
            "insufficient_quota"
        );
        assert_eq!(
            get("openai.invalid_key").body["error"]["code"],
            "invalid_api_key"
        );
        assert_eq!(get("anthropic.overloaded").status, 529);
        assert_eq!(
            get("anthropic.rate_limited").body["error"]["type"],
            "rate_limit_error"
        );
        assert_eq!(
            get("anthropic.invalid_key").body["error"]["type"],
            "authentication_error"
        );
        assert_eq!(get("openrouter.quota_exhausted").status, 402);
        assert_eq!(
            get("deepseek.quota_exhausted").body["error"]["message"],
            "Insufficient Balance"
        );
        assert_eq!(
            get("qwen.quota_exhausted").body["error"]["code"],
            "Arrearage"
        );
        assert_eq!(get("qwen.native_invalid_key").body["code"], "InvalidApiKey");
        let gemini = get("gemini.rate_limited").body;
        assert_eq!(gemini[0]["error"]["status"], "RESOURCE_EXHAUSTED");
        assert_eq!(
            get("groq.rate_limited").body["error"]["code"],
            "rate_limit_exceeded"
        );

        let spend_cap = get("anthropic.spend_cap").body;
        let message = spend_cap["error"]["message"].as_str().unwrap().to_owned();
        assert!(message.contains("-01 at 00:00 UTC"), "{message}");
    }

    #[test]
    fn messages_never_hold_a_plausible_real_key() {
        for name in provider_error_names() {
            let text = provider_error_by_name(&name).unwrap().body.to_string();
            // A masked test value only: no long run of key characters after a key prefix.
            for prefix in ["sk-", "sk-ant-", "sk-or-", "gsk_", "AIza"] {
                if let Some(at) = text.find(prefix) {
                    let tail: String = text[at + prefix.len()..]
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric())
                        .collect();
                    assert!(tail.len() < 16, "{name}: {text}");
                }
            }
        }
    }

    #[test]
    fn calendar_helpers() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        assert_eq!(next_month(1_703_980_800), (2024, 1)); // 2023-12-31
        assert_eq!(next_month(1_709_164_800), (2024, 3)); // 2024-02-29
        assert_eq!(days_from_civil(2024, 3, 1), 19_783);
        assert_eq!(
            civil_from_days(days_from_civil(2028, 12, 31)),
            (2028, 12, 31)
        );
        assert_eq!(next_utc_midnight_ms(1_709_164_801), 1_709_251_200_000);
    }
}
