// Package storetest is the contract suite for store.Store implementations.
//
// An implementation's test calls Run with a function that opens its store at a path:
//
//	func TestContract(t *testing.T) {
//		storetest.Run(t, func(t *testing.T, path string) store.Store {
//			s, err := sqlite.Open(t.Context(), path)
//			require.NoError(t, err)
//			return s
//		})
//	}
package storetest
