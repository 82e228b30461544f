// Package constrain enforces structured outputs by constrained decoding: it compiles a JSON
// language (any JSON object, or the JSON texts that validate against a JSON Schema of the
// subset it supports) to a deterministic automaton over bytes, lifts it to a model's
// vocabulary, and answers at each decoding step which tokens keep the text a prefix of the
// language (Tokens.Mask) and whether it is complete (Tokens.Accepts: only then may an
// end-of-sequence token come).
//
// The schema is compiled once to a Thompson automaton over bytes (compact JSON: no
// whitespace between tokens; numbers of bounded length; UTF-8 checked in strings), which
// subset construction makes deterministic, with bytes no edge tells apart merged into
// classes and the states that cannot reach acceptance pruned, so every state left can
// still complete. Recursion through $ref is unrolled MaxRefExpansions times; nesting,
// states and compile time are bounded, and a schema past them, or using a keyword outside
// the subset, is refused with an *Error naming the keyword. Compiled schemas are kept in a
// bounded LRU keyed by the schema's compact text.
//
// A token mask is computed by walking a trie of the vocabulary's byte strings with the
// automaton, pruning each branch at its first dead byte, and is kept per automaton state
// (bounded), so each state's mask is computed once per (schema, tokenizer).
//
// Why written here: no maintained Go library compiles JSON Schema to a token-level
// automaton (the maintained ones, llguidance, outlines-core and xgrammar, are Rust, Python
// and C++; the torch worker uses llguidance), and the reference engine is pure Go. The
// package does one job and knows nothing of models: the engine gives it the vocabulary's
// bytes and end-of-sequence ids (NewVocab).
package constrain
