//! The bundled price table (`control-plane/data/model-prices.yaml`) and `autoPrice`: a model
//! without a `cost` is priced from the table by its bare id, less the model's `discount`, else
//! its provider's. An explicit `cost` always wins; a model the table does not know stays
//! unpriced.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use crate::config::file::CostConfig;

const TABLE: &str = include_str!("../../data/model-prices.yaml");

/// One row: a maker's list price per million tokens, where it was read and when.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PriceRow {
    pub maker: String,
    pub input: f64,
    pub output: f64,
    pub source: String,
    pub date: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Table {
    models: BTreeMap<String, PriceRow>,
}

/// The table, parsed once; empty if the bundled file did not parse (a unit test keeps it
/// parsing).
pub fn table() -> &'static BTreeMap<String, PriceRow> {
    static PARSED: OnceLock<BTreeMap<String, PriceRow>> = OnceLock::new();
    PARSED.get_or_init(|| {
        serde_yaml_ng::from_str::<Table>(TABLE)
            .map(|t| t.models)
            .unwrap_or_default()
    })
}

/// The row of a model id: the id itself, else its part after the last `/` (an aggregator's
/// `openai/gpt-4o`).
pub fn lookup(model_id: &str) -> Option<(&'static str, &'static PriceRow)> {
    let table = table();
    let bare = model_id.rsplit('/').next().unwrap_or(model_id);
    [model_id, bare]
        .into_iter()
        .find_map(|id| table.get_key_value(id))
        .map(|(k, v)| (k.as_str(), v))
}

/// Where a model's price came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PriceSource {
    /// Its own `cost`.
    Config,
    /// The price table (`autoPrice`), with a discount when one applies.
    Table,
    /// Nowhere: no `cost`, and `autoPrice` is off or the table does not know it.
    Unpriced,
}

impl PriceSource {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Config => "config",
            Self::Table => "table",
            Self::Unpriced => "unpriced",
        }
    }
}

/// The table's price of `model_id` less `discount` (0.2 = 20% off).
pub fn table_cost(model_id: &str, discount: Option<f64>) -> Option<CostConfig> {
    let (_, row) = lookup(model_id)?;
    let factor = 1.0 - discount.unwrap_or(0.0);
    Some(CostConfig {
        input: row.input * factor,
        output: row.output * factor,
        cached_input: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bundled_table_parses_and_every_row_is_sound() {
        let table = table();
        assert!(table.len() >= 40, "{} rows", table.len());
        let makers = [
            "openai",
            "anthropic",
            "google",
            "xai",
            "mistral",
            "deepseek",
            "qwen",
            "kimi",
            "minimax",
            "glm",
        ];
        for maker in makers {
            assert!(
                table.values().any(|r| r.maker == maker),
                "no row of {maker}"
            );
        }
        for (id, row) in table {
            assert!(
                makers.contains(&row.maker.as_str()),
                "{id}: maker {}",
                row.maker
            );
            assert!(row.input > 0.0 && row.output >= 0.0, "{id}");
            assert!(row.source.starts_with("https://"), "{id}: {}", row.source);
            let date = row.date.as_bytes();
            assert!(
                date.len() == 10 && date[4] == b'-' && date[7] == b'-',
                "{id}: date {}",
                row.date
            );
        }
    }

    #[test]
    fn lookups_by_bare_id_and_discounts() {
        assert_eq!(lookup("gpt-4o-mini").map(|(id, _)| id), Some("gpt-4o-mini"));
        assert_eq!(
            lookup("openai/gpt-4o-mini").map(|(id, _)| id),
            Some("gpt-4o-mini")
        );
        assert!(lookup("my-own-llama").is_none());
        let full = table_cost("gpt-4o-mini", None).unwrap();
        assert_eq!((full.input, full.output), (0.15, 0.6));
        let off = table_cost("gpt-4o-mini", Some(0.2)).unwrap();
        assert!((off.input - 0.12).abs() < 1e-12 && (off.output - 0.48).abs() < 1e-12);
    }
}
