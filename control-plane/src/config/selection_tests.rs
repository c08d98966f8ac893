//! `selection`: the strategy, score weights, filters and affinity, their defaults and checks.

use std::path::Path;

use super::*;
use crate::config::secrets::MapEnv;

const BASE: &str = "providers:\n  - kind: groq\n    keys: [{alias: g, env: GROQ}]\n    models: [{id: openai/gpt-oss-120b}]\n";

fn with(selection: &str) -> Result<Config, String> {
    let text = format!("{BASE}selection:\n{selection}");
    parse(&text)
        .and_then(|f| f.resolve(&MapEnv::new([("GROQ", "sk-g")]), Path::new("/etc")))
        .map_err(|e| e.to_string())
}

#[test]
fn defaults_are_tiers_development_and_affinity_on() -> Result<(), String> {
    let c = with("  lowHeadroom: 1\n")?;
    let s = &c.selection;
    assert_eq!(s.strategy, SelectionStrategy::Tiers);
    assert_eq!(
        (s.score.alpha, s.score.beta, s.score.gamma),
        (0.3, 0.4, 0.3)
    );
    assert_eq!(s.mode, SelectionMode::Development);
    assert!(s.allow_prompt_logging && !s.keyless_fallback && s.region.is_none());
    assert!(s.affinity.enabled);
    Ok(())
}

#[test]
fn strategies_weights_and_filters_parse() -> Result<(), String> {
    let c = with(
        "  strategy: score\n  score: {alpha: 0.5, beta: 0.5, gamma: 0}\n  mode: production\n  region: de\n  allowPromptLogging: false\n  keylessFallback: true\n  affinity: {idleMs: 1000}\n",
    )?;
    let s = &c.selection;
    assert_eq!(s.strategy, SelectionStrategy::Score);
    assert_eq!(s.score.gamma, 0.0);
    assert_eq!(s.region.as_deref(), Some("DE"));
    assert_eq!(s.affinity.idle_ms, 1000);
    assert_eq!(
        with("  strategy: headroom\n")?.selection.strategy,
        SelectionStrategy::Headroom
    );
    Ok(())
}

#[test]
fn bad_selection_settings_are_refused_naming_the_field() {
    let cases = [
        ("  strategy: fastest\n", "strategy"),
        ("  score: {alpha: -1}\n", "selection.score.alpha"),
        (
            "  score: {alpha: 0, beta: 0, gamma: 0}\n",
            "must not all be 0",
        ),
        ("  region: Germany\n", "selection.region: 'Germany'"),
        ("  unreportedWeight: 0\n", "selection.unreportedWeight"),
        ("  affinity: {idleMs: 0}\n", "selection.affinity.idleMs"),
        ("  mode: prod\n", "mode"),
    ];
    for (yaml, want) in cases {
        match with(yaml) {
            Ok(_) => panic!("accepted: {yaml}"),
            Err(e) => assert!(e.contains(want), "{yaml}: {e}"),
        }
    }
}

#[test]
fn a_family_is_a_plain_name_and_its_rank_at_least_one() {
    let text = |m: &str| {
        format!(
            "providers:\n  - kind: groq\n    keys: [{{alias: g, env: GROQ}}]\n    models: [{m}]\n"
        )
    };
    let env = MapEnv::new([("GROQ", "sk-g")]);
    let err = |m: &str| {
        parse(&text(m))
            .and_then(|f| f.resolve(&env, Path::new("/etc")))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    assert!(err("{id: a, family: 'family:x'}").contains("providers[0].models[0].family"));
    assert!(err("{id: a, familyRank: 0}").contains("familyRank"));
    assert!(err("{id: a, family: house, familyRank: 1}").is_empty());
}

#[test]
fn blocked_regions_are_countries_or_groups() {
    let env = MapEnv::new([("GROQ", "sk-g")]);
    let with_terms = |terms: &str| {
        let text = format!(
            "providers:\n  - kind: groq\n    keys: [{{alias: g, env: GROQ}}]\n    models: [{{id: m}}]\n    terms: {terms}\n"
        );
        parse(&text)
            .and_then(|f| f.resolve(&env, Path::new("/etc")))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    assert!(with_terms("{ blockedRegions: [EU, us] }").is_empty());
    let e = with_terms("{ blockedRegions: [Europe] }");
    assert!(
        e.contains("providers[0].terms.blockedRegions: 'Europe'"),
        "{e}"
    );
    assert!(with_terms("{ trainsOnPrompts: maybe }").contains("trainsOnPrompts"));
}
