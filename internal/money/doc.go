// Package money is exact money arithmetic: USD, an amount of US dollars in pico-dollars
// (1e-12 USD) held in an int64, with checked sums and products (ErrOverflow past about 9.2
// million dollars), its exact decimal form (String, ParseUSD), and never a float. The price
// sheet (gateway/prices) and the usage store add costs with it.
package money
