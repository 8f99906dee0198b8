//! Whether an agent run is over its budget, as a pure function of the budget, what the run has
//! used, and how many raises were approved (each approved ask adds the budget again).

use std::time::Duration;

use lamplighter_config::Budget;

use crate::run::AgentUsage;

/// What is about to happen, which decides the limits that apply: the tool-call limit only
/// stops a tool call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BudgetCheck {
    ModelCall,
    ToolCall,
}

/// Why the run is over `budget` (raised `approved` times), or `None` while it is within it.
/// When several limits are reached, the last of tokens, tool calls, cost and duration is named.
pub(crate) fn over_budget(budget: &Budget, usage: &AgentUsage, approved: u32, check: BudgetCheck) -> Option<String> {
    let factor = u64::from(approved) + 1;
    let mut over = None;
    if let Some(max) = budget.max_tokens_total
        && usage.tokens() >= max.saturating_mul(factor)
    {
        over = Some(format!("{} tokens used, max_tokens_total is {}", usage.tokens(), max.saturating_mul(factor)));
    }
    if let Some(max) = budget.max_tool_calls
        && check == BudgetCheck::ToolCall
        && usage.tool_calls >= u64::from(max).saturating_mul(factor)
    {
        over = Some(format!("{} tool calls made, max_tool_calls is {}", usage.tool_calls, u64::from(max).saturating_mul(factor)));
    }
    if let Some(max) = budget.max_cost
        && let cost = usage.cost.unwrap_or(0.0)
        && cost >= max * factor as f64
    {
        over = Some(format!("cost {:.6} reached, max_cost is {:.6}", cost, max * factor as f64));
    }
    if let Some(max) = budget.max_duration
        && usage.busy >= max.saturating_mul(u32::try_from(factor).unwrap_or(u32::MAX))
    {
        over = Some(format!(
            "running for {}, max_duration is {}",
            humantime::format_duration(Duration::from_secs(usage.busy.as_secs())),
            humantime::format_duration(max.saturating_mul(u32::try_from(factor).unwrap_or(u32::MAX)))
        ));
    }
    over
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(tokens: u64, tool_calls: u64, cost: Option<f64>, busy_s: u64) -> AgentUsage {
        AgentUsage { model_calls: 1, tool_calls, input_tokens: tokens, output_tokens: 0, cost, busy: Duration::from_secs(busy_s) }
    }

    #[test]
    fn budgets_by_the_table() {
        use BudgetCheck::{ModelCall, ToolCall};
        let tokens = Budget { max_tokens_total: Some(100), ..Default::default() };
        let tools = Budget { max_tool_calls: Some(3), ..Default::default() };
        let cost = Budget { max_cost: Some(0.5), ..Default::default() };
        let time = Budget { max_duration: Some(Duration::from_secs(60)), ..Default::default() };
        let none = Budget::default();
        let cases: Vec<(&Budget, AgentUsage, u32, BudgetCheck, Option<&str>)> = vec![
            (&none, usage(1_000_000, 1000, Some(99.0), 9999), 0, ToolCall, None),
            (&tokens, usage(99, 0, None, 0), 0, ModelCall, None),
            (&tokens, usage(100, 0, None, 0), 0, ModelCall, Some("100 tokens used, max_tokens_total is 100")),
            // One approved raise doubles the limit.
            (&tokens, usage(150, 0, None, 0), 1, ModelCall, None),
            (&tokens, usage(200, 0, None, 0), 1, ModelCall, Some("200 tokens used, max_tokens_total is 200")),
            // The tool-call limit stops tool calls only.
            (&tools, usage(0, 3, None, 0), 0, ModelCall, None),
            (&tools, usage(0, 3, None, 0), 0, ToolCall, Some("3 tool calls made, max_tool_calls is 3")),
            (&cost, usage(0, 0, None, 0), 0, ModelCall, None),
            (&cost, usage(0, 0, Some(0.5), 0), 0, ModelCall, Some("cost 0.500000 reached, max_cost is 0.500000")),
            (&time, usage(0, 0, None, 59), 0, ModelCall, None),
            (&time, usage(0, 0, None, 61), 0, ModelCall, Some("running for 1m 1s, max_duration is 1m")),
            (&time, usage(0, 0, None, 61), 2, ModelCall, None),
        ];
        for (i, (budget, usage, approved, check, want)) in cases.into_iter().enumerate() {
            assert_eq!(over_budget(budget, &usage, approved, check).as_deref(), want, "case {i}");
        }
    }
}
