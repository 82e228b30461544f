// Package bounded reads and decompresses request bodies with memory bounded by their limits.
//
// A decompressed body is allocated once, at its exact size, and only after that size is
// known and has been reserved in the server's Budget: zstd frames that declare their content
// size are decoded straight into a buffer of that size (a frame producing more than it
// declared fails within one block), and anything else is first decoded into nothing to count
// it. No buffer grows by doubling toward a limit, a body over its limit costs no output
// buffer at all, and the Budget bounds the memory of bodies being decompressed, or held
// decompressed, across the server at once, counting a body until the garbage collector has
// really freed it.
package bounded
