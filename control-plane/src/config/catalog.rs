//! The bundled data tables of `control-plane/data/`: canonical model families (`families.yaml`)
//! and what each provider kind's terms say (`terms.yaml`), merged with the config's own
//! `family:` on a model and `terms:` on a provider. Parsed once; a unit test keeps both files
//! well-formed (a broken table would otherwise act as an empty one).

use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde::Deserialize;

use crate::config::file::{ModelConfig, TermsConfig};

const FAMILIES_YAML: &str = include_str!("../../data/families.yaml");
const TERMS_YAML: &str = include_str!("../../data/terms.yaml");

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct FamilyTable {
    families: BTreeMap<String, FamilyEntry>,
    unknown_rank: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FamilyEntry {
    rank: u32,
    ids: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TermsTable {
    kinds: BTreeMap<String, TermsConfig>,
    #[serde(default)]
    groups: BTreeMap<String, Vec<String>>,
}

fn families() -> &'static FamilyTable {
    static TABLE: OnceLock<FamilyTable> = OnceLock::new();
    TABLE.get_or_init(|| serde_yaml_ng::from_str(FAMILIES_YAML).unwrap_or_default())
}

fn terms_table() -> &'static TermsTable {
    static TABLE: OnceLock<TermsTable> = OnceLock::new();
    TABLE.get_or_init(|| serde_yaml_ng::from_str(TERMS_YAML).unwrap_or_default())
}

/// A model's family and the family's quality rank (1 best).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Family {
    pub name: String,
    pub rank: u32,
}

/// The bundled family serving this id, if any (ids compare case-insensitively).
fn table_family(id: &str) -> Option<(&'static str, u32)> {
    families().families.iter().find_map(|(name, f)| {
        f.ids
            .iter()
            .any(|i| i.eq_ignore_ascii_case(id))
            .then_some((name.as_str(), f.rank))
    })
}

/// The family of a pool model: `family:` in the config, else the table's for its id, else a
/// family of its own (its id) at the table's conservative rank.
pub fn family_of(model: &ModelConfig) -> Family {
    let unknown = families().unknown_rank.max(1);
    let (name, table_rank) = match model.family.as_deref().map(str::trim) {
        Some(name) if !name.is_empty() => {
            let rank = families().families.get(name).map(|f| f.rank);
            (name.to_owned(), rank)
        }
        _ => match table_family(&model.id) {
            Some((name, rank)) => (name.to_owned(), Some(rank)),
            None => (model.id.clone(), None),
        },
    };
    Family {
        name,
        rank: model.family_rank.or(table_rank).unwrap_or(unknown),
    }
}

/// A provider's terms: the kind table's entry with the provider's overrides on top; region
/// groups (`EU`) expanded to their countries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Terms {
    pub production_allowed: bool,
    pub trains_on_prompts: bool,
    pub blocked_regions: Vec<String>,
    pub keyless: bool,
}

/// Whether a `blockedRegions` entry is an ISO 3166 alpha-2 code or a group of the table.
pub fn is_region(code: &str) -> bool {
    let code = code.trim().to_ascii_uppercase();
    (code.len() == 2 && code.chars().all(|c| c.is_ascii_alphabetic()))
        || terms_table().groups.contains_key(&code)
}

pub fn terms_of(kind: &str, over: Option<&TermsConfig>) -> Terms {
    let table = terms_table();
    let base = table.kinds.get(kind);
    let field = |f: fn(&TermsConfig) -> Option<bool>| over.and_then(f).or_else(|| base.and_then(f));
    let regions = over
        .and_then(|o| o.blocked_regions.clone())
        .or_else(|| base.and_then(|b| b.blocked_regions.clone()))
        .unwrap_or_default();
    let mut blocked: Vec<String> = Vec::new();
    for r in regions {
        let r = r.trim().to_ascii_uppercase();
        match table.groups.get(&r) {
            Some(members) => blocked.extend(members.iter().map(|m| m.to_ascii_uppercase())),
            None => blocked.push(r),
        }
    }
    blocked.sort();
    blocked.dedup();
    Terms {
        production_allowed: field(|t| t.production_allowed).unwrap_or(true),
        trains_on_prompts: field(|t| t.trains_on_prompts).unwrap_or(false),
        blocked_regions: blocked,
        keyless: field(|t| t.keyless).unwrap_or(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(id: &str, family: Option<&str>, rank: Option<u32>) -> ModelConfig {
        ModelConfig {
            family: family.map(Into::into),
            family_rank: rank,
            ..ModelConfig::with_id(id)
        }
    }

    #[test]
    fn the_bundled_tables_parse() -> Result<(), serde_yaml_ng::Error> {
        let f: FamilyTable = serde_yaml_ng::from_str(FAMILIES_YAML)?;
        assert!(f.families.len() >= 5);
        assert!(f
            .families
            .values()
            .all(|e| e.rank >= 1 && !e.ids.is_empty()));
        let t: TermsTable = serde_yaml_ng::from_str(TERMS_YAML)?;
        assert!(t.kinds.contains_key("nvidia"));
        Ok(())
    }

    #[test]
    fn one_model_under_the_ids_of_five_providers_is_one_family() {
        for id in [
            "openai/gpt-oss-120b",
            "gpt-oss-120b",
            "@cf/openai/gpt-oss-120b",
            "openai/gpt-oss-120b:free",
            "OPENAI/GPT-OSS-120B",
        ] {
            assert_eq!(
                family_of(&model(id, None, None)),
                Family {
                    name: "gpt-oss-120b".into(),
                    rank: 2
                },
                "{id}"
            );
        }
    }

    #[test]
    fn config_extends_the_table_and_unknown_models_stand_alone() {
        // `family:` joins a table family (its rank) or names a new one.
        assert_eq!(
            family_of(&model("my-oss", Some("gpt-oss-120b"), None)).rank,
            2
        );
        assert_eq!(
            family_of(&model("x", Some("house"), Some(1))),
            Family {
                name: "house".into(),
                rank: 1
            }
        );
        assert_eq!(
            family_of(&model("brand-new-model", None, None)),
            Family {
                name: "brand-new-model".into(),
                rank: 3
            }
        );
    }

    #[test]
    fn terms_come_from_the_kind_table_and_a_provider_overrides_them() {
        let nvidia = terms_of("nvidia", None);
        assert!(!nvidia.production_allowed);
        let gemini = terms_of("gemini", None);
        assert!(gemini.trains_on_prompts);
        for c in ["DE", "FR", "GB", "CH", "NO"] {
            assert!(gemini.blocked_regions.iter().any(|r| r == c), "{c}");
        }
        assert!(!gemini.blocked_regions.iter().any(|r| r == "US"));
        let groq = terms_of("groq", None);
        assert_eq!(
            groq,
            Terms {
                production_allowed: true,
                ..Terms::default()
            }
        );
        // A paid Gemini project: no region block, no training.
        let paid = terms_of(
            "gemini",
            Some(&TermsConfig {
                trains_on_prompts: Some(false),
                blocked_regions: Some(vec![]),
                ..TermsConfig::default()
            }),
        );
        assert!(!paid.trains_on_prompts && paid.blocked_regions.is_empty());
        assert!(terms_of("ovhcloud", None).keyless);
    }
}
