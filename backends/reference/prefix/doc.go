// Package prefix is the reference engine's prefix cache: the keys and values of recent
// prompts, in blocks of BlockTokens tokens, found by a hash chain over a scope and the
// prompt's tokens, held under a byte budget with least-recently-used eviction.
//
// A block's hash covers the scope (which names the base model, the workspace and the
// adapter's weights: the engine decides what it holds), every token before and in the
// block, and every block's product mode (the kernels the engine ran it with, which
// change its bits), so a block found is one computed from exactly that input. Blocks are
// immutable once stored; a lookup hands out references that stay valid after eviction.
// No lock is held while keys and values are copied or hashed.
package prefix
