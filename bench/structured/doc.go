// Package structured measures what constrained decoding (response_format json_schema and
// json_object, internal/constrain) costs: output tokens/s of chat completions through the
// OpenAI route on loops/tiny, constrained against unconstrained, in alternating rounds of
// one script, with the ratio side by side. See README.md; run with LOOPS_BENCH=1.
package structured
