//! `ai-router prices [MODEL]`: the bundled price table `autoPrice` reads, as JSON: every row
//! by model id, or the row of one model (by its bare id, as `autoPrice` looks it up).

use ai_router_contract::error_code::ErrorCode;
use clap::Args;
use serde_json::{json, Value};

use crate::config::prices;
use crate::stdout;

#[derive(Debug, Args)]
pub struct PricesArgs {
    /// One model id (`gpt-4o-mini`, or `openai/gpt-4o-mini`); none: the whole table.
    model: Option<String>,
}

/// The answer for `model`, or the whole table; `Err` with the error object when the table does
/// not know the model.
pub fn answer(model: Option<&str>) -> Result<Value, Value> {
    match model {
        None => Ok(json!({ "unit": "USD per million tokens", "models": prices::table() })),
        Some(id) => match prices::lookup(id) {
            Some((key, row)) => {
                let mut value = json!(row);
                value["model"] = json!(key);
                Ok(value)
            }
            None => {
                let code = ErrorCode::ModelNotFound;
                Err(json!({ "error": {
                    "message": format!("The price table has no model '{id}'; give it an explicit cost."),
                    "type": code.openai_type(),
                    "code": code.as_str(),
                }}))
            }
        },
    }
}

pub fn run(args: PricesArgs) -> anyhow::Result<()> {
    match answer(args.model.as_deref()) {
        Ok(value) => Ok(stdout::print_line(&serde_json::to_string_pretty(&value)?)?),
        Err(err) => {
            stdout::print_line(&err.to_string())?;
            Err(anyhow::anyhow!("no price for that model"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_row_the_whole_table_and_an_unknown_model() {
        let row = answer(Some("openai/gpt-4o")).unwrap();
        assert_eq!(row["model"], "gpt-4o");
        assert_eq!(row["maker"], "openai");
        assert!(row["source"]
            .as_str()
            .is_some_and(|s| s.starts_with("https://")));
        let all = answer(None).unwrap();
        assert_eq!(all["models"]["gpt-4o"]["input"], row["input"]);
        let err = answer(Some("no-such-model")).unwrap_err();
        assert_eq!(err["error"]["code"], "model_not_found");
    }
}
