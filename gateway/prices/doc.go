// Package prices is the operator's price sheet: what each kind of metered usage costs, per
// base model, per GPU kind and per workspace (discount sheets), and exact money arithmetic.
// `loops serve --prices FILE` loads it (Watch) and reloads it when the file changes; the
// core prices each usage record with the sheet in force when the work ran (Sheet.Cost) and
// stores the cost with the usage, so a later sheet never reprices past work.
//
// # Money
//
// Costs are internal/money.USD amounts (pico-dollars in an int64, every sum and product
// checked for overflow, never a float). A sheet's token prices have at most 6 decimal
// places in USD per million tokens, so a token's price is a whole number of pico-dollars
// and a token cost is exact; a GPU-hour price is prorated per second and rounded half up to
// the pico-dollar once per metering record.
//
// # File format
//
// YAML or JSON (unknown keys are errors; every price is a decimal USD amount, as a string
// or a number, at least 0, with at most 6 decimal places):
//
//	models:                     # USD per million tokens, by base model ("*": any other model)
//	  Qwen/Qwen3-8B:
//	    prefill: "0.20"         # prompt tokens of a sample
//	    cached_prefill: "0.05"  # prompt tokens served from a prefix cache
//	    sample: "0.60"          # generated tokens
//	    train: "0.40"           # forward and forward_backward tokens
//	storage_gb_month: "0.031"   # USD per GB-month of checkpoint storage
//	gpu_hour:                   # USD per GPU-hour of a dedicated replica, by GPU kind ("*": any)
//	  "*": "2.50"
//	workspaces:                 # a workspace's own prices, field by field over the above
//	  team-a:
//	    models:
//	      Qwen/Qwen3-8B: {sample: "0.45"}
//
// A kind of usage with no price (a model the sheet does not list, a field left out) has no
// cost: it is shown without one, never as zero. A price of "0" is free, and shown as 0.
//
// # Versions
//
// Every sheet loaded has a version: the first 12 hex digits of its content's SHA-256 and
// the time it was loaded ("sha256:3f1a2b4c5d6e@2026-12-06T08:40:00Z"). The core records
// the version with each operation's cost.
package prices
